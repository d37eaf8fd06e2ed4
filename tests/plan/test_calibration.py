"""Calibration: the cache (format, keys, invalidation), how measured rates change step times, and measuring."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from convoy.devices.inventory import load_inventory
from convoy.errors import ConvoyWarning
from convoy.plan.activations import block_bytes, head_saved_bytes
from convoy.plan.api import plan, plan_for
from convoy.plan.hardware import parse_hardware
from convoy.plan.memory import Layout
from convoy.plan.model import from_hf_config
from convoy.plan.run import RunSpec
from convoy.plan.speed.collectives import Group, collective_seconds
from convoy.plan.speed.measure import resolve_calibration
from convoy.plan.speed.rates import ModeledRates
from convoy.plan.speed.records import (
    FORMAT,
    Calibration,
    attention_key,
    cache_path,
    calibration_key,
    gemm_key,
    load_calibration,
    save_calibration,
)
from convoy.plan.timing import (
    DDP_BUCKET_BYTES,
    NCCL_LINK_FRACTION,
    attention_shape,
    gemm_shapes,
    model_flops_per_token,
    step_time,
)

CONFIGS = Path(__file__).parent / "configs"
GPT2 = from_hf_config(CONFIGS / "gpt2.json")
RUN = RunSpec(seq_len=1024, micro_batch=8, precision="bf16-autocast", attention="flash")
H100 = parse_hardware("1xH100-80GB")


def _record(rate: float = 400e12, attn: float = 2e-3, **kw) -> Calibration:
    """A fake H100 record with every GPT-2 GEMM shape at ``rate`` FLOP/s."""
    gemms = {gemm_key(m, k, n, "bf16"): rate for m, k, n, _ in gemm_shapes(GPT2, RUN)}
    fields = dict(device_name="NVIDIA H100 80GB HBM3", device_uuid="GPU-1234", torch_version="2.11.0+cu130",
                  gemm_flops=gemms, attention_seconds={attention_key(*attention_shape(GPT2, RUN), "bf16"): attn},
                  memory_bytes_per_s=3.0e12, launch_seconds=5e-6, measured_at=1.7e9)
    return Calibration(**{**fields, **kw})


def test_cache_round_trip_and_what_invalidates_it(tmp_path):
    path = tmp_path / "calibration.json"
    rec = _record()
    assert save_calibration(rec, path=path) == path
    ident = dict(device_name=rec.device_name, device_uuid=rec.device_uuid, torch_version=rec.torch_version)
    assert load_calibration(**ident, path=path) == rec
    assert load_calibration(**{**ident, "torch_version": "2.12.0"}, path=path) is None  # another torch
    assert load_calibration(**{**ident, "device_uuid": "GPU-5678"}, path=path) is None  # another board
    data = json.loads(path.read_text())
    key = calibration_key(rec.device_name, "GPU-1234", "2.11.0+cu130")
    assert list(data) == [key] == ["GPU-1234|torch 2.11.0+cu130"]
    data[rec.key]["format"] = FORMAT - 1  # an older format is measured again, not misread
    path.write_text(json.dumps(data))
    assert load_calibration(**ident, path=path) is None
    path.write_text("{not json")  # a damaged cache is ignored, then overwritten
    assert load_calibration(**ident, path=path) is None
    save_calibration(rec, path=path)
    assert load_calibration(**ident, path=path) == rec


def test_saving_merges_new_shapes_into_the_entry(tmp_path):
    path = tmp_path / "c.json"
    save_calibration(_record(), path=path)
    extra = _record(gemm_flops={"1x2x3:bf16": 1e12}, attention_seconds={}, memory_bytes_per_s=2.5e12,
                    measured_at=1.7e9)
    save_calibration(extra, path=path)
    got = load_calibration(device_name=extra.device_name, device_uuid="GPU-1234", torch_version="2.11.0+cu130",
                           path=path)
    assert got.gemm_flops["1x2x3:bf16"] == 1e12 and len(got.gemm_flops) == len(_record().gemm_flops) + 1
    assert got.attention_seconds == _record().attention_seconds and got.memory_bytes_per_s == 2.5e12


def test_cache_file_lives_under_the_user_cache_dir():
    assert cache_path({"XDG_CACHE_HOME": "/x"}) == Path("/x/convoy/calibration.json")
    assert cache_path({}).parts[-3:] == (".cache", "convoy", "calibration.json")


def test_measured_rates_replace_the_fixed_efficiency():
    layout = Layout()
    sheet = step_time(GPT2, RUN, layout, H100, global_batch=8, efficiency=0.5)
    assert sheet.time_model == "datasheet"
    # only GEMMs (no memory traffic, no launches, attention free): the step is the GEMM FLOPs at the rate
    rec = _record(attn=0.0, memory_bytes_per_s=float("inf"), launch_seconds=0.0)
    fast = step_time(GPT2, RUN, layout, H100, global_batch=8, calibration=rec)
    flops = sum(3 * count * 2 * m * k * n for m, k, n, count in gemm_shapes(GPT2, RUN))
    assert fast.time_model == "calibrated" and fast.seconds == pytest.approx(flops / 400e12)
    half = step_time(GPT2, RUN, layout, H100, global_batch=8,
                     calibration=_record(200e12, attn=0.0, memory_bytes_per_s=float("inf"), launch_seconds=0.0))
    assert half.seconds == pytest.approx(2 * fast.seconds)
    # attention, memory traffic and launches each add time
    full = step_time(GPT2, RUN, layout, H100, global_batch=8, calibration=_record())
    assert full.seconds > fast.seconds + 12 * 2e-3
    assert full.mfu == pytest.approx(model_flops_per_token(GPT2, 1024) * 8192 / (full.seconds * 989.4e12))
    # a measured cost per saved byte replaces the 4x-traffic-at-bandwidth estimate for memory-bound work
    only_pointwise = _record(attn=0.0, memory_bytes_per_s=float("inf"), launch_seconds=0.0,
                             pointwise_seconds_per_byte=1e-12)
    pw = step_time(GPT2, RUN, layout, H100, global_batch=8, calibration=only_pointwise)
    saved = 12 * block_bytes(GPT2, RUN) + head_saved_bytes(GPT2, RUN)
    assert pw.seconds == pytest.approx(fast.seconds + saved * 1e-12)


def test_a_gemm_measured_above_the_peak_raises_the_peak_mfu_is_taken_against():
    """--peak-tflops 100 on an H100 that measured 400 TFLOPs (or fp32 GEMMs on TF32 tensor cores, or a GPU the
    table lacks): MFU against the lower figure was about 4 x the efficiency; the plan still stands."""
    low_peak = plan_for(GPT2, RUN, parse_hardware("1xH100-80GB", peak_tflops=100), calibration=_record(400e12))
    assert all(r.time.peak_flops == 400e12 for r in low_peak.rows)
    assert 0 < max(r.time.mfu for r in low_peak.rows) <= 1.0
    at_peak = plan_for(GPT2, RUN, parse_hardware("1xH100-80GB"), calibration=_record(989.4e12))
    assert max(r.time.mfu for r in at_peak.rows) <= 1.0


def test_recompute_and_unknown_shapes():
    rec = _record(attn=0.0, memory_bytes_per_s=float("inf"), launch_seconds=0.0)
    base = step_time(GPT2, RUN, Layout(), H100, global_batch=8, calibration=rec)
    full = step_time(GPT2, replace(RUN, recompute="full"), Layout(), H100, global_batch=8, calibration=rec)
    blocks = sum(count * 2 * m * k * n for m, k, n, count in gemm_shapes(GPT2, RUN) if count > 1)
    assert full.seconds == pytest.approx(base.seconds + blocks / 400e12)  # every block's GEMMs forward again
    half = step_time(GPT2, replace(RUN, recompute="full", recompute_every=2), Layout(), H100, global_batch=8,
                     calibration=rec)  # every other block checkpointed: half of them again
    assert half.seconds == pytest.approx(base.seconds + blocks / 2 / 400e12)
    # shapes the record lacks: the shape-aware model, scaled by the record's own median of measured / modeled
    other = replace(RUN, seq_len=512)
    t = step_time(GPT2, other, Layout(), H100, global_batch=8, calibration=rec)
    model = ModeledRates(H100.gpu)
    scale = statistics.median(2 * m * k * n / 400e12 / model.gemm_seconds(m, k, n, "bf16")
                              for m, k, n, _ in gemm_shapes(GPT2, RUN))
    gemms = sum(3 * count * scale * model.gemm_seconds(m, k, n, "bf16") for m, k, n, count in gemm_shapes(GPT2, other))
    # the record's one attention shape took 0 s, which is no rate: the model's own figure at this shape
    attention = 12 * model.attention_seconds(*attention_shape(GPT2, other), "bf16")
    assert t.seconds == pytest.approx(gemms + attention)


def test_peer_bandwidth_replaces_the_datasheet_link():
    hw = parse_hardware("8xH100-80GB")
    layout = plan_for(GPT2, RUN, hw, global_batch=64).row("ddp").candidate.layout
    sheet = step_time(GPT2, RUN, layout, hw, global_batch=64)
    slow = step_time(GPT2, RUN, layout, hw, global_batch=64, calibration=_record(peer_bytes_per_s=45e9))
    # the measured copy rate is the link NCCL runs on (taken as it is); the datasheet's at NCCL's figure for NVLink
    grads = 4 * GPT2.num_params  # fp32 gradients
    buckets = math.ceil(grads / DDP_BUCKET_BYTES)
    for t, bus in ((slow, 45e9), (sheet, 450e9 * NCCL_LINK_FRACTION["nvlink"])):
        group = Group(ranks=8, nodes=1, bus_bytes_per_s=bus, link="nvlink")
        assert t.dp_comm == pytest.approx(buckets * collective_seconds("all_reduce", grads / buckets, group))


def test_without_the_planned_gpu_the_plan_says_why_and_keeps_the_profile(tmp_path, monkeypatch):
    inv = load_inventory(Path(__file__).parents[1] / "inventories" / "8xh100_nvswitch.json")
    planned = parse_hardware("1xMI300X")
    record, note = resolve_calibration(planned, GPT2, RUN, inventory=inv, path=tmp_path / "c.json")
    assert record is None and "calibration needs the MI300X" in note
    record, note = resolve_calibration(planned, GPT2, RUN, inventory=type("Empty", (), {"devices": ()})())
    assert record is None and "no GPU" in note
    import convoy.devices.discovery as discovery

    monkeypatch.setattr(discovery, "discover", lambda *a, **k: type("Empty", (), {"devices": ()})())
    p = plan(GPT2, hardware="1xH100-80GB", seq_len=1024, micro_batch=8, precision="bf16-autocast", calibrate=True)
    d = p.as_dict()["time_model"]
    assert d["kind"] == "profile" and d["calibration"] is None and "needs the H100-80GB" in d["note"]
    assert "profile shipped with convoy" in d["note"]
    assert all(r.time.time_model == "profile" for r in p.rows)
    # the planned GPU is visible but this torch cannot reach it (a CPU build): the profile, and why
    h100 = type("One", (), {"devices": (type("D", (), {"name": "NVIDIA H100 80GB HBM3"})(),)})()
    import convoy.plan.speed.measure as cal

    monkeypatch.setattr(cal, "device_identity", lambda device: (_ for _ in ()).throw(
        cal.PlanError("calibration needs a CUDA device and torch.cuda.is_available() is False")))
    record, note = resolve_calibration(H100, GPT2, RUN, inventory=h100, path=tmp_path / "c.json")
    assert record is None and "calibration failed" in note and "is_available() is False" in note
    plain = plan(GPT2, hardware="1xH100-80GB").as_dict()["time_model"]
    assert plain["kind"] == "profile" and "--calibrate" in plain["note"]
    # a GPU without a profile: the shape-aware model, said so; efficiency= asks for the flat datasheet model
    other = plan(GPT2, hardware="1xA100-80GB").as_dict()["time_model"]
    assert other["kind"] == "modeled" and "no measured profile" in other["note"]
    flat = plan(GPT2, hardware="1xH100-80GB", efficiency=0.5).as_dict()["time_model"]
    assert flat["kind"] == "datasheet" and "0.5 x the H100-80GB peak" in flat["note"]


def test_measuring_code_runs_on_the_cpu_and_caches(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from convoy.plan.speed import measure as cal

    tiny = from_hf_config({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                           "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256})
    run = RunSpec(seq_len=32, micro_batch=2, precision="fp32")
    path = tmp_path / "c.json"
    rec = cal.calibrate(tiny, run, device="cpu", path=path, reps=2, copy_bytes=1 << 20)
    assert rec.device_type == "cpu" and rec.memory_bytes_per_s > 0 and rec.launch_seconds > 0
    assert 0 < rec.pointwise_seconds_per_byte < 1e-6
    assert {gemm_key(m, k, n, "fp32") for m, k, n, _ in gemm_shapes(tiny, run)} == set(rec.gemm_flops)
    assert all(v > 0 for v in rec.gemm_flops.values()) and len(rec.attention_seconds) == 1
    monkeypatch.setattr(cal, "measure", lambda *a, **k: pytest.fail("a cached record was measured again"))
    assert cal.calibrate(tiny, run, device="cpu", path=path) == rec
    with pytest.raises(Exception, match="cuda or cpu"):
        cal.device_identity("mps:0")


def test_a_damaged_entry_is_measured_again_not_divided_by(tmp_path):
    path = tmp_path / "c.json"
    save_calibration(_record(), path=path)
    who = dict(device_name="NVIDIA H100 80GB HBM3", device_uuid="GPU-1234", torch_version="2.11.0+cu130", path=path)
    assert load_calibration(**who) == _record()
    data = json.loads(path.read_text())
    for damage in ({"gemm_flops": {"2048x768x2304:bf16": 0}}, {"gemm_flops": {"x": "fast"}},
                   {"memory_bytes_per_s": -1.0}, {"peer_bytes_per_s": float("inf")}, {"launch_seconds": True}):
        entry = {**next(iter(data.values())), **damage}
        path.write_text(json.dumps({next(iter(data)): entry}))
        assert load_calibration(**who) is None, damage
        fresh = _record(gemm_flops={"64x64x64:bf16": 1e12}, attention_seconds={})
        save_calibration(fresh, path=path)  # the damaged entry is replaced, not merged into
        assert load_calibration(**who) == fresh, damage
    path.write_text(json.dumps({next(iter(data)): {**next(iter(data.values())), "memory_bytes_per_s": 10**400}}))
    with pytest.warns(ConvoyWarning, match="memory_bytes_per_s = a number too large is above the H100-80GB's"):
        assert load_calibration(**who) is None  # a huge whole number is absurd: refused, not an OverflowError


def _tiny_cpu_model():
    return from_hf_config({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
                           "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
                           "vocab_size": 256})


def test_several_tp_degrees_measure_their_shapes_and_the_device_once(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from convoy.plan.speed import measure as cal

    tiny, run, calls = _tiny_cpu_model(), RunSpec(seq_len=32, micro_batch=2, precision="fp32"), []
    real = cal.measure

    def counted(*args, **kwargs):
        calls.append((kwargs["tp"], kwargs["device_wide"]))
        return real(*args, **{**kwargs, "reps": 1, "copy_bytes": 1 << 16})

    monkeypatch.setattr(cal, "measure", counted)
    rec = cal.calibrate(tiny, run, device="cpu", tp=(1, 2, 2), path=tmp_path / "c.json")
    assert calls == [(1, True), (2, False)]  # each degree's shapes, the device's bandwidth and launch once
    shapes = [shape for t in (1, 2) for shape in gemm_shapes(tiny, run, tp=t)]
    assert {gemm_key(m, k, n, "fp32") for m, k, n, _ in shapes} == set(rec.gemm_flops)
    assert rec.memory_bytes_per_s > 0 and len(rec.attention_seconds) == 2
    assert cal.calibrate(tiny, run, device="cpu", tp=(2, 1), path=tmp_path / "c.json") == rec and len(calls) == 2
    for bad in ((3,), (0,), ()):  # 3 does not divide the 4 heads
        with pytest.raises(cal.PlanError, match="divide the model's 4 attention heads"):
            cal.calibrate(tiny, run, device="cpu", tp=bad, path=tmp_path / "c.json")
    # a model known by its size alone: the device-wide rates once, then the cache
    bare = replace(tiny, hidden=None, heads=None, num_layers=None)
    assert cal.calibrate(bare, run, device="cpu", path=tmp_path / "c.json") == rec and len(calls) == 2
    # measured first, it leaves no pointwise rate (no hidden size to measure at): the first shaped model adds one
    first = cal.calibrate(bare, run, device="cpu", path=tmp_path / "d.json")
    assert first.pointwise_seconds_per_byte == 0 and not first.gemm_flops
    assert cal.calibrate(tiny, run, device="cpu", path=tmp_path / "d.json").pointwise_seconds_per_byte > 0


def test_an_unwritable_cache_costs_a_warning_not_the_measurement(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from functools import partial

    from convoy.plan.speed import measure as cal

    monkeypatch.setattr(cal, "measure", partial(cal.measure, reps=1, copy_bytes=1 << 16))
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    with pytest.warns(UserWarning, match="cannot write the calibration cache .* used for this plan only"):
        rec = cal.calibrate(_tiny_cpu_model(), RunSpec(seq_len=32, micro_batch=2, precision="fp32"), device="cpu",
                            path=blocked / "calibration.json")
    assert rec.gemm_flops and rec.memory_bytes_per_s > 0


@pytest.mark.gpu
def test_calibration_on_the_gpu_measures_and_the_plan_uses_it(tmp_path, monkeypatch):
    """Runs on a GPU machine: the real CUDA path, its cache, and a plan timed with it."""
    import torch

    from convoy.plan.hardware import lookup_gpu
    from convoy.plan.speed import measure as cal

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    rec = cal.calibrate(GPT2, RUN, device="cuda")
    name = torch.cuda.get_device_name(0)
    assert rec.device_name == name and rec.torch_version == torch.__version__ and rec.device_type == "cuda"
    peak = lookup_gpu(name).peak_flops("bf16")
    assert all(0.02 * peak < r < 1.05 * peak for r in rec.gemm_flops.values()), rec.gemm_flops
    assert 1e11 < rec.memory_bytes_per_s < 1e13 and 0 < rec.launch_seconds < 1e-3
    assert (tmp_path / "convoy" / "calibration.json").exists()
    p = plan(GPT2, seq_len=1024, micro_batch=8, precision="bf16-autocast", calibrate=True)
    assert p.calibration is not None and p.as_dict()["time_model"]["kind"] == "calibrated"
    assert p.row("single").time.time_model == "calibrated" and p.row("single").time.seconds > 0
