"""Measured against reality: a 2-process CPU run's per-rank parameter, gradient and optimizer bytes under
FSDP2 (ZeRO-3), DDP + ZeroRedundancyOptimizer (ZeRO-1) and convoy's zero2 equal the planner's estimate for the
same model."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from convoy.plan.dims import ParallelDims
from convoy.plan.memory import Layout, memory_per_gpu
from convoy.plan.model import from_factory
from convoy.plan.run import RunSpec
from tests.distributed import run_script

SCRIPT = Path(__file__).parent / "scripts" / "state_bytes.py"


@pytest.mark.slow
def test_zero3_zero1_and_convoys_zero2_state_bytes_per_rank_equal_the_estimate():
    pytest.importorskip("torch")
    result = run_script(SCRIPT, nproc=2, timeout=120)
    assert result.returncode == 0, result.output
    # the launcher may prefix each line with "[rankN]: "
    ranks = [json.loads(m.group(1)) for m in re.finditer(r"STATE_BYTES (\{.*\})", result.output)]
    assert sorted(r["rank"] for r in ranks) == [0, 1], result.output

    model = from_factory(f"{SCRIPT}:build")
    assert model.num_layers == 4 and model.heads == 4
    run = RunSpec(precision="fp32", optimizer="adamw")
    layouts = {"zero3": Layout(dims=ParallelDims(dp_shard=2), zero_stage=3),
               "zero1": Layout(dims=ParallelDims(dp_replicate=2), zero_stage=1)}
    for name, layout in layouts.items():
        est = memory_per_gpu(model, run, layout)
        for r in ranks:
            got = r[name]
            assert (got["params"], got["grads"], got["optimizer"]) == (est.params, est.grads, est.optimizer), (
                name, r["rank"], got, est)
    assert all(r["zero1"]["params_at_peak"] == r["zero1"]["params"] for r in ranks)  # one copy, whole

    # convoy's zero2 (FSDP2, gathered weights kept from forward to backward): at rest the fp32 shards; between
    # the forward and the backward the shards and the whole weights, which is what the planner counts
    zero2 = memory_per_gpu(model, run, Layout(dims=ParallelDims(dp_shard=2), zero_stage=2))
    shard = model.num_params * 4 // 2
    assert zero2.params == model.num_params * 4 + shard and zero2.master == 0
    for r in ranks:
        got = r["zero2"]
        assert (got["params"], got["params_at_peak"]) == (shard, zero2.params), (r["rank"], got, zero2)
        assert (got["grads"], got["optimizer"]) == (zero2.grads, zero2.optimizer), (r["rank"], got, zero2)
