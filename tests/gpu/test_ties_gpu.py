"""Tied weights on two GPUs (NCCL): a GPT whose head is its embedding trains at pp=2 and tp=2 as one GPU does
(the CPU parity tests are tests/train/parallel/test_ties_parity.py)."""

from __future__ import annotations

import pytest

from tests.gpu.gpu_run import SCRIPTS, checks, run_json, run_ok

pytestmark = pytest.mark.gpu


def test_a_tied_gpt_at_pp2_and_tp2_on_two_gpus_matches_one_gpu():
    _, inventory, _ = run_json(["convoy", "devices", "--json"])
    if len((inventory or {}).get("devices", [])) < 2:
        pytest.skip("needs two GPUs (pp=2 and tp=2 over NCCL)")
    out = run_ok(["convoy", "launch", "--devices", "2", str(SCRIPTS / "tied_cuda.py")], timeout=600)
    found = checks(out)
    assert sum(line.startswith("pp=2 PP on cuda:") for line in found) == 2, out[-4000:]
    assert sum(line.startswith("tp=2 TP on cuda:") for line in found) == 2, out[-4000:]
