"""Every error convoy raises on purpose, in one place.

Each class refines the builtin it behaves like, so ``except ValueError`` keeps working for callers who do
not know convoy. Messages say what was wrong and what would be right, in one line, for a user::

    ConvoyError                                   base; ``exit_code`` is what the CLI exits with
    ├── DeviceSpecError(ValueError)               a device request that cannot be parsed or met
    ├── InventoryError(ValueError)                an inventory file that is missing or malformed
    ├── SelectionError(RuntimeError)              not enough devices pass the filters (exit 1)
    ├── LeaseError(RuntimeError)                  devices held by another job past --wait (exit 1)
    ├── VisibilityError(RuntimeError)             visibility changed after CUDA started (exit 1)
    ├── ConfigError(ValueError)                   a malformed or conflicting setting
    ├── LaunchError(RuntimeError)                 a launch that could not start (exit 1)
    │   └── RankFailedError                       a rank failed; carries rank, host, exit code, traceback
    ├── StrategyError(ValueError)                 a strategy or parallel layout that cannot work
    ├── CheckpointError(RuntimeError)             no loadable checkpoint, or a save that failed (exit 1)
    ├── PlanError(ValueError)                     a model or hardware description the planner cannot use
    ├── CollectiveTimeoutError(RuntimeError)      a collective that not every rank reached (exit 1)
    ├── DistributedOperationError(RuntimeError)   a collective whose ranks passed mismatched shapes (exit 1)
    └── NotSupportedYetError(NotImplementedError) a real gap, named; never a silent fallback

The CLI turns a ``ConvoyError`` into ``convoy: <message>`` on stderr and ``exit_code`` in exactly one place,
``convoy.cli.main.main``, by one rule (docs/launching.md, "Exit codes"): 2 when the command is wrong here and
stays wrong however often it is retried (a bad or conflicting flag, setting or file, devices the machine does not
have, a combination convoy does not support yet, an optional package the request needs), 1 when it could run but
did not this time (devices taken or too few free, a rank failed, a launch, checkpoint or collective that failed).

Warnings: ``ConvoyWarning(UserWarning)``, for input convoy sets aside and goes on without (a calibration cache it
may not trust, a measurement no device could make); the CLI prints each as one ``convoy: warning: ...`` line.

Outside the tree, as ``KeyboardInterrupt`` is: ``Terminated(BaseException)``, a job stopped by a signal other
than Ctrl-C (a scheduler's SIGTERM); the CLI exits 128 + the signal's number with a line that says so
(``stop_report``).
"""

from __future__ import annotations

__all__ = [
    "ConvoyError",
    "DeviceSpecError",
    "InventoryError",
    "SelectionError",
    "LeaseError",
    "VisibilityError",
    "ConfigError",
    "LaunchError",
    "RankFailedError",
    "StrategyError",
    "CheckpointError",
    "PlanError",
    "CollectiveTimeoutError",
    "DistributedOperationError",
    "NotSupportedYetError",
    "ConvoyWarning",
    "Terminated",
    "stop_report",
    "shown",
]


class ConvoyError(Exception):
    """Base of every error convoy raises on purpose."""

    #: what ``convoy`` exits with when this error reaches the command line: 2 = bad input, 1 = runtime.
    exit_code: int = 2


class DeviceSpecError(ConvoyError, ValueError):
    """A device request (``devices=``) that cannot be parsed or asks for devices that do not exist."""


class InventoryError(ConvoyError, ValueError):
    """An inventory file (``CONVOY_INVENTORY``) that is missing, unreadable or malformed."""


class SelectionError(ConvoyError, RuntimeError):
    """Too few devices pass the request's filters (free memory, utilisation, busy, excluded)."""

    exit_code = 1


class LeaseError(ConvoyError, RuntimeError):
    """The devices are leased by another job and did not come free within the wait."""

    exit_code = 1


class VisibilityError(ConvoyError, RuntimeError):
    """Device visibility was requested after the accelerator runtime had already started."""

    exit_code = 1


class ConfigError(ConvoyError, ValueError):
    """A setting that is malformed, unknown, or conflicts with another setting."""


class LaunchError(ConvoyError, RuntimeError):
    """A launch that could not start, or whose worker group failed."""

    exit_code = 1


class RankFailedError(LaunchError):
    """A rank of a launched job failed. The first failing rank is the one reported."""

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        host: str | None = None,
        exitcode: int | None = None,
        traceback: str | None = None,
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.host = host
        self.exitcode = exitcode
        self.traceback = traceback


class StrategyError(ConvoyError, ValueError):
    """A training strategy or parallel layout that cannot work with this model, world size or device."""


class CheckpointError(ConvoyError, RuntimeError):
    """No complete checkpoint to load, or a checkpoint that could not be written."""

    exit_code = 1


class PlanError(ConvoyError, ValueError):
    """A model, run or hardware description the planner cannot use."""


class CollectiveTimeoutError(ConvoyError, RuntimeError):
    """A collective operation that some ranks never reached within the timeout."""

    exit_code = 1


class DistributedOperationError(ConvoyError, RuntimeError):
    """A collective whose processes passed tensors that cannot go together (Accelerate's
    ``DistributedOperationException``): different numbers of dimensions, or different shapes."""

    exit_code = 1


class NotSupportedYetError(ConvoyError, NotImplementedError):
    """Something convoy does not do yet; the message says what, and what to use instead. On the command line a
    usage error (exit 2): retried as it is, the request never runs; change it."""


class ConvoyWarning(UserWarning):
    """Input convoy sets aside and goes on without; the message names it (the file, the key) and says why."""


class Terminated(BaseException):
    """The job was stopped by a signal other than Ctrl-C (``KeyboardInterrupt``): a scheduler's SIGTERM before a
    preemption, SIGHUP, or a ``--signals-to-handle`` signal passed on to the ranks. Not an error of the job; a
    ``BaseException``, as ``KeyboardInterrupt`` is, so that no ``except Exception`` on the way swallows it.
    ``convoy`` exits 128 + ``signum``, as a shell reports a process that signal ended (143 for SIGTERM), so
    that Slurm or Kubernetes tell a preemption from an interruption (130)."""

    def __init__(self, signum: int) -> None:
        import signal

        try:
            name = signal.Signals(signum).name
        except ValueError:
            name = f"signal {signum}"
        super().__init__(f"terminated ({name})")
        self.signum = int(signum)
        self.name = name


def stop_report(signum: int) -> tuple[str, int]:
    """What ``convoy`` says when a signal stops it, and the code it exits with: ``("interrupted", 130)`` for
    Ctrl-C, ``("terminated (SIGTERM)", 143)`` and 128 + the number for another."""
    import signal

    if signum == signal.SIGINT:
        return "interrupted", 130
    return str(Terminated(signum)), 128 + int(signum)


def shown(value: object, *, limit: int = 40, huge: str | None = None) -> str:
    """``repr(value)`` for a one-line error message: at most ``limit`` characters (cut ones end in ``...``), never
    failing. ``huge``: what an int past 64 bits reads as instead (else its digits, cut); an int past Python's
    4300-digit printing limit reads as ``<a int too long to print>``."""
    if huge is not None and isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return huge
    try:
        text = repr(value)
    except ValueError:
        return f"<a {type(value).__name__} too long to print>"
    return text if len(text) <= limit else text[:limit - 3] + "..."
