"""A single-node job listens on 127.0.0.1 only: the rendezvous store (both engines, convoy.launch(fn)) and gloo.

CPU processes on every machine (``--devices 0``): on a one-GPU box two ranks would be refused by the plan."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import convoy
from convoy.launch.guard import JOB_ID_VARIABLE, job_processes
from convoy.launch.loopback import is_loopback
from tests.launch.listening import listening

SCRIPT = str(Path(__file__).parent / "scripts" / "listen_and_wait.py")
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/net/tcp")


def _job_token(pid: int) -> str:
    with open(f"/proc/{pid}/environ", "rb") as handle:
        for item in handle.read().split(b"\0"):
            if item.startswith(JOB_ID_VARIABLE.encode() + b"="):
                return item.split(b"=", 1)[1].decode()
    raise AssertionError(f"pid {pid} has no {JOB_ID_VARIABLE}")


@pytest.mark.slow
@pytest.mark.parametrize("engine", [[], ["--max-restarts", "1"]], ids=["direct", "elastic"])
def test_every_listening_socket_of_a_single_node_job_is_on_loopback(engine, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "GLOO_SOCKET_IFNAME"}
    launcher = subprocess.Popen([sys.executable, "-m", "convoy", "launch", "--devices", "0", "--nproc-per-node", "2",
                                 *engine, SCRIPT, str(tmp_path)], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while not all((tmp_path / f"rank{r}").exists() for r in (0, 1)):
            assert launcher.poll() is None, launcher.stderr.read().decode()
            assert time.monotonic() < deadline, "the ranks did not start"
            time.sleep(0.1)
        worker, master_port = map(int, (tmp_path / "rank0").read_text().split())
        pids = {launcher.pid, *job_processes(_job_token(worker))}
        sockets = listening(pids)
        assert (worker, "127.0.0.1", master_port) in sockets  # rank 0's store, on MASTER_PORT
        assert all(address == "127.0.0.1" for _, address, _ in sockets), sockets
    finally:
        (tmp_path / "stop").touch()
        try:
            launcher.wait(timeout=60)
        finally:
            launcher.kill()
    assert launcher.returncode == 0, launcher.stderr.read().decode()


def _rank0_listeners():
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()
    found = listening([os.getpid()])
    dist.barrier()
    dist.destroy_process_group()
    return found, int(os.environ["MASTER_PORT"])


@pytest.mark.slow
def test_convoy_launch_fn_listens_on_loopback_only():
    sockets, port = convoy.launch(_rank0_listeners, devices=0, nproc_per_node=2, start_method="spawn")
    assert any(p == port for _, _, p in sockets) and all(a == "127.0.0.1" for _, a, _ in sockets), sockets


def test_is_loopback():
    assert is_loopback("127.0.0.1") and is_loopback("127.1.2.3") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1") and not is_loopback("node1")
    assert not is_loopback("") and not is_loopback(None)


def test_rank_0_stops_serving_when_released_when_its_launcher_is_gone_or_at_the_bound():
    import time as clock

    from convoy.launch.loopback import keep_serving, released_by_fd

    read_end, write_end = os.pipe()
    waits = []
    began = clock.monotonic()
    keep_serving(lambda wait: waits.append(wait) or len(waits) == 3, limit=30)  # released on the third look
    assert len(waits) == 3 and clock.monotonic() - began < 5
    began = clock.monotonic()
    keep_serving(released_by_fd(read_end), limit=0.3)  # never released: the bound ends it
    assert 0.25 < clock.monotonic() - began < 2
    os.close(write_end)
    assert released_by_fd(read_end)(5.0)  # the launcher closed its end: released at once
    os.close(read_end)
