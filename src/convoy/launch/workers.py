"""The direct engine: start one node's workers with torchrun's environment, without importing torch.

    from convoy.launch.workers import run_direct
    run_direct(plan, base_env=os.environ)    # 0, or raises RankFailedError for the first failing rank

For a single node without restarts, PyTorch's elastic agent adds nothing but its own ``import torch``
(about 2.5 s on a 2-core box) before any worker starts. This engine starts the workers at once, gives each
the variables torch's ``LocalElasticAgent`` would (``convoy.launch.rank_env.rank_env``; rank 0's process group
creates the TCPStore on ``MASTER_PORT``), and does what the agent's monitor does: stream rank-prefixed
output, stop every rank within seconds when one fails (SIGTERM, then SIGKILL after ``grace`` seconds),
report the first failing rank once, and leave no process behind (each worker leads its own process group,
killed as a group, and dies with this process via ``PR_SET_PDEATHSIG`` on Linux). On a loopback address the
rendezvous store listens on that address only: this process binds the socket and hands it to rank 0
(``convoy.launch.loopback``), with a pipe whose end of file tells rank 0 that the other ranks' programs have
finished (each holds its write end until then), so that it keeps serving the store until then and no
longer. Multi-node jobs and ``--max-restarts`` use the elastic agent instead (``convoy.launch.elastic``).
"""

from __future__ import annotations

import io
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import IO, Any

from convoy.errors import LaunchError, Terminated
from convoy.launch.console import RankLines, own_prefix_stripped, pieces
from convoy.launch.failures import RankFailure, TracebackHold, failure_error, read_error_file
from convoy.launch.hang_report import missing_note
from convoy.launch.loopback import (
    DONE_FD_VARIABLE,
    LISTEN_FD_VARIABLE,
    RELEASE_FD_VARIABLE,
    STORE_VARIABLES,
    is_loopback,
    listen_socket,
    loopback_env,
)
from convoy.launch.ports import free_port
from convoy.launch.rank_env import rank_env
from convoy.launch.resolve import STOP_SIGNALS, LaunchPlan, forwarded_signals, shown_ranks, stream_map
from convoy.launch.scratch import Scratch

__all__ = ["run_direct"]

FORWARDED_GRACE = 30.0
"""Seconds between a passed-on signal (``--signals-to-handle``'s SIGUSR1, say) and SIGKILL, without
``--shutdown-timeout``: torch's agent's default, time for a rank to save; a stop or a failure gets ``grace``."""
_TICK = 0.25  # the monitor wakes at once on an exit or a stop signal; this bounds the wait otherwise
_STALE_TRACEBACK = 1.0  # a held traceback of a live process is printed inline after this many seconds


class _Rank:
    """One worker: its process, its output pumps and its held traceback."""

    def __init__(self, local_rank: int, rank: int, proc: subprocess.Popen, *, show: tuple[bool, bool],
                 log: IO[str] | None, lock: threading.Lock, error_file: str, wake: _Wake):
        self.local_rank, self.rank, self.proc = local_rank, rank, proc
        self.hold = TracebackHold()
        self.shown_traceback = False
        self.eof_at: float | None = None
        self.held_since = 0.0
        self.error_file = error_file
        self._lock, self._log, self._wake = lock, log, wake
        self._prefix = f"[rank{rank}]: "
        out = (sys.stdout, RankLines(self._prefix, tty=_isatty(sys.stdout)))
        merged = proc.stderr is None  # one pipe for both (_one_console): its lines in the order the rank wrote them
        self._consoles = {False: out, True: out if merged else
                          (sys.stderr, RankLines(self._prefix, tty=_isatty(sys.stderr)))}
        pumps = [(proc.stdout, show[0], True)] if merged else \
            [(proc.stdout, show[0], False), (proc.stderr, show[1], True)]
        self.threads = [threading.Thread(target=self._pump, args=pump, daemon=True) for pump in pumps]
        self._waiter = threading.Thread(target=self._wait, daemon=True)

    def start(self) -> None:
        """Start the output pumps and the exit waiter (after every worker has been started)."""
        for thread in (*self.threads, self._waiter):
            thread.start()

    def join(self, timeout: float) -> None:
        for thread in (*self.threads, self._waiter):
            if thread.ident is not None:  # started
                thread.join(timeout=timeout)

    def _wait(self) -> None:
        self.proc.wait()
        self._wake.set()

    def _pump(self, raw, show: bool, is_err: bool) -> None:
        # carriage returns kept: a progress bar's redraw is a piece of its own (convoy.launch.console.RankLines);
        # is_err: the rank's stderr, or its one pipe for both: tracebacks held (TracebackHold)
        stream = io.TextIOWrapper(raw, errors="replace", newline="")
        console, lines = self._consoles[is_err]
        for piece in pieces(stream):
            if RankLines.is_redraw(piece):
                with self._lock:
                    if self._log is not None:
                        self._log.write(piece)
                    if show and not (is_err and self.hold.holding):
                        self._emit(console, lines.feed(piece))
                continue
            line = piece[:-2] + "\n" if piece.endswith("\r\n") else piece if piece.endswith("\n") else piece + "\n"
            line = own_prefix_stripped(line, self._prefix)  # torch's tracebacks and C++ warnings carry it already
            with self._lock:
                if self._log is not None:
                    self._log.write(line)
                if not show:
                    continue
                if not is_err:
                    self._write(False, [line])
                    continue
                was_holding = self.hold.holding
                out = self.hold.feed(line)
                if self.hold.holding and not was_holding:
                    self.held_since = time.monotonic()
                self._write(True, out)
        if is_err:
            self.eof_at = time.monotonic()
        with self._lock:
            if show:
                self._emit(console, lines.close())
        stream.close()

    def _write(self, is_err: bool, lines: list[str]) -> None:
        console, stream = self._consoles[is_err]
        self._emit(console, "".join(stream.feed(line) for line in lines))

    @staticmethod
    def _emit(console, text: str) -> None:
        if text:
            console.write(text)
            console.flush()

    def flush_stale(self, now: float) -> None:
        """Print a held traceback inline when the process lives on after it (it was caught and printed)."""
        with self._lock:
            if self.hold.holding and self.proc.poll() is None and now - self.held_since > _STALE_TRACEBACK:
                self._write(True, self.hold.release())
                self.shown_traceback = True

    def release_inline(self) -> None:
        with self._lock:
            self._write(True, self.hold.release())

    def traceback(self) -> tuple[str | None, bool]:
        """(traceback, already shown inline)."""
        with self._lock:
            if self.hold.holding:
                return self.hold.take(), False
            if self.hold.traceback:
                return self.hold.traceback, True
        return read_error_file(self.error_file), False

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _one_console() -> bool:
    """Whether this process's stdout and stderr are one file (a terminal, ``2>&1``): then each rank writes both
    into one pipe, read in the order it wrote them (two pipes read side by side lose that order: a line printed
    right after a progress bar closed on stderr came before the bar's last line). Apart (``> out 2> err``),
    each rank's streams stay apart."""
    try:
        out, err = os.fstat(sys.stdout.fileno()), os.fstat(sys.stderr.fileno())
    except (AttributeError, ValueError, OSError, io.UnsupportedOperation):  # not files (a test's capture)
        return False
    return (out.st_dev, out.st_ino) == (err.st_dev, err.st_ino)


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _die_with_parent_hook():
    """A pre-exec hook that makes the worker die with this process (Linux ``PR_SET_PDEATHSIG``).

    libc is loaded here, before any fork: importing in the child could deadlock on an import lock held by
    one of this process's output threads at fork time.
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None).prctl

    def hook() -> None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG

    return hook


def run_direct(plan: LaunchPlan, *, base_env: Mapping[str, str], grace: float = 3.0) -> int:
    """Run ``plan``'s workers on this node; 0 on success, else raise ``RankFailedError`` (first failure)."""
    _check_direct(plan)
    listener = _store_socket(plan)
    release = _Release() if listener is not None else None
    port = _store_port(plan, listener)
    scratch_dir = Scratch.create("convoy-launch-")  # (a launcher killed before left one: swept there)
    redirects, shown = _output_choices(plan)
    logs: list[IO[str]] = []
    ranks: list[_Rank] = []
    lock, wake, start = threading.Lock(), _Wake(), time.monotonic()
    stop = _StopSignal(wake, forward=forwarded_signals(plan.workers.signals_to_handle))
    grace, passed_on_grace = _graces(plan, grace)
    pre_exec = _die_with_parent_hook()
    stop.install()  # before the first worker: a stop that comes while they start still stops them all
    try:
        _start_ranks(plan, ranks, logs, base_env=base_env, port=port, scratch=scratch_dir.path, listener=listener,
                     release=release, pre_exec=pre_exec, redirects=redirects, shown=shown, lock=lock, wake=wake)
        _hand_over_release(release)
        _start_pumps(ranks)
        failure = _monitor(ranks, start, stop, grace, wake, passed_on_grace=passed_on_grace)
        return _outcome(plan, failure, stop)
    finally:
        _close_store(listener, release)
        stop.uninstall()
        _reap(ranks)
        for log in logs:
            log.close()
        wake.close()
        scratch_dir.remove()


def _check_direct(plan: LaunchPlan) -> None:
    """Refuse a plan of several nodes or with restarts (the elastic engine's)."""
    if plan.engine != "direct" or plan.world_size is None:
        raise LaunchError("run_direct runs single-node plans without restarts; use convoy.launch.elastic")


def _store_port(plan: LaunchPlan, listener) -> int:
    """The rendezvous store's port: the listener's, else the plan's, else a free one."""
    return listener.getsockname()[1] if listener is not None else plan.master_port or free_port(plan.master_addr)


def _output_choices(plan: LaunchPlan) -> tuple[dict[int, int], set[int]]:
    """(local rank -> ``--redirects`` mode, the local ranks whose output is shown)."""
    redirects = stream_map(plan.workers.redirects, plan.nproc_per_node)
    shown = shown_ranks(plan.workers.local_ranks_filter, plan.nproc_per_node)
    return redirects, set(range(plan.nproc_per_node)) if shown is None else shown


def _graces(plan: LaunchPlan, grace: float) -> tuple[float, float]:
    """Seconds before SIGKILL after a stop or failure, and after a passed-on signal (``--shutdown-timeout``)."""
    passed_on_grace = FORWARDED_GRACE  # a rank told by SIGUSR1 to save gets torch's agent's time for it
    if plan.workers.shutdown_timeout is not None:
        grace = passed_on_grace = float(plan.workers.shutdown_timeout)
    return grace, passed_on_grace


def _start_ranks(plan: LaunchPlan, ranks: list[_Rank], logs: list[IO[str]], *, base_env: Mapping[str, str],
                 port: int, scratch: Path, listener, release: _Release | None, pre_exec,
                 redirects: dict[int, int], shown: set[int], lock: threading.Lock, wake: _Wake) -> None:
    """Start each local rank's process, adding it to ``ranks`` and its log file to ``logs`` as it starts."""
    for local in range(plan.nproc_per_node):
        rank = plan.rank_of(local)
        error_file = str(scratch / f"rank{rank}_error.json")
        env = _worker_env(plan, rank, local, base_env=base_env, port=port, error_file=error_file,
                          loopback=listener is not None)
        command, pass_fds = _worker_command(plan.command, rank, listener, release, env)
        log = _open_log(plan.workers.log_dir, rank)
        if log is not None:
            logs.append(log)
        show = _shows(local, redirects, shown)
        proc = _spawn(plan, rank, command, env, pass_fds, pre_exec, listener, release,
                      merged=show[0] == show[1] and _one_console())
        ranks.append(_Rank(local, rank, proc, show=show, log=log, lock=lock,
                           error_file=error_file, wake=wake))


def _worker_env(plan: LaunchPlan, rank: int, local: int, *, base_env: Mapping[str, str], port: int,
                error_file: str, loopback: bool) -> dict[str, str]:
    """One rank's environment: this one's, the plan's, torchrun's rank variables, and the loopback store's."""
    assert plan.world_size is not None  # a single-node plan (_check_direct)
    env = {**base_env, **plan.env, **rank_env(
        rank=rank, local_rank=local, world_size=plan.world_size, local_world_size=plan.nproc_per_node,
        master_addr=plan.master_addr, master_port=port, run_id=plan.run_id, group_rank=plan.node_rank,
        group_world_size=plan.max_nodes, error_file=error_file, role=plan.workers.role,
        signals_to_handle=plan.workers.signals_to_handle)}
    if loopback:
        env.update(loopback_env(base_env))
    return env


def _spawn(plan: LaunchPlan, rank: int, command, env: dict[str, str], pass_fds, pre_exec, listener,
           release: _Release | None, *, merged: bool = False) -> subprocess.Popen:
    """One rank's process, leading its own session; once rank 0 starts, the store's socket is its alone.
    ``merged``: its stderr goes into its stdout's pipe (``_one_console``)."""
    try:
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT if merged else subprocess.PIPE,
                                stdin=subprocess.DEVNULL, bufsize=0,
                                start_new_session=True, preexec_fn=pre_exec, pass_fds=pass_fds)
    except OSError as err:
        raise LaunchError(f"cannot start {plan.command[0]!r} for rank {rank}: {err.strerror}") from None
    finally:
        if listener is not None and rank == 0:
            listener.close()  # rank 0 has it now (or binds the port itself)
            assert release is not None  # made with the listener
            release.close_read_end()


def _shows(local: int, redirects: dict[int, int], shown: set[int]) -> tuple[bool, bool]:
    """Whether a local rank's stdout and stderr reach the console (``--local-ranks-filter``, ``--redirects``)."""
    mode = redirects.get(local, 0)
    visible = local in shown
    return visible and not mode & 1, visible and not mode & 2


def _hand_over_release(release: _Release | None) -> None:
    """Close this process's copies of the release pipe once every rank has started."""
    if release is not None:
        release.close()  # the ranks hold the pipe now: its end of file is theirs to give


def _start_pumps(ranks: list[_Rank]) -> None:
    """Start each rank's output pumps and exit waiter."""
    for worker in ranks:  # threads start once every rank runs: rank N's start does not wait on them
        worker.start()


def _outcome(plan: LaunchPlan, failure: RankFailure | None, stop: _StopSignal) -> int:
    """0, or the first failure, a Ctrl-C or a stop signal raised."""
    if failure is not None:
        raise failure_error(failure, stopped=plan.nproc_per_node - 1)
    if stop.signum == signal.SIGINT:
        raise KeyboardInterrupt
    if stop.signum is not None:  # a scheduler's SIGTERM, SIGHUP, or a passed-on --signals-to-handle signal
        raise Terminated(stop.signum)
    return 0


def _close_store(listener, release: _Release | None) -> None:
    """Close the store's listening socket and the release pipe, where there are any."""
    if listener is not None:
        listener.close()
        assert release is not None  # made with the listener
        release.close()


def _reap(ranks: list[_Rank]) -> None:
    """Leave no process behind: kill each rank's group if it still runs, wait for it, join its threads."""
    for worker in ranks:
        if worker.proc.poll() is None:
            worker.signal_group(signal.SIGKILL)
        worker.proc.wait()
        worker.signal_group(signal.SIGKILL)  # grandchildren left in the worker's group
        worker.join(timeout=2)


def _store_socket(plan: LaunchPlan):
    """The rendezvous store's listening socket on loopback, for a single-node job on a loopback address."""
    if plan.max_nodes != 1 or not is_loopback(plan.master_addr):
        return None
    host = "127.0.0.1" if plan.master_addr == "localhost" else plan.master_addr
    try:
        return listen_socket(host, plan.master_port or 0)
    except OSError as err:
        raise LaunchError(f"cannot listen on {host}:{plan.master_port} for the rendezvous: {err.strerror}; "
                          "pick another --master-port, or leave it out for a free one") from None


def _worker_command(command: tuple[str, ...], rank: int, listener, release: _Release | None,
                    env: dict[str, str]):
    """A Python program starts through ``convoy.launch.record`` (error file, collective timeout and counts,
    ``convoy.launch.hang_report``); rank 0 also gets the store's loopback socket and the release pipe's read end,
    every other rank its write end (``convoy.launch.loopback``). Other commands run as they are and rank 0
    binds the port itself."""
    for name in STORE_VARIABLES:  # a job started inside a job's rank: its launcher's are not this job's
        env.pop(name, None)
    if tuple(command[:2]) != (sys.executable, "-u"):
        return command, ()
    wrapped = (sys.executable, "-u", "-m", "convoy.launch.record", *command[2:])
    if listener is None or release is None:
        return wrapped, ()
    if rank != 0:
        env[DONE_FD_VARIABLE] = str(release.write_end)
        return wrapped, (release.write_end,)
    env[LISTEN_FD_VARIABLE] = str(listener.fileno())
    env[RELEASE_FD_VARIABLE] = str(release.read_end)
    return wrapped, (listener.fileno(), release.read_end)


class _Release:
    """The pipe that tells rank 0 (which serves the store) that every other rank's program has finished: rank 0
    reads it, the others hold copies of its write end until then (``loopback.close_when_done``) and the OS
    closes a dead rank's copy; its end of file comes when the last copy is closed. This process closes its own
    copies once every rank has started."""

    def __init__(self) -> None:
        self.read_end, self.write_end = os.pipe()

    def close_read_end(self) -> None:
        if self.read_end >= 0:
            os.close(self.read_end)  # rank 0 has its copy
            self.read_end = -1

    def close(self) -> None:
        self.close_read_end()
        if self.write_end >= 0:
            os.close(self.write_end)
            self.write_end = -1


def _monitor(ranks: list[_Rank], start: float, stop: _StopSignal, grace: float,
             wake: _Wake, *, passed_on_grace: float = FORWARDED_GRACE) -> RankFailure | None:
    failure: RankFailure | None = None
    deadline: float | None = None
    saving = False
    while True:
        wake.clear()  # before looking: an exit from now on wakes the wait below at once
        now = time.monotonic()
        alive = [w for w in ranks if w.proc.poll() is None]
        for worker in ranks:
            worker.flush_stale(now)
        if failure is None and stop.signum is None:  # after our own stop signal, exits are not failures
            failed = [w for w in ranks if w.proc.returncode not in (None, 0)]
            if failed:
                first = min(failed, key=lambda w: (w.eof_at is None, w.eof_at or 0.0, w.rank))
                if first.eof_at is None:
                    first.threads[-1].join(timeout=1)  # let its stderr drain so the traceback is complete
                text, shown = first.traceback()
                note = missing_note({w.rank: w.error_file for w in ranks}, failed_rank=first.rank)
                failure = RankFailure(rank=first.rank, local_rank=first.local_rank, host=socket.gethostname(),
                                      returncode=first.proc.returncode, traceback=text, traceback_shown=shown,
                                      elapsed=now - start, note=note)
        if (failure is not None or stop.signum is not None) and deadline is None:
            deadline = now + (passed_on_grace if stop.passed_on else grace)
            saving = stop.passed_on is not None  # the ranks were told to save (SIGUSR1): they get the longer time
            for worker in alive:
                worker.signal_group(stop.passed_on or signal.SIGTERM)
        elif saving and stop.passed_on is None:  # then a stop (Ctrl-C, SIGTERM) while they save: stop them now
            assert deadline is not None  # set when saving began
            saving, deadline = False, min(deadline, now + grace)
            for worker in alive:
                worker.signal_group(signal.SIGTERM)
        if not alive:
            break
        if deadline is not None and now > deadline:
            for worker in alive:
                worker.signal_group(signal.SIGKILL)
        wake.wait(min(_TICK, deadline - now) if deadline is not None and now < deadline else _TICK)
    for worker in ranks:
        worker.join(timeout=2)
        if failure is None or worker.rank != failure.rank:
            worker.release_inline()  # other ranks' tracebacks (often consequences of the first failure)
    return failure


def _open_log(log_dir: str | None, rank: int) -> IO[str] | None:
    if not log_dir:
        return None
    path = Path(log_dir)
    path.mkdir(parents=True, exist_ok=True)
    return open(path / f"rank{rank}.log", "w", buffering=1)


class _Wake:
    """Wakes the monitor when a worker exits or a stop signal comes, instead of a sleep-based poll.

    A pipe rather than a ``threading.Event``: the signal handler may run while the main thread holds the
    event's lock; writing a byte to a non-blocking pipe is safe from anywhere.
    """

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._poll = select.poll()  # not select.select: a host process may hold more than 1024 descriptors
        self._poll.register(self._read, select.POLLIN)

    def set(self) -> None:
        try:
            os.write(self._write, b"!")
        except (BlockingIOError, OSError):  # full (a wake is pending anyway) or already closed
            pass

    def clear(self) -> None:
        try:
            while os.read(self._read, 4096):
                pass
        except BlockingIOError:
            pass

    def wait(self, timeout: float) -> None:
        self._poll.poll(timeout * 1000)

    def close(self) -> None:
        os.close(self._read)
        os.close(self._write)


class _StopSignal:
    """SIGINT/SIGTERM/SIGHUP to the launcher: stop the workers cleanly (SIGTERM) instead of dying and orphaning
    them. Another signal of ``--signals-to-handle`` (SLURM's SIGUSR1 before a preemption) is passed on to the
    workers as itself, as torchrun's agent does, and then stops them the same way."""

    def __init__(self, wake: _Wake | None = None, *, forward: tuple[str, ...] = ()) -> None:
        self.signum: int | None = None
        self._wake = wake
        self._previous: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}
        self._forward = {getattr(signal, name) for name in forward} - {getattr(signal, n) for n in STOP_SIGNALS}

    @property
    def passed_on(self) -> int | None:
        """The signal the workers get as is (None: they get SIGTERM)."""
        return self.signum if self.signum in self._forward else None

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in {*(getattr(signal, name) for name in STOP_SIGNALS), *self._forward}:
            self._previous[signum] = signal.signal(signum, self._handle)

    def _handle(self, signum, frame) -> None:
        self.signum = signum
        if self._wake is not None:
            self._wake.set()

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
