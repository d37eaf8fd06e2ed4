"""The launcher's stdout and stderr, which carry every rank's output: a reader that leaves does not end the job,
and a rank's progress bar reads as it would without convoy.

    with guarded_consoles(kept="--log-dir"):   # sys.stdout / sys.stderr guarded while the job runs
        run_direct(plan, base_env=env)
    lines = RankLines("[rank0]: ", tty=sys.stderr.isatty())
    sys.stderr.write(lines.feed(piece))        # piece: one line ("...\n") or one redraw ("...\r") of the rank's

``convoy launch train.py | head`` closes the pipe the ranks' lines go to once ``head`` has its lines. Unguarded,
the first write after that raised ``BrokenPipeError`` in the thread that copies a rank's output (the direct
engine) or in torch's log tailer (the elastic engine): the copying stopped, a rank then blocked on its full
pipe and the job hung, or torch logged a traceback per rank. A shell pipeline's program would die of SIGPIPE;
a training job should not lose its work because a viewer went away. Guarded, the stream that broke is pointed
at ``/dev/null`` (so Python's own flush at exit cannot fail on it either), the job goes on, and one line on
the other stream says so and where the output still goes (``--log-dir``).

A progress bar (tqdm, convoy's ``progress_bar``) redraws its line after a carriage return. Read line by line
with the carriage return taken for a line end, each redraw became a ``[rank0]:  25%|...`` line of its own.
``RankLines`` keeps the rank's pieces as they end: on a terminal a redraw is written with its prefix and its
carriage return, so the bar redraws in place; elsewhere (a pipe, a file) a bar is one line at most every
``BAR_EVERY_S`` seconds, and its last state. Both engines read ranks' output through it (the direct engine's
pumps; torch's log tailer under the elastic engine, ``tail_rank_file``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

__all__ = ["guarded_consoles", "RankLines", "BAR_EVERY_S", "own_prefix_stripped", "pieces", "tail_rank_file"]

BAR_EVERY_S = 10.0
"""Not on a terminal, a progress bar's redraws become one line at most this often (and its last state)."""
_ERASE_LINE = "\x1b[K"  # erase to the end of the line: a line written over a bar leaves none of it behind


class RankLines:
    """One rank's stream on the launcher's console (see the module docstring): ``feed`` takes one piece as it
    ended, a line (``"...\\n"``) or a redraw (``"...\\r"``), and returns what to write."""

    def __init__(self, prefix: str, *, tty: bool, every: float = BAR_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.prefix, self.tty, self.every, self._clock = prefix, tty, every, clock
        self._drawn = False  # a terminal line holds a redraw of this stream
        self._shown_at: float | None = None  # when a redraw was last written as a line (not a terminal)
        self._pending: str | None = None  # the latest redraw not written (not a terminal)

    @staticmethod
    def is_redraw(piece: str) -> bool:
        return piece.endswith("\r")

    def feed(self, piece: str) -> str:
        if self.is_redraw(piece):
            text = piece[:-1]
            if not text:  # the carriage return that starts a redraw
                return ""
            if self.tty:
                self._drawn = True
                return f"{self.prefix}{text}\r"
            now = self._clock()
            if self._shown_at is None or now - self._shown_at >= self.every:
                self._shown_at, self._pending = now, None
                return f"{self.prefix}{text}\n"
            self._pending = text
            return ""
        line = own_prefix_stripped(piece if piece.endswith("\n") else piece + "\n", self.prefix)
        erase = _ERASE_LINE if self._drawn and line.strip() else ""
        self._drawn, self._shown_at, self._pending = False, None, None  # a bar's last state, or other output
        return f"{self.prefix}{line[:-1]}{erase}\n" if erase else f"{self.prefix}{line}"

    def close(self) -> str:
        """The end of the stream: a redraw not shown yet, as a line; a terminal's bar line ended."""
        if self._pending is not None:
            text, self._pending = self._pending, None
            return f"{self.prefix}{text}\n"
        if self._drawn:
            self._drawn = False
            return "\n"
        return ""


def own_prefix_stripped(line: str, prefix: str) -> str:
    """``line`` without the rank prefix it already carries: torch prefixes a rank's tracebacks (``[rank1]: ``) and
    its C++ warnings (``[rank1]:[W1127 ...]``) itself, and convoy's logger its lines (``[rank1]: ``); the launcher
    adds its own, so ``[rank1]: [rank1]:[W...`` read twice."""
    if line.startswith(prefix):
        return line[len(prefix):]
    bare = prefix.rstrip(" ")
    return line[len(bare):] if line.startswith(bare + "[") else line


def pieces(stream) -> Iterator[str]:
    """The pieces of a text stream opened with ``newline=""``, each ending in ``"\\n"``, ``"\\r\\n"`` or
    ``"\\r"`` (the last one maybe in neither)."""
    return iter(stream.readline, "")


def tail_rank_file(header: str, file: str, dst: TextIO, finished: threading.Event, interval_sec: float,
                   log_line_filter: Callable[[str], bool] | None = None) -> None:
    """torch's ``tail_logfile`` (the elastic engine's tee of a rank's output file to the console) with a bar
    that reads as under the direct engine: the file is read with its carriage returns kept (``RankLines``)."""
    while not os.path.exists(file):
        if finished.is_set():
            return
        time.sleep(interval_sec)
    try:
        tty = dst.isatty()
    except (AttributeError, ValueError):
        tty = False
    lines = RankLines(header, tty=tty)
    carry = ""  # a piece the rank has not finished writing yet
    with open(file, errors="replace", newline="") as fp:
        while True:
            piece = carry + fp.readline()
            carry = ""
            if piece and not piece.endswith(("\n", "\r")) and not finished.is_set():
                carry = piece  # read to the end of the file in the middle of a piece: wait for the rest
                time.sleep(interval_sec)
                continue
            if piece:
                if log_line_filter is None or lines.is_redraw(piece) or log_line_filter(piece):
                    out = lines.feed(piece)
                    if out:
                        dst.write(out)
                        dst.flush()
            elif finished.is_set():
                break
            else:
                time.sleep(interval_sec)
    tail = lines.close()
    if tail:
        dst.write(tail)


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
    sys.stdout = _Guarded(out, "stdout", other=err, kept=kept)
    sys.stderr = _Guarded(err, "stderr", other=out, kept=kept)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
