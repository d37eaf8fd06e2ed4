"""What the machine at hand achieves, measured once per device and torch version, and cached.

    from convoy.plan.calibration import Calibration, load_calibration, save_calibration, cache_path
    record = load_calibration(device_name="NVIDIA H100 80GB HBM3", device_uuid="GPU-...", torch_version="2.13.0")
    step_time(model, run, layout, hw, global_batch=8, calibration=record)      # convoy.plan.timing

A ``Calibration`` holds achieved rates, not a single efficiency: matmul FLOP/s per GEMM shape (the model's
own shapes), the seconds of one fused-attention forward + backward per shape, the memory bandwidth of a large
copy, the per-kernel launch overhead, and (several GPUs) the peer-to-peer copy bandwidth. The measuring code
is ``convoy.plan.calibrate`` (imports torch); this module is plain data and a JSON cache, torch-free. A record
also keeps what training jobs measured on the device next to their plans (``observed``, written by the
``Accelerator`` after its first steps and read by later plans: ``convoy.plan.observed``); a record may hold
only those, no rates (``has_rates``).

The cache is one JSON file, ``$XDG_CACHE_HOME/convoy/calibration.json`` (``~/.cache/...`` by default),
a map from ``calibration_key(device name, device uuid, torch version)`` to a record. A record's rates are used only
for the same device (uuid, else name), the same torch version and the same ``FORMAT``; anything else is
measured again. Shapes missing from a record are measured and merged in. ``cached_records`` reads every entry,
whatever its torch version, without torch (how ``convoy plan`` finds the observations of the GPU at hand).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from convoy.errors import PlanError

__all__ = ["Calibration", "FORMAT", "cache_path", "calibration_key", "load_calibration", "save_calibration",
           "cached_records", "gemm_key", "attention_key", "time_model"]

#: bump when a field's meaning changes: older records are then ignored (measured again). Adding an optional
#: field is not such a change (``observed`` came without a bump: a record without it has none, and an older
#: convoy drops the key it does not know)
FORMAT = 1


def gemm_key(m: int, k: int, n: int, dtype: str) -> str:
    """``"8192x768x2304:bf16"``: an (m, k) @ (k, n) product in ``dtype``."""
    return f"{m}x{k}x{n}:{dtype}"


def attention_key(batch: int, heads: int, kv_heads: int, seq: int, head_dim: int, dtype: str) -> str:
    """``"8x12x12x1024x64:bf16"``: causal SDPA over (batch, heads, seq, head_dim) with ``kv_heads`` K/V heads."""
    return f"{batch}x{heads}x{kv_heads}x{seq}x{head_dim}:{dtype}"


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """Achieved rates of one device under one torch version."""

    device_name: str
    """As the runtime names it (``torch.cuda.get_device_name``), e.g. ``"NVIDIA H100 80GB HBM3"``."""
    device_uuid: str = ""
    """The device's UUID where the runtime gives one (``GPU-...``); empty for the CPU."""
    torch_version: str
    device_type: str = "cuda"
    """``"cuda"`` or ``"cpu"`` (``"datasheet"``: no measurement, the rates a datasheet promises)."""
    gemm_flops: Mapping[str, float] = field(default_factory=dict)
    """``gemm_key`` -> achieved FLOP/s (2mnk per product, median of timed runs)."""
    attention_seconds: Mapping[str, float] = field(default_factory=dict)
    """``attention_key`` -> seconds of one causal SDPA forward + backward."""
    memory_bytes_per_s: float = 0.0
    """Device memory bandwidth: bytes read + written per second by a large copy."""
    launch_seconds: float = 0.0
    """Seconds per small kernel in a row of them (launch overhead as eager PyTorch sees it)."""
    pointwise_seconds_per_byte: float = 0.0
    """Seconds of forward + backward of a chain of norm / GELU / SiLU / residual ops per byte they save for
    backward: what memory-bound work costs per saved activation byte (0: not measured)."""
    peer_bytes_per_s: float | None = None
    """One-direction copy bandwidth between two devices of the node; None with one device."""
    measured_at: float = 0.0
    """Unix time of the (last) measurement."""
    observed: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """What training jobs measured on this device next to their plans: ``convoy.plan.observed.case_key`` ->
    ``Observation.as_dict()`` (plain JSON; ``convoy.plan.observed`` reads it)."""
    cpu_ops: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """On a CPU: the cost per operator, matmul rate and bandwidth one process measured, per thread count
    (``convoy.plan.cpu.rates_key`` -> ``CpuRates.as_dict()``; ``convoy.plan.cpu_measure.cpu_rates``)."""
    format: int = FORMAT

    @property
    def key(self) -> str:
        return calibration_key(self.device_name, self.device_uuid, self.torch_version)

    @property
    def has_rates(self) -> bool:
        """False for a record that holds only observations (a job ran here, nothing was calibrated)."""
        return bool(self.gemm_flops or self.attention_seconds or self.memory_bytes_per_s)

    def merged(self, other: "Calibration") -> "Calibration":
        """This record with ``other``'s shapes and rates added (``other`` wins where both measured)."""
        return replace(self, gemm_flops={**self.gemm_flops, **other.gemm_flops},
                       attention_seconds={**self.attention_seconds, **other.attention_seconds},
                       memory_bytes_per_s=other.memory_bytes_per_s or self.memory_bytes_per_s,
                       launch_seconds=other.launch_seconds or self.launch_seconds,
                       pointwise_seconds_per_byte=other.pointwise_seconds_per_byte or self.pointwise_seconds_per_byte,
                       peer_bytes_per_s=other.peer_bytes_per_s or self.peer_bytes_per_s,
                       measured_at=max(self.measured_at, other.measured_at),
                       observed={**self.observed, **other.observed},
                       cpu_ops={**self.cpu_ops, **other.cpu_ops})

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gemm_flops"], d["attention_seconds"] = dict(self.gemm_flops), dict(self.attention_seconds)
        d["observed"] = {k: dict(v) for k, v in self.observed.items()}
        d["cpu_ops"] = {k: dict(v) for k, v in self.cpu_ops.items()}
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Calibration":
        names = set(cls.__dataclass_fields__)
        fields = {k: v for k, v in d.items() if k in names}
        if "observed" in fields:  # an edited or damaged map loses its bad entries, never the record's rates
            seen = fields["observed"]
            fields["observed"] = ({k: v for k, v in seen.items() if isinstance(k, str) and isinstance(v, Mapping)}
                                  if isinstance(seen, Mapping) else {})
        if "cpu_ops" in fields:
            ops = fields["cpu_ops"]
            fields["cpu_ops"] = ({k: v for k, v in ops.items() if isinstance(k, str) and isinstance(v, Mapping)}
                                 if isinstance(ops, Mapping) else {})
        return cls(**fields)

    def describe(self) -> str:
        rates = sorted(self.gemm_flops.values())
        median = rates[len(rates) // 2] if rates else 0.0
        mid = (f"{median / 1e12:.0f} TFLOP/s median matmul" if median >= 1e12 else
               f"{median / 1e9:.0f} GFLOP/s median matmul" if rates else "no matmul shapes")
        bw = f", {self.memory_bytes_per_s / 1e9:.0f} GB/s memory" if self.memory_bytes_per_s else ""
        peer = f", {self.peer_bytes_per_s / 1e9:.0f} GB/s peer" if self.peer_bytes_per_s else ""
        when = time.strftime("%Y-%m-%d", time.gmtime(self.measured_at)) if self.measured_at else "?"
        return f"{self.device_name} (torch {self.torch_version}, measured {when}): {mid}{bw}{peer}"


def time_model(record: "Calibration") -> str:
    """The sentence every output (``convoy plan``, ``strategy="auto"``) uses for step times measured on this
    machine (``convoy.plan.rates.Rates.describe`` says it for the other sources)."""
    return f"rates measured on this machine ({record.describe()})"


def calibration_key(device_name: str, device_uuid: str, torch_version: str) -> str:
    """One cache entry per physical device (its uuid, else its name) and torch version."""
    return f"{device_uuid or device_name}|torch {torch_version}"


def cache_path(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/convoy/calibration.json``, ``~/.cache/convoy/calibration.json`` without it."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "convoy" / "calibration.json"


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, json.JSONDecodeError):
        return {}  # a damaged cache is measured again, not an error
    return data if isinstance(data, dict) else {}


def load_calibration(*, device_name: str, device_uuid: str = "", torch_version: str,
                     path: Path | None = None) -> Calibration | None:
    """The cached record for this device and torch version, or None (absent, other version, older format)."""
    entry = _read(path or cache_path()).get(calibration_key(device_name, device_uuid, torch_version))
    if not isinstance(entry, dict) or entry.get("format") != FORMAT:
        return None
    try:
        record = Calibration.from_dict(entry)
    except TypeError:
        return None
    if record.torch_version != torch_version or (device_uuid and record.device_uuid != device_uuid):
        return None
    return record if _rates_are_sound(record) else None


def cached_records(*, path: Path | None = None) -> list[Calibration]:
    """Every sound entry of the cache, whatever its device and torch version (no torch needed to read them)."""
    out = []
    for entry in _read(path or cache_path()).values():
        if not isinstance(entry, dict) or entry.get("format") != FORMAT:
            continue
        try:
            record = Calibration.from_dict(entry)
        except TypeError:
            continue
        if _rates_are_sound(record):
            out.append(record)
    return out


def _rate(value: Any, *, positive: bool) -> bool:
    """A finite number (> 0 when ``positive``, else >= 0): what a measured rate can be."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, float) and not math.isfinite(value):  # an int is finite (isfinite(10**400) overflows)
        return False
    return value > 0 if positive else value >= 0


def _rates_are_sound(record: Calibration) -> bool:
    """False for a cache entry edited or damaged into values no measurement gives (a rate of 0, a string):
    such an entry is measured again rather than dividing by it."""
    maps_ok = all(isinstance(m, Mapping) and all(isinstance(k, str) and _rate(v, positive=True) for k, v in m.items())
                  for m in (record.gemm_flops, record.attention_seconds))
    scalars_ok = all(_rate(v, positive=False) for v in (record.memory_bytes_per_s, record.launch_seconds,
                                                          record.pointwise_seconds_per_byte, record.measured_at))
    peer_ok = record.peer_bytes_per_s is None or _rate(record.peer_bytes_per_s, positive=True)
    return maps_ok and scalars_ok and peer_ok


def save_calibration(record: Calibration, *, path: Path | None = None) -> Path:
    """Write (or merge into) the cache entry for ``record``'s device and torch version; returns the file."""
    path = path or cache_path()
    data = _read(path)
    old = data.get(record.key)
    if isinstance(old, dict) and old.get("format") == FORMAT:
        try:
            previous = Calibration.from_dict(old)
        except TypeError:
            previous = None
        if previous is not None and _rates_are_sound(previous):  # a damaged entry is replaced, not merged
            record = previous.merged(record)
    data[record.key] = record.as_dict()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # a temporary file of this writer's own (two jobs finishing at once must not write into one), then an
        # atomic rename: a reader sees the old cache or the new one, never half of it
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(data, indent=1, sort_keys=True))
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as err:
        raise PlanError(f"cannot write the calibration cache {str(path)!r} ({err}); set XDG_CACHE_HOME to a "
                        "writable directory") from None
    return path
