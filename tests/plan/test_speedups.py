"""The planner prices torch.compile and float8 (``convoy.plan.speedups``, ``convoy.plan.variants``): the fp8 column
of the board table, the factors a compiled or float8 step changes by, the recommendation, the printed commands and
the JSON, and torchtitan's published gains."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from dataclasses import dataclass, replace

import pytest

from convoy.cli.main import main
from convoy.errors import PlanError
from convoy.plan.activations import block_bytes
from convoy.plan.api import format_plan, plan, recommend_for_module
from convoy.plan.candidates import Candidate
from convoy.plan.commands import accelerator_call, launch_args
from convoy.plan.dims import ParallelDims
from convoy.plan.hardware import CPU, GPUS, Hardware, lookup_gpu, parse_hardware
from convoy.plan.memory import Layout, memory_per_gpu
from convoy.plan.model import from_hf_config
from convoy.plan.run import RunSpec
from convoy.plan.shapes import gemm_shapes
from convoy.plan.speed.observed import case_key
from convoy.plan.speed.rates import rates_for
from convoy.plan.speedups import FACTORS, converted, converted_block_params, fp8_cast_seconds, fp8_gemm_factor
from convoy.plan.timing import compute_seconds, step_time
from convoy.plan.variants import choose as choose_variant
from convoy.plan.variants import compare
from tests.conftest import REPO

#: a small Llama (every block dimension a multiple of 16, a head of vocab 32000)
LLAMA = from_hf_config({"model_type": "llama", "num_hidden_layers": 4, "hidden_size": 1024,
                        "num_attention_heads": 16, "num_key_value_heads": 4, "intermediate_size": 2816,
                        "vocab_size": 32000, "_name_or_path": "tiny-llama"})
RUN = RunSpec(seq_len=2048, micro_batch=2, precision="bf16-fsdp")
H100 = parse_hardware("8xH100-80GB")
FSDP8 = Layout(dims=ParallelDims(dp_shard=8), zero_stage=3)


@dataclass(frozen=True)
class _Rates:
    """Rates that isolate one term of the step: GEMMs at a fixed FLOP rate, or memory-bound work alone."""

    gemm_flops: float = 0.0
    pointwise: float = 0.0
    memory_bytes_per_s: float = 0.0
    kind: str = "modeled"
    launch_seconds: float = 0.0
    peer_bytes_per_s: float | None = None

    @property
    def pointwise_seconds_per_byte(self) -> float:
        return self.pointwise

    def gemm_seconds(self, m, k, n, dtype):
        return 2 * m * k * n / self.gemm_flops if self.gemm_flops else 0.0

    def attention_seconds(self, *args):
        return 0.0


# -- the board table ---------------------------------------------------------------------------------------------

def test_fp8_column_per_board_with_its_source():
    with_fp8 = {name for name, g in GPUS.items() if g.fp8_tflops is not None}
    assert {"h100-80gb", "h100-pcie", "h100-nvl", "h200-141gb", "l40s", "l4", "mi300x", "b200"} <= with_fp8
    for name in with_fp8:
        g = GPUS[name]
        assert "fp8" in g.fp8_source.lower(), name
        assert g.peak_flops("fp8") == g.fp8_tflops * 1e12
        # dense fp8 is twice dense bf16 on every board that has it (the datasheets' own ratio)
        assert g.fp8_tflops == pytest.approx(2 * g.bf16_tflops, rel=0.02), name
    assert lookup_gpu("H100-80GB").fp8_tflops == pytest.approx(1978.9)  # the H100 SXM datasheet's dense figure
    for name in ("A100-80GB", "A100-40GB", "V100-32GB", "T4", "A10", "MI250X"):
        assert lookup_gpu(name).fp8_tflops is None
        with pytest.raises(PlanError, match="no float8 tensor cores"):
            lookup_gpu(name).peak_flops("fp8")
    assert CPU.fp8_tflops is None
    # a peak given by the user keeps the table's fp8 : bf16 ratio (and none where the board has none)
    assert parse_hardware("8xH100-80GB", peak_tflops=500).gpu.fp8_tflops == pytest.approx(500 * 1978.9 / 989.4)
    assert parse_hardware("8xA100-80GB", peak_tflops=500).gpu.fp8_tflops is None


def test_fp8_on_an_a100_is_refused_in_one_line(capsys):
    with pytest.raises(PlanError, match="A100-80GB has no float8 tensor cores"):
        plan(params=7e9, hardware="8xA100-80GB", fp8="tensorwise")
    assert main(["plan", "--params", "7e9", "--hardware", "8xA100-80GB", "--precision", "fp8"]) == 2
    err = capsys.readouterr().err
    assert "no float8 tensor cores" in err and len(err.strip().splitlines()) == 1


def test_fp8_needs_a_bf16_recipe_and_known_names():
    with pytest.raises(PlanError, match="fp8 trains on top of bf16"):
        RunSpec(precision="fp32", fp8="tensorwise")
    with pytest.raises(PlanError, match="compile 'all'"):
        RunSpec(compile="all")
    with pytest.raises(PlanError, match="fp8='e4m3'"):
        plan(params=1e9, hardware="1xH100-80GB", fp8="e4m3")


# -- compile: memory-bound work and saved activations ----------------------------------------------------------

def test_compile_scales_memory_bound_work_by_its_factor():
    only_memory = _Rates(pointwise=1e-12, memory_bytes_per_s=1e12)
    eager = compute_seconds(LLAMA, RUN, FSDP8, only_memory)
    compiled = compute_seconds(LLAMA, replace(RUN, compile="blocks"), FSDP8, only_memory)
    assert compiled == pytest.approx(FACTORS["compile_memory_bound"].value * eager)
    # GEMMs and attention are the same kernels compiled or not
    only_gemms = _Rates(gemm_flops=1e15)
    assert compute_seconds(LLAMA, replace(RUN, compile="blocks"), FSDP8, only_gemms) == compute_seconds(
        LLAMA, RUN, FSDP8, only_gemms)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_compile_keeps_the_stated_fraction_of_a_blocks_activations(recompute):
    run = replace(RUN, recompute=recompute)
    eager, compiled = block_bytes(LLAMA, run), block_bytes(LLAMA, replace(run, compile="blocks"))
    assert compiled == pytest.approx(FACTORS[f"compile_saved_{recompute}"].value * eager)
    # what a block holds while it is recomputed is the partitioner's set
    working = block_bytes(LLAMA, run, stored_only=False)
    assert block_bytes(LLAMA, replace(run, compile="blocks"), stored_only=False) == pytest.approx(
        FACTORS["compile_saved_none"].value * working)
    mem_e, mem_c = memory_per_gpu(LLAMA, run, FSDP8), memory_per_gpu(LLAMA, replace(run, compile="blocks"), FSDP8)
    assert (mem_c.activations < mem_e.activations) == (recompute == "none")


def test_every_factor_has_a_source_and_compile_time_is_an_estimate():
    assert all(len(f.source) > 60 for f in FACTORS.values())
    assert FACTORS["compile_seconds_per_graph"].estimate
    t = step_time(LLAMA, replace(RUN, compile="blocks"), FSDP8, H100, global_batch=16)
    e = step_time(LLAMA, RUN, FSDP8, H100, global_batch=16)
    assert t.seconds < e.seconds


# -- float8: GEMMs, casts, gathers, memory ------------------------------------------------------------------------

def test_fp8_halves_the_converted_gemms_and_leaves_the_head():
    rates = _Rates(gemm_flops=1e15)  # no memory-bound work: the casts cost nothing here
    fp8 = replace(RUN, fp8="tensorwise")
    head = sum(3 * 2 * m * k * n * c / 1e15 for m, k, n, c in gemm_shapes(LLAMA, RUN) if not converted(k, n, c))
    blocks = sum(3 * 2 * m * k * n * c / 1e15 for m, k, n, c in gemm_shapes(LLAMA, RUN) if converted(k, n, c))
    assert head > 0 and blocks > 0
    assert compute_seconds(LLAMA, RUN, FSDP8, rates) == pytest.approx(head + blocks)
    half = fp8_gemm_factor(H100.gpu)  # 989.4 / 1978.9 TFLOP/s
    assert half == pytest.approx(0.5, rel=1e-3)
    assert compute_seconds(LLAMA, fp8, FSDP8, rates, gpu=H100.gpu) == pytest.approx(head + blocks * half)
    # the weight gradient in 16 bits: two of the three passes at the fp8 rate
    gw = replace(RUN, fp8="rowwise_with_gw_hp")
    assert compute_seconds(LLAMA, gw, FSDP8, rates, gpu=H100.gpu) == pytest.approx(
        head + blocks * (2 * half + 1) / 3)


def test_fp8_pays_its_casts_at_the_memory_bandwidth():
    rates = _Rates(memory_bytes_per_s=1e12)
    fp8 = replace(RUN, fp8="tensorwise")
    eager_casts = fp8_cast_seconds(LLAMA, fp8, FSDP8, rates)
    compiled_casts = fp8_cast_seconds(LLAMA, replace(fp8, compile="blocks"), FSDP8, rates)
    assert compiled_casts == pytest.approx(eager_casts * FACTORS["fp8_cast_bytes_compiled"].value
                                           / FACTORS["fp8_cast_bytes_eager"].value)
    assert fp8_cast_seconds(LLAMA, RUN, FSDP8, rates) == 0.0
    # the input and the output gradient of every converted linear, 3 bytes each compiled (weights: on the shard)
    acts = sum(c * (m * k + m * n) for m, k, n, c in gemm_shapes(LLAMA, RUN) if converted(k, n, c))
    weights = sum(c * k * n / 8 for m, k, n, c in gemm_shapes(LLAMA, RUN) if converted(k, n, c))
    assert compiled_casts == pytest.approx((acts + weights) * 3 / 1e12)


def test_fp8_all_gather_halves_the_gathered_bytes_of_converted_weights_only():
    ddp = Layout(dims=ParallelDims(dp_replicate=8))
    eager = step_time(LLAMA, RUN, FSDP8, H100, global_batch=16)
    tensorwise = step_time(LLAMA, replace(RUN, fp8="tensorwise"), FSDP8, H100, global_batch=16)
    rowwise = step_time(LLAMA, replace(RUN, fp8="rowwise"), FSDP8, H100, global_batch=16)
    # ZeRO-3 gathers twice per micro-batch (forward, backward); 1 byte instead of 2 for each converted weight
    saved = 7 / 8 * 2 * LLAMA.num_layers * converted_block_params(LLAMA, replace(RUN, fp8="tensorwise"))
    assert eager.comm_bytes - tensorwise.comm_bytes == pytest.approx(saved)
    assert rowwise.comm_bytes == eager.comm_bytes  # rowwise gathers in 16 bits
    assert step_time(LLAMA, replace(RUN, fp8="tensorwise"), ddp, H100, global_batch=16).comm_bytes == \
        step_time(LLAMA, RUN, ddp, H100, global_batch=16).comm_bytes  # DDP's all-reduce: gradients
    # master weights, optimizer states, gradients and activations as in bf16
    m_e, m_f = memory_per_gpu(LLAMA, RUN, FSDP8), memory_per_gpu(LLAMA, replace(RUN, fp8="tensorwise"), FSDP8)
    assert (m_f.master, m_f.optimizer, m_f.grads, m_f.activations) == (m_e.master, m_e.optimizer, m_e.grads,
                                                                       m_e.activations)


# -- the recommendation, the commands and the JSON ---------------------------------------------------------------

def _compare(hw, run=RUN, asked=None):
    rates = rates_for(hw.gpu)
    return compare(LLAMA, run, FSDP8, hw, global_batch=16, rates=rates, asked=asked or {})


def test_a_model_known_by_its_count_alone_is_planned_compiled_and_in_float8():
    p = plan(params=1.3e9, hardware="8xH100-80GB", nodes=2)  # no shape: no memory-bound term, every matmul float8
    eager, compiled, fp8 = p.recommendation.variants
    assert compiled.time.seconds == pytest.approx(eager.time.seconds)
    assert fp8.time.seconds < compiled.time.seconds and p.recommendation.fp8 == "tensorwise"


def test_recommends_compile_and_fp8_when_faster_on_a_board_that_has_it():
    options = _compare(H100)
    assert [v.name for v in options] == ["eager", "compile", "compile+fp8 tensorwise"]
    best, why = choose_variant(options, hw=H100, asked={})
    fastest = min(options, key=lambda v: v.time.seconds)
    assert best is fastest and (best.compile, best.fp8) == ("blocks", "tensorwise") and "faster than eager" in why
    a100 = parse_hardware("8xA100-80GB")
    options = _compare(a100)
    assert "no float8 tensor cores" in options[2].why_not and options[2].time is None
    best, _ = choose_variant(options, hw=a100, asked={})
    assert (best.compile, best.fp8) == ("blocks", "none")


def test_a_pipeline_layout_is_priced_and_recommended_in_float8():
    """The trainer runs float8 beside pp > 1 (FSDP2 per stage gathering float8): the planner prices it, not refuses."""
    pipeline = Layout(dims=ParallelDims(dp_shard=4, pp=2), zero_stage=3, microbatches=4)
    options = compare(LLAMA, RUN, pipeline, H100, global_batch=16, rates=rates_for(H100.gpu))
    fp8 = options[2]
    assert (fp8.name, fp8.why_not) == ("compile+fp8 tensorwise", "") and fp8.time is not None
    assert fp8.time.seconds < options[1].time.seconds
    best, _ = choose_variant(options, hw=H100, asked={})
    assert (best.compile, best.fp8) == ("blocks", "tensorwise")


def test_turns_nothing_on_that_is_not_faster_or_not_asked():
    options = _compare(H100)
    slower = tuple(replace(v, time=replace(v.time, correction=3.0)) if v.compile != "none" else v for v in options)
    best, why = choose_variant(slower, hw=H100, asked={})
    assert (best.compile, best.fp8) == ("none", "none") and why == ""
    best, _ = choose_variant(options, hw=H100, asked={"compile": "none", "fp8": "none"})
    assert (best.compile, best.fp8) == ("none", "none")
    # CPU processes: compile is shown, not chosen unasked
    cpu = Hardware(gpu=CPU, gpus_per_node=2, intra="pcie")
    options = _compare(cpu)
    best, _ = choose_variant(options, hw=cpu, asked={})
    assert best.compile == "none" and any(v.compile == "blocks" and v.time for v in options)


def test_the_plan_prints_the_choice_in_its_launch_line_and_accelerator_call():
    p = plan(LLAMA, hardware="8xH100-80GB", seq_len=2048, micro_batch=2, recompute="selective")
    rec = p.recommendation
    assert (rec.compile, rec.fp8) == ("blocks", "tensorwise")
    assert "--mixed-precision fp8 --fp8-recipe tensorwise " in rec.command
    assert rec.command.endswith(" --compile blocks train.py")
    assert 'mixed_precision="fp8", fp8_recipe="tensorwise"' in rec.accelerator and 'compile="blocks"' in rec.accelerator
    assert rec.launch_args[-2:] == ("--compile", "blocks") and rec.launch_args.count("--mixed-precision") == 1
    text = format_plan(p)
    assert "compile and float8 for" in text and "compile+fp8 tensorwise" in text and "(estimate)" in text
    # asked for eager: nothing added
    eager = plan(LLAMA, hardware="8xH100-80GB", compile="none", fp8="none").recommendation
    assert "--compile" not in eager.command and "fp8" not in eager.accelerator
    # precision='fp8' is bf16 with float8 tensorwise, and a recipe given is kept
    p8 = plan(LLAMA, hardware="8xH100-80GB", precision="fp8", compile="none")
    assert (p8.run.precision, p8.run.fp8, p8.recommendation.compile) == ("bf16", "tensorwise", "none")
    cand = Candidate(name="zero3", strategy="zero3", layout=FSDP8)
    rowwise = launch_args(cand, H100, precision="bf16", fp8="rowwise")
    assert rowwise[rowwise.index("--mixed-precision"):][:4] == ("--mixed-precision", "fp8", "--fp8-recipe", "rowwise")
    assert accelerator_call(cand, precision="bf16", compile="model") == \
        'Accelerator(strategy="zero3", mixed_precision="bf16", compile="model")'


def test_cli_flags_and_json_fields(capsys):
    assert main(["plan", "--params", "7e9", "--layers", "32", "--hidden", "4096", "--heads", "32", "--hardware",
                 "8xH100-80GB", "--compile", "blocks", "--fp8", "rowwise", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rec = data["recommendation"]
    assert (data["run"]["compile"], data["run"]["fp8"]) == ("blocks", "rowwise")
    assert (rec["compile"], rec["fp8"]) == ("blocks", "rowwise") and rec["compile_seconds"] > 0
    assert {"compile", "fp8"} <= set(data["candidates"][0])
    names = [v["name"] for v in rec["variants"]]
    assert names == ["eager", "compile", "compile+fp8 rowwise"]
    for v in rec["variants"]:
        assert {"step_seconds", "memory_bytes", "tokens_per_s_per_gpu", "compile_seconds", "why_not"} <= set(v)
    assert rec["variants"][0]["step_seconds"] > rec["variants"][2]["step_seconds"]
    assert "--fp8-recipe rowwise" in rec["command"]


def test_recommend_for_module_costs_the_layout_with_the_runs_compile_and_fp8():
    rec = recommend_for_module(LLAMA, world_size=8, device_memory_bytes=80 * 2**30, gpu="H100-80GB",
                               precision="bf16", compile="blocks", fp8="tensorwise", seq_len=2048)
    assert rec.row is not None and (rec.row.compile, rec.row.fp8) == ("blocks", "tensorwise")
    assert (rec.compile, rec.fp8) == ("blocks", "tensorwise")  # as asked, not chosen


def test_a_compiled_or_float8_run_is_a_case_of_its_own_and_eager_keys_stay():
    eager = case_key(LLAMA, RUN, FSDP8, H100)
    assert "compile" not in eager and "fp8" not in eager  # what jobs measured before keeps matching
    compiled = case_key(LLAMA, replace(RUN, compile="blocks", fp8="tensorwise"), FSDP8, H100)
    assert compiled != eager and "compile blocks fp8 tensorwise" in compiled


# -- torchtitan's published gains ------------------------------------------------------------------------------

def _published():
    spec = importlib.util.spec_from_file_location("published_results", REPO / "benchmarks" / "published_results.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("published_results", module)
    spec.loader.exec_module(module)
    return module


def test_torchtitan_table_1_and_3_gains_within_10_percent():
    pairs = _published().speedup_pairs()
    assert {after for _, after, *_ in pairs} == {"T1c", "T1f", "T2c", "T2f"}
    for before, after, _what, published, planned in pairs:
        assert math.isclose(planned, published, rel_tol=0.10), (before, after, published, planned)
        assert planned > 1.05  # each step is a gain, as published


def test_strategy_auto_costs_the_runs_compile_and_prices_fp8_only_where_it_runs():
    pytest.importorskip("torch")
    from convoy.train.strategies.auto import _priced_fp8, planner_hook

    assert _priced_fp8("tensorwise", CPU) == "none"  # emulated float8 is not priced
    assert _priced_fp8("tensorwise", "H100-80GB") == "tensorwise"
    assert _priced_fp8("tensorwise", "A100-80GB") == "none"
    hook = planner_hook("bf16", device_type="cpu", compile="blocks", fp8="tensorwise")
    layout = hook(num_parameters=10_000_000, world_size=2, device_bytes=16 * 2**30)
    assert layout is not None and layout.name in ("ddp", "single", "zero1", "zero2", "zero3")
