"""Hang detection on 2 real CPU processes: one rank skips a collective and the job ends with its name."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from convoy.errors import ConfigError
from convoy.train.hang import DEFAULT_COLLECTIVE_TIMEOUT, CollectiveWatch, collective_timeout
from tests.distributed import run_script

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.mark.slow
def test_skipped_collective_ends_the_job_naming_the_missing_rank(tmp_path):
    started = time.monotonic()
    log = tmp_path / "log.txt"
    result = run_script(SCRIPTS / "hang_worker.py", nproc=2, args=["3", str(log)], timeout=100)
    elapsed = time.monotonic() - started
    out = result.output
    assert result.returncode != 0, out
    # the guarded collectives in step passed, and rank-aware logging printed once / in rank order (in the
    # file both ranks append to: their two stdout pipes may reach the launcher in either order)
    assert out.count("LOG main only 3") == 1, out
    assert "LOG [rank0]: in order" in out and "LOG [rank1]: in order" in out, out
    assert re.search(r"LOG \[rank0\]: in order.*LOG \[rank1\]: in order", log.read_text(), re.S), log.read_text()
    # ranks at different collectives: each is told who is where
    assert "MISMATCH rank 0: ranks are out of step at guarded collective #3: rank 0 is at 'broadcast'; " \
           "rank 1 is at 'all_gather'" in out, out
    assert "MISMATCH rank 1:" in out
    # the skipped collective: rank 0 gives up after the 3 s timeout and names rank 1
    match = re.search(r"HANG rank 0 after ([\d.]+)s: collective 'all_reduce grads' \(#4\) did not complete "
                      r"within 3 s: rank 1 of 2 did not arrive", out)
    assert match, out
    assert 2.5 <= float(match.group(1)) < 10, out
    # the one line says it: no torch C++ "[c10d] waitForInput ... timed out" warnings before it, no rank said twice
    assert "socket.cpp" not in out and "waitForInput" not in out and "[rank0]: [rank0]" not in out, out
    assert elapsed < 60, f"the job should end soon after the timeout, not after rank 1's 120 s sleep ({elapsed:.0f}s)"


def test_collective_timeout_from_the_environment():
    assert collective_timeout({}) == DEFAULT_COLLECTIVE_TIMEOUT == 300.0
    assert collective_timeout({"CONVOY_COLLECTIVE_TIMEOUT": "12"}) == 12.0
    with pytest.raises(ConfigError, match="CONVOY_COLLECTIVE_TIMEOUT: 'x' is not valid"):
        collective_timeout({"CONVOY_COLLECTIVE_TIMEOUT": "x"})


def test_watch_needs_a_process_group():
    with pytest.raises(ConfigError, match="needs an initialised process group"):
        CollectiveWatch(timeout=1)


def test_watch_call_counts_calls_in_the_store_and_leaves_no_keys_behind():
    import torch.distributed as dist

    from convoy.train.hang import watch_call

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        watch_call("gather", timeout=5)
        keys_after_one = store.num_keys()
        for name in ["reduce", "broadcast"] * 10:
            watch_call(name, timeout=5)
        assert store.num_keys() == keys_after_one  # the previous call's key goes as the next one arrives
        watch = CollectiveWatch(timeout=5, prefix="convoy/watched")
        counter = int(watch._store.add("calls/0", 0))
        assert counter == 21  # one sequence over every call, though no watch was kept between them
    finally:
        dist.destroy_process_group()
