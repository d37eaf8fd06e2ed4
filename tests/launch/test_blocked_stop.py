"""A stop signal while the launcher's main thread is inside a call that runs no Python handler (torch meeting the
other nodes in TCPStore's constructor): the launch still ends, with convoy's line and code, unless the main thread
acts on it itself or workers have started (``convoy.launch.blocked_stop``). The real case, a node waiting for the
others under ``convoy launch``, is in test_elastic.py."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.distributed import cpu_env
from tests.processes import finish, start, stop_tree

SCRIPT = str(Path(__file__).parent / "scripts" / "blocked.py")


def stopped(how: str, signum: int) -> tuple[int, str, float]:
    """Run blocked.py ``how``, send ``signum`` once it waits: (exit status, output, seconds it took to end)."""
    proc = start([sys.executable, "-u", SCRIPT, how])
    try:
        assert proc.stdout.readline() == "waiting\n"
        time.sleep(0.2)
        began = time.monotonic()
        proc.send_signal(signum)
        try:
            out = finish(proc, timeout=120)  # the blocked call never returns: an end at all is the helper's
        except Exception:
            out = "(still running 120 s after the signal)"
        return proc.returncode, out, time.monotonic() - began
    finally:
        stop_tree(proc.pid)


@pytest.mark.parametrize("signum, code, line", [(signal.SIGTERM, 143, "convoy: terminated (SIGTERM)"),
                                                (signal.SIGINT, 130, "convoy: interrupted"),
                                                (signal.SIGHUP, 129, "convoy: terminated (SIGHUP)")])
def test_a_stop_the_blocked_main_thread_cannot_act_on_ends_the_process_with_its_line_and_code(signum, code, line):
    status, out, took = stopped("c-call", signum)
    assert (status, out.strip()) == (code, line), out
    assert took >= 1.5, took  # the main thread had its 2 s to act first (an upper bound is the load's, not ours)


def test_a_main_thread_that_acts_on_the_stop_itself_is_left_to_clean_up():
    """(Python ends a program that leaves a KeyboardInterrupt uncaught by SIGINT: status -2.)"""
    status, out, _ = stopped("python-loop", signal.SIGINT)
    assert status == -signal.SIGINT and "cleaned up after KeyboardInterrupt" in out and "convoy:" not in out, out


def test_once_the_gate_is_shut_a_stop_is_the_main_threads_own_again():
    """As when torch's agent has started workers: its own handlers stop them; nothing here ends the process."""
    status, out, _ = stopped("after-shut", signal.SIGINT)
    assert status == -signal.SIGINT and "cleaned up after KeyboardInterrupt" in out and "convoy:" not in out, out


def test_a_main_thread_blocked_writing_its_output_does_not_keep_the_process_from_ending():
    """Blocked in a write to a full pipe, the main thread holds stdout: flushing it from the helper waited forever."""
    buffered = {name: value for name, value in cpu_env().items() if name != "PYTHONUNBUFFERED"}  # as a launcher's
    proc = start([sys.executable, SCRIPT, "full-stdout"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=buffered)
    try:
        assert proc.stderr.readline() == "waiting\n"
        time.sleep(0.5)  # stdout's pipe (never read) is full by now
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
        assert proc.returncode == 143 and proc.stderr.read() == "convoy: terminated (SIGTERM)\n"
    finally:
        stop_tree(proc.pid)
