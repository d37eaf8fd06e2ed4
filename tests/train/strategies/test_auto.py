"""strategy="auto": the planner answers (data parallel, or tp/pp where model and loop allow), else the rule."""

import re
from pathlib import Path

import pytest
import torch

import convoy.plan.candidates
from convoy.errors import StrategyError
from convoy.plan.dims import ParallelDims
from convoy.train.strategies.auto import (
    AutoLayout,
    auto_strategy,
    choose_strategy,
    dp_engine_for,
    layout_shards_with_fsdp,
    planner_hook,
    pp_degrees,
    shards_with_fsdp,
    tp_degrees,
)
from tests.distributed import run_script
from tests.train.parallel.tiny_gpt import TinyConfig, TinyGPT, lm_loss

GIB = 2**30
SCRIPTS = Path(__file__).parents[1] / "scripts"
# a Llama-7B-shaped model (6.74B parameters, 32 heads, 32 blocks), built on the meta device: no memory
LLAMA_7B_SHAPE = TinyConfig(vocab=32000, dim=4096, heads=32, layers=32, hidden=11008)


def meta_gpt(cfg: TinyConfig = LLAMA_7B_SHAPE) -> TinyGPT:
    with torch.device("meta"):
        return TinyGPT(cfg)


def count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def auto(model, *, world_size, device_gib, options=None, precision="bf16") -> AutoLayout:
    return choose_strategy(world_size=world_size, num_parameters=count(model), device_bytes=int(device_gib * GIB),
                           planner=planner_hook(precision), model=model, options=options or {})


def test_planner_keeps_a_small_model_replicated():
    layout = choose_strategy(world_size=2, num_parameters=100_000, device_bytes=12 * GIB, planner=planner_hook("no"))
    assert layout.name == "ddp" and layout.dims is None
    assert "100.0K parameters with fp32 adamw" in layout.reason and "case 1" in layout.reason


def test_planner_shards_a_model_that_does_not_fit_one_device():
    layout = choose_strategy(world_size=8, num_parameters=7_000_000_000, device_bytes=80 * GIB,
                             planner=planner_hook("bf16"))
    assert layout.name in ("zero1", "zero2", "zero3")
    assert "104.3 GiB" in layout.reason and "case 2" in layout.reason


def test_rule_answers_when_nothing_fits_for_the_planner():
    # 1e12 parameters on 2 x 1 GiB: no layout fits, the planner declines, the rule says zero3.
    layout = choose_strategy(world_size=2, num_parameters=10**12, device_bytes=GIB, planner=planner_hook("no"))
    assert layout.name == "zero3"


def test_a_model_too_big_for_sharded_data_parallel_gets_tensor_parallel():
    model = meta_gpt()
    # fp32, 4 x 32 GiB: zero3 needs 42.5-43 GiB per device, zero3 + tp2 37.8 GiB, tp4 31.6 GiB (the blocks read as
    # the SwiGLU MLP of width 11008 they hold)
    layout = auto(model, world_size=4, device_gib=32, precision="no")
    assert layout.name == "parallel" and layout.dims.tp == 4 and layout.dims.world_size == 4
    assert "tp4 fits" in layout.reason and "case 2" in layout.reason
    assert layout.describe() == "parallel (dp=1,tp=4,pp=1)"
    # 4 x 38 GiB: FSDP2 over dp=2 with tp=2 inside
    layout = auto(model, world_size=4, device_gib=38, precision="no")
    assert (layout.dims.dp_shard, layout.dims.tp, layout.dims.pp, layout.dp_engine) == (2, 2, 1, "fsdp")
    assert layout.dims.world_size == 4
    # with room for ZeRO the planner keeps data parallelism (faster on paper than tp here)
    assert auto(model, world_size=4, device_gib=43, precision="no").name == "zero3"


def test_mixed_precision_costs_each_candidate_as_the_trainer_runs_it():
    """Under mixed_precision="bf16" FSDP2 over the whole model (zero3) gathers bf16 weights and reduces fp32
    gradients, while tp alone keeps fp32 weights under autocast, whose bf16 copies live until the backward: on this
    generic PCIe device tp4 needs 32.6 GiB (the model read as the SwiGLU blocks of width 11008 it holds)."""
    model = meta_gpt()
    # nothing fits as asked: auto turns the planner's knobs, recomputation first, then offload, and applies them
    recomputed = auto(model, world_size=4, device_gib=31.5)
    assert recomputed.recompute == "selective" and not recomputed.cpu_offload, recomputed
    assert "No layout fits as asked" in recomputed.reason and "Turning on recompute='selective'" in recomputed.reason
    assert recomputed.describe().endswith("with recompute='selective'")
    offloaded = auto(model, world_size=4, device_gib=20)
    assert offloaded.cpu_offload and offloaded.name in ("zero2", "zero3"), offloaded
    assert "No layout fits as asked" in offloaded.reason and "Turning on CPU offload" in offloaded.reason
    layout = auto(model, world_size=4, device_gib=34)
    assert (layout.dims.tp, layout.dp_engine) == (4, None) and "case 2" in layout.reason, layout
    assert "tp4 fits at 32.6 GiB per GPU and takes" in layout.reason and "costed as" not in layout.reason


@pytest.mark.parametrize("strategy,dims,expected", [
    ("single", dict(), "bf16-autocast"), ("ddp", dict(dp_replicate=4), "bf16-autocast"),
    ("zero1", dict(dp_replicate=4), "bf16-autocast"), ("zero2", dict(dp_shard=4), "bf16-fsdp"),
    ("zero3", dict(dp_shard=4), "bf16-fsdp"), ("zero3", dict(dp_shard=2, tp=2), "bf16-fsdp"),
    ("ddp", dict(dp_replicate=2, pp=2), "bf16-autocast"), ("zero1", dict(dp_shard=2, tp=2, pp=2), "bf16-autocast"),
    ("single", dict(tp=4), "bf16-autocast"),
])
def test_trainer_precision_names_the_recipe_each_strategy_runs(strategy, dims, expected):
    from convoy.plan.candidates import Candidate
    from convoy.plan.dims import ParallelDims
    from convoy.plan.memory import Layout
    from convoy.train.strategies.auto import trainer_precision

    stage = {"single": 0, "ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3}[strategy]
    cand = Candidate(name=strategy, strategy=strategy, layout=Layout(dims=ParallelDims(**dims), zero_stage=stage))
    assert trainer_precision("bf16", cand) == expected
    assert trainer_precision("fp16", cand) == expected.replace("bf16", "fp16")


def test_a_model_that_fits_stays_data_parallel_though_it_could_be_split():
    model = TinyGPT(TinyConfig())
    assert tp_degrees(model, world_size=2, options={}) == (2,)
    layout = auto(model, world_size=2, device_gib=64, precision="no")
    assert layout.name == "ddp" and layout.dims is None


class BigMLP(torch.nn.Module):
    """No projection names, so no tensor-parallel plan, even with a head count attribute."""

    num_heads = 32

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(16384, 16384) for _ in range(24))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def test_an_mlp_without_a_tp_plan_never_gets_tp():
    with torch.device("meta"):
        mlp = BigMLP()
    assert tp_degrees(mlp, world_size=4, options={}) == ()
    for gib in (30, 40, 80):
        layout = auto(mlp, world_size=4, device_gib=gib)
        assert layout.name != "parallel" and layout.dims is None, layout


def test_tp_needs_heads_that_are_known_and_divisible():
    three_heads = TinyGPT(TinyConfig(vocab=48, dim=12, heads=3, hidden=24))
    assert tp_degrees(three_heads, world_size=2, options={}) == ()
    assert tp_degrees(three_heads, world_size=6, options={}) == (3,)
    unknown = TinyGPT(TinyConfig())
    del unknown.config  # the head count now lives only on the attention modules
    assert tp_degrees(unknown, world_size=2, options={}) == (2,)
    for block in unknown.layers:
        del block.self_attn.num_heads
        block.self_attn.head_dim = 4
    assert tp_degrees(unknown, world_size=2, options={}) == ()


def test_nn_multihead_attention_gets_no_tp():
    # its q/k/v are one packed parameter; splitting only out_proj would be wrong
    enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(16, 4, 32, batch_first=True), 2)
    assert tp_degrees(enc, world_size=2, options={}) == ()


def test_pp_only_with_loss_fn():
    model = meta_gpt()
    assert pp_degrees(model, world_size=4, options={}) == ()
    assert pp_degrees(model, world_size=4, options={"loss_fn": lm_loss}) == (2, 4)
    for gib in (30, 33, 80):
        layout = auto(model, world_size=4, device_gib=gib)
        assert layout.dims is None or layout.dims.pp == 1, layout
    # the loop trains with model(x, target=y): only pipeline layouts are compared
    for gib in (33, 80):
        layout = auto(model, world_size=4, device_gib=gib, options={"loss_fn": lm_loss})
        assert layout.name == "parallel" and layout.dims.pp > 1 and layout.dims.world_size == 4, layout
        assert "loss_fn" in layout.reason
        if layout.dims.dp > 1:
            assert layout.dp_engine in ("ddp", "zero1", "zero2", "fsdp")  # zero2, fsdp: FSDP2 per pipeline stage


def test_auto_can_choose_dp_x_tp_x_pp():
    # 8 devices of 40 GiB, a 7B-shaped model, a pipeline loop, and a model that splits only 2 ways by tp and by pp:
    # the other factor of 2 is data parallel: the planner's zero1+tp2+pp2, built with the zero1 engine (over
    # tp-split weights, FSDP2 per stage keeping the gathered weights through the step)
    model = meta_gpt()
    layout = auto_strategy(num_parameters=count(model), world_size=8, device_bytes=40 * GIB, model=model,
                           tp_degrees=(2,), pp_degrees=(2,), pipeline=True, mixed_precision="bf16", heads=32)
    assert layout.name == "parallel" and (layout.dims.dp, layout.dims.tp, layout.dims.pp) == (2, 2, 2), layout
    assert layout.dims.world_size == 8 and layout.dp_engine in ("zero1", "zero2"), layout  # zero2: FSDP2 per stage


def test_a_pipeline_loop_keeps_a_pipeline_when_none_fits_the_estimate():
    # 8 GiB devices: nothing fits by the planner's guess; the loop calls model(x, target=y), so a data-parallel
    # layout would break it: the most split pipeline is used, and the line says so
    layout = auto(meta_gpt(), world_size=8, device_gib=8, options={"loss_fn": lm_loss})
    assert layout.name == "parallel" and layout.dims.pp == 8 and layout.dims.dp == 1, layout
    assert "none fits" in layout.reason and "parallelism=" in layout.reason
    small = auto(TinyGPT(TinyConfig(layers=2)), world_size=8, device_gib=1e-6, options={"loss_fn": lm_loss})
    assert small.dims.pp == 2 and small.dims.dp == 4 and small.dp_engine == "zero1", small


def test_a_pipeline_loop_without_a_pipeline_degree_keeps_its_call_at_pp1():
    # one process: nothing to split, but the loop still calls model(x, target=y) (strategy "parallel" wraps it)
    one = auto(TinyGPT(TinyConfig(layers=2)), world_size=1, device_gib=80, options={"loss_fn": lm_loss})
    assert one.name == "parallel" and one.dims.world_size == 1 and one.dp_engine is None, one
    assert "pp=1" in one.reason
    # 3 processes and 2 layers: no pp degree divides 3 and fits, so data parallel at pp=1
    three = auto(TinyGPT(TinyConfig(layers=2)), world_size=3, device_gib=80, options={"loss_fn": lm_loss})
    assert three.name == "parallel" and three.dims.pp == 1 and three.dims.dp == 3, three
    assert three.dp_engine in ("ddp", "zero1", "fsdp"), three


def test_pp_degrees_follow_the_pipeline_options():
    model = TinyGPT(TinyConfig(layers=4))
    assert pp_degrees(model, world_size=8, options={"loss_fn": lm_loss}) == (2, 4)
    # interleaved: two stages per process, so pp=4 would need 8 layers
    options = {"loss_fn": lm_loss, "pp_schedule": "interleaved_1f1b"}
    assert pp_degrees(model, world_size=8, options=options) == (2,)


def test_a_planner_with_the_old_three_keywords_and_a_pair_still_answers():
    def planner(*, num_parameters, world_size, device_bytes):
        return "zero2", f"{num_parameters} on {world_size}"

    layout = choose_strategy(world_size=2, num_parameters=10, device_bytes=GIB, planner=planner,
                             model=TinyGPT(TinyConfig()), options={})
    assert layout == AutoLayout(name="zero2", reason="10 on 2")


@pytest.mark.slow
def test_strategy_auto_trains_tiny_gpt_at_tp2_on_two_processes():
    result = run_script(SCRIPTS / "auto_tp.py", nproc=2, timeout=120)
    assert result.returncode == 0, result.output
    assert re.search(r"strategy=auto chose parallel \(dp=1,tp=2,pp=1\): .*tp2 fits", result.output), result.output
    # both tp ranks matched one process (losses, clipped gradient norms, final weights)
    assert sorted(re.findall(r"rank (\d) TP loss diff .* OK", result.output)) == ["0", "1"], result.output


@pytest.mark.slow
def test_every_rank_builds_rank_zeros_layout():
    # a planner that answers differently per rank: without agreement rank 0 builds DDP and rank 1 FSDP
    result = run_script(SCRIPTS / "auto_agree.py", nproc=2, timeout=120)
    assert result.returncode == 0, result.output
    built = re.findall(r"rank (\d) built (\w+) planned for (\d+) OK", result.output)
    assert sorted(rank for rank, _, _ in built) == ["0", "1"], result.output
    assert {name for _, name, _ in built} == {"ddp"}, result.output
    assert len({planned for _, _, planned in built}) == 1, result.output  # one device size: the smallest


# --- the trainer's side of the planner (moved here from convoy.plan.api) ---------------------------------

def _gpt_config(**overrides):
    """A Llama-2-7B-shaped config dict (32 heads, 32 layers)."""
    return {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
            "num_attention_heads": 32, "vocab_size": 32000, **overrides}


def test_auto_strategy_hook_for_choose_strategy():
    layout = auto_strategy(num_parameters=10**8, world_size=4, device_bytes=80 * GIB)
    assert layout.name in ("ddp", "zero2") and layout.dims is None and "fits" in layout.reason
    if layout.name != "ddp":  # a data-parallel choice other than DDP in case 1 says why
        assert "DDP fits too but takes" in layout.reason, layout.reason
    assert auto_strategy(num_parameters=6 * 10**9, world_size=4, device_bytes=80 * GIB).name in ("zero2", "zero3")
    # 7e9 in fp32 on 4 x 80 GiB: by a bare count (one unit) zero3 gathers the whole model and zero2 keeps the fp32
    # shards beside the whole weights (82.7 GiB): nothing fits as asked, and the planner turns CPU offload
    offloaded = auto_strategy(num_parameters=7 * 10**9, world_size=4, device_bytes=80 * GIB)
    assert offloaded.cpu_offload and offloaded.describe() in ("zero2 with cpu_offload", "zero3 with cpu_offload")
    assert choose_strategy(world_size=4, num_parameters=7 * 10**9, device_bytes=80 * GIB,
                           planner=auto_strategy) == offloaded
    assert auto_strategy(num_parameters=10**8, world_size=1, device_bytes=80 * GIB).name == "single"
    assert auto_strategy(num_parameters=10**12, world_size=2, device_bytes=GIB) is None


def test_auto_strategy_splits_only_by_the_degrees_it_is_given():
    model = _gpt_config()
    n = 6_738_415_616
    # 4 x 32 GiB bf16: no data-parallel layout fits; tp4 does (25.1 GIB of states + 2.8 GIB of activations)
    layout = auto_strategy(num_parameters=n, world_size=4, device_bytes=32 * GIB, precision="bf16", model=model,
                           tp_degrees=(2, 4))
    assert layout.name == "parallel" and layout.dims.tp == 4 and layout.dims.world_size == 4
    assert layout.describe() == "parallel (dp=1,tp=4,pp=1)" and "tp4 fits" in layout.reason
    # tp=2 only (as for a model whose kv heads tp=4 would not divide): nothing fits as asked, only with the
    # planner's first knob, recomputation
    turned = auto_strategy(num_parameters=n, world_size=4, device_bytes=32 * GIB, precision="bf16", model=model,
                           tp_degrees=(2,))
    assert turned.dims.tp == 2 and turned.recompute is not None and not turned.cpu_offload, turned
    # no degrees: the data-parallel comparison of a bare parameter count (one unit: offload gathers it whole),
    # whatever the model: nothing fits even with offload
    assert auto_strategy(num_parameters=n, world_size=4, device_bytes=32 * GIB, precision="bf16",
                         model=model) is None
    # a pipeline loop: pipeline layouts only, each replica by DDP or ZeRO-1
    layout = auto_strategy(num_parameters=n, world_size=4, device_bytes=80 * GIB, precision="bf16", model=model,
                           tp_degrees=(2, 4), pp_degrees=(2, 4), pipeline=True)
    assert layout.dims.pp > 1 and "loss_fn" in layout.reason
    assert layout.dp_engine in (("ddp", "zero1", "zero2") if layout.dims.dp > 1 else (None,)), layout


def test_auto_layout_degrees_go_with_strategy_parallel_only():
    from convoy.plan.dims import ParallelDims

    with pytest.raises(StrategyError, match="parallel"):
        AutoLayout(name="ddp", reason="", dims=ParallelDims(tp=2))
    with pytest.raises(StrategyError, match="parallel"):
        AutoLayout(name="parallel", reason="")


def test_the_planners_candidates_are_built_with_the_engine_their_strategy_names():
    """Every candidate runs in the trainer as named (ddp and zero1 beside tp too, which were planned but refused);
    auto narrows them only by the trainer's facts about the model, as planner inputs."""
    from convoy.plan.candidates import TrainerFacts
    from convoy.plan.hardware import parse_hardware
    from convoy.plan.model import from_hf_config

    model, hw = from_hf_config(_gpt_config()), parse_hardware("8xH100-80GB")
    cands = list(convoy.plan.candidates.enumerate_candidates(model, hw, global_batch=8, micro_batch=1))
    named = {c.name: c for c in cands}
    assert {"ddp", "zero3", "zero3+tp2", "tp8", "ddp+pp2", "zero1+pp2", "tp2+pp4", "zero1+tp2+pp2", "ddp+tp2",
            "zero1+tp2", "ddp+tp2+pp2"} <= set(named)
    assert named["tp8"].strategy == "parallel" and named["tp2+pp4"].strategy == "parallel"
    assert [dp_engine_for(named[n].strategy, named[n].dims) for n in ("zero1+tp2+pp2", "ddp+tp2", "zero1+pp2", "tp8")
            ] == ["zero1", "ddp", "zero1", None]
    only = TrainerFacts(tp_degrees=(2,), pp_degrees=(), fsdp=False)
    kept = {c.name for c in convoy.plan.candidates.enumerate_candidates(model, hw, global_batch=8, micro_batch=1,
                                                                       facts=only)}
    # tp2 only, no pp, and nothing FSDP2 runs (zero2/zero3, offload, and dp beside tp, whose DTensors it holds)
    assert kept == {"ddp", "zero1"}


# --- on the device at hand: its measured rates rank the layouts ------------------------------------------------

GPT2_SMALL = {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
              "n_positions": 1024}


def _planted_rates(tp2_speedup: float):
    """A cached calibration of this CPU in which GPT-2 small's tp2 GEMMs run ``tp2_speedup`` x faster than its
    whole-model ones (1 TFLOP/s): what auto reads instead of measuring."""
    from convoy.plan.model import resolve_model
    from convoy.plan.run import RunSpec
    from convoy.plan.speed.measure import device_identity
    from convoy.plan.speed.records import Calibration, attention_key, gemm_key, save_calibration
    from convoy.plan.timing import attention_shape, gemm_shapes

    spec, run = resolve_model(GPT2_SMALL), RunSpec(precision="fp32")
    name, uuid, version = device_identity("cpu")
    rates = {gemm_key(m, k, n, "fp32"): 1e12 * (tp2_speedup if tp == 2 else 1)
             for tp in (1, 2) for m, k, n, _ in gemm_shapes(spec, run, tp=tp)}
    attention = {attention_key(*attention_shape(spec, run, tp=tp), "fp32"): 1e-4 for tp in (1, 2)}
    save_calibration(Calibration(device_name=name, device_uuid=uuid, torch_version=version, device_type="cpu",
                                 gemm_flops=rates, attention_seconds=attention, memory_bytes_per_s=1e12,
                                 launch_seconds=1e-6, pointwise_seconds_per_byte=1e-12, measured_at=1.7e9))


def _auto_gpt2(device="cpu"):
    return auto_strategy(num_parameters=124_439_808, world_size=2, device_bytes=64 * GIB, model=GPT2_SMALL,
                         tp_degrees=(2,), device=device)


def test_the_rates_measured_on_the_device_time_the_plan_but_a_model_that_fits_one_process_is_not_split(
        tmp_path, monkeypatch):
    import convoy.plan.speed.measure as cal

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(cal, "measure", lambda *a, **k: pytest.fail("a cached record was measured again"))
    _planted_rates(tp2_speedup=1)  # GEMMs as fast at either split: a replica per process wins (no tp traffic)
    layout = _auto_gpt2()
    assert layout.name == "ddp", layout
    assert "Step times: rates measured on this machine (cpu" in layout.reason and "1 TFLOP/s" in layout.reason
    # the split model's GEMMs measured 100x faster make tp2 the planner's fastest, but GPT-2 small fits one
    # process of 64 GiB (the guide's case 1): data parallelism, and the line says why tp was not used
    _planted_rates(tp2_speedup=100)
    layout = _auto_gpt2()
    assert layout.name == "ddp" and "case 1" in layout.reason, layout
    assert "100 TFLOP/s median matmul, 1000 GB/s memory)." in layout.reason
    assert layout.reason.endswith("so tensor and pipeline parallelism (communication in every layer, a pipeline "
                                  "bubble) were not used."), layout.reason
    assert "rates measured" not in _auto_gpt2(device=None).reason  # no device: the datasheet of a generic one


def test_auto_measures_each_split_once_and_then_reads_the_cache(tmp_path, monkeypatch):
    from functools import partial

    import convoy.plan.speed.measure as cal
    from convoy.plan.speed.records import cache_path, load_calibration

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(cal, "measure", partial(cal.measure, reps=2, copy_bytes=1 << 20))
    model = TinyGPT(TinyConfig())
    layout = auto_strategy(num_parameters=count(model), world_size=2, device_bytes=64 * GIB, model=model,
                           tp_degrees=(2,), device="cpu")
    assert "rates measured on this machine (cpu" in layout.reason, layout
    name, uuid, version = cal.device_identity("cpu")
    record = load_calibration(device_name=name, device_uuid=uuid, torch_version=version, path=cache_path())
    # one tp rank's GEMMs at tp1 and at tp2 (TinyGPT, dim 16: fused q/k/v of 48 columns, 24 on a tp2 rank,
    # whose output projection reads 8 of the 16 rows)
    assert {"2048x16x48:fp32", "2048x16x24:fp32", "2048x8x16:fp32"} <= set(record.gemm_flops), record.gemm_flops
    monkeypatch.setattr(cal, "measure", lambda *a, **k: pytest.fail("a cached record was measured again"))
    again = auto_strategy(num_parameters=count(model), world_size=2, device_bytes=64 * GIB, model=model,
                          tp_degrees=(2,), device="cpu")
    assert again == layout


def test_a_failed_measurement_leaves_the_unmeasured_rates_and_the_job_goes_on(tmp_path, monkeypatch):
    import convoy.plan.speed.measure as cal

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

    def out_of_memory(*args, **kwargs):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")

    monkeypatch.setattr(cal, "measure", out_of_memory)
    layout = _auto_gpt2()
    assert layout.name == "ddp"
    assert layout.reason.endswith("Step times: measuring cpu failed, CUDA out of memory. Tried to allocate 2.00 "
                                  "GiB; step times use the shape-aware model on a generic device."), layout.reason


def test_a_model_without_a_shape_is_not_measured(tmp_path, monkeypatch):
    """A pipeline split of a model whose heads are unknown is costed without a shape: rates at its shapes cannot
    apply, so nothing is measured and the reason claims none."""
    import convoy.plan.speed.measure as cal
    from convoy.plan.model import ModelSpec

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(cal, "measure", lambda *a, **k: pytest.fail("measured a model without a shape"))
    spec = ModelSpec(name="mlp", num_params=10**8)
    layout = auto_strategy(num_parameters=10**8, world_size=2, device_bytes=64 * GIB, model=spec,
                           pp_degrees=(2,), device="cpu")
    assert layout is not None and "Step times" not in layout.reason, layout


def test_only_rank_zero_on_a_gpu_measures():
    from convoy.train.settings import TrainSettings
    from convoy.train.strategies.build import _measured_here

    assert _measured_here(TrainSettings(device_type="cuda", rank=0, local_rank=3, world_size=8,
                                        local_world_size=4)) == "cuda:3"
    assert _measured_here(TrainSettings(device_type="cuda", rank=1, local_rank=0, world_size=8,
                                        local_world_size=4)) is None
    assert _measured_here(TrainSettings(device_type="cpu")) is None


@pytest.mark.gpu
def test_auto_on_a_gpu_plans_with_its_table_row_and_rates_measured_on_it(tmp_path, monkeypatch):
    """Runs on a GPU machine: rank 0's planner measures the GPU at GPT-2 small's shapes (tp1 and tp2, bf16),
    caches them, and the reason names the device."""
    from convoy.plan.speed.measure import device_identity
    from convoy.plan.speed.records import cache_path, load_calibration

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    warm = torch.ones(64, 64, device="cuda:0")
    (warm @ warm).sum().item()  # cuBLAS's workspace, which stays allocated for the process, is in the baseline
    del warm
    baseline = torch.cuda.memory_allocated()
    layout = auto_strategy(num_parameters=124_439_808, world_size=2, device_bytes=64 * GIB, model=GPT2_SMALL,
                           tp_degrees=(2,), mixed_precision="bf16", device="cuda:0")
    name, uuid, version = device_identity("cuda:0")
    assert f"Step times: rates measured on this machine ({name}" in layout.reason, layout.reason
    record = load_calibration(device_name=name, device_uuid=uuid, torch_version=version, path=cache_path())
    assert {"2048x768x2304:bf16", "2048x768x1152:bf16"} <= set(record.gemm_flops), record.gemm_flops
    # the measurement's tensors (256 MiB copy buffers, a 196 MiB bf16 logits GEMM) are gone; a library workspace
    # the bf16 kernels may keep for the process (cuBLASLt, cuDNN) is not one of them
    assert torch.cuda.memory_allocated() - baseline < 32 * 2**20


def test_on_several_machines_auto_keeps_tp_inside_one():
    """16 processes, a 39B shape (64 heads) and 80 GiB each: on one machine of 16 devices the planner splits
    by tp8 (dp=2); on 4 machines of 4 it never splits across the network (tp <= 4) and says it planned for nodes."""
    from convoy.train.settings import TrainSettings
    from convoy.train.strategies.build import _nodes

    model = meta_gpt(TinyConfig(vocab=32000, dim=8192, heads=64, layers=48, hidden=22016))

    def layout(nodes):
        return choose_strategy(world_size=16, num_parameters=count(model), device_bytes=80 * GIB,
                               planner=planner_hook("bf16"), model=model, options={}, nodes=nodes)

    one = layout(1)
    assert one.name == "parallel" and (one.dims.dp, one.dims.tp) == (2, 8), one
    for nodes in (2, 4):
        several = layout(nodes)
        assert (16 // nodes) % (several.dims.tp if several.dims else 1) == 0, several  # tp inside a machine
        assert "multi-node" in several.reason, several.reason
    assert (layout(4).dims.tp if layout(4).dims else 1) < one.dims.tp

    # the Accelerator's reading of the launch: WORLD_SIZE / LOCAL_WORLD_SIZE when even, else one machine
    assert _nodes(TrainSettings(world_size=16, local_world_size=4)) == 4
    assert _nodes(TrainSettings(world_size=6, local_world_size=4)) == 1
    assert _nodes(TrainSettings()) == 1


# --- never a layout the model cannot be wrapped in (issue 24, item 4) ------------------------------------------

class Scalars(torch.nn.Module):
    """Accelerate's RegressionModel (y = a * x + b with 0-dim a, b), which fully_shard refuses."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.tensor(2.0))
        self.b = torch.nn.Parameter(torch.tensor(3.0))
        self.body = torch.nn.Linear(512, 512)  # 262,656 parameters: bf16 got zero3 for the 268K model


def test_a_model_fsdp2_cannot_wrap_never_gets_an_fsdp2_layout():
    model = Scalars()
    for precision in ("bf16", "no"):
        layout = choose_strategy(world_size=2, num_parameters=count(model), device_bytes=12 * GIB,
                                 planner=planner_hook(precision), model=model)
        assert layout.name in ("ddp", "zero1"), layout
        assert "FSDP2 layouts (zero2, zero3) were left out: it cannot shard this model (parameter 'a' is a " \
               "scalar (0-dim)" in layout.reason
    # too big for one device: the rule shards what it can (optimizer state), not zero3
    layout = choose_strategy(world_size=2, num_parameters=10**12, device_bytes=GIB, planner=planner_hook("no"),
                             model=model)
    assert layout.name == "zero1" and "FSDP2 cannot shard it (parameter 'a' is a scalar" in layout.reason


def test_the_planners_filter_leaves_out_every_layout_the_trainer_shards_with_fsdp2():
    # 6e9 fp32 on 4 x 80 GiB: zero2/zero3 fit, nothing else does; without them the planner declines
    assert auto_strategy(num_parameters=6 * 10**9, world_size=4, device_bytes=80 * GIB).name in ("zero2", "zero3")
    assert auto_strategy(num_parameters=6 * 10**9, world_size=4, device_bytes=80 * GIB, fsdp_limit="why") is None
    # a tp layout beside dp is FSDP2 too (bf16 on 8 x 20 GiB chose dp=4 x tp=2 when this was written)
    model = meta_gpt()
    chosen = {}
    for gib in (16, 20, 24, 40):
        for limit in (None, "why"):
            chosen[gib, limit] = auto_strategy(num_parameters=count(model), world_size=8, device_bytes=gib * GIB,
                                               precision="bf16", model=model, tp_degrees=(2, 4, 8), fsdp_limit=limit)
    assert any(layout_shards_with_fsdp(chosen[gib, None]) for gib in (16, 20, 24, 40)), chosen
    assert not any(chosen[gib, "why"] and layout_shards_with_fsdp(chosen[gib, "why"]) for gib in (16, 20, 24, 40))


@pytest.mark.parametrize("strategy, dims, fsdp", [
    ("zero3", ParallelDims(dp_replicate=2), True), ("zero2", ParallelDims(), True), ("ddp", ParallelDims(), False),
    ("zero1", ParallelDims(dp_replicate=2), False), ("zero3", ParallelDims(dp_replicate=2, tp=2), True),
    ("zero3", ParallelDims(tp=2), False), ("ddp", ParallelDims(dp_replicate=2, pp=2), False),
    ("zero1", ParallelDims(dp_replicate=2, tp=2, pp=2), True),  # 3D: FSDP2 per stage
    ("ddp", ParallelDims(dp_replicate=2, tp=2), True),  # whole replicas of DTensor weights: FSDP2's replicate
    ("hsdp", ParallelDims(dp_replicate=2, dp_shard=2), True),
])
def test_shards_with_fsdp_follows_how_the_trainer_runs_each_candidate(strategy, dims, fsdp):
    assert shards_with_fsdp(strategy, dims) is fsdp


def test_a_planner_of_the_users_that_picks_fsdp2_for_such_a_model_is_not_followed():
    layout = choose_strategy(world_size=2, num_parameters=10, device_bytes=GIB, model=Scalars(),
                             planner=lambda **_: ("zero3", "mine"))
    assert layout.name == "ddp" and "left out" in layout.reason


@pytest.mark.parametrize("mixed_precision", [None, "bf16"])
def test_a_small_model_on_cpu_processes_gets_ddp_and_an_explanation_about_them(mixed_precision):
    """A 268K-parameter model under bf16 on 2 processes got zero3, explained by "the model fits on one GPU ... whose
    memory is 11.8 GiB" on a CPU job: collective latency and FSDP's copies now keep it on DDP, and the line speaks
    of CPU processes and their share of the machine's memory."""
    from convoy.train.strategies.auto import auto_strategy

    layout = auto_strategy(num_parameters=268_000, world_size=2, device_bytes=11 * 2**30,
                           mixed_precision=mixed_precision, device_type="cpu")
    assert layout.name == "ddp"
    assert "CPU process" in layout.reason and "share of this machine's memory is 11.0 GiB" in layout.reason
    assert "GPU" not in layout.reason


def test_the_offload_the_planner_turned_is_applied_by_the_strategy_built():
    """auto's answer with cpu_offload (nothing fit as asked) is built with FSDP2's CPUOffloadPolicy, as planned."""
    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy

    from convoy.train.settings import resolve_settings
    from convoy.train.strategies.build import build_strategy
    from convoy.train.strategies.fsdp import offload_policy

    settings = resolve_settings(env={}, cpu=True)
    try:
        strategy = build_strategy(settings, model=torch.nn.Linear(4, 4), planner=lambda **_: AutoLayout(
            name="zero3", reason="nothing fits as asked", cpu_offload=True))
        assert strategy.name == "zero3" and strategy.context.options == {"cpu_offload": True}
        assert isinstance(offload_policy(strategy.context.options), CPUOffloadPolicy)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_the_recompute_the_planner_turned_is_applied_by_the_strategy_built():
    """auto's answer with recompute (nothing fit without it) reaches the strategy's settings, which apply it; a run
    that asks for recomputation itself is planned with it, so the knob is not turned again."""
    import torch.distributed as dist

    from convoy.train.settings import resolve_settings
    from convoy.train.strategies.auto import ConvoyPlanner
    from convoy.train.strategies.build import build_strategy

    settings = resolve_settings(env={}, cpu=True)
    try:
        strategy = build_strategy(settings, model=torch.nn.Linear(4, 4), planner=lambda **_: AutoLayout(
            name="single", reason="nothing fits as asked", recompute="full"))
        assert strategy.name == "single" and strategy.context.recompute == "full"
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    asked = ConvoyPlanner(mixed_precision="bf16", recompute="full")(
        num_parameters=count(meta_gpt()), world_size=4, device_bytes=int(28 * GIB), model=meta_gpt(),
        tp_degrees=(2, 4))
    assert asked.recompute is None and "Turning on recompute" not in asked.reason, asked
