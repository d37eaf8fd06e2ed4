"""A stop signal that reaches the launcher while torch waits inside C++ (pytorch/pytorch#63802).

    gate = StopGate()
    with stoppable_while_blocked(gate):    # around torch's agent, in the main thread
        ...                                # the agent calls gate.shut() as it starts the first workers

torch's elastic agent meets the other nodes in ``TCPStore``'s constructor: node 0 waits there until every node
has connected, another node until node 0 answers, for up to torch's timeouts (600 and 900 s). Python runs a
signal handler only between bytecodes, so Ctrl-C and a scheduler's SIGTERM did nothing for 10-15 minutes.

While the block runs, the main thread blocks the stops (SIGINT, SIGTERM, SIGHUP), so torch's C++ is not
interrupted mid-call (its retry loop printed a C++ stack for the interrupted system call). A helper thread
receives them: Python's C-level handler writes each one's number to the wakeup descriptor it reads, and marks
the handler due in the main thread. When a stop has not ended the block within ``GRACE_SECONDS`` and the gate
is open, the helper says the line ``convoy`` says for that stop and ends the process with its code (130 for
Ctrl-C, 128 + the signal's number otherwise). That leaves what a ``kill -9`` of the launcher leaves: no worker
(the gate shuts, and the main thread gets its signals back, before the first starts), the lease released by the
job's guard (``convoy.launch.guard``), a temporary directory the next launch sweeps. Once workers run, torch's
own handlers stop them and this stands aside.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from convoy.errors import stop_report

__all__ = ["GRACE_SECONDS", "StopGate", "stoppable_while_blocked"]

#: how long the main thread has to act on a stop itself (it runs its handler within microseconds when not blocked)
GRACE_SECONDS = 2.0

_STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_WAKE = 0  # the byte that tells the helper the block has ended (signal numbers start at 1)


@dataclass
class StopGate:
    """Open while a stop may end the process at once: the block runs and no worker has started."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    open: bool = True
    mask: set[int | signal.Signals] | None = None  # the main thread's signal mask to restore as the gate shuts

    def shut(self) -> None:
        """From now on a stop is the main thread's to act on (waits while the helper is ending the process); called
        from the main thread, which gets its signals back: a worker started now inherits its mask."""
        with self.lock:
            self.open = False
            if self.mask is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)
                self.mask = None


@contextmanager
def stoppable_while_blocked(gate: StopGate, *, grace: float = GRACE_SECONDS) -> Iterator[None]:
    """Run the block with a helper that ends the process on a stop the blocked main thread cannot act on."""
    if threading.current_thread() is not threading.main_thread():
        yield  # (the wakeup descriptor can only be set from the main thread)
        return
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    try:
        before = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except ValueError:
        reader.close()
        writer.close()
        yield
        return
    helper = threading.Thread(target=_watch, args=(reader, gate, grace), name="convoy-stop-watch", daemon=True)
    helper.start()  # before the mask: the helper thread keeps the stops and receives them
    gate.mask = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
    try:
        yield
    finally:
        gate.shut()
        signal.set_wakeup_fd(before)
        try:
            writer.send(bytes([_WAKE]))
        except OSError:
            pass
        helper.join(timeout=grace + 1)
        reader.close()
        writer.close()


def _watch(reader: socket.socket, gate: StopGate, grace: float) -> None:
    """The helper: on each stop, give the main thread ``grace`` seconds, then end the process if the gate is open."""
    while True:
        try:
            received = reader.recv(64)
        except OSError:
            return
        if not received or _WAKE in received:
            return
        stops = [number for number in received if number in _STOPS]
        if not stops:
            continue
        reader.settimeout(grace)  # wait out the grace, still reading: the block may end meanwhile
        try:
            more = reader.recv(64)
            if not more or _WAKE in more:
                return
        except TimeoutError:
            pass
        except OSError:
            return
        finally:
            reader.settimeout(None)
        with gate.lock:
            if gate.open:
                _end(stops[0])


def _end(signum: int) -> None:
    """Say what ``convoy`` says for this stop and exit with its code, now."""
    line, code = stop_report(signum)
    # what the launcher printed is flushed, unless the blocked main thread holds a stream (a write to a full
    # pipe): then the flush would wait for it forever, so it gets a moment in a thread of its own
    flusher = threading.Thread(target=_flush_streams, name="convoy-stop-flush", daemon=True)
    flusher.start()
    flusher.join(timeout=0.5)
    os.write(2, f"convoy: {line}\n".encode())
    os._exit(code)


def _flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
