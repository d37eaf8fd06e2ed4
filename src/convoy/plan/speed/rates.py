"""How fast a GPU runs each kind of kernel a training step is made of: GEMMs, fused attention, memory-bound work.

    from convoy.plan.speed.rates import rates_for
    rates = rates_for(gpu)                                   # a shipped profile, else the shape-aware model
    rates = rates_for(gpu, calibration=record)               # rates measured here (``convoy plan --calibrate``)
    rates = rates_for(gpu, efficiency=0.5)                   # the flat datasheet model (``--efficiency``)
    rates.gemm_seconds(8192, 768, 2304, "bf16"), rates.attention_seconds(8, 12, 12, 1024, 64, "bf16")

``rates_for`` picks the best of four sources, and ``Rates.kind`` / ``Rates.describe`` name it in every plan:
``calibrated`` (a ``Calibration`` of this device, ``MeasuredRates``), ``profile`` (a record shipped for the planned
board, ``convoy.plan.speed.profiles``, used the same way), ``modeled`` (``ModeledRates``: tiles in waves over the
board's compute units at its power-limited clock) and ``datasheet`` (``FlatRates``: one fraction of the peak).
Shapes a measured record lacks come from the shape-aware model scaled to that record. The model, its constants
and its accuracy against the H100 profile: docs/planner.md, "Where the rates come from".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from convoy.plan.architectures import Architecture, architecture_of
from convoy.plan.hardware import GpuSpec
from convoy.plan.memo import hashed_once
from convoy.plan.speed.profiles import profile_for
from convoy.plan.speed.records import Calibration, attention_key, gemm_key, time_model
from convoy.plan.units import GB

TYPE_CHECKING = False  # typing is not imported at run time: a plan starts without it
if TYPE_CHECKING:
    from typing import Protocol
else:
    Protocol = object  # Rates is a protocol for the type checker; nothing checks an object against it at run time

__all__ = ["Rates", "ModeledRates", "MeasuredRates", "FlatRates", "StackGemms", "rates_for", "GEMM_FLOOR_S",
           "TILE_FILL_K", "UNALIGNED_FACTOR", "ATTENTION_FLOOR_S", "POINTWISE_TRAFFIC", "LAUNCH_S"]

#: seconds every timed GEMM costs beyond its tiles (the profile's host: launch and synchronisation; least squares
#: over the H100 profile's 31 products with the tile model's other terms fixed)
GEMM_FLOOR_S = 22.5e-6
#: a tile's pipeline fill and drain, in k (two 64-deep k-steps of the main loop that no MMA overlaps)
TILE_FILL_K = 128
#: the compute rate of a GEMM with a feature dimension (k or n) that is not a multiple of 8 elements, as a fraction
#: of an aligned one: a row of such a matrix does not start on a 16-byte boundary, so the tensor-core kernels' vector
#: and bulk-copy loads cannot be used (the H100 profile: n = 50257, GPT-2's vocabulary). The token count m is never a
#: row length (the activations are m rows of k, the outputs m rows of n; the weight gradient reads them transposed),
#: so an odd m costs only its tiles: measured on an H200, 8191 tokens through a Llama 3 8B block trained at 53-58 %
#: MFU (benchmarks/step_throughput.py, docs/planner-accuracy.md section 7)
UNALIGNED_FACTOR = 1 / 5.5
#: seconds each attention forward + backward costs beyond its FLOPs (least squares over the H100 profile)
ATTENTION_FLOOR_S = 207e-6
#: bytes read and written, forward and backward, per byte of activations a chain of norm / activation / residual
#: kernels saves for backward (the H100 profile's pointwise cost x its measured bandwidth: 14.96)
POINTWISE_TRAFFIC = 15.0
#: seconds per small kernel launched from eager PyTorch (the H100 profile's host: 6.9 us)
LAUNCH_S = 6.9e-6
_ALIGN = 8


class Rates(Protocol):
    """What a device achieves: the time model's only view of the hardware's speed."""

    @property
    def kind(self) -> str:
        """``"calibrated"``, ``"profile"``, ``"modeled"`` or ``"datasheet"``: where the rates come from."""
        ...

    @property
    def memory_bytes_per_s(self) -> float:
        """Bandwidth of large device-memory copies (the optimizer step, FSDP's copies, DDP's buckets)."""
        ...

    @property
    def pointwise_seconds_per_byte(self) -> float:
        """Forward + backward of memory-bound work per byte it saves for backward (0: charged by the bytes rule)."""
        ...

    @property
    def launch_seconds(self) -> float:
        """Seconds per small kernel launch (the floor of a step made of many small kernels)."""
        ...

    @property
    def peer_bytes_per_s(self) -> float | None:
        """Measured copy bandwidth to another GPU of the node; None: the link's datasheet figure."""
        ...

    def gemm_seconds(self, m: int, k: int, n: int, dtype: str) -> float: ...

    def attention_seconds(self, batch: int, heads: int, kv_heads: int, seq: int, head_dim: int,
                          dtype: str) -> float: ...

    def peak_seen(self, dtype: str) -> float:
        """The fastest GEMM rate these rates know in ``dtype`` (0 when none is measured)."""
        ...

    def bulk_flops(self, dtype: str) -> float:
        """FLOP/s of a model's matmuls when their shapes are unknown (a model known by its parameter count)."""
        ...

    def describe(self) -> str:
        """One sentence for the plan's output: where these rates come from."""
        ...


def _aligned(k: int, n: int) -> bool:
    """Whether the rows of a GEMM's operands and output (k and n elements long) start on 16-byte boundaries."""
    return k % _ALIGN == 0 and n % _ALIGN == 0


@hashed_once
@dataclass(frozen=True)
class ModeledRates:
    """The shape-aware model on ``gpu``'s compute units, power-limited clock, peak and bandwidth, with its
    architecture's attainable fractions (``convoy.plan.architectures``).

    A GEMM of m x k x n runs as tiles of tm x tn outputs, one per compute unit at a time (NVIDIA, "Matrix
    Multiplication Background User's Guide", tile and wave quantization): ``ceil(m/tm) x ceil(n/tn)`` tiles in
    ``ceil(tiles / units)`` waves, each tile ``2·tm·tn·(k + TILE_FILL_K)`` FLOPs at one unit's share of the
    architecture's best GEMM fraction of the power-limited peak, the fastest tile shape winning; divided by
    ``UNALIGNED_FACTOR`` when k or n (a row's length) is not a multiple of 8 elements; never faster than its
    operands' bytes at the memory bandwidth; plus ``GEMM_FLOOR_S``. A fused causal attention forward + backward
    is ``12·b·a·s²·d`` FLOPs at the architecture's attention fraction, plus ``ATTENTION_FLOOR_S``. Memory-bound
    work moves ``POINTWISE_TRAFFIC`` bytes per byte it saves for backward at the bandwidth a large copy reaches."""

    gpu: GpuSpec
    gemm_scale: float = 1.0
    """Multiplies every modeled GEMM time (a measured record's own fit, ``MeasuredRates``); 1 for the datasheet."""
    attention_scale: float = 1.0
    """Multiplies every modeled attention time (likewise)."""
    kind: str = "modeled"
    peer_bytes_per_s: float | None = None
    launch_seconds: float = LAUNCH_S

    @property
    def architecture(self) -> Architecture:
        return architecture_of(self.gpu)

    @property
    def memory_bytes_per_s(self) -> float:
        return (self.gpu.memory_gbs or 0.0) * GB * self.architecture.memory_fraction

    @property
    def pointwise_seconds_per_byte(self) -> float:
        bandwidth = self.memory_bytes_per_s
        return POINTWISE_TRAFFIC / bandwidth if bandwidth else 0.0

    def clocked_peak(self, dtype: str) -> float:
        """The dense peak at the clock the board's power limit lets a GEMM hold (``GpuSpec.power_limited_mhz``)."""
        peak = self.gpu.peak_flops(dtype)
        clock, limited = self.gpu.clock_mhz, self.gpu.power_limited_mhz
        return peak * limited / clock if clock and limited else peak

    def gemm_seconds(self, m: int, k: int, n: int, dtype: str) -> float:
        rate = self.architecture.gemm_fraction * self.clocked_peak(dtype)
        units = self.gpu.units
        compute = math.inf
        for tm, tn in self.architecture.tiles:
            tiles = math.ceil(m / tm) * math.ceil(n / tn)
            tile_flops = 2 * tm * tn * (k + TILE_FILL_K)
            # whole waves over the units; a board without a unit count spreads its tiles evenly
            waves = math.ceil(tiles / units) if units else tiles / 1.0
            compute = min(compute, waves * tile_flops / (rate / units if units else rate))
        if not _aligned(k, n):
            compute /= UNALIGNED_FACTOR
        moved = (m * k + k * n + m * n) * _dtype_bytes(dtype)
        bandwidth = self.memory_bytes_per_s or math.inf
        return self.gemm_scale * (max(compute, moved / bandwidth) + GEMM_FLOOR_S)

    def attention_seconds(self, batch: int, heads: int, kv_heads: int, seq: int, head_dim: int, dtype: str) -> float:
        flops = 12 * batch * heads * seq * seq * head_dim
        rate = self.architecture.attention_fraction * self.clocked_peak(dtype)
        return self.attention_scale * (flops / rate + ATTENTION_FLOOR_S)

    def peak_seen(self, dtype: str) -> float:
        return 0.0

    def bulk_flops(self, dtype: str) -> float:
        return self.architecture.gemm_fraction * self.clocked_peak(dtype) / self.gemm_scale

    def describe(self) -> str:
        arch = self.architecture
        return (f"the shape-aware model of the {self.gpu.describe()}: GEMMs in waves of tiles over its units at "
                f"{arch.gemm_fraction:.1%} of the peak ({arch.name}'s measured best) plus "
                f"{GEMM_FLOOR_S * 1e6:.1f} us each; no measured profile for this GPU")


@hashed_once
@dataclass(frozen=True)
class MeasuredRates:
    """A measured record (a calibration, or a shipped profile): its rates where it has the shape, the
    shape-aware model scaled to fit the record where it does not."""

    record: Calibration
    fallback: ModeledRates
    kind: str = "calibrated"
    origin: str = ""
    """For a profile, where it was measured (shown by ``describe``)."""
    _scaled: ModeledRates = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_scaled", _fit_to(self.record, self.fallback))

    @property
    def memory_bytes_per_s(self) -> float:
        return self.record.memory_bytes_per_s or self.fallback.memory_bytes_per_s

    @property
    def pointwise_seconds_per_byte(self) -> float:
        return self.record.pointwise_seconds_per_byte

    @property
    def launch_seconds(self) -> float:
        return self.record.launch_seconds or self.fallback.launch_seconds

    @property
    def peer_bytes_per_s(self) -> float | None:
        return self.record.peer_bytes_per_s

    def gemm_seconds(self, m: int, k: int, n: int, dtype: str) -> float:
        rate = self.record.gemm_flops.get(gemm_key(m, k, n, dtype))
        return 2 * m * k * n / rate if rate else self._scaled.gemm_seconds(m, k, n, dtype)

    def attention_seconds(self, batch: int, heads: int, kv_heads: int, seq: int, head_dim: int, dtype: str) -> float:
        seconds = self.record.attention_seconds.get(attention_key(batch, heads, kv_heads, seq, head_dim, dtype))
        if seconds is None:
            return self._scaled.attention_seconds(batch, heads, kv_heads, seq, head_dim, dtype)
        return seconds

    def peak_seen(self, dtype: str) -> float:
        return max(self._measured(dtype), default=0.0)

    def bulk_flops(self, dtype: str) -> float:
        rates = self._measured(dtype)
        return _median(rates) if rates else self._scaled.bulk_flops(dtype)

    def _measured(self, dtype: str) -> list[float]:
        return [rate for key, rate in self.record.gemm_flops.items() if key.rpartition(":")[2] == dtype]

    def describe(self) -> str:
        if self.kind == "profile":
            return (f"the {self.fallback.gpu.name} profile shipped with convoy (measured on {self.origin}; other "
                    f"shapes from the shape-aware model fitted to it); on the {self.fallback.gpu.name} itself, "
                    "--calibrate measures that board")
        return time_model(self.record)


def _median(values: list[float]) -> float:
    """``statistics.median`` (the same arithmetic), without importing it: with fractions, decimal and random it
    costs a plan's start more than the plan's own median does."""
    data = sorted(values)
    half = len(data) // 2
    return data[half] if len(data) % 2 else (data[half - 1] + data[half]) / 2


def _fit_to(record: Calibration, model: ModeledRates) -> ModeledRates:
    """``model`` with its GEMM and attention times scaled by the median of measured / modeled over ``record``'s
    shapes (1 where the record has none): the record's device, where its shapes do not reach."""
    def ratios(items, seconds_of) -> list[float]:
        out = []
        for key, value in items:
            shape, _, dtype = key.rpartition(":")
            try:
                dims = tuple(int(x) for x in shape.split("x"))
                out.append(seconds_of(dims, dtype, value))
            except (ValueError, TypeError):  # a key of another format: not part of the fit
                continue
        return [r for r in out if r > 0 and math.isfinite(r)]

    def gemm(dims, dtype, flops):
        m, k, n = dims
        return (2 * m * k * n / flops) / model.gemm_seconds(m, k, n, dtype)

    def attention(dims, dtype, seconds):
        return seconds / model.attention_seconds(*dims, dtype)

    g = ratios(record.gemm_flops.items(), gemm)
    a = ratios(record.attention_seconds.items(), attention)
    return ModeledRates(gpu=model.gpu, gemm_scale=_median(g) if g else 1.0,
                        attention_scale=_median(a) if a else 1.0, kind=model.kind)


@dataclass(frozen=True)
class FlatRates:
    """The datasheet model: GEMMs and attention at ``efficiency`` x the peak, memory-bound work at the board's
    bandwidth, no launch overhead (``efficiency=``)."""

    gpu: GpuSpec
    efficiency: float
    kind: str = "datasheet"
    pointwise_seconds_per_byte: float = 0.0
    launch_seconds: float = 0.0
    peer_bytes_per_s: float | None = None

    @property
    def memory_bytes_per_s(self) -> float:
        return (self.gpu.memory_gbs or 0.0) * GB

    def gemm_seconds(self, m: int, k: int, n: int, dtype: str) -> float:
        return 2 * m * k * n / (self.efficiency * self.gpu.peak_flops(dtype))

    def attention_seconds(self, batch: int, heads: int, kv_heads: int, seq: int, head_dim: int, dtype: str) -> float:
        return 3 * 4 * batch * heads * seq * seq * head_dim / (self.efficiency * self.gpu.peak_flops(dtype))

    def peak_seen(self, dtype: str) -> float:
        return 0.0

    def bulk_flops(self, dtype: str) -> float:
        return self.efficiency * self.gpu.peak_flops(dtype)

    def describe(self) -> str:
        return (f"the datasheet model (GEMMs and attention at {self.efficiency:g} x the {self.gpu.name} peak, "
                "memory-bound work at its bandwidth), as efficiency= asks")


@hashed_once
@dataclass(frozen=True)
class StackGemms:
    """``rates`` with every GEMM at ``fraction`` of their speed: another software stack's GEMM library on the same
    board (``convoy.plan.stacks.Stack.gemm_fraction``); everything else as ``rates`` has it."""

    rates: Rates
    fraction: float

    @property
    def kind(self) -> str:
        return self.rates.kind

    @property
    def memory_bytes_per_s(self) -> float:
        return self.rates.memory_bytes_per_s

    @property
    def pointwise_seconds_per_byte(self) -> float:
        return self.rates.pointwise_seconds_per_byte

    @property
    def launch_seconds(self) -> float:
        return self.rates.launch_seconds

    @property
    def peer_bytes_per_s(self) -> float | None:
        return self.rates.peer_bytes_per_s

    def gemm_seconds(self, m: int, k: int, n: int, dtype: str) -> float:
        return self.rates.gemm_seconds(m, k, n, dtype) / self.fraction

    def attention_seconds(self, batch: int, heads: int, kv_heads: int, seq: int, head_dim: int, dtype: str) -> float:
        return self.rates.attention_seconds(batch, heads, kv_heads, seq, head_dim, dtype)

    def peak_seen(self, dtype: str) -> float:
        return self.rates.peak_seen(dtype) * self.fraction

    def bulk_flops(self, dtype: str) -> float:
        return self.rates.bulk_flops(dtype) * self.fraction

    def describe(self) -> str:
        return f"{self.rates.describe()}; GEMMs at {self.fraction:.0%} of that (the run's software stack)"


def _dtype_bytes(dtype: str) -> int:
    return 4 if dtype == "fp32" else 2


def rates_for(gpu: GpuSpec, *, calibration: Calibration | None = None, efficiency: float | None = None) -> Rates:
    """The rates a plan for ``gpu`` uses: ``efficiency`` given, the flat datasheet model; else a measured
    ``calibration`` of this device; else the profile convoy ships for ``gpu``; else the shape-aware model."""
    if efficiency is not None:
        return FlatRates(gpu=gpu, efficiency=efficiency)
    model = ModeledRates(gpu=gpu)
    if calibration is not None:
        return MeasuredRates(record=calibration, fallback=model, kind="calibrated")
    shipped = profile_for(gpu)
    if shipped is not None:
        record, origin = shipped
        return MeasuredRates(record=record, fallback=model, kind="profile", origin=origin)
    return model
