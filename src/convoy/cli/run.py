"""``convoy run``: reserve devices, make exactly those visible, and run any command on them.

    convoy run --devices 1,3 -- python train.py --lr 1e-3   # GPUs 1 and 3 leased while it runs
    convoy run --devices 1 --free --wait 5m -- python train.py
    convoy run --devices 2,0 -- ./my_jax_job.sh             # physical 2 is the job's first device
    convoy run --devices 0, --no-lease -- nvidia-smi        # GPU 0, shared: no lease

Resolves the request with ``select_devices`` and leases the devices it chose for the life of CMD, as
``convoy launch`` does: a device another job has leased is refused at once, naming the holder, or waited for
with ``--wait``; ``--free`` moves a count past leased devices (``select_and_lease``); ``--no-lease`` shares
them. CMD runs in a process group of its own (``convoy.launch.group``): SIGTERM/SIGHUP/SIGINT/SIGQUIT/SIGUSR1/
SIGUSR2 to convoy reach every process of that group and every other descendant of CMD (one that left the group or
its session too), a stop signal is followed by SIGKILL after ``--shutdown-timeout`` seconds, and what CMD leaves
running when it ends is stopped the same way. convoy exits with CMD's exit code (128+N when a signal N killed
it: 143 for a scheduler's SIGTERM) once every one is gone.
The lease is held by convoy and by CMD (it inherits the lock, and so do its children), and convoy only closes
its own copy: it ends when the last of them is gone, SIGKILL included. Torch-free.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys

from convoy.cli.select import NO_LEASE_WAIT, add_filter_arguments, command_env, selection_kwargs
from convoy.errors import ConfigError

TYPE_CHECKING = False  # typing is not imported at run time: `convoy select` starts without it
if TYPE_CHECKING:
    from collections.abc import Sequence

DESCRIPTION = "Reserve devices, make exactly those visible, and run any command (any framework) on them."
EPILOG = """examples:
  convoy run --devices 1,3 -- python train.py                 # GPUs 1 and 3, leased while it runs
  convoy run --devices 1 --free -- python train.py            # any 1 GPU nobody uses or has leased
  convoy run --devices 2 --free --wait 10m -- bash job.sh     # wait for 2 GPUs no other job holds
  convoy run --devices 0, --no-lease -- nvidia-smi            # GPU 0, shared: no lease

leases: the devices are leased for the life of CMD and every process it starts (as convoy launch leases them),
so another convoy run or launch cannot take them, and --free skips them; one that another job holds is refused at
once (exit 1, naming the holder) unless --wait T waits for it. --no-lease shares the devices: no lease is taken.
signals: SIGTERM, SIGHUP, SIGINT, SIGQUIT, SIGUSR1 and SIGUSR2 to convoy reach CMD's whole process group and every
process it started (those that left its group too); after a stop signal, SIGKILL follows --shutdown-timeout
seconds later. Processes CMD leaves running when it ends are
stopped (SIGTERM, then SIGKILL) before the lease ends.
exit code: CMD's own; 128+N if signal N killed it (SIGTERM to convoy reaches CMD: 143 if it ends CMD);
1 if no devices could be had; 2 for bad flags; 127 if CMD is not found; 126 if it cannot be run (no
permission, or a script without a #! line)."""

SHUTDOWN_TIMEOUT = 30.0
"""Seconds between a stop signal passed on to CMD's group and SIGKILL (torch's agent's and Slurm's default)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--devices", metavar="SPEC", default="auto",
                        help="count (2), index list (2,0), range (0-3), -1/all, or auto (default)")
    add_filter_arguments(parser)
    parser.add_argument("--wait", metavar="T", default=None,
                        help="wait up to T (30s, 5m, 1h, inf) for devices other jobs have leased (default: refuse "
                             "at once)")
    parser.add_argument("--no-lease", action="store_true",
                        help="share the devices: take no lease (by default they are leased while CMD runs)")
    parser.add_argument("--explain", action="store_true", help="print why these devices, to stderr")
    parser.add_argument("--shutdown-timeout", "--shutdown_timeout", metavar="S", type=_seconds,
                        default=SHUTDOWN_TIMEOUT, help="seconds CMD's processes get after a stop signal (SIGTERM, "
                        f"SIGINT, SIGHUP, SIGQUIT) before SIGKILL (default {SHUTDOWN_TIMEOUT:g})")
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the command to run")


def _seconds(text: str) -> float:
    from convoy.devices.amounts import parse_duration

    try:
        value = parse_duration(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    if value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: give a finite time such as 30 or 2m")
    return value


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    argv = list(argv)
    if "--" in argv:
        cut = argv.index("--")
        args = parser.parse_args(argv[:cut])
        args.command = list(args.command) + argv[cut + 1:]
    else:
        args = parser.parse_args(argv)
    if not args.command:
        parser.error("no command to run; write e.g.: convoy run --devices 1 -- python train.py")
    return args


STOPPED_BY_SIGTERM = True  # convoy.cli.main: a SIGTERM before CMD starts (waiting for a lease) says "terminated"


def run(args: argparse.Namespace) -> int:
    from convoy.devices.amounts import parse_duration

    env = command_env(args)
    if args.wait is not None and args.no_lease:
        raise ConfigError(NO_LEASE_WAIT)
    wait = None if args.wait is None else parse_duration(args.wait)
    selection, lease = _select_and_lease(args, env, wait=wait)
    try:
        if args.explain:
            print("\n".join(selection.explanation), file=sys.stderr)
        child_env = {**os.environ, **selection.env}
        ended = _run_child(args.command, child_env, pass_fds=lease.fds if lease else (),
                           grace=args.shutdown_timeout)
    finally:
        if lease is not None:
            lease.close()  # not unlocked: a process of CMD out of convoy's reach keeps its copy, and the lease
    if isinstance(ended, int):
        return ended
    if ended.foreground and ended.signum == signal.SIGINT:
        # Ctrl-C went to CMD (it had the terminal): end as it did, so that a shell loop around convoy stops too
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return ended.code


def _select_and_lease(args: argparse.Namespace, env: dict[str, str], *, wait: float | None):
    """``(selection, lease or None)``, as ``convoy launch`` takes its devices: with ``--free`` a count moves
    past devices other jobs have leased (also with ``--no-lease``, as ``convoy select --free``); otherwise the
    devices asked for are leased, or refused naming their holder (waited for with ``--wait``)."""
    from convoy.devices.discovery import discover
    from convoy.devices.lease import default_lock_dir, lease_devices, select_and_lease, visible_holders
    from convoy.devices.selection import select_devices

    def say(line: str) -> None:  # a wait is told: what it waits for, and when it has the devices
        print(line, file=sys.stderr, flush=True)

    if args.free and not args.no_lease:
        return select_and_lease(args.devices, wait=wait, env=env, say=say, **selection_kwargs(args))
    inventory = discover(env)
    held = visible_holders(inventory, env) if args.free else {}
    selection = select_devices(args.devices, inventory=inventory, env=env, held=held, **selection_kwargs(args))
    if args.no_lease or not selection.devices:  # shared, or CPU only: nothing to lease
        return selection, None
    return selection, lease_devices(selection.devices, wait=wait, lock_dir=default_lock_dir(env), spec=args.devices,
                                    say=say)


def _run_child(command: list[str], env: dict[str, str], pass_fds: Sequence[int], *,
               grace: float = SHUTDOWN_TIMEOUT):
    """CMD's end (``convoy.launch.group.Ended``), or the exit code when it could not be started."""
    from convoy.launch.group import run_group

    try:
        return run_group(command, env=env, pass_fds=pass_fds, grace=grace)
    except FileNotFoundError:
        print(f"convoy: command not found: {command[0]!r}", file=sys.stderr)
        return 127
    except PermissionError:
        print(f"convoy: command not executable: {command[0]!r}", file=sys.stderr)
        return 126
    except OSError as err:
        if err.errno != errno.ENOEXEC:
            raise
        # a script without a '#!' line: the kernel cannot run it (a shell would guess; exec does not)
        print(f"convoy: {command[0]} is not executable as a program: add a #! line or run it with "
              f"bash {command[0]}", file=sys.stderr)
        return 126
