"""The rendezvous store of a single-node job lives while any rank still needs it, and no longer.

Direct engine: rank 0 serves the store and stops once every other rank's program has finished (each rank
closes its copy of a pipe then, or the OS does when it dies), so rank 0 ends beside the others instead of
after them. Elastic engine on one node: without restarts the agent serves the workers'
store (torch's static rendezvous on a loopback store), so it lives as long as the agent; with restarts each
attempt's rank 0 serves it, until the other ranks let go of a lock each (the agent passes no descriptors).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from convoy.launch.guard import JOB_ID_VARIABLE, job_processes
from convoy.launch.loopback import DONE_FD_VARIABLE, HOLD_DIR_VARIABLE, others_done, released_by_fd
from tests.distributed import cpu_env
from tests.launch.listening import listening
from tests.processes import finish, start

SCRIPTS = Path(__file__).parent / "scripts"


def convoy_launch(*argv: str, env=None) -> subprocess.Popen:
    """``convoy launch`` of CPU processes in its own session."""
    return start([sys.executable, "-m", "convoy", "launch", "--devices", "0", *argv], env=env or cpu_env())


@pytest.mark.slow
def test_rank_0_stops_serving_once_the_other_ranks_programs_finish_and_their_teardown_holds_nothing(tmp_path):
    """Rank 0 kept serving until the launcher had reaped rank 1's process, so the two interpreters' teardowns
    (about 0.4 s each with torch) ran one after the other. Rank 1 lets rank 0 go when its program has finished,
    before the finalizers of its objects run (convoy.launch.worker_exit): the object that waits there for rank 0's
    end sees it."""
    job = convoy_launch("--nproc-per-node", "2", str(SCRIPTS / "slow_teardown.py"), str(tmp_path))
    out = finish(job, timeout=90)
    assert job.returncode == 0, out
    assert (tmp_path / "rank0-exit").exists(), out
    assert (tmp_path / "rank1").read_text() == "rank 0 ended during rank 1's teardown", out


@pytest.mark.slow
def test_a_rank_that_fails_after_rank_0_is_done_is_still_reported(tmp_path):
    """Rank 0 is done and released when rank 1's program raises: the job still fails with rank 1's traceback."""
    job = convoy_launch("--nproc-per-node", "2", str(SCRIPTS / "slow_teardown.py"), str(tmp_path), "--rank1-fails")
    out = finish(job, timeout=90)
    assert job.returncode == 1, out
    assert "convoy: rank 1 (local rank 1)" in out and "failed with exit code 1" in out, out
    assert out.count("ValueError: rank 1 fails after rank 0 is done") == 1, out


@pytest.mark.slow
@pytest.mark.parametrize("engine", [("--engine", "elastic"), ("--max-restarts", "1")], ids=["static", "restarts"])
def test_a_rank_still_reaching_the_store_after_rank_0_is_done_gets_it_under_the_elastic_engine(engine):
    """Rank 0's program is done at once; rank 1 reaches the store a second later (raw torch). Under the elastic
    engine rank 0 served the store and left: 'client socket has timed out'. Now the agent serves it (static
    rendezvous), or with restarts rank 0 waits for rank 1's lock. (The direct engine's test is in
    test_direct.py.)"""
    job = convoy_launch("--nproc-per-node", "2", *engine, str(SCRIPTS / "rank0_leaves_early.py"))
    out = finish(job, timeout=90)
    assert job.returncode == 0 and "rank 1 reached the store" in out, out


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


@pytest.mark.parametrize("hold", ["pipe", "lock"])
def test_a_rank_holds_rank_0_while_its_program_runs_and_lets_go_when_it_ends_whatever_its_children_do(
        hold, tmp_path):
    """The direct engine's pipe, and under torch's agent (restarts on one node) a lock of this attempt's."""
    if hold == "pipe":
        read_end, write_end = os.pipe()
        env, fds, done = {DONE_FD_VARIABLE: str(write_end)}, (write_end,), released_by_fd(read_end)
    else:
        read_end = write_end = -1
        attempt = {HOLD_DIR_VARIABLE: str(tmp_path), "TORCHELASTIC_RESTART_COUNT": "2"}
        env, fds, done = {**attempt, "RANK": "1"}, (), others_done({**attempt, "RANK": "0", "WORLD_SIZE": "2"})
        (tmp_path / "1.1").touch()  # the previous attempt's rank 1, long gone: not this attempt's
        assert not done(0.1)  # this attempt's rank 1 has not started
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER], env={**os.environ, **env}, pass_fds=fds,
                              text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    if write_end >= 0:
        os.close(write_end)
    children = []
    try:
        children = [int(pid) for pid in holder.stdout.readline().split()]
        assert len(children) == 2
        assert not done(0.3)  # the program runs: rank 0 keeps serving
        holder.stdin.write("done\n")
        holder.stdin.flush()
        assert done(30)  # the program ended; its children live on
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
        if read_end >= 0:
            os.close(read_end)
        holder.stdin.close()
        holder.stdout.close()


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/net/tcp")
def test_elastic_engine_on_one_node_without_restarts_serves_the_workers_store_from_the_agent(tmp_path):
    """The agent's store, on loopback, is the workers' store: no worker listens on MASTER_PORT."""
    env = {k: v for k, v in cpu_env().items() if k != "GLOO_SOCKET_IFNAME"}
    launcher = convoy_launch("--engine", "elastic", "--nproc-per-node", "2", str(SCRIPTS / "listen_and_wait.py"),
                             str(tmp_path), env=env)
    try:
        deadline = time.monotonic() + 90
        while not all((tmp_path / f"rank{r}").exists() for r in (0, 1)):
            assert launcher.poll() is None, launcher.stdout.read()
            assert time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.1)
        worker, master_port = map(int, (tmp_path / "rank0").read_text().split())
        with open(f"/proc/{worker}/environ", "rb") as handle:
            environ = dict(item.split(b"=", 1) for item in handle.read().split(b"\0") if b"=" in item)
        assert environ[b"TORCHELASTIC_USE_AGENT_STORE"] == b"True"
        token = environ[JOB_ID_VARIABLE.encode()].decode().split(":")[-1]
        sockets = listening({launcher.pid, *job_processes(token)})
        assert (launcher.pid, "127.0.0.1", master_port) in sockets, sockets
        assert all(address == "127.0.0.1" for _, address, _ in sockets), sockets
    finally:
        (tmp_path / "stop").touch()
        out = finish(launcher, timeout=60)
    assert launcher.returncode == 0, out


_TEARS_DOWN_SLOWLY = textwrap.dedent("""
    import os, sys, time, types
    from convoy.launch.loopback import close_when_done
    close_when_done()
    if sys.argv[2] != "none":  # no NCCL on a CPU box: what torch.distributed answers about the group left alive
        fake = types.ModuleType("torch.distributed")
        fake.is_available = fake.is_initialized = lambda: True
        fake.get_backend = lambda: sys.argv[2]
        sys.modules["torch.distributed"] = fake

    class UntilGo:  # freed by the interpreter's teardown, after every exit handler
        def __del__(self, exists=os.path.exists, sleep=time.sleep, clock=time.monotonic, go=sys.argv[1] + "/go"):
            deadline = clock() + 30
            while not exists(go) and clock() < deadline:
                sleep(0.02)

    holder = types.ModuleType("holds_until_go")
    holder.keep = UntilGo()
    sys.modules[holder.__name__] = holder
""")


@pytest.mark.parametrize("group, held_through_teardown", [("none", False), ("gloo", False), ("nccl", True)])
def test_a_program_that_leaves_an_nccl_group_alive_holds_rank_0_through_its_teardown(
        group, held_through_teardown, tmp_path):
    """NCCL's monitor thread reads the store until its group is destroyed, and warns once the store is gone."""
    read_end, write_end = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", _TEARS_DOWN_SLOWLY, str(tmp_path), group], pass_fds=(write_end,),
                            env={**os.environ, DONE_FD_VARIABLE: str(write_end)})
    os.close(write_end)
    try:
        if held_through_teardown:
            assert not released_by_fd(read_end)(2.0)  # the program is done, its teardown waits: still held
            (tmp_path / "go").touch()
        assert released_by_fd(read_end)(30)
        (tmp_path / "go").touch()
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()
        os.close(read_end)
