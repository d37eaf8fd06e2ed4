"""The launcher's stdout and stderr, which carry every rank's output: a reader that leaves does not end the job.

    with guarded_consoles(kept="--log-dir"):   # sys.stdout / sys.stderr guarded while the job runs
        run_direct(plan, base_env=env)

``convoy launch train.py | head`` closes the pipe the ranks' lines go to once ``head`` has its lines. Unguarded,
the first write after that raised ``BrokenPipeError`` in the thread that copies a rank's output (the direct
engine) or in torch's log tailer (the elastic engine): the copying stopped, a rank then blocked on its full
pipe and the job hung, or torch logged a traceback per rank. A shell pipeline's program would die of SIGPIPE;
a training job should not lose its work because a viewer went away. Guarded, the stream that broke is pointed
at ``/dev/null`` (so Python's own flush at exit cannot fail on it either), the job goes on, and one line on
the other stream says so and where the output still goes (``--log-dir``).
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator, TextIO

__all__ = ["guarded_consoles"]


class _Guarded:
    """A text stream that survives its reader: writes after a ``BrokenPipeError`` go to ``/dev/null``."""

    def __init__(self, stream: TextIO, name: str, *, other: TextIO, kept: str | None) -> None:
        self._stream, self._name, self._other, self._kept = stream, name, other, kept
        self._gone = False
        self._lock = threading.Lock()  # the pumps of several ranks write from their own threads

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._reader_left()
            return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_left()

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, ...: the real stream's
        return getattr(self._stream, name)

    def _reader_left(self) -> None:
        with self._lock:
            if self._gone:
                return
            self._gone = True
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, self._stream.fileno())
            finally:
                os.close(null)
            self._stream.flush()  # what was buffered goes to /dev/null too
        except (OSError, ValueError):  # not a file descriptor (a test's capture): nothing to point elsewhere
            pass
        where = f"their output reaches {self._kept} only" if self._kept else \
            "their output to it is dropped (--log-dir keeps it)"
        try:
            self._other.write(f"convoy: nobody reads the job's {self._name} any more (a closed pipe); the ranks go "
                              f"on, {where}\n")
            self._other.flush()
        except (BrokenPipeError, ValueError):
            pass


@contextmanager
def guarded_consoles(*, kept: str | None = None) -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` guarded (see the module docstring) inside the block; ``kept`` names
    where the ranks' output still goes when the console's reader has left (``"--log-dir"``), or None."""
    out, err = sys.stdout, sys.stderr
    sys.stdout = _Guarded(out, "stdout", other=err, kept=kept)  # type: ignore[assignment]
    sys.stderr = _Guarded(err, "stderr", other=out, kept=kept)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
