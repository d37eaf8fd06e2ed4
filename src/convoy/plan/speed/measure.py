"""Measure a device for the planner's time model: GEMMs at the model's shapes, fused attention, bandwidth.

    from convoy.plan.speed.measure import calibrate, measure
    record = calibrate(model, run, device="cuda")          # cached per device + torch version; measures what is missing
    record = calibrate(model, run, device="cuda", tp=(1, 2, 4))   # every tp degree's shapes, one record
    record = measure(model, run, device="cuda:0")         # always measures, no cache

torch is imported inside its functions only. Every number is a median of timed repetitions after a warm-up,
synchronised on the device (``torch.cuda.synchronize``). On the CPU it measures the CPU (used by tests of this code
path and for plans of CPU runs). What it records: ``convoy.plan.speed.records``.
"""

from __future__ import annotations

import functools
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from convoy.errors import PlanError
from convoy.plan.hardware import lookup_gpu
from convoy.plan.model import ModelSpec
from convoy.plan.run import RunSpec
from convoy.plan.shapes import attention_shape, gemm_shapes
from convoy.plan.speed.records import Calibration, attention_key, gemm_key, load_calibration, save_calibration

__all__ = ["calibrate", "measure", "device_identity", "resolve_calibration"]

_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def _timer(device: Any) -> Callable[[Callable[[], Any], int, int], float]:
    import torch

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def median_seconds(fn: Callable[[], Any], warmup: int, reps: int) -> float:
        for _ in range(warmup):
            fn()
        sync()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    return median_seconds


def device_identity(device: str = "cuda") -> tuple[str, str, str]:
    """(name, uuid, torch version) of ``device`` as the cache keys them."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise PlanError("calibration needs a CUDA device and torch.cuda.is_available() is False")
        props = torch.cuda.get_device_properties(dev.index or 0)
        return props.name, str(getattr(props, "uuid", "") or ""), torch.__version__
    if dev.type == "cpu":
        import platform

        return f"cpu {platform.processor() or platform.machine()}", "", torch.__version__
    raise PlanError(f"calibration measures cuda or cpu devices, not {device!r}")


def measure(model: ModelSpec, run: RunSpec, *, device: str = "cuda", tp: int = 1, reps: int = 10,
            copy_bytes: int = 1 << 28, gemms: bool = True, attention: bool = True, device_wide: bool = True,
            peer: bool = True) -> Calibration:
    """Measure ``model``'s GEMM shapes and attention for ``run`` (one tp rank's share) on ``device`` and, with
    ``device_wide``, its bandwidth, launch overhead and pointwise cost; the peer bandwidth too when several CUDA
    devices are visible and ``peer`` (which touches a second GPU: a training rank measuring its own device
    passes False)."""
    import torch
    import torch.nn.functional as F

    dev = torch.device(device)
    name, uuid, version = device_identity(device)
    timed = _timer(dev)
    dtype_name = run.recipe.compute
    dtype = getattr(torch, _DTYPES[dtype_name])
    flops: dict[str, float] = {}
    if gemms and model.has_shape:
        for m, k, n, _ in gemm_shapes(model, run, tp=tp):
            key = gemm_key(m, k, n, dtype_name)
            if key in flops:
                continue
            a, b = torch.randn(m, k, device=dev, dtype=dtype), torch.randn(k, n, device=dev, dtype=dtype)
            flops[key] = 2 * m * k * n / timed(functools.partial(torch.mm, a, b), 2, reps)
            del a, b
    attn: dict[str, float] = {}
    if attention and model.has_shape:
        bsz, heads, kv, seq, hd = attention_shape(model, run, tp=tp)
        query = torch.randn(bsz, heads, seq, hd, device=dev, dtype=dtype, requires_grad=True)
        keys = torch.randn(bsz, kv, seq, hd, device=dev, dtype=dtype, requires_grad=True)
        values = torch.randn(bsz, kv, seq, hd, device=dev, dtype=dtype, requires_grad=True)

        def fwd_bwd() -> None:
            out = F.scaled_dot_product_attention(query, keys, values, is_causal=True, enable_gqa=kv != heads)
            out.backward(torch.ones_like(out))

        attn[attention_key(bsz, heads, kv, seq, hd, dtype_name)] = timed(fwd_bwd, 2, reps)
        del query, keys, values
    bandwidth = launch = pointwise = 0.0
    peer_rate = None
    if device_wide:
        src = torch.empty(copy_bytes // 4, device=dev, dtype=torch.float32)
        dst = torch.empty_like(src)
        bandwidth = 2 * copy_bytes / timed(lambda: dst.copy_(src), 2, reps)
        small = torch.zeros(16, device=dev)
        launch = timed(lambda: [small.add_(1) for _ in range(100)], 1, reps) / 100
        pointwise = _pointwise_seconds_per_byte(model, run, dev, dtype, timed, reps) if model.has_shape else 0.0
        if peer and _several_gpus(device):
            other = torch.empty_like(src, device=torch.device("cuda", 1 if (dev.index or 0) == 0 else 0))
            peer_rate = copy_bytes / timed(lambda: other.copy_(src), 2, reps)
            del other
        del src, dst
    return Calibration(device_name=name, device_uuid=uuid, torch_version=version, device_type=dev.type,
                       gemm_flops=flops, attention_seconds=attn, memory_bytes_per_s=bandwidth,
                       launch_seconds=launch, pointwise_seconds_per_byte=pointwise, peer_bytes_per_s=peer_rate,
                       measured_at=time.time())


def _pointwise_seconds_per_byte(model: ModelSpec, run: RunSpec, dev: Any, dtype: Any, timed, reps: int) -> float:
    """Forward + backward of a memory-bound chain like a block's (LayerNorm in fp32, GPT-2's unfused tanh GELU,
    SiLU x up, residual add) on (tokens, hidden) under autocast, per byte it saves for backward."""
    import torch
    import torch.nn.functional as F

    h = model.hidden or 1
    m = max(1, min(run.seq_len * run.micro_batch, (1 << 26) // h))  # at most 64M elements
    x = torch.randn(m, h, device=dev, dtype=torch.float32, requires_grad=True)
    saved: dict[int, int] = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    def chain(count: bool = False) -> None:
        with torch.autograd.graph.saved_tensors_hooks(pack if count else (lambda t: t), lambda t: t):
            with torch.autocast(dev.type, dtype=dtype, enabled=dtype != torch.float32):
                y = F.layer_norm(x, (h,))
                g = 0.5 * y * (1.0 + torch.tanh(0.7978845608 * (y + 0.044715 * torch.pow(y, 3.0))))
                lo = y.to(dtype)
                out = g + F.silu(lo) * lo + x
        out.backward(torch.ones_like(out))

    chain(count=True)
    x.grad = None
    seconds = timed(chain, 1, reps)
    return seconds / max(1, sum(saved.values()))


def _several_gpus(device: str) -> bool:
    """True when ``device`` is a CUDA device and another one is visible (the peer bandwidth can be measured)."""
    import torch

    return torch.device(device).type == "cuda" and torch.cuda.device_count() > 1


def calibrate(model: ModelSpec, run: RunSpec, *, device: str = "cuda", tp: int | tuple[int, ...] = 1,
              path: Path | None = None, peer: bool = True, **kwargs: Any) -> Calibration:
    """The cached record for ``device`` with what it lacks measured (then cached): one tp rank's shapes of
    ``model`` at ``tp``, or at each degree of a tuple ``tp`` (the layouts a plan compares; each must divide the
    model's heads), and the device-wide rates once. A cache that cannot be written costs only the next run's
    measurement: the record is returned all the same (with a warning). ``peer``: also the bandwidth to another
    visible GPU (see ``measure``)."""
    degrees = tuple(dict.fromkeys((tp,) if isinstance(tp, int) else tp))
    bad = [t for t in degrees if not isinstance(t, int) or t < 1 or (model.heads and model.heads % t)]
    if bad or not degrees:
        raise PlanError(f"calibration tp degrees {bad or list(degrees)}: give degrees >= 1 that divide the model's "
                        f"{model.heads} attention heads")
    name, uuid, version = device_identity(device)
    cached = load_calibration(device_name=name, device_uuid=uuid, torch_version=version, path=path)
    dtype = run.recipe.compute
    record, measured = cached, False
    for t in degrees:
        need_gemm = need_attn = model.has_shape
        if record is not None and model.has_shape:
            need_gemm = any(gemm_key(m, k, n, dtype) not in record.gemm_flops
                            for m, k, n, _ in gemm_shapes(model, run, tp=t))
            need_attn = attention_key(*attention_shape(model, run, tp=t), dtype) not in record.attention_seconds
        device_wide = (record is None or not record.memory_bytes_per_s
                       or (model.has_shape and not record.pointwise_seconds_per_byte)  # a shapeless first record
                       or (peer and record.peer_bytes_per_s is None and _several_gpus(device)))
        if not (need_gemm or need_attn or device_wide):
            continue
        fresh = measure(model, run, device=device, tp=t, gemms=need_gemm, attention=need_attn,
                        device_wide=device_wide, peer=peer, **kwargs)
        record, measured = (record.merged(fresh) if record is not None else fresh), True
    assert record is not None  # the first degree measured the device-wide rates when nothing was cached
    if measured:
        try:
            save_calibration(record, path=path)
        except PlanError as err:
            warnings.warn(f"{err}; the rates just measured are used for this plan only", stacklevel=2)
    return record


def resolve_calibration(hw: Any, model: ModelSpec, run: RunSpec, *, tp: int = 1, inventory: Any = None,
                        path: Path | None = None) -> tuple[Calibration | None, str]:
    """The calibration ``convoy plan --calibrate`` uses, or None and why it was not measured.

    Measures only when a device of the planned kind is visible here (the inventory, else this machine's
    discovery); a plan without it keeps the GPU's profile or the shape-aware model (``convoy.plan.speed.rates``)."""
    if inventory is None:
        try:
            from convoy.devices.discovery import discover

            inventory = discover()
        except Exception as err:  # noqa: BLE001 -- probing is best effort: the plan still stands without it
            return None, f"calibration skipped, no device probe ({err})"
    visible = []
    for d in getattr(inventory, "devices", ()) or ():
        try:
            visible.append(lookup_gpu(d.name).name)
        except PlanError:
            visible.append(d.name)
    if hw.gpu.name not in visible:
        here = ", ".join(sorted(set(visible))) or "no GPU"
        return None, f"calibration needs the {hw.gpu.name} being planned for, and this machine has {here}"
    try:
        record = calibrate(model, run, device="cuda", tp=tp, path=path)
    except PlanError as err:  # e.g. a CPU-only torch on a GPU machine: the plan stands without it
        return None, f"calibration failed ({err})"
    return record, ""
