"""The elastic engine (torch's agent) for restarts and several nodes, for real on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from convoy.launch.ports import free_port

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).parent / "scripts"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
ENV.pop("CONVOY_INVENTORY", None)


def launch(*argv: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "convoy", "launch", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=ENV)


def test_max_restarts_recovers_from_one_failure():
    ok = launch("--max-restarts", "1", str(SCRIPTS / "fail.py"), "--until-restart", "1")
    out = ok.communicate(timeout=120)[0]
    assert ok.returncode == 0, out
    assert "[rank0]: recovered rank=0 restart=1" in out and "[rank1]: recovered rank=1 restart=1" in out
    assert "[rank1]: ValueError: boom from rank 1" in out  # the first attempt's failure was shown


def test_elastic_engine_reports_the_real_failing_rank():
    bad = launch("--engine", "elastic", str(SCRIPTS / "fail.py"), "--bad", "1")
    out = bad.communicate(timeout=120)[0]
    assert bad.returncode == 1, out
    assert "convoy: rank 1 (local rank 1) on host" in out and "failed with exit code 1" in out
    assert out.count("ValueError: boom from rank 1") == 1, out
    assert 'File "' in out and "runpy" not in out  # the user's frames, not the record wrapper's


def test_two_nodes_on_loopback_train():
    port = str(free_port())
    nodes = [launch("--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", port,
                    "--nproc-per-node", "1", str(SCRIPTS / "ddp_train.py"), "--steps", "2") for rank in (1, 0)]
    outs = [node.communicate(timeout=120)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outs
    assert "[rank1]: trained rank=1 world=2 local=0" in outs[0]  # --node-rank is respected
    assert "[rank0]: trained rank=0 world=2 local=0" in outs[1]
