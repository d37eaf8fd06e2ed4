"""The rendezvous store of a single-node job lives while any rank still needs it, and no longer.

Direct engine: rank 0 serves the store and stops once every other rank's program has finished (each rank
closes its copy of a pipe then, or the OS does when it dies), so its interpreter's teardown runs beside the
others' instead of after them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from convoy.launch.loopback import DONE_FD_VARIABLE, released_by_fd
from tests.distributed import cpu_env
from tests.processes import finish, start

SCRIPTS = Path(__file__).parent / "scripts"


def convoy_launch(*argv: str, env=None) -> subprocess.Popen:
    """``convoy launch`` of CPU processes in its own session."""
    return start([sys.executable, "-m", "convoy", "launch", "--devices", "0", *argv], env=env or cpu_env())


@pytest.mark.slow
def test_rank_0_stops_serving_once_the_other_ranks_programs_finish_not_once_their_processes_end(tmp_path):
    """Rank 0 kept serving until the launcher had reaped rank 1's process, so the two interpreters' teardowns
    (about 0.4 s each with torch) ran one after the other; rank 1 here tears down until rank 0 has ended."""
    job = convoy_launch("--nproc-per-node", "2", str(SCRIPTS / "slow_teardown.py"), str(tmp_path))
    out = finish(job, timeout=90)
    assert job.returncode == 0, out
    assert (tmp_path / "rank1").read_text() == "rank 0 ended during rank 1's teardown", out


@pytest.mark.slow
def test_a_rank_that_fails_after_rank_0_is_done_is_still_reported(tmp_path):
    """Rank 0 is done and released when rank 1's program raises: the job still fails with rank 1's traceback."""
    job = convoy_launch("--nproc-per-node", "2", str(SCRIPTS / "slow_teardown.py"), str(tmp_path), "--rank1-fails")
    out = finish(job, timeout=90)
    assert job.returncode == 1, out
    assert "convoy: rank 1 (local rank 1)" in out and "failed with exit code 1" in out, out
    assert out.count("ValueError: rank 1 fails after rank 0 is done") == 1, out


_HOLDER = textwrap.dedent("""
    import os, subprocess, sys, time
    from convoy.launch.loopback import close_when_done
    close_when_done()
    child = os.fork()
    if child == 0:  # a fork (a data loader's worker) outliving the program must not hold the pipe
        time.sleep(60)
        os._exit(0)
    other = subprocess.Popen(["sleep", "60"], close_fds=False)  # nor a program it starts
    print(child, other.pid, flush=True)
    sys.stdin.readline()  # the program runs until told
""")


def test_the_pipe_is_held_while_the_program_runs_and_released_when_it_ends_not_by_its_children():
    read_end, write_end = os.pipe()
    env = {**os.environ, DONE_FD_VARIABLE: str(write_end)}
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER], env=env, pass_fds=(write_end,), text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    os.close(write_end)
    children = []
    try:
        children = [int(pid) for pid in holder.stdout.readline().split()]
        assert len(children) == 2
        assert not released_by_fd(read_end)(0.3)  # the program runs: rank 0 keeps serving
        holder.stdin.write("done\n")
        holder.stdin.flush()
        assert released_by_fd(read_end)(30)  # the program ended; its children live on
        assert all(os.path.exists(f"/proc/{pid}") for pid in children)
        assert holder.wait(timeout=30) == 0
    finally:
        for pid in children:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        holder.kill()
        holder.wait()
        os.close(read_end)
        holder.stdin.close()
        holder.stdout.close()
