"""No process of a job outlives its launcher, and its devices stay leased until the last one is gone.

    with job_guard(keep_fds=lease.fds) as guard:          # in the launcher (torch-free)
        run_direct(plan, base_env={**base_env, **guard.env})

Every process of the job carries ``CONVOY_JOB_ID=<token>`` in its environment (the workers, and whatever they start,
inherit it; a job started inside a job carries both ids, ``outer:inner``). A small guard process, in its own session
so that a signal to the launcher's process group does not reach it, holds the read end of a pipe whose write end
only the launcher has, and a copy of the lease's lock descriptors. When the launcher dies in any way, even by
SIGKILL, the pipe reads end-of-file; the guard then SIGKILLs every process whose environment carries the token (read
from ``/proc/<pid>/environ``), until none is left, and only then exits, which releases the lease. On a normal end
the launcher does the same sweep itself and then ends the guard. The guard is a fork of the launcher (a fresh
``python -S`` when the launcher runs threads, as a notebook may).

This catches what ``PR_SET_PDEATHSIG`` (the direct engine sets it on each worker) does not: a worker's own
children, workers that torch's elastic agent starts, and processes that left the worker's process group. While
the job runs the launcher is also a child subreaper (``PR_SET_CHILD_SUBREAPER``): an orphan of the job comes back
to it rather than to init, so the launcher's own sweep also stops every descendant, one that cleared its
environment (``env -i``) included; only after the launcher's own death does such a one escape. Linux only
(``/proc``); elsewhere the guard is not started and the engines' own clean-up is all there is.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Sequence

__all__ = ["JOB_ID_VARIABLE", "JobGuard", "descendants", "job_guard", "job_processes", "process_table", "set_subreaper",
           "sweep"]

JOB_ID_VARIABLE = "CONVOY_JOB_ID"


def job_processes(token: str, *, exclude: Sequence[int] = ()) -> list[int]:
    """Pids of live processes whose environment has ``CONVOY_JOB_ID=<token>`` (zombies have none)."""
    prefix, wanted = f"{JOB_ID_VARIABLE}=".encode(), token.encode()
    found = []
    skip = {os.getpid(), *exclude}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in skip:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as handle:
                environ = handle.read()
        except OSError:  # gone, or another user's
            continue
        for item in environ.split(b"\0"):
            if item.startswith(prefix) and wanted in item[len(prefix):].split(b":"):
                found.append(int(name))
                break
    return found


def process_table() -> dict[int, tuple[bytes, int, int]]:
    """Every process as ``/proc`` shows it: pid -> (state, parent pid, process group); {} without ``/proc``."""
    if not os.path.isdir("/proc/self"):
        return {}
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # after "pid (comm) ": state ppid pgrp ...
        if len(fields) > 2:
            table[int(name)] = (fields[0], int(fields[1]), int(fields[2]))
    return table


def descendants(root: int | None = None) -> list[int]:
    """Pids of live (not zombie) processes descended from ``root`` (default: this process), from ``/proc``; []
    where there is none. With this process a child subreaper, that is every process it started, wherever each
    moved (another group or session) and whatever it closed."""
    root = os.getpid() if root is None else root
    table = process_table()

    def descends(pid: int) -> bool:
        seen: set[int] = set()
        while pid in table and pid not in seen:
            seen.add(pid)
            pid = table[pid][1]
            if pid == root:
                return True
        return False

    return sorted(pid for pid, (state, _, _) in table.items() if state != b"Z" and descends(pid))


def set_subreaper(on: bool) -> bool:
    """Linux: orphans of this process's descendants are re-parented here rather than to init; True if set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


_PR_SET_CHILD_SUBREAPER = 36


def sweep(token: str, *, exclude: Sequence[int] = (), timeout: float = 30.0, descended: bool = False) -> int:
    """SIGKILL every process of the job until none is left (or ``timeout``); returns how many were killed.
    ``descended``: this process's descendants are the job's too (the launcher, a subreaper while it runs)."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = set(job_processes(token, exclude=exclude))
        if descended:
            pids.update(pid for pid in descendants() if pid not in exclude)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.02)
    for pid in killed if descended else ():  # orphans re-parented here: their zombies are this process's to reap
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
    return len(killed)


# Write ends of live guards' pipes. os.pipe() fds are non-inheritable only across exec: a rank that is
# forked (convoy.launch(fn) on Linux), and anything it forks, would keep the write end open, and the guard
# would never see the launcher die. Every fork of this process closes them in the child.
_WRITE_ENDS: set[int] = set()


def _close_write_ends_in_child() -> None:
    for fd in _WRITE_ENDS:
        try:
            os.close(fd)
        except OSError:
            pass
    _WRITE_ENDS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_write_ends_in_child)


class JobGuard:
    """The launcher's side: the token for the workers' environment, and the guard process."""

    def __init__(self, keep_fds: Sequence[int] = ()) -> None:
        import threading
        import uuid

        self.token = uuid.uuid4().hex
        self._proc = None
        self._subreaper = False
        self._before = descendants()  # a program's own processes from before the job are not the job's
        self._pid: int | None  # None once closed
        read, self._write = os.pipe()  # both non-inheritable: no exec'd worker gets the write end
        try:
            if threading.active_count() == 1 and threading.current_thread() is threading.main_thread():
                self._pid = _fork_guard(self.token, read, self._write, keep_fds)  # ~2 ms, no interpreter start
            else:  # forking a threaded process is unsafe: start a fresh interpreter
                self._proc = _spawn_guard(self.token, read, keep_fds)
                self._pid = self._proc.pid
        finally:
            os.close(read)
        _WRITE_ENDS.add(self._write)  # after the guard's own fork: forks from here on close it (above)
        self._subreaper = set_subreaper(True)  # the job's orphans come back here (a notebook's too, until close)

    @property
    def env(self) -> dict[str, str]:
        """What every process of the job must find in its environment (a job inside a job: both ids)."""
        outer = os.environ.get(JOB_ID_VARIABLE)
        return {JOB_ID_VARIABLE: f"{outer}:{self.token}" if outer else self.token}

    def close(self) -> None:
        """The job is over: stop what is left of it here, then end the guard (which releases its fds)."""
        if self._pid is None:
            return
        sweep(self.token, exclude=(self._pid, *self._before), descended=self._subreaper)
        if self._subreaper:
            set_subreaper(False)
        _WRITE_ENDS.discard(self._write)
        os.close(self._write)
        # Nothing is left for it to do: end it now rather than wait for it (a spawned one may still be
        # starting), so that the lease's locks it holds are free when this returns.
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
        else:
            try:
                os.kill(self._pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(self._pid, 0)
        self._pid = self._proc = None


    def __enter__(self) -> JobGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _fork_guard(token: str, read: int, write: int, keep_fds: Sequence[int]) -> int:
    """The guard as a forked copy of this (single-threaded) process: own session, only its fds kept."""
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: never returns, never runs this process's exit handlers
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        keep = {0, 1, 2, read, *keep_fds}
        for name in os.listdir("/proc/self/fd"):  # e.g. a test's pipe on our stdout must not stay open
            if int(name) not in keep:
                try:
                    os.close(int(name))
                except OSError:
                    pass
        main([token, str(read)])
    finally:
        os._exit(0)


def _spawn_guard(token: str, read: int, keep_fds: Sequence[int]):
    import subprocess

    import convoy

    env = {k: v for k, v in os.environ.items() if k != JOB_ID_VARIABLE}  # a nested launch's guard lives on
    # -S (no site, no .pth files) starts it sooner; convoy's own directory is all it imports from
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(convoy.__file__)))
    return subprocess.Popen([sys.executable, "-S", "-m", "convoy.launch.guard", token, str(read)], env=env,
                            pass_fds=(read, *keep_fds), start_new_session=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL)


def job_guard(keep_fds: Sequence[int] = ()):
    """A ``JobGuard`` as a context manager (closed when the block ends); a context of None without ``/proc``."""
    if not os.path.isdir("/proc/self"):
        from contextlib import nullcontext

        return nullcontext()
    return JobGuard(keep_fds)


def main(argv: list[str]) -> int:
    """The guard process: wait for the launcher's end; unless it said done, stop every process of the job."""
    token, fd = argv[0], int(argv[1])
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)  # only the launcher's end ends the guard
    while os.read(fd, 64):  # nothing is written: end-of-file is the launcher's end
        pass
    sweep(token)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
