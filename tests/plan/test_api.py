"""convoy.plan end to end: rows, the recommendation, its reasons, speed, and the Accelerator's entry point."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import convoy
from convoy.errors import PlanError
from convoy.plan.api import format_plan, plan, recommend_for_module
from convoy.plan.units import GiB

CONFIGS = Path(__file__).parent / "configs"


def test_convoy_plan_is_the_public_function_even_after_submodule_imports():
    import convoy.plan.hardware  # noqa: F401  binds the package to convoy.plan

    p = convoy.plan(params=1e9, hardware="2xA100-80GB")
    assert p.recommendation.row is not None and "plan" in convoy.__all__


def test_70b_config_plans_in_well_under_a_second():
    start = time.perf_counter()
    p = plan(CONFIGS / "llama2_70b.json", hardware="8xH100-80GB", nodes=4, inter_gbps=3200, seq_len=4096,
             recompute="full")
    elapsed = time.perf_counter() - start
    assert elapsed < 0.5, elapsed
    assert len(p.rows) > 20 and p.recommendation.row is not None
    assert p.recommendation.case == "multi-node fast"


def test_small_model_on_one_box_is_case_1_and_data_parallel():
    p = plan(CONFIGS / "gpt2.json", hardware="8xA100-80GB", seq_len=1024, micro_batch=8)
    rec = p.recommendation
    assert rec.case == "case 1" and rec.strategy == "ddp" and rec.dims.dp == 8
    assert "case 1" in rec.reasons[0] and any("sequence length 2048" in b for b in rec.breaks)
    assert any("Without NVLink" in b for b in rec.breaks)


def test_7b_on_8_gpus_is_case_2_and_picks_a_sharded_layout_that_fits():
    p = plan(CONFIGS / "llama2_7b.json", hardware="8xH100-80GB", seq_len=4096, global_batch=64)
    rec = p.recommendation
    assert rec.case == "case 2" and not p.row("ddp").fits
    assert rec.row.fits and rec.row.memory.total <= p.hardware.gpu.memory_bytes
    fastest = min((r for r in p.rows if r.fits), key=lambda r: r.time.seconds)
    assert rec.row.time.seconds <= fastest.time.seconds * 1.05
    # ties go to less sharding: nothing as fast and simpler was passed over
    simpler = [r for r in p.rows if r.fits and r.candidate.sharding_rank < rec.row.candidate.sharding_rank]
    assert all(r.time.seconds > fastest.time.seconds * 1.05 for r in simpler)


def test_nothing_fits_says_so_and_suggests_recompute():
    p = plan(CONFIGS / "llama2_70b.json", hardware="8xH100-80GB", seq_len=4096)
    assert p.recommendation.row is None and "No layout fits" in " ".join(p.recommendation.reasons)
    assert any("recompute='full'" in b for b in p.recommendation.breaks)
    assert "nothing fits" in format_plan(p)


def test_largest_layer_too_big_is_case_3():
    p = plan(params=2e9, layers=1, hidden=16384, heads=128, vocab=1000, hardware="8xL4", seq_len=512)
    assert p.recommendation.case == "case 3"


def test_allowed_strategies_filter_and_json_round_trip():
    p = plan(params=3e9, layers=24, hidden=3072, heads=24, vocab=32000, hardware="4xA100-40GB",
             allowed=("ddp", "zero1", "zero2"))
    assert {r.candidate.strategy for r in p.rows} <= {"ddp", "zero1", "zero2"}
    data = json.loads(p.to_json())
    assert data["recommendation"]["strategy"] in ("ddp", "zero1", "zero2")
    assert {"params", "grads", "optimizer", "master", "activations", "buffers", "reserve", "total"} <= set(
        data["candidates"][0]["memory"])
    with pytest.raises(PlanError, match="no candidate layout is allowed"):
        plan(params=3e9, hardware="4xA100-40GB", allowed=("hsdp",))


def test_inventory_file_gives_the_hardware(inventory_path):
    p = plan(params=1e9, inventory=inventory_path("8xh100_nvswitch"))
    assert p.hardware.gpus_per_node == 8 and p.hardware.intra == "nvlink"


def test_recommend_for_module_for_the_accelerator():
    torch = pytest.importorskip("torch")
    net = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(4)])  # 4.2M parameters
    rec = recommend_for_module(net, world_size=2, device_memory_bytes=16 * GiB, precision="fp32", seq_len=1)
    assert rec.strategy == "ddp" and rec.dims.dp == 2 and not rec.cpu_offload
    # fp32 Adam: DDP needs 16 B/param + its 4 B/param buckets (84 MB); sharded layouts about half of that
    rec = recommend_for_module(net, world_size=2, device_memory_bytes=600 * 2**20 + 60 * 10**6,
                               precision="fp32", seq_len=1)
    assert rec.strategy in ("zero2", "zero3") and rec.row.fits
    with pytest.raises(PlanError, match="No layout fits"):
        recommend_for_module(net, world_size=2, device_memory_bytes=2**20, precision="fp32", seq_len=1)


def test_auto_strategy_hook_for_choose_strategy():
    from convoy.plan.api import auto_strategy

    layout = auto_strategy(num_parameters=10**8, world_size=4, device_bytes=80 * GiB)
    assert layout.name == "ddp" and layout.dims is None and "fits" in layout.reason
    assert auto_strategy(num_parameters=7 * 10**9, world_size=4, device_bytes=80 * GiB).name in ("zero2", "zero3")
    assert auto_strategy(num_parameters=10**8, world_size=1, device_bytes=80 * GiB).name == "single"
    assert auto_strategy(num_parameters=10**12, world_size=2, device_bytes=GiB) is None


def _gpt_config(**overrides):
    """A Llama-2-7B-shaped config dict (32 heads, 32 layers)."""
    return {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
            "num_attention_heads": 32, "vocab_size": 32000, **overrides}


def test_auto_strategy_splits_only_by_the_degrees_it_is_given():
    from convoy.plan.api import auto_strategy

    model = _gpt_config()
    n = 6_738_415_616
    # 4 x 32 GiB bf16: no data-parallel layout fits; tp4 does (25.1 GiB of states + 2.8 GiB of activations)
    layout = auto_strategy(num_parameters=n, world_size=4, device_bytes=32 * GiB, precision="bf16", model=model,
                           tp_degrees=(2, 4))
    assert layout.name == "parallel" and layout.dims.tp == 4 and layout.dims.world_size == 4
    assert layout.describe() == "parallel (dp=1,tp=4,pp=1)" and "tp4 fits" in layout.reason
    # tp=2 only (as for a model whose kv heads tp=4 would not divide): nothing fits
    assert auto_strategy(num_parameters=n, world_size=4, device_bytes=32 * GiB, precision="bf16", model=model,
                         tp_degrees=(2,)) is None
    # no degrees: the data-parallel comparison of a bare parameter count, whatever the model
    assert auto_strategy(num_parameters=n, world_size=4, device_bytes=32 * GiB, precision="bf16",
                         model=model) is None
    # a pipeline loop: pipeline layouts only, each replica by DDP or ZeRO-1
    layout = auto_strategy(num_parameters=n, world_size=4, device_bytes=80 * GiB, precision="bf16", model=model,
                           tp_degrees=(2, 4), pp_degrees=(2, 4), pipeline=True)
    assert layout.dims.pp > 1 and "loss_fn" in layout.reason
    assert layout.dp_engine in (("ddp", "zero1") if layout.dims.dp > 1 else (None,)), layout


def test_auto_layout_degrees_go_with_strategy_parallel_only():
    from convoy.plan.api import AutoLayout
    from convoy.plan.dims import ParallelDims

    with pytest.raises(PlanError, match="parallel"):
        AutoLayout(name="ddp", reason="", dims=ParallelDims(tp=2))
    with pytest.raises(PlanError, match="parallel"):
        AutoLayout(name="parallel", reason="")


def test_recommend_for_module_proposes_only_layouts_the_trainer_runs():
    from convoy.plan.api import dp_engine_for, runs_in_trainer
    from convoy.plan.hardware import parse_hardware
    from convoy.plan.model import from_hf_config

    cands = list(convoy.plan.candidates.enumerate_candidates(from_hf_config(_gpt_config()),
                                                             parse_hardware("8xH100-80GB"), global_batch=8,
                                                             micro_batch=1))
    kept = {c.name for c in cands if runs_in_trainer(c)}
    assert {"ddp", "zero3", "zero3+tp2", "tp8", "ddp+pp2", "zero1+pp2", "tp2+pp4", "zero1+tp2+pp2"} <= kept
    # tp with dp > 1 only through FSDP2 (dp x tp x pp: the zero1 candidate, FSDP2 per stage)
    assert not kept & {"ddp+tp2", "zero1+tp2", "ddp+tp2+pp2"}
    three_d = next(c for c in cands if c.name == "zero1+tp2+pp2")
    assert dp_engine_for(three_d.strategy, three_d.dims) == "fsdp"
    assert dp_engine_for("zero1", next(c for c in cands if c.name == "zero1+pp2").dims) == "zero1"
    assert {"ddp+tp2", "zero1+tp2", "ddp+tp2+pp2"} <= {c.name for c in cands}
