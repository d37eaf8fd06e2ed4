"""No process of a job outlives its launcher, and its devices stay leased until the last one is gone.

    with job_guard(keep_fds=lease.fds) as guard:          # in the launcher (torch-free)
        run_direct(plan, base_env={**base_env, **guard.env})

Every process of the job carries ``CONVOY_JOB_ID=<token>`` in its environment (the workers, and whatever
they start, inherit it). A small guard process, in its own session so that a signal to the launcher's
process group does not reach it, holds the read end of a pipe whose write end only the launcher has, and
a copy of the lease's lock descriptors. When the launcher dies in any way, even by SIGKILL, the pipe reads
end-of-file; the guard then SIGKILLs every process whose environment carries the token (read from
``/proc/<pid>/environ``), until none is left, and only then exits, which releases the lease. On a normal
end the launcher does the same sweep itself and then ends the guard.

This catches what ``PR_SET_PDEATHSIG`` (the direct engine sets it on each worker) does not: a worker's own
children, workers that torch's elastic agent starts, and processes that left the worker's process group.
A process that clears its environment (``env -i``) escapes it. Linux only (``/proc``); elsewhere the guard
is not started and the engines' own clean-up is all there is.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Sequence

__all__ = ["JOB_ID_VARIABLE", "JobGuard", "job_guard", "job_processes", "sweep"]

JOB_ID_VARIABLE = "CONVOY_JOB_ID"
_DONE = b"done"


def job_processes(token: str, *, exclude: Sequence[int] = ()) -> list[int]:
    """Pids of live processes whose environment has ``CONVOY_JOB_ID=<token>`` (zombies have none)."""
    needle = f"{JOB_ID_VARIABLE}={token}".encode()
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
        if needle in environ.split(b"\0"):
            found.append(int(name))
    return found


def sweep(token: str, *, exclude: Sequence[int] = (), timeout: float = 30.0) -> int:
    """SIGKILL every process of the job until none is left (or ``timeout``); returns how many were killed."""
    killed: set[int] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = job_processes(token, exclude=exclude)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.02)
    return len(killed)


class JobGuard:
    """The launcher's side: the token for the workers' environment, and the guard process."""

    def __init__(self, keep_fds: Sequence[int] = ()) -> None:
        import subprocess
        import uuid

        import convoy

        self.token = uuid.uuid4().hex
        read, self._write = os.pipe()  # both non-inheritable: no worker gets the write end
        env = {k: v for k, v in os.environ.items() if k != JOB_ID_VARIABLE}  # a nested launch's guard lives on
        # -S (no site, no .pth files) starts it sooner; convoy's own directory is all it imports from
        env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(convoy.__file__)))
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-S", "-m", "convoy.launch.guard", self.token, str(read)], env=env,
                pass_fds=(read, *keep_fds), start_new_session=True, stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL)
        finally:
            os.close(read)

    @property
    def env(self) -> dict[str, str]:
        """What every process of the job must find in its environment."""
        return {JOB_ID_VARIABLE: self.token}

    def close(self) -> None:
        """The job is over: stop what is left of it here, then let the guard go (it releases its fds)."""
        if self._proc is None:
            return
        sweep(self.token, exclude=(self._proc.pid,))
        try:
            os.write(self._write, _DONE)
        except OSError:
            pass
        os.close(self._write)
        # Nothing is left for it to do: end it now rather than wait for it to finish starting (~0.1 s), so
        # the lease's locks it holds are free when this returns.
        self._proc.kill()
        self._proc.wait()
        self._proc = None


    def __enter__(self) -> "JobGuard":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
    received = b""
    while True:
        chunk = os.read(fd, 64)
        if not chunk:
            break
        received += chunk
    if received != _DONE:
        sweep(token)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
