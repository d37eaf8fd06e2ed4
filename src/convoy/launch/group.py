"""One command in a process group of its own, stopped as a group: what ``convoy run`` starts.

    ended = run_group(["./wrapper.sh"], env=env, pass_fds=lease.fds, grace=30.0)
    ended.code                        # CMD's exit code, 128+N when signal N ended it

CMD leads a new process group. Its processes are its group and, on Linux, every descendant wherever it moved:
this process is a child subreaper while CMD runs (``PR_SET_CHILD_SUBREAPER``), so an orphan (a double-forked
daemon, torchrun's worker whose agent died) is re-parented here rather than to init, and the tree read from
``/proc`` at each step holds a process that left the group or its session (``setsid``) or closed every
descriptor. Each gets every signal passed on (SIGTERM, SIGHUP, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2). A stop signal
(the first four) is followed by SIGKILL to all of them after ``grace`` seconds, as the launcher does. When CMD
has ended, what is left gets SIGTERM, then SIGKILL after ``grace``, and ``run_group`` returns only once every
one is gone: a lease held around it ends after the command's last process. Elsewhere (no ``/proc``) the group
is all there is. On a terminal CMD's group is made the foreground one (Ctrl-C and Ctrl-Z reach it, it reads the
keyboard), and the terminal is taken back when it ends. Torch-free.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from convoy.launch.guard import descendants, process_table, set_subreaper

TYPE_CHECKING = False  # typing is not imported at run time: `convoy select` starts without it
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from types import FrameType
    from typing import Any

__all__ = ["Ended", "STOP_SIGNALS", "PASSED_SIGNALS", "run_group"]

STOP_SIGNALS = ("SIGTERM", "SIGHUP", "SIGINT", "SIGQUIT")
"""Signals that stop CMD: passed on to its group, then SIGKILL after the grace."""
PASSED_SIGNALS = (*STOP_SIGNALS, "SIGUSR1", "SIGUSR2")
"""Every signal passed on to CMD's group as it came."""
_POLL_S = 0.05


@dataclass(frozen=True)
class Ended:
    """How CMD ended."""

    code: int
    """Its exit code, 128+N when signal N ended it."""
    signum: int | None = None
    """The signal that ended it, or None."""
    foreground: bool = False
    """CMD's group had the terminal (so a Ctrl-C went to it, not to convoy)."""
    left: int = 0
    """Processes of its group still running when it ended (stopped before ``run_group`` returned)."""


def run_group(command: Sequence[str], *, env: Mapping[str, str], pass_fds: Sequence[int] = (), grace: float = 30.0,
              say: Callable[[str], None] | None = None) -> Ended:
    """Run ``command`` as the leader of a new process group and wait until that group is gone.

    Raises ``OSError`` (``FileNotFoundError``, ``PermissionError``, ...) when it cannot be started; nothing
    runs then. ``say``: where a line about processes left behind goes (default: stderr)."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    tty = _foreground_tty()
    job = _Job(grace)
    job.install()
    subreaper = set_subreaper(True)
    try:
        job.proc = subprocess.Popen(list(command), env=dict(env), pass_fds=tuple(pass_fds),
                                    preexec_fn=_own_group(tty))
        try:  # also here, as a shell does: whichever of the two comes first
            os.setpgid(job.proc.pid, job.proc.pid)
        except OSError:  # it has run its program already (in its own group), or ended
            pass
        if tty is not None:
            _give_terminal(tty, job.proc.pid)
        job.started()
        status = _wait_leader(job.proc.pid, tty)
        job.proc.returncode = _code(status)
        if tty is not None:
            _give_terminal(tty, os.getpgrp())
        left = job.stop_rest(say)
        signum = -job.proc.returncode if job.proc.returncode < 0 else None
        code = 128 + signum if signum is not None else job.proc.returncode
        return Ended(code=code, signum=signum, foreground=tty is not None, left=left)
    finally:
        job.uninstall()
        if subreaper:
            set_subreaper(False)


class _Job:
    """The signal handlers and the group's state while CMD runs."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.proc: subprocess.Popen | None = None
        self._pending: list[int] = []
        self._previous: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}
        self._armed = False

    @property
    def pgid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def install(self) -> None:
        # in before CMD starts: a signal between its start and their installation ended convoy and left CMD
        for name in PASSED_SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None:
                self._previous[sig] = signal.signal(sig, self._forward)
        self._previous[signal.SIGALRM] = signal.signal(signal.SIGALRM, self._kill)

    def uninstall(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def started(self) -> None:
        for signum in self._pending:  # what came while it was being started
            self._forward(signum, None)
        self._pending.clear()

    def _forward(self, signum: int, _frame) -> None:
        if self.proc is None:
            self._pending.append(signum)
            return
        _signal_job(self.proc.pid, signum)
        if signal.Signals(signum).name in STOP_SIGNALS:
            self.arm()

    def arm(self) -> None:
        """SIGKILL to the group after the grace (once)."""
        if not self._armed:
            self._armed = True
            signal.setitimer(signal.ITIMER_REAL, max(self.grace, 0.001))

    def _kill(self, _signum: int, _frame) -> None:
        if self.pgid is not None:
            _signal_job(self.pgid, signal.SIGKILL)

    def stop_rest(self, say: Callable[[str], None]) -> int:
        """CMD has ended: stop what is left of its group (SIGTERM, SIGKILL after the grace), wait until it is gone;
        returns how many processes were left."""
        pgid = self.pgid
        assert pgid is not None
        _reap()
        if not _alive(pgid):
            return 0
        left = _job_members(pgid)
        if not self._armed:  # (after a stop signal they have had it, and SIGKILL is on its way)
            pids = ", ".join(map(str, left[:5])) + (", ..." if len(left) > 5 else "")
            which = f"{len(left)} process{'es' if len(left) > 1 else ''} it started (pid {pids})" if left else \
                "processes it started"
            verb = "runs" if len(left) == 1 else "run"
            say(f"convoy: the command has ended, but {which} still {verb}; stopping them (SIGTERM, SIGKILL after "
                f"{self.grace:g}s) before the devices are released")
            _signal_job(pgid, signal.SIGTERM)
            _signal_job(pgid, signal.SIGCONT)  # a stopped one could not act on the SIGTERM
            self.arm()
        while _alive(pgid):
            _reap()
            time.sleep(_POLL_S)
        return len(left) if left else 1


def _wait_leader(pid: int, tty: int | None) -> int:
    """CMD's wait status. On a terminal, a CMD stopped by Ctrl-Z stops convoy too (the shell sees the job stop),
    and is continued with it."""
    while True:
        _, status = os.waitpid(pid, os.WUNTRACED if tty is not None else 0)
        if not os.WIFSTOPPED(status):
            return status
        _give_terminal(tty, os.getpgrp())
        os.kill(os.getpid(), signal.SIGSTOP)  # continued by the shell's fg or bg
        if _foreground(tty):
            _give_terminal(tty, pid)
        _signal_group(pid, signal.SIGCONT)


def _code(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_job(pgid: int, signum: int) -> None:
    """``signum`` to CMD's group and to every descendant that left it (once each: a second SIGTERM to a process
    exiting on its first finds the interpreter's default handler back, and kills it)."""
    _signal_group(pgid, signum)
    group = set(_members(pgid))
    for pid in descendants():
        if pid in group:
            continue
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def _alive(pgid: int) -> bool:
    if not os.path.isdir("/proc/self"):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # a member that changed its user: still there
            return True
        return True
    return bool(_job_members(pgid))  # zombies do not count


def _job_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of CMD: of group ``pgid`` or descended from this process, from ``/proc``;
    [] where there is no ``/proc``."""
    return sorted(set(_members(pgid)) | set(descendants()))


def _members(pgid: int) -> list[int]:
    """Live (not zombie) processes of group ``pgid``, from ``/proc``; [] where there is no ``/proc``."""
    return [pid for pid, (state, _, group) in process_table().items() if state != b"Z" and group == pgid]


def _reap() -> None:
    """Reap this process's dead children: CMD's group, and the orphans re-parented here (a subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _foreground_tty() -> int | None:
    """The descriptor of this process's terminal when its process group is the terminal's foreground one."""
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
                return fd
        except OSError:
            continue
    return None


def _foreground(fd: int | None) -> bool:
    try:
        return fd is not None and os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False


def _give_terminal(fd: int | None, pgid: int) -> None:
    """Make ``pgid`` the terminal's foreground group (SIGTTOU held off: a background group may do it then)."""
    if fd is None:
        return
    previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(fd, pgid)
    except OSError:  # the group is gone already, or the terminal is
        pass
    finally:
        signal.signal(signal.SIGTTOU, previous)


def _own_group(fd: int | None) -> Callable[[], None]:
    """CMD's pre-exec step: a process group of its own, which on a terminal takes the foreground before the
    program runs (a program that reads the keyboard at once would otherwise be stopped by SIGTTIN)."""
    def hook() -> None:
        os.setpgid(0, 0)
        if fd is None:
            return
        previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        try:
            os.tcsetpgrp(fd, os.getpgrp())
        except OSError:
            pass
        signal.signal(signal.SIGTTOU, previous)

    return hook
