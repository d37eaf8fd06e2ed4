"""The ``convoy`` command: a lazy table of subcommands.

Usage::

    convoy devices            # what this machine has
    convoy select 2 --free    # which devices a job would get
    convoy launch train.py    # one process per device

Each subcommand lives in its own module ``convoy.cli.<name>`` with ``add_arguments(parser)`` and
``run(args) -> int``. Only the module of the command being run is imported, so ``convoy --help`` and the
device commands never import torch. Errors become exit codes here and nowhere else.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys

TYPE_CHECKING = False  # typing is not imported at run time: `convoy select` starts without it
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

# name -> (module, one-line summary). Order is the order of ``convoy --help``.
COMMANDS: dict[str, tuple[str, str]] = {
    "devices": ("convoy.cli.devices", "list this machine's accelerators (or an inventory file's)"),
    "select": ("convoy.cli.select", "choose devices for a request and print them or their environment"),
    "run": ("convoy.cli.run", "reserve devices, make them visible, and run any command"),
    "launch": ("convoy.cli.launch", "start one process per device, on one machine or many (torchrun's flags)"),
    "plan": ("convoy.cli.plan", "memory and time per parallelism strategy, and which to use"),
    "env": ("convoy.cli.env", "print everything a bug report needs"),
    "test": ("convoy.cli.test", "a short self-check of the selected devices and their links"),
    "config": ("convoy.cli.config", "write or show convoy's settings file"),
}

EPILOG = """examples:
  convoy devices --json > box.json        snapshot this machine (replay with CONVOY_INVENTORY=box.json)
  eval $(convoy select 2 --free --format env)
  convoy run --devices 1,3 -- python train.py
  convoy launch --devices 0,2 train.py --lr 1e-3
  convoy plan config.json --hardware 8xH100-80GB

run 'convoy COMMAND --help' for a command's options."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and exit 2, with a hint where a typo is likely."""

    def error(self, message: str) -> None:  # type: ignore[override]
        # every error line starts "convoy:" (the ConvoyError lines too), then the command it is about
        command = self.prog.partition(" ")[2]
        where = f"{command}: " if command else ""
        self.exit(2, f"convoy: {where}{message} (see '{self.prog} --help')\n")


def _help_width() -> int:
    """The width argparse's help takes, ``shutil.get_terminal_size().columns - 2``, found as shutil finds it
    (``$COLUMNS``, else the terminal of stdout, else 80) without importing shutil: argparse imports it (and with it
    bz2, lzma and zlib, ~2.5 ms) in every help formatter it builds, and it builds one for each ``add_argument``."""
    try:
        columns = int(os.environ.get("COLUMNS", ""))
    except ValueError:
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
        except (AttributeError, ValueError, OSError):
            columns = 0
    return (columns or 80) - 2


def _formatter(kind: type[argparse.HelpFormatter]) -> Callable[..., argparse.HelpFormatter]:
    """``kind`` with the width given (``_help_width``), so that argparse does not import shutil to find it."""
    width = _help_width()

    def formatter(prog: str) -> argparse.HelpFormatter:
        return kind(prog, width=width)

    return formatter


def _top_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="convoy",
        description="Select accelerators, plan parallelism, launch and train on PyTorch's native engines.",
        epilog=EPILOG,
        formatter_class=_formatter(argparse.RawDescriptionHelpFormatter),
    )
    parser.add_argument("--version", action="store_true", help="print convoy's version and exit")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks for errors")
    lines = "\n".join(f"  {name:<9} {summary}" for name, (_, summary) in COMMANDS.items())
    parser.add_argument("command", nargs="?", metavar="COMMAND", help=f"one of:\n{lines}")
    parser.formatter_class = _formatter(argparse.RawTextHelpFormatter)
    return parser


def _command_parser(name: str, module) -> argparse.ArgumentParser:
    parser = _Parser(
        prog=f"convoy {name}",
        description=getattr(module, "DESCRIPTION", COMMANDS[name][1]),
        epilog=getattr(module, "EPILOG", None),
        formatter_class=_formatter(argparse.RawDescriptionHelpFormatter),
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks for errors")
    module.add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``convoy`` with ``argv`` (default: ``sys.argv[1:]``) and return the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # Split at the first non-option word: everything after it belongs to the subcommand.
    head: list[str] = []
    while argv and argv[0].startswith("-"):
        head.append(argv.pop(0))
    top = _top_parser()
    top_args = top.parse_args(head)
    if top_args.version:
        from convoy import __version__

        print(f"convoy {__version__}")
        return 0
    if not argv:
        top.print_help()
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else f"; commands: {', '.join(COMMANDS)}"
        print(f"convoy: unknown command '{name}'{hint}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    parser = _command_parser(name, module)
    parse = getattr(module, "parse_args", None)
    args = parse(parser, rest) if parse else parser.parse_args(rest)
    _one_value_each(parser, args)
    debug = top_args.debug or getattr(args, "debug", False)
    return _run(module, args, debug=debug)


def _one_value_each(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse ``--flag=--``, which Python 3.11's argparse turns into an empty list for an option taking one
    value (it drops the ``--`` and keeps what is left; 3.12 reads it as the value ``--``): the command then failed
    with a traceback on a list where a number or a word was expected."""
    for action in parser._actions:  # noqa: SLF001 -- argparse keeps no public list of an option's actions
        stores_one = type(action) is argparse._StoreAction and action.nargs is None  # noqa: SLF001 -- not append
        if action.option_strings and stores_one and isinstance(getattr(args, action.dest, None), list):
            parser.error(f"argument {'/'.join(action.option_strings)}: expected one argument")


def _run(module, args: argparse.Namespace, *, debug: bool) -> int:
    from convoy.errors import ConvoyError, Terminated, stop_report

    try:
        with _terminated_on_signal(getattr(module, "STOPPED_BY_SIGTERM", False)), _warnings_as_lines():
            return int(module.run(args) or 0)
    except ConvoyError as err:
        if debug:
            raise
        print(f"convoy: {err}", file=sys.stderr)
        return err.exit_code
    except (KeyboardInterrupt, Terminated) as stop:  # a scheduler's SIGTERM (preemption) is not a Ctrl-C's 130
        import signal  # only here: the device commands start without it

        line, code = stop_report(stop.signum if isinstance(stop, Terminated) else signal.SIGINT)
        print(f"convoy: {line}", file=sys.stderr)
        return code
    except BrokenPipeError:  # `convoy launch --dry-run | head`: the reader left; no traceback, as for `cat`
        if debug:
            raise
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())  # Python's flush of stdout at exit must not fail on it too
        os.close(null)
        return 141  # 128 + SIGPIPE, what a shell reports for a program the pipe stopped


@contextlib.contextmanager
def _warnings_as_lines():
    """A ``ConvoyWarning`` is one ``convoy: warning: ...`` line on stderr (Python's format adds the file, the line
    number and the source line of the call); every other warning is shown as Python shows it."""
    import warnings

    from convoy.errors import ConvoyWarning

    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if isinstance(category, type) and issubclass(category, ConvoyWarning):
            print(f"convoy: warning: {message}", file=sys.stderr if file is None else file, flush=True)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


@contextlib.contextmanager
def _terminated_on_signal(wanted: bool):
    """For a command that runs a job (``STOPPED_BY_SIGTERM``: ``convoy launch``, ``convoy run``): SIGTERM and
    SIGHUP raise ``Terminated`` while it runs, as SIGINT raises ``KeyboardInterrupt``, so that a stop before
    the job's own handlers are in place (selecting devices, waiting for a lease) still cleans up and says
    "terminated" with 128 + the signal's number, where Python's default would end the process without a word.
    The job's engines install their own handlers while the job runs (``convoy.launch.workers``)."""
    if not wanted:
        yield
        return
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    from convoy.errors import Terminated

    def stop(signum, _frame):
        raise Terminated(signum)

    previous = {signum: signal.signal(signum, stop) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def entry_point() -> None:
    """Console-script entry point. The command's objects are frozen out of the garbage collector as it leaves:
    the interpreter's last collections would walk every object of an imported torch again (~0.4 s of CPU when a
    launcher exits after torch's agent ran; docs/launching.md), only to free memory the exit frees anyway. Only
    the command's own process does this (``gc.freeze``), never a program that calls convoy's functions."""
    code = main()
    import gc

    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    entry_point()
