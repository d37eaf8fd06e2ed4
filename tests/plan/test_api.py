"""convoy.plan end to end: rows, the recommendation, its reasons, speed, and the Accelerator's entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from convoy.errors import PlanError
from convoy.plan.api import format_plan, plan, recommend_for_module
from convoy.plan.recommend import tie_rank, tie_reason
from convoy.plan.units import GiB

CONFIGS = Path(__file__).parent / "configs"


def test_convoy_plan_is_the_public_function_even_after_submodule_imports():
    import convoy.plan.hardware  # noqa: F401  binds the package to convoy.plan

    p = convoy.plan(params=1e9, hardware="2xA100-80GB")
    assert p.recommendation.row is not None and "plan" in convoy.__all__


def test_70b_config_on_four_nodes_plans_the_multi_node_case():
    """(How fast: benchmarks/cli_latency.py measures it; a test asserts no wall-clock time.)"""
    p = plan(CONFIGS / "llama2_70b.json", hardware="8xH100-80GB", nodes=4, inter_gbps=3200, seq_len=4096,
             recompute="full")
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
    # ties go to the simpler layout: nothing as fast and simpler was passed over
    simpler = [r for r in p.rows if r.fits and tie_rank(r.candidate, rec.case) < tie_rank(rec.row.candidate, rec.case)]
    assert all(r.time.seconds > fastest.time.seconds * 1.05 for r in simpler)


def test_nothing_fits_as_asked_turns_recompute_then_offload_and_says_which():
    """70B on one 8xH100 box at 4096 tokens: no layout fits as asked, nor with recompute alone; the plan
    recommends the fastest that fits with the least recomputation ('selective', which keeps each block's matmul
    and attention outputs) and CPU offload, and says so (it recommended nothing, and the Accelerator had no way to
    apply the recompute it suggested)."""
    p = plan(CONFIGS / "llama2_70b.json", hardware="8xH100-80GB", seq_len=4096)
    rec = p.recommendation
    assert not any(r.fits for r in p.rows if not r.candidate.layout.offload)
    assert rec.row.fits and rec.recompute == "selective" and rec.cpu_offload and rec.knob == "recompute+offload"
    said = " ".join(rec.reasons)
    assert "No layout fits as asked" in said and "Turning on recompute='selective'" in said and "CPU offload" in said
    assert "--cpu-offload --recompute selective" in " ".join(rec.launch_args)  # then compile and float8, if chosen
    assert "with recompute='selective'" in format_plan(p).split("recommended: ")[1].splitlines()[0]
    # 7B at 16384 tokens on 2 A100-80GB: recompute alone is enough, and faster than offloading
    small = plan(CONFIGS / "llama2_7b.json", hardware="2xA100-80GB", seq_len=16384)
    assert small.recommendation.knob == "recompute" and not small.recommendation.cpu_offload, small.recommendation
    # knobs the caller cannot turn are not turned (Accelerator(strategy="auto") before it can recompute)
    from convoy.plan.api import plan_for

    bare = plan_for(p.model, p.run, p.hardware, knobs=())
    assert bare.recommendation.row is None and "nothing fits" in format_plan(bare)
    assert any("recompute='full'" in b for b in bare.recommendation.breaks)


def test_largest_layer_too_big_is_case_3():
    # one block of hidden 16384 holds 12h² = 3.2e9 parameters (2e9 were refused as no model of that shape)
    p = plan(params=3.3e9, layers=1, hidden=16384, heads=128, vocab=1000, hardware="8xL4", seq_len=512)
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




def test_each_candidate_can_be_costed_in_its_own_precision_recipe():
    """``plan_for(precision_for=)`` (what strategy="auto" gives): each row is costed in the recipe it names."""
    from dataclasses import replace

    from convoy.plan.api import plan_for
    from convoy.plan.hardware import parse_hardware
    from convoy.plan.memory import memory_per_gpu
    from convoy.plan.model import from_hf_config
    from convoy.plan.run import RunSpec
    from convoy.plan.timing import step_time

    def recipe(candidate):
        return "bf16-fsdp" if candidate.strategy in ("zero2", "zero3") else "bf16-autocast"

    spec, hw = from_hf_config(CONFIGS / "gpt2.json"), parse_hardware("4xH100-80GB")
    run = RunSpec(seq_len=1024, micro_batch=8, precision="bf16-autocast")
    p = plan_for(spec, run, hw, precision_for=recipe, explain_breaks=False, offload=False)
    assert {r.name: r.precision for r in p.rows if r.candidate.layout.dims.is_trivial} == {
        "ddp": "bf16-autocast", "zero1": "bf16-autocast", "zero2": "bf16-fsdp", "zero3": "bf16-fsdp"}
    for row in p.rows:
        own = replace(run, precision=row.precision)
        assert row.memory == memory_per_gpu(spec, own, row.candidate.layout)
        assert row.time == step_time(spec, own, row.candidate.layout, hw, global_batch=p.global_batch)
        assert row.as_dict()["precision"] == row.precision
    same = plan_for(spec, run, hw, explain_breaks=False, offload=False)
    assert {r.precision for r in same.rows} == {"bf16-autocast"}
    assert same.row("zero3").memory.activations > p.row("zero3").memory.activations  # no weight copies


def test_tensor_parallel_groups_never_straddle_two_nodes():
    """2 nodes of 6 GPUs and 8 heads: tp4 divides the 12 GPUs and the heads, but ranks 4-7 (tp innermost) would sit
    on both nodes; only degrees that divide a node's GPUs are candidates (it chose tp4 x pp3 before)."""
    from convoy.plan.candidates import enumerate_candidates
    from convoy.plan.hardware import Hardware, lookup_gpu
    from convoy.plan.model import from_numbers

    model = from_numbers(30e9, layers=48, hidden=7168, heads=8, vocab=32000)
    hw = Hardware(gpu=lookup_gpu("H100-80GB"), gpus_per_node=6, nodes=2)
    assert {c.layout.dims.tp for c in enumerate_candidates(model, hw, global_batch=12, micro_batch=1)} == {1, 2}
    rec = recommend_for_module(model, world_size=12, nodes=2, device_memory_bytes=80 * 2**30, gpu="H100-80GB",
                               allowed=("ddp", "zero1", "zero2", "zero3", "tp", "pp"))
    assert 6 % rec.dims.tp == 0, rec.dims


@pytest.mark.parametrize("kwargs, word", [
    ({"seq_len": None}, "seq_len=None: give a whole number"),  # was TypeError: '<' not supported
    ({"micro_batch": None}, "micro_batch=None"),
    ({"nodes": None}, "nodes=None"),
    ({"efficiency": "0.5"}, "efficiency='0.5'"),  # None is the default (the device's rates), a string is not
    ({"inter_gbps": None}, "inter_gbps=None"),  # was TypeError
    ({"offload": "no"}, "offload='no' is a str"),  # was truthy: planned with offload on
    ({"calibrate": "no"}, "calibrate='no' is a str"),
    ({"allowed": "ddp"}, "allowed='ddp'"),  # a str is a collection of letters
    ({"allowed": [None]}, r"allowed=\[None\]"),  # was TypeError in the message join
])
def test_wrong_python_types_are_one_plan_error(kwargs, word):
    with pytest.raises(PlanError, match=word):
        plan(params=7e9, hardware="8xH100-80GB", **kwargs)


def test_global_batch_none_is_still_the_default():
    assert plan(params=7e9, hardware="8xH100-80GB", global_batch=None).recommendation is not None


def test_multi_node_plans_name_the_network_and_tie_break_toward_zero1():
    """70B on 4 nodes of 8 H100s: ZeRO-1 beside tp x pp (52.3 GiB), where the tie-break chose DDP at 77.8 of 79.6
    GiB while its reason recommended ZeRO-1; the network speed assumed is printed, and named where it decides."""
    p = plan(CONFIGS / "llama2_70b.json", hardware="8xH100-80GB", nodes=4, recompute="full")
    rec = p.recommendation
    assert rec.strategy == "zero1" and rec.dims.tp > 1 and rec.dims.pp > 1, rec.row.name
    assert p.row("ddp+tp4+pp4").fits and rec.row.name != "ddp+tp4+pp4"
    assert "(network: --inter-gbps)" in format_plan(p).splitlines()[1] and "400 Gbit/s" in format_plan(p)
    assert any("assumes 400 Gbit/s per node (--inter-gbps); on a faster one, 3,200 Gbit/s, zero3 would be chosen"
               in b for b in rec.breaks), rec.breaks
    zero1, ddp = (p.row(n).candidate for n in ("zero1+tp4+pp4", "ddp+tp4+pp4"))
    assert tie_rank(zero1, rec.case) < tie_rank(ddp, rec.case)
    assert "ZeRO-1 shards the optimizer state for the traffic of DDP" in tie_reason(zero1, ddp, rec.case)
    # on one node, where the model fits one GPU, the guide's order holds: DDP before ZeRO
    assert tie_rank(ddp, "case 1") < tie_rank(zero1, "case 1")


def test_a_node_of_more_than_16_gpus_is_refused_with_the_nodes_spelling():
    with pytest.raises(PlanError, match=r"32xH100-80GB is 32 GPUs in one node .*; for 4 nodes of 8 write "
                                        r"--hardware 8xH100-80GB --nodes 4"):
        plan(params=7e9, hardware="32xH100-80GB")


def test_a_gain_under_one_percent_reads_less_than_1_percent_never_0_percent():
    """"zero2 is 0% faster" read as no gain at all: a gain under half a percent is "less than 1%"."""
    from dataclasses import replace

    from convoy.plan.recommend import recommend

    p = plan(CONFIGS / "gpt2.json", hardware="8xA100-80GB", seq_len=1024, micro_batch=8)
    best = p.recommendation.row
    assert best is not None and best.candidate.strategy == "ddp"
    other = next(r for r in p.rows if r.fits and r.candidate.strategy == "zero2" and r.candidate.layout.dims.is_trivial
                 and not r.candidate.layout.offload)

    def at(row, ratio):  # the row with its step ``ratio`` times ddp's (its compute absorbs the difference)
        return replace(row, time=replace(row.time, compute=row.time.compute + best.time.seconds * ratio
                                         - row.time.seconds))

    def reasons(row):
        rec = recommend([best, row], model=p.model, run=p.run, hw=p.hardware, single=p.single_gpu)
        assert rec.row is best  # within the tie, ddp is simpler
        return " ".join(rec.reasons)

    assert f"{other.name} is less than 1% faster on paper" in reasons(at(other, 0.997))
    assert f"{other.name} is 2% faster on paper" in reasons(at(other, 0.98))
