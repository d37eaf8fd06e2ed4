"""The record of what a device achieves (``Calibration``), measured once per device and torch version, and its cache.

    from convoy.plan.speed.records import Calibration, load_calibration, save_calibration, cache_path
    record = load_calibration(device_name="NVIDIA H100 80GB HBM3", device_uuid="GPU-...", torch_version="2.13.0")
    step_time(model, run, layout, hw, global_batch=8, calibration=record)      # convoy.plan.timing

A record holds achieved rates (FLOP/s per GEMM shape, seconds per attention shape, copy bandwidth, launch cost,
peer bandwidth), what jobs measured beside their plans (``observed``, ``convoy.plan.speed.observed``) and a CPU's
costs per operator (``cpu_ops``); ``convoy.plan.speed.measure`` fills it. The cache is one JSON file,
``$XDG_CACHE_HOME/convoy/calibration.json``, keyed by ``calibration_key(device name, uuid, torch version)`` and
read and written only where no other user can steer it (``convoy.plan.speed.cache_file``). An entry whose values no
measurement gives (``rates_problem``) is one warning and is ignored. Rates are used only for the same device, torch
version and ``FORMAT``; ``cached_records`` reads every entry, whatever its torch version. Torch-free.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace

from convoy.errors import ConvoyWarning, PlanError
from convoy.plan.speed.cache_file import read_cache, write_cache
from convoy.reading import path_and_name

TYPE_CHECKING = False  # typing is not imported at run time: a plan starts without it
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

__all__ = ["Calibration", "FORMAT", "cache_path", "calibration_key", "load_calibration", "save_calibration",
           "cached_records", "gemm_key", "attention_key", "time_model", "rates_problem", "LAUNCH_FLOOR_S"]

#: bump when a field's meaning changes: older records are then ignored (measured again). Adding an optional
#: field is not such a change (a record without it has none, and an older convoy drops the key it does not know)
FORMAT = 1

LAUNCH_FLOOR_S = 5e-7
"""Seconds below which no kernel (nor step) runs on any GPU: a launch alone costs more (eager PyTorch measures
several microseconds)."""
_MARGIN = 1.1  # a measurement may exceed a datasheet's rounded figure a little, never by more


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
    """The measured device's type: ``"cuda"`` or ``"cpu"``."""
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
    """What training jobs measured on this device next to their plans: ``convoy.plan.speed.observed.case_key`` ->
    ``Observation.as_dict()`` (plain JSON; ``convoy.plan.speed.observed`` reads it)."""
    cpu_ops: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """On a CPU: the cost per operator, matmul rate and bandwidth one process measured, per thread count
    (``convoy.plan.speed.cpu_step.rates_key`` -> ``CpuRates.as_dict()``;
    ``convoy.plan.speed.measure_cpu.cpu_rates``)."""
    format: int = FORMAT

    def __hash__(self) -> int:
        # a record is a key of the planner's memoized step times (through ``MeasuredRates``); its rates are
        # mappings, so the hash takes the fields that name it (records that compare equal share them)
        return hash((self.device_name, self.device_uuid, self.torch_version, self.device_type, self.measured_at))

    @property
    def key(self) -> str:
        return calibration_key(self.device_name, self.device_uuid, self.torch_version)

    @property
    def has_rates(self) -> bool:
        """False for a record that holds only observations (a job ran here, nothing was calibrated)."""
        return bool(self.gemm_flops or self.attention_seconds or self.memory_bytes_per_s)

    def merged(self, other: Calibration) -> Calibration:
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
    def from_dict(cls, d: Mapping[str, Any]) -> Calibration:
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


def time_model(record: Calibration) -> str:
    """The sentence every output (``convoy plan``, ``strategy="auto"``) uses for step times measured on this
    machine (``convoy.plan.speed.rates.Rates.describe`` says it for the other sources)."""
    return f"rates measured on this machine ({record.describe()})"


def calibration_key(device_name: str, device_uuid: str, torch_version: str) -> str:
    """One cache entry per physical device (its uuid, else its name) and torch version."""
    return f"{device_uuid or device_name}|torch {torch_version}"


def cache_path(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/convoy/calibration.json``, ``~/.cache/convoy/calibration.json`` without it."""
    from pathlib import Path

    return Path(cache_path_text(env))


def cache_path_text(env: Mapping[str, str] | None = None) -> str:
    """``str(cache_path(env))``, without importing pathlib: what a plan reads when it starts."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return path_and_name(os.path.join(base, "convoy", "calibration.json"))[0]


def _where(path: str | Path) -> str:
    return f"calibration cache {str(path)!r}"


def _record(path: str | Path, key: Any, entry: Any) -> Calibration | None:
    """The sound record ``entry`` holds, or None: an older format silently (measured again), anything else no
    measurement wrote with one warning naming the file and the entry."""
    def refuse(why: str) -> None:
        warnings.warn(f"{_where(path)}, entry {_short(key)}: {why}: ignored", ConvoyWarning, stacklevel=4)

    if not isinstance(entry, dict):
        refuse(f"a JSON {type(entry).__name__}, not a record")
        return None
    if entry.get("format") != FORMAT:
        return None
    try:
        record = Calibration.from_dict(entry)
    except TypeError as err:
        refuse(f"not a calibration record ({err})")
        return None
    problem = rates_problem(record)
    if problem is not None:
        refuse(problem)
        return None
    seen = entry.get("observed", {})
    if not isinstance(seen, Mapping):  # the record's rates stand; its observations are set aside
        refuse(f"observed is a JSON {type(seen).__name__}, not a map of observations")
    else:
        bad = next((k for k, v in seen.items() if not isinstance(v, Mapping)), None)
        if bad is not None:
            refuse(f"observed[{_short(bad)}] is a JSON {type(seen[bad]).__name__}, not an observation")
    return record


def load_calibration(*, device_name: str, device_uuid: str = "", torch_version: str,
                     path: Path | None = None) -> Calibration | None:
    """The cached record for this device and torch version, or None (absent, other version, older format)."""
    where = path or cache_path_text()
    key = calibration_key(device_name, device_uuid, torch_version)
    data = read_cache(where)
    if key not in data:
        return None
    record = _record(where, key, data[key])
    if record is None or record.torch_version != torch_version or (device_uuid and record.device_uuid != device_uuid):
        return None
    return record


def cached_records(*, path: Path | None = None) -> list[Calibration]:
    """Every sound entry of the cache, whatever its device and torch version (no torch needed to read them)."""
    where = path or cache_path_text()
    out = []
    for key, entry in read_cache(where).items():
        record = _record(where, key, entry)
        if record is not None:
            out.append(record)
    return out


def _short(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return "a number too large"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _rate(value: Any, *, positive: bool) -> bool:
    """A finite number (> 0 when ``positive``, else >= 0): what a measured rate can be."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, float) and not math.isfinite(value):  # an int is finite (isfinite(10**400) overflows)
        return False
    return value > 0 if positive else value >= 0


def _board(record: Calibration):
    """The table row of the measured device (None: the CPU, or a board the table lacks: no physical bounds)."""
    if record.device_type == "cpu":
        return None
    from convoy.plan.hardware import lookup_gpu

    try:
        return lookup_gpu(record.device_name)
    except PlanError:
        return None


def _peak(board, dtype: str) -> float | None:
    """The most FLOP/s any GEMM of ``dtype`` can reach on ``board`` (fp32: its tensor cores' TF32, below fp16's)."""
    try:
        return board.peak_flops("fp16" if dtype in ("fp32", "tf32") else dtype)
    except PlanError:
        return None


def rates_problem(record: Calibration) -> str | None:
    """Why ``record`` holds values no measurement gives, or None. Every value must be a finite number (> 0 for
    the maps and the peer bandwidth, >= 0 for the rest: 0 is "not measured"); on a board of the GPU table none may
    be beyond it: a matmul above the datasheet's peak (times a small margin), a copy above its memory bandwidth, a
    peer copy above its fastest link, an attention faster than its FLOPs at peak, a kernel below
    ``LAUNCH_FLOOR_S``."""
    for name in ("device_name", "device_uuid", "torch_version", "device_type"):  # before anything reads them
        if not isinstance(getattr(record, name), str):
            return f"{name} = {_short(getattr(record, name))} is not a string"
    if not record.device_name.strip():
        return "device_name is empty"
    for name in ("gemm_flops", "attention_seconds"):
        values = getattr(record, name)
        if not isinstance(values, Mapping):
            return f"{name} is not a map"
        for key, value in values.items():
            if not isinstance(key, str) or not _rate(value, positive=True):
                return f"{name}[{_short(key)}] = {_short(value)} is not a finite number > 0"
    for name in ("memory_bytes_per_s", "launch_seconds", "pointwise_seconds_per_byte", "measured_at"):
        if not _rate(getattr(record, name), positive=False):
            return f"{name} = {_short(getattr(record, name))} is not a finite number >= 0"
    if record.measured_at > time.time() + 86400:  # a day of clock skew; 1e300 is no date
        return f"measured_at = {_short(record.measured_at)} is a date in the future"
    if record.peer_bytes_per_s is not None and not _rate(record.peer_bytes_per_s, positive=True):
        return f"peer_bytes_per_s = {_short(record.peer_bytes_per_s)} is not a finite number > 0"
    if record.launch_seconds and record.launch_seconds < LAUNCH_FLOOR_S:
        return (f"launch_seconds = {_short(record.launch_seconds)} is below the kernel-launch floor "
                f"({LAUNCH_FLOOR_S:g} s)")
    board = _board(record)
    return None if board is None else _beyond_board(record, board)


def _beyond_board(record: Calibration, board) -> str | None:
    for key, flops in record.gemm_flops.items():
        peak = _peak(board, key.rpartition(":")[2])
        if peak is not None and flops > peak * _MARGIN:
            return (f"gemm_flops[{key!r}] = {_short(flops)} FLOP/s is above the {board.name}'s peak "
                    f"({peak / 1e12:g} TFLOP/s)")
    for key, seconds in record.attention_seconds.items():
        lower = _attention_floor(key, board)
        if seconds < lower:
            return (f"attention_seconds[{key!r}] = {_short(seconds)} s is faster than its FLOPs at the "
                    f"{board.name}'s peak ({lower:.3g} s)")
    bandwidth = board.memory_gbs * 1e9 if board.memory_gbs else None
    if bandwidth and record.memory_bytes_per_s > bandwidth * _MARGIN:
        return (f"memory_bytes_per_s = {_short(record.memory_bytes_per_s)} is above the {board.name}'s memory "
                f"bandwidth ({board.memory_gbs:g} GB/s)")
    if bandwidth and record.pointwise_seconds_per_byte and \
            record.pointwise_seconds_per_byte * bandwidth * _MARGIN < 1:
        return (f"pointwise_seconds_per_byte = {_short(record.pointwise_seconds_per_byte)} is faster than the "
                f"{board.name}'s memory bandwidth ({board.memory_gbs:g} GB/s)")
    link = max(board.nvlink_gbs or 0.0, board.pcie_gbs) * 1e9
    if record.peer_bytes_per_s is not None and record.peer_bytes_per_s > link * _MARGIN:
        return (f"peer_bytes_per_s = {_short(record.peer_bytes_per_s)} is above the {board.name}'s fastest link "
                f"({link / 1e9:g} GB/s)")
    return None


def _attention_floor(key: str, board) -> float:
    """Seconds below which a causal attention forward + backward of ``key``'s shape cannot run on ``board``: its
    forward's matmul FLOPs (2 * b * h * s^2 * d, causal) at peak; 0 for a key that is not a shape."""
    shape, _, dtype = key.partition(":")
    try:
        batch, heads, _kv, seq, head_dim = (int(n) for n in shape.split("x"))
    except ValueError:
        return 0.0
    peak = _peak(board, dtype)
    return max(2.0 * batch * heads * seq * seq * head_dim / (peak * _MARGIN), LAUNCH_FLOOR_S) if peak else 0.0


def save_calibration(record: Calibration, *, path: Path | None = None) -> Path:
    """Write (or merge into) the cache entry for ``record``'s device and torch version; returns the file.
    ``PlanError`` where the cache may not be written (``convoy.plan.speed.cache_file``)."""
    path = path or cache_path()
    data = read_cache(path)
    old = data.get(record.key)
    if isinstance(old, dict) and old.get("format") == FORMAT:
        previous = _record(path, record.key, old)
        if previous is not None:  # a damaged entry is replaced, not merged
            record = previous.merged(record)
    data[record.key] = record.as_dict()
    write_cache(path, data)
    return path
