"""What a training job measured on this machine next to what its plan said, and how later plans use it.

    from convoy.plan.speed.observed import Observation, case_key, observations_here
    key = case_key(model, run, layout, hw)                   # one job: model, layout, s x b, recipe, machine shape
    seen = Observation(measured_s=0.071, planned_s=0.0766, measured_bytes=14.6e9, planned_bytes=14.2e9,
                       rates="profile", steps=5, at=time.time())
    save_calibration(Calibration(device_name=..., torch_version=..., observed={key: seen.as_dict()}))
    plan_for(model, run, hw, observed=observations_here(hw))  # what convoy.plan() does on the GPU at hand

``convoy.Accelerator`` writes one ``Observation`` per job into its device's record (``convoy.plan.speed.records``)
once its first steps are measured (``convoy.train.plan_report``). A later plan of the same case on that device takes
the measured step time (``StepTime.correction``) and says so; the measured peak memory is shown but not applied
(a loop's peak also holds what it keeps beyond the layout). ``observations_here`` finds them without torch.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from convoy.errors import ConvoyWarning, PlanError
from convoy.plan.hardware import Hardware, lookup_gpu
from convoy.plan.memory import Layout
from convoy.plan.model import ModelSpec
from convoy.plan.run import RunSpec
from convoy.plan.speed.records import LAUNCH_FLOOR_S, Calibration, cache_path_text, cached_records

TYPE_CHECKING = False  # typing is not imported at run time: a plan starts without it
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

__all__ = ["Observation", "case_key", "observed_in", "observations_for", "observations_here", "impossible",
           "LONGEST_STEP_S", "BAND", "FUTURE_SLACK_S"]

LONGEST_STEP_S = 86400.0
"""A step measured longer than this (a day) is no measurement of a job's first steps."""
BAND = (0.1, 10.0)
"""On a GPU, an observation is used only within this multiple of the model's time for its case: one further off is
another job's (a loaded machine, a slow filesystem, a pause in the debugger) rather than the layout's, and would flip
the recommendation on its own; it is kept aside with one warning naming it. On the CPU (one nominal row for every
processor, about 1 TFLOP/s) the model is no yardstick, and what was measured there is the best figure there is."""
FUTURE_SLACK_S = 86400.0
"""An observation dated more than this ahead of the clock (``at``) is no measurement made yet."""
_MARGIN = 1.1  # as the calibration's bounds: a datasheet's rounded figure may be beaten a little, never more


@dataclass(frozen=True, kw_only=True)
class Observation:
    """One job's first steps on a device, next to its plan."""

    measured_s: float
    """Median seconds of one optimizer step, measured after warm-up."""
    planned_s: float
    """Seconds the plan said, for that case, with the rates it had then (``rates``)."""
    planned_bytes: int
    """Peak allocated bytes the plan said (``MemoryBreakdown.allocated``)."""
    measured_bytes: int | None = None
    """``torch.cuda.max_memory_allocated`` over the measured steps; None where there is no allocator peak (CPU)."""
    rates: str = ""
    """Where the plan's rates came from then (``Rates.kind``: calibrated, profile, modeled, datasheet)."""
    steps: int = 0
    """How many steps the median is over."""
    at: float = 0.0
    """Unix time of the measurement."""
    where: str = field(default="", compare=False, repr=False)
    """Where it was read (the cache file, the entry, the case), for a warning about it; not stored."""

    @property
    def time_ratio(self) -> float:
        """The plan as a multiple of what was measured (docs/planner-accuracy.md's convention)."""
        return self.planned_s / self.measured_s

    @property
    def memory_ratio(self) -> float | None:
        return self.planned_bytes / self.measured_bytes if self.measured_bytes else None

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        del d["where"]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, where: str = "") -> Observation | None:
        """The observation ``d`` holds, or None when it is damaged (``problem``)."""
        return None if cls.problem(d) is not None else cls(
            measured_s=float(d["measured_s"]), planned_s=float(d["planned_s"]), planned_bytes=int(d["planned_bytes"]),
            measured_bytes=int(d["measured_bytes"]) if d.get("measured_bytes") is not None else None,
            rates=str(d.get("rates", "")), steps=int(d.get("steps") or 0), at=float(d.get("at") or 0.0), where=where)

    @staticmethod
    def problem(d: Any) -> str | None:
        """Why ``d`` is not an observation (a missing, non-numeric, non-finite or non-positive value), or None."""
        if not isinstance(d, Mapping):
            return f"a JSON {type(d).__name__}, not an observation"
        for key in ("measured_s", "planned_s", "planned_bytes", "measured_bytes", "steps", "at"):
            value = d.get(key)
            if value is None and key not in ("measured_s", "planned_s", "planned_bytes"):
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                return f"{key} = {_short(value)} is not a finite number > 0"
            if isinstance(value, int) and value.bit_length() > 64:
                return f"{key} = {_short(value)} is not a finite number > 0"
        if d.get("rates") is not None and not isinstance(d["rates"], str):
            return f"rates = {_short(d['rates'])} is not a string"
        if d.get("at") is not None and d["at"] > time.time() + FUTURE_SLACK_S:
            return f"at = {_short(d['at'])} is a date in the future"
        return None


def case_key(model: ModelSpec, run: RunSpec, layout: Layout, hw: Hardware) -> str:
    """The one string that names a case: the same model (parameter count and shape, not its name: a config path
    and the module built from it are one model), layout (ZeRO stage, degrees, micro-batches per step, offload),
    sequence length and micro-batch, precision recipe, optimizer, recomputation, attention, and compile and float8
    where they are on, on as many GPUs of the same table row per node and as many nodes, e.g.
    ``"124439808 params 12x768 a12/12 f3072 v50257 | zero3 dp2 (shard 2) tp1 pp1 m1 | s1024 b8 | bf16-fsdp adamw
    recompute none flash | 2 H100-80GB per node x 1"``."""
    shape = f"{model.num_layers}x{model.hidden} a{model.heads}/{model.kv_heads or model.heads} f{model.ffn} " \
            f"v{model.vocab}" if model.has_shape else "no shape"
    d = layout.dims
    split = f" (replicate {d.dp_replicate} x shard {d.dp_shard})" if layout.zero_stage == 3 and d.dp_replicate_enabled \
        else ""
    stage = f"zero{layout.zero_stage}" if layout.zero_stage else "replicated"
    where = f"{stage} dp{d.dp}{split} tp{d.tp} pp{d.pp} m{layout.microbatches}" + (" offload" if layout.offload else "")
    if d.pp_enabled and (layout.pp_schedule, layout.pp_stages_per_rank) != ("1f1b", 1):
        where += f" {layout.pp_schedule} v{layout.pp_stages_per_rank}"
    how = f"{run.precision} {run.optimizer} recompute {run.recompute}" + (
        f"/{run.recompute_every}" if run.recompute == "full" and run.recompute_every > 1 else "") + f" {run.attention}"
    # compiled and float8 runs are cases of their own (an eager run's key is as it was)
    how += (f" compile {run.compile}" if run.compile != "none" else "") + (f" fp8 {run.fp8}" if run.fp8 != "none"
                                                                          else "")
    return " | ".join((f"{model.num_params} params {shape}", where, f"s{run.seq_len} b{run.micro_batch}", how,
                       f"{hw.gpus_per_node} {hw.gpu.name} per node x {hw.nodes}"))


def _short(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return "a number too large"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def observed_in(record: Calibration | None, *, path: Path | None = None) -> dict[str, Observation]:
    """The sound observations of ``record`` by case; a damaged one is left out, with one warning naming the file
    (``path``, default: the cache), the entry and the case."""
    out: dict[str, Observation] = {}
    if record is None:
        return out
    for key, value in record.observed.items():
        where = f"calibration cache {str(path or cache_path_text())!r}, entry {record.key!r}, case {key!r}"
        problem = Observation.problem(value)
        if problem is not None:
            warnings.warn(f"{where}: {problem}: ignored", ConvoyWarning, stacklevel=2)
            continue
        observation = Observation.from_dict(value, where=where)
        assert observation is not None  # from_dict gives None only where problem() found one
        out[key] = observation
    return out


def impossible(seen: Observation, step: Any, hw: Hardware) -> str | None:
    """Why no GPU of ``hw`` could have measured ``seen`` for the case ``step`` (its modeled ``StepTime``) times,
    after one warning naming where it was read; None when it could. Faster than the case's model FLOPs at the
    board's peak (an MFU above 100 %) or than ``LAUNCH_FLOOR_S``, longer than ``LONGEST_STEP_S``, a peak above
    the board's memory, or (on a GPU) a time outside ``BAND`` around the model's."""
    floor = max(step.model_flops / (step.world_size * step.peak_flops * _MARGIN), LAUNCH_FLOOR_S)
    why = None
    if seen.measured_s < floor:
        why = (f"measured_s = {seen.measured_s:.3g} s is faster than any {hw.gpu.name} runs this case "
               f"({floor:.3g} s: its model FLOPs at peak, or the kernel-launch floor)")
    elif seen.measured_s > LONGEST_STEP_S:
        why = f"measured_s = {seen.measured_s:.3g} s is longer than a day: no measurement of a job's first steps"
    elif seen.measured_bytes is not None and seen.measured_bytes > hw.gpu.memory_bytes * _MARGIN:
        why = f"measured_bytes = {seen.measured_bytes:,} is more than a {hw.gpu.name} holds"
    elif hw.gpu.name != "cpu" and not BAND[0] <= seen.measured_s / step.seconds <= BAND[1]:
        why = (f"measured_s = {seen.measured_s:.3g} s is {seen.measured_s / step.seconds:.3g}x the modeled "
               f"{step.seconds:.3g} s, outside the {BAND[0]:g}x-{BAND[1]:g}x band an observation is used in "
               f"(another job's time, not the layout's?)")
    if why is not None:
        warnings.warn(f"{seen.where or 'an observation'}: {why}: ignored, the plan keeps its modeled time",
                      ConvoyWarning, stacklevel=2)
    return why


def observations_for(*, uuids: tuple[str, ...] = (), names: tuple[str, ...] = (), path: Path | None = None
                     ) -> dict[str, Observation]:
    """Every case observed on these devices (a cache entry with one of ``uuids``; one without a uuid whose device
    name is in ``names``), whatever torch version wrote it; the newest observation of each case wins."""
    out: dict[str, Observation] = {}
    bare = {_bare_uuid(u) for u in uuids}
    for record in cached_records(path=path):
        if not (_bare_uuid(record.device_uuid) in bare if record.device_uuid else record.device_name in names):
            continue
        for key, seen in observed_in(record, path=path).items():
            if key not in out or seen.at > out[key].at:
                out[key] = seen
    return out


def _bare_uuid(uuid: str) -> str:
    """NVML says ``GPU-2f9e...``, torch's device properties ``2f9e...``: one device, compared without the prefix."""
    uuid = uuid.strip().lower()
    return uuid[4:] if uuid.startswith("gpu-") else uuid


def _row(name: str) -> str:
    try:
        return lookup_gpu(name).name
    except PlanError:
        return name


def observations_here(hw: Hardware, *, inventory: Any = None, path: Path | None = None) -> dict[str, Observation]:
    """The observations a plan for ``hw`` takes on this machine: those of the devices here whose table row is the
    planned GPU's (``inventory``, else ``convoy.devices.discovery.discover()``). Devices are probed only when the
    cache holds an observation of that GPU, so a plan elsewhere costs one read of the cache file. A GPU whose peak
    was overridden (``--peak-tflops``) is not the board that was measured: no observations."""
    try:
        row = lookup_gpu(hw.gpu.name)
    except PlanError:
        return {}
    if (row.bf16_tflops, row.fp16_tflops, row.fp32_tflops) != (hw.gpu.bf16_tflops, hw.gpu.fp16_tflops,
                                                               hw.gpu.fp32_tflops):
        return {}
    if not any(record.observed and _row(record.device_name) == hw.gpu.name for record in cached_records(path=path)):
        return {}
    if inventory is None:
        try:
            from convoy.devices.discovery import discover

            inventory = discover()
        except Exception:  # noqa: BLE001 -- probing is best effort: the plan stands without observations
            return {}
    here = [d for d in getattr(inventory, "devices", ()) or () if _row(d.name) == hw.gpu.name]
    return observations_for(uuids=tuple(d.uuid for d in here if d.uuid), names=tuple(d.name for d in here),
                            path=path)
