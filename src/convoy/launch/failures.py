"""Which rank failed first, how (exit code or signal), and its traceback, told once.

    from convoy.launch.failures import RankFailure, TracebackHold, describe_exit
    describe_exit(-9)                    # 'signal SIGKILL'
    hold = TracebackHold()
    hold.feed("Traceback (most recent call last):\\n")   # [] - held until we know whether the rank failed

A rank's stderr is streamed line by line, except Python traceback blocks: they are held until the block
ends (printed inline then) or the process exits. When the process failed, the held block becomes the
traceback of the failure report, so the real failing rank's traceback is printed once, with its rank, host
and exit code, at the end of the output where people look. Scripts that use torch's ``@record`` also leave
an error file (``TORCHELASTIC_ERROR_FILE``), read as a fallback when the traceback did not reach stderr.
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from pathlib import Path

from convoy import errors
from convoy.errors import RankFailedError

__all__ = ["PEER_GONE", "peer_gone_line", "RankFailure", "TracebackHold", "describe_exit", "read_error_file",
           "failure_error"]

_CHAIN = (
    "Traceback (most recent call last):",
    "During handling of the above exception",
    "The above exception was the direct cause",
    "Exception Group Traceback",
)


#: what a collective says when another rank's process ended (gloo, NCCL's socket): this rank lost a peer
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Connection refused")


def peer_gone_line(exc: BaseException) -> str | None:
    """A collective's error after another rank ended, as one line (gloo's runs 300 characters, and its traceback
    a dozen lines, printed before the launcher names the rank that ended); ``None`` for any other error."""
    text = str(exc)
    words = next((w for w in PEER_GONE if w in text), None)
    if words is None:
        return None
    where = text[:text.index(words) + len(words)].rsplit("] ", 1)[-1]  # without gloo's source location
    return f"{type(exc).__name__}: {where} (another rank ended; the launcher names it)"


#: what a worker prints instead of a traceback for a ``ConvoyError`` (``convoy.launch.record``): "StrategyError: ..."
_ONE_LINE_ERRORS = frozenset(name for name in errors.__all__ if name.endswith("Error"))


def describe_exit(returncode: int) -> str:
    """``exit code 3`` or ``signal SIGKILL`` for a ``Popen.returncode``."""
    if returncode < 0:
        try:
            return f"signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


@dataclass(frozen=True, kw_only=True)
class RankFailure:
    """The first rank that failed."""

    rank: int
    local_rank: int
    host: str
    returncode: int
    """``Popen`` convention: negative = killed by that signal."""
    traceback: str | None
    """Its traceback (unprefixed), or ``None`` when it printed none (killed, ``os._exit``, ...)."""
    traceback_shown: bool = False
    """True when the traceback already went to the console inline (so the report does not repeat it)."""
    elapsed: float = 0.0
    """Seconds from the job's start to the failure."""
    note: str | None = None
    """What else is known, e.g. the ranks that never joined the collective it waited in."""

    @property
    def how(self) -> str:
        return describe_exit(self.returncode)


def failure_error(failure: RankFailure, *, stopped: int) -> RankFailedError:
    """The ``RankFailedError`` that reports ``failure``: one header line, then the prefixed traceback."""
    header = (f"rank {failure.rank} (local rank {failure.local_rank}) on host {failure.host} failed with "
              f"{failure.how} after {failure.elapsed:.1f} s; stopped the other {stopped} rank(s)")
    if failure.note:
        header += f"; {failure.note}"
    if failure.traceback and not failure.traceback_shown:
        body = "".join(f"[rank{failure.rank}]: {line}\n" for line in failure.traceback.rstrip("\n").split("\n"))
        message = f"{header}\n{body.rstrip()}"
    elif failure.traceback:
        one_line = "\n" not in failure.traceback.strip()
        message = f"{header} (its {'error' if one_line else 'traceback'} is above)"
    else:
        message = f"{header} (it printed no traceback)"
    return RankFailedError(message, rank=failure.rank, host=failure.host, exitcode=failure.returncode,
                           traceback=failure.traceback)


def read_error_file(path: str | Path) -> str | None:
    """The traceback torchelastic's ``@record`` wrote to ``path``, or ``None``."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    message = data.get("message") if isinstance(data, dict) else None
    if isinstance(message, dict):
        extra = message.get("extraInfo") or {}
        return extra.get("py_callstack") or message.get("message")
    return message if isinstance(message, str) else None


class TracebackHold:
    """Line filter for one stderr stream: passes lines through, holds Python traceback blocks."""

    def __init__(self) -> None:
        self.held: list[str] = []
        self.traceback: str | None = None  # the last traceback block seen (held or released)
        self._ended = False  # the block's "ExcType: message" line has been seen

    @property
    def holding(self) -> bool:
        return bool(self.held)

    def feed(self, line: str) -> list[str]:
        """Lines to print now (possibly none while a traceback block is being held)."""
        if not self.held:
            if line.startswith(_CHAIN[0]) or line.startswith(_CHAIN[3]):
                self.held, self._ended = [line], False
                return []
            if line.partition(": ")[0] in _ONE_LINE_ERRORS:  # a convoy error a worker printed as its one line
                self.held, self._ended = [line], True
                return []
            return [line]
        if line.startswith((" ", "\t")) or not line.strip():
            self.held.append(line)
            return []
        if line.startswith(_CHAIN):
            self.held.append(line)
            self._ended = False
            return []
        if not self._ended:
            self.held.append(line)
            self._ended = True
            return []
        return self.release() + self.feed(line)

    def release(self) -> list[str]:
        """Give up the held block (for printing inline); remember it as the last traceback."""
        block, self.held, self._ended = self.held, [], False
        if block:
            self.traceback = "".join(block)
        return block

    def take(self) -> str | None:
        """The held block (if any) as the failure's traceback, without printing it; else the last one seen."""
        if self.held:
            self.traceback = "".join(self.held)
            self.held, self._ended = [], False
        return self.traceback
