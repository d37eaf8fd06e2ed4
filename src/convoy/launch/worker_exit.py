"""How a launched Python worker ends: with its program's status, after every exit handler, without the
interpreter's final teardown when the program used ``torch.distributed``.

    end_without_teardown()      # in convoy.launch.record, before the program starts
    program_ended(status)       # once the program's status is known

Why: gloo's worker threads can outlive ``destroy_process_group()`` when something (a DDP module, a device
mesh, a global) still holds the group. When one of them reaches for the interpreter while it finalizes, a
process that finished all its work aborts with SIGABRT and ``terminate called without an active exception``
(pytorch/pytorch#179291). So a script launched by convoy ends plainly, with no ``os._exit`` of its own.

What still happens, in Python's order: the program's non-daemon threads are joined, every exit handler runs
(the program's, torch's, the Accelerator's group teardown, logging's, multiprocessing's), then the standard
streams and every open file are flushed. What is skipped is what runs after the handlers: ``__del__`` of
objects still alive and the interpreter's own clean-up, which the operating system does at exit anyway.
"""

from __future__ import annotations

import _io
import atexit
import gc
import os
import sys

__all__ = ["end_without_teardown", "exit_status", "program_ended"]

_status: int | None = None  # the program's exit status, once it is known


def end_without_teardown() -> None:
    """Register the handler that ends the process, so that it runs after every other exit handler.

    Exit handlers run last-registered first, so this must be called before the program starts. Does nothing
    when a handler is registered already: an earlier call's (then in place), or another, which would run after
    this one and never run (the interpreter's teardown is then kept).
    """
    if atexit._ncallbacks() == 0:
        atexit.register(_leave)


def program_ended(status: int | None) -> None:
    """Record the program's exit status (None: not known, so the interpreter ends as usual)."""
    global _status
    _status = status


def exit_status(code: object) -> int | None:
    """The status Python exits with for ``SystemExit(code)``: 0 for None, the number for an int (a bool too),
    1 for anything else (Python prints it); None for a number the operating system cannot take."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code if -(2**31) <= code < 2**31 else None
    return 1


def _leave() -> None:
    if _status is None or "torch.distributed" not in sys.modules:
        return
    _flush_open_files()
    os._exit(_status)


def _flush_open_files() -> None:
    """What the interpreter's teardown would write: the standard streams, then every open file's buffer."""
    for stream in (sys.stdout, sys.stderr):
        _flush(stream)
    for obj in gc.get_objects():
        # every file object's C base; a plain subclass check (io.IOBase's is an ABC's, three times slower), and
        # not isinstance, which reads __class__, which a proxy (a deprecated torch name) answers with a warning
        if issubclass(type(obj), _io._IOBase):
            _flush(obj)


def _flush(stream: object) -> None:
    try:
        stream.flush()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):  # None, a closed file, a reader gone
        pass
