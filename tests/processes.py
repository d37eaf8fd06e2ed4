"""Processes started by tests: each in its own session, stopped with everything it started, never left behind.

    from tests.processes import start, finish
    proc = start([sys.executable, "-m", "convoy", "launch", "--devices", "0", "train.py"], env=env)
    out = finish(proc, timeout=120)          # TimeoutExpired after stopping the whole tree, output attached

A launcher that hangs (two loopback "nodes" waiting for each other, a rank stuck in a collective) must not
outlive its test: it would keep a device lease, a port and the CPU. ``finish`` stops the launcher and every
process below it (torch's elastic agent starts its workers in sessions of their own, so killing one process
group is not enough: the tree is read from ``/proc`` first). ``tests/conftest.py`` stops whatever a test left
running and fails that test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

__all__ = ["start", "finish", "run", "side_by_side", "descendants", "stop_tree", "live_children"]

_started: list[subprocess.Popen] = []


def start(argv: Sequence[str], **kwargs) -> subprocess.Popen:
    """``subprocess.Popen(argv, ...)`` in a new session (stdout and stderr merged, text) that tests track."""
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.STDOUT)
    kwargs.setdefault("text", True)
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    proc = subprocess.Popen(list(argv), start_new_session=True, **kwargs)
    _started.append(proc)
    return proc


def finish(proc: subprocess.Popen, timeout: float) -> str:
    """Wait for ``proc`` and return its output; on timeout stop its whole tree and raise ``TimeoutExpired``."""
    try:
        return proc.communicate(timeout=timeout)[0] or ""
    except subprocess.TimeoutExpired:
        stop_tree(proc.pid)
        out = proc.communicate()[0] or ""
        raise subprocess.TimeoutExpired(proc.args, timeout, output=out) from None


def side_by_side(*calls: Callable[[], Any]) -> list[Any]:
    """Make independent blocking calls (each starts processes and waits for them) at the same time; their
    results in order, the first error raised. A one-process job leaves a core of a small box idle, and a
    starting job waits on imports: two side by side finish sooner than one after the other."""
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [future.result() for future in futures]


def run(argv: Sequence[str], *, timeout: float, capture_output: bool = False, check: bool = False,
        **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run`` in a session of its own whose whole tree is stopped on timeout (``TimeoutExpired``).

    ``subprocess.run`` kills only the direct child on timeout: workers that torch's agent started in sessions
    of their own would outlive it, holding a port and the CPU.
    """
    if capture_output:
        kwargs["stdout"] = kwargs["stderr"] = subprocess.PIPE
    kwargs.setdefault("stdout", None)
    kwargs.setdefault("stderr", None)
    proc = start(argv, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_tree(proc.pid)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(proc.args, timeout, output=out, stderr=err) from None
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check:
        done.check_returncode()
    return done


def stop_started() -> list[int]:
    """Stop every process ``start`` started that still runs (with its tree); their pids."""
    alive = [proc for proc in _started if proc.poll() is None]
    for proc in alive:
        stop_tree(proc.pid)
        try:
            proc.communicate(timeout=5)
        except (subprocess.TimeoutExpired, ValueError, OSError):
            pass
    _started.clear()
    return [proc.pid for proc in alive]


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of ``pid`` from ``/proc``, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return fields[0], int(fields[1])


def _all_parents() -> dict[int, int]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[0] != "Z":  # zombies are dead; their parent reaps them
                parents[int(entry)] = stat[1]
    return parents


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children first), read from ``/proc``."""
    parents = _all_parents()
    out: list[int] = []
    frontier = [pid]
    while frontier:
        nxt = [child for child, parent in parents.items() if parent in frontier and child not in out]
        out += nxt
        frontier = nxt
    return out


def _alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_tree(pid: int, grace: float = 3.0) -> None:
    """SIGTERM ``pid`` (a launcher stops its workers on it), then SIGKILL it and every process that was below it."""
    tree = [pid, *descendants(pid)]
    _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(_alive(p) for p in tree):
        time.sleep(0.05)
    for p in tree + descendants(pid):
        _signal(p, signal.SIGKILL)
    try:  # a child that outlived its parent has left the tree but not the session's process group
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _is_helper(pid: int) -> bool:
    """Long-lived helpers that Python and torch start on purpose (multiprocessing's resource tracker and
    forkserver, inductor's compile workers): not a test's leak."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return True
    return any(name in cmdline for name in ("resource_tracker", "forkserver", "compile_worker"))


def live_children(grace: float = 5.0) -> list[int]:
    """Processes below this one (the test runner) that still run after ``grace`` seconds, helpers excepted."""
    deadline = time.monotonic() + grace
    while True:
        left = [p for p in descendants(os.getpid()) if not _is_helper(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.05)
