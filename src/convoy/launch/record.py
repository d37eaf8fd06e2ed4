"""Run a script or module the way ``python`` would, recording an uncaught exception in torchelastic's error file.

    python -m convoy.launch.record train.py --lr 1e-3
    python -m convoy.launch.record -m my.module --lr 1e-3

The elastic engine starts workers through this so that an unmodified script (no ``@record``) still leaves
its traceback in ``TORCHELASTIC_ERROR_FILE``, where the agent reads the failing rank's root cause; rank 0 of a
single-node job also starts the rendezvous store on loopback here, and keeps serving it after the program
succeeded until the other ranks' programs have finished, which they say here (``convoy.launch.loopback``).
The worker then ends with the program's status once its objects are finalized, without the interpreter's
C-level teardown, where gloo can abort a finished process (``convoy.launch.worker_exit``). Torch-free: it
writes the same JSON as ``torch.distributed.elastic.multiprocessing.errors.ErrorHandler``.

A failing rank's report is written whole even when the agent stops it meanwhile: once one rank has failed, the
agent SIGTERMs the others, and one that was itself failing (a peer gone) could die with its traceback half
printed and its error file empty, which torch's agent cannot parse (it gave up the whole job, restarts left).
The error file appears at once, complete (written aside, then renamed), and a SIGTERM that comes while the
report is written takes effect after it.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["main", "write_error_file"]


def write_error_file(exc: BaseException, path: str) -> None:
    """``exc`` as torchelastic's error file at ``path``, which exists only once it is complete."""
    data = {"message": {"message": f"{type(exc).__name__}: {exc}", "extraInfo": {
        "py_callstack": "".join(traceback.format_exception(exc)), "timestamp": str(int(time.time()))}}}
    aside = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{os.getpid()}")
    try:
        with open(aside, "w") as handle:
            json.dump(data, handle)
        os.replace(aside, path)
    except OSError:
        pass
    finally:
        if os.path.exists(aside):
            os.unlink(aside)


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: python -m convoy.launch.record SCRIPT [ARGS] | -m MODULE [ARGS]")
    from convoy.launch import hang_report, worker_exit
    from convoy.launch.failures import peer_gone_line
    from convoy.launch.loopback import STORE_VARIABLES, close_when_done, prepare_worker

    worker_exit.end_without_teardown()  # first: its exit handler runs after every other one
    env = dict(os.environ)
    for name in STORE_VARIABLES:  # this rank's own: a program it starts must not take them for its own
        os.environ.pop(name, None)
    prepare_worker(env)  # rank 0 of a single-node job: the store listens on loopback only
    close_when_done(env)  # the other ranks: tell rank 0 once this program is done, before the interpreter's teardown
    hang_report.install()  # raw collectives: convoy's default timeout, and counts that name a missing rank
    try:
        if argv[0] == "-m":
            sys.argv = argv[1:]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as done:
        if done.code in (None, 0):
            _keep_serving_the_store(env)
        worker_exit.program_ended(worker_exit.exit_status(done.code))
        raise
    except BaseException as exc:
        with _sigterm_deferred():
            exc.__traceback__ = _user_frames(exc.__traceback__)
            lost = None if _debug() else peer_gone_line(exc)
            if _one_line(exc):  # convoy's own error says what was wrong and what is right: its line, once
                print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
            elif lost:  # a collective that lost its peer: what matters is the rank that ended, said by the launcher
                print(lost, file=sys.stderr)
            else:
                traceback.print_exception(exc, file=sys.stderr)  # as Python would, without this wrapper's frames
            sys.stderr.flush()
            path = os.environ.get("TORCHELASTIC_ERROR_FILE")
            if path:
                write_error_file(exc, path)
        worker_exit.program_ended(1)
        sys.exit(1)
    _keep_serving_the_store(env)
    worker_exit.program_ended(0)


def _keep_serving_the_store(env: dict[str, str]) -> None:
    """Rank 0 of a single-node job, its program done: the other ranks may still reach the store it serves."""
    from convoy.launch.loopback import keep_serving, others_done, serving

    done = others_done(env)
    if done is not None and serving():
        keep_serving(done)


@contextmanager
def _sigterm_deferred() -> Iterator[None]:
    """A SIGTERM that comes inside the block takes effect (as its handler before would have it) at the end."""
    came: list[int] = []
    try:
        before = signal.signal(signal.SIGTERM, lambda signum, frame: came.append(signum))
    except ValueError:  # not the main thread: nothing to defer with
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)
        if came:
            signal.raise_signal(signal.SIGTERM)


def _one_line(exc: BaseException) -> bool:
    """A ``ConvoyError`` of one line is printed as that line, as the CLI prints one (``CONVOY_DEBUG=1``: the
    traceback); the error file keeps the traceback either way."""
    from convoy.errors import ConvoyError

    return isinstance(exc, ConvoyError) and "\n" not in str(exc) and not _debug()


def _debug() -> bool:
    return os.environ.get("CONVOY_DEBUG", "") not in ("", "0")


def _user_frames(tb):
    """Drop the leading frames of this module and runpy, so the traceback starts in the user's program."""
    while tb is not None and (tb.tb_frame.f_code.co_filename in (__file__, "<frozen runpy>")
                              or tb.tb_frame.f_code.co_filename.endswith("runpy.py")):
        tb = tb.tb_next
    return tb


if __name__ == "__main__":
    main(sys.argv[1:])
