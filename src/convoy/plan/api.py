"""``convoy.plan``: memory and time of every parallelism layout for a model on a machine, and which to use.

    import convoy
    p = convoy.plan("Llama-2-7b/config.json", hardware="8xH100-80GB", seq_len=4096, micro_batch=1)
    p.recommendation.candidate.name, p.recommendation.reasons
    [(r.name, r.memory.total, r.time.seconds, r.fits) for r in p.rows]
    p.to_json()

    convoy plan Llama-2-7b/config.json --hardware 8xH100-80GB --seq-len 4096        # the same, as a table

For a module in hand: ``recommend_for_module(module, world_size=..., device_memory_bytes=...)`` returns the
``Recommendation`` (``.strategy``, ``.dims``, ``.cpu_offload``, ``.reasons``); ``Accelerator(strategy="auto")``
asks it (``convoy.train.strategies.auto``) and turns the answer into a layout the trainer builds.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field, replace

from convoy.errors import PlanError, shown
from convoy.plan.candidates import STRATEGY_NAMES, Candidate, TrainerFacts, enumerate_candidates
from convoy.plan.commands import accelerator_call, launch_args, launch_command
from convoy.plan.hardware import GpuSpec, Hardware, hardware_from_inventory, lookup_gpu, parse_hardware
from convoy.plan.knobs import KNOBS, turn_knobs
from convoy.plan.memory import FRAGMENTATION, Layout, MemoryBreakdown, memory_per_gpu
from convoy.plan.model import ModelSpec, resolve_model
from convoy.plan.recommend import Recommendation, Row, guide_case, recommend
from convoy.plan.run import COMPILE, FP8_RECIPES, RunSpec
from convoy.plan.speed.observed import Observation, case_key, impossible, observations_here
from convoy.plan.speed.rates import Rates, rates_for
from convoy.plan.speed.records import Calibration
from convoy.plan.timing import StepTime, choose_schedule, step_time
from convoy.plan.units import GiB, format_bytes, format_seconds
from convoy.plan.variants import AXES, compare
from convoy.plan.variants import choose as choose_variant
from convoy.reading import is_pathlib_path

TYPE_CHECKING = False  # typing is not imported at run time: a plan starts without it
if TYPE_CHECKING:
    from typing import Any

__all__ = ["Plan", "plan", "plan_for", "recommend_for_module", "MAX_GPUS_PER_NODE", "MAX_GPUS"]

#: the most GPUs one node has (an 8-GPU HGX board, 16 on the largest PCIe servers): ``--hardware 32xH100-80GB`` is
#: a mistake for several nodes, which plan differently (tp inside a node, the network between them); the job
#: as a whole is bounded too, which keeps a plan's time independent of the count asked for
MAX_GPUS_PER_NODE = 16
#: the most devices per node a plan compares layouts for, however the machine was described (an inventory, CPU
#: processes of ``Accelerator(strategy="auto")``)
MAX_DEVICES_PER_NODE = 4096
MAX_GPUS = 2**20


@dataclass(frozen=True, kw_only=True)
class Plan:
    """Everything ``convoy plan`` prints, as data."""

    model: ModelSpec
    run: RunSpec
    hardware: Hardware
    global_batch: int
    efficiency: float | None
    """The flat efficiency the step times use (``efficiency=``), or None: the rates of ``time_model``."""
    rows: tuple[Row, ...]
    """One per candidate, in enumeration order."""
    single_gpu: MemoryBreakdown
    """The unsharded one-GPU memory (what the guide's case 1 asks about)."""
    recommendation: Recommendation
    calibration: Calibration | None = None
    """Rates measured on this machine (``--calibrate``) the step times use; None: a profile or a model."""
    time_note: str = ""
    """One sentence: which time model the step times come from, and why."""
    time_model: str = "modeled"
    """Where the rates came from: ``calibrated``, ``profile``, ``modeled`` or ``datasheet``
    (``convoy.plan.speed.rates``)."""
    observations: Mapping[str, Observation] = field(default_factory=dict)
    """Candidate name -> what a job measured for exactly that case on this machine; those rows' step times are
    the measured ones (``convoy.plan.speed.observed``)."""

    def row(self, name: str) -> Row:
        for r in self.rows:
            if r.name == name:
                return r
        raise PlanError(f"no candidate named {name!r}; have: {', '.join(r.name for r in self.rows)}")

    def as_dict(self) -> dict[str, Any]:
        m, hw = self.model, self.hardware
        return {
            "model": {"name": m.name, "params": m.num_params, "layers": m.num_layers, "hidden": m.hidden,
                      "heads": m.heads, "kv_heads": m.kv_heads, "ffn": m.ffn, "vocab": m.vocab,
                      "max_positions": m.max_positions, "source": m.source},
            "run": {**self.run.__dict__, "global_batch": self.global_batch, "efficiency": self.efficiency},
            "hardware": {"gpu": hw.gpu.name, "memory_bytes": hw.gpu.memory_bytes, "gpus_per_node": hw.gpus_per_node,
                         "nodes": hw.nodes, "intra": hw.intra, "intra_bytes_per_s": hw.intra_bandwidth,
                         "inter_gbps": hw.inter_gbps, "source": hw.gpu.source},
            "time_model": {"kind": self.time_model, "note": self.time_note,
                           "calibration": self.calibration.as_dict() if self.calibration else None,
                           "observed": {name: o.as_dict() for name, o in self.observations.items()}},
            "single_gpu": self.single_gpu.as_dict(),
            "candidates": [r.as_dict() for r in self.rows],
            "recommendation": self.recommendation.as_dict(),
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)


def plan_for(model: ModelSpec, run: RunSpec, hw: Hardware, *, global_batch: int | None = None,
             efficiency: float | None = None, offload: bool = True,
             allowed: Collection[str] | None = None, explain_breaks: bool = True,
             facts: TrainerFacts = TrainerFacts(), calibration: Calibration | None = None,
             time_note: str = "", precision_for: Callable[[Candidate], str] | None = None,
             observed: Mapping[str, Observation] | None = None, knobs: Collection[str] = KNOBS,
             choose: Collection[str] = (), variants: bool = True,
             answer_only: Collection[str] | None = None) -> Plan:
    """The plan for already-resolved inputs (``plan`` resolves names, files and the inventory first).

    ``facts``: what the trainer can run of this model and loop (``TrainerFacts``; ``Accelerator(strategy="auto")``
    passes its own, so that its answer is this function's for the same case).
    ``precision_for``: the precision recipe each candidate runs in, where it is not ``run.precision`` for all of
    them (a trainer whose sharded strategies gather 16-bit weights while its replicated ones autocast).
    ``observed``: what jobs measured on this machine, by ``case_key`` (``observations_here``): a candidate whose
    case is there takes the measured step time. ``knobs``: what may be turned when nothing fits as asked
    (``"recompute"``, ``"offload"``; ``convoy.plan.knobs``). ``choose``: what the plan picks for the chosen layout
    among ``convoy.plan.variants.AXES`` (``"compile"``, ``"fp8"``); the others stay as ``run`` has them.
    ``variants``: price the chosen layout eager, compiled and compiled + float8 side by side.
    ``answer_only``: the names of the rows a caller reads besides the recommendation (None: all of them), as the
    re-plans of "what would change it" do: a row that does not fit and is not named is not timed (its ``time`` is
    ``UNTIMED``); no choice weighs the step of a layout that does not fit, so the recommendation is the same."""
    if efficiency is not None and not 0 < efficiency <= 1:
        raise PlanError(f"efficiency must be in (0, 1], got {efficiency}")
    if allowed is not None and "cp" in allowed:  # the loop splits sequences: cp layouts are candidates too
        facts = replace(facts, context_parallel=True)
    _check_scale(hw)
    rates = rates_for(hw.gpu, calibration=calibration, efficiency=efficiency)
    gb = global_batch or run.global_batch or run.micro_batch * hw.world_size
    if gb < run.micro_batch:
        raise PlanError(f"global batch {gb} is smaller than the micro-batch {run.micro_batch}")
    single = memory_per_gpu(model, run, Layout())
    if facts.pipeline_only and guide_case(model, run, hw, single) == "case 1":
        # a pipeline loop (model(x, target=y)) runs at pp = 1 too, and a model that fits one device is not split
        facts = replace(facts, pipeline_only=False)
    costing = _Costing(model=model, hw=hw, gb=gb, rates=rates, offload=offload, allowed=allowed, facts=facts,
                       precision_for=precision_for, observed=observed or {})
    read = None if answer_only is None else frozenset(answer_only)
    rows, applied = costing.rows(run, read=read)
    rec = recommend(rows, model=model, run=run, hw=hw, single=single)
    if rec.row is None and run.training:  # turn_knobs reads the rows that fit at each level, and only those
        rec = turn_knobs(rec, lambda level: costing.rows(replace(run, recompute=level), read=read or frozenset())[0],
                         asked=run.recompute,
                         knobs=knobs if offload or "offload" not in knobs else tuple(set(knobs) - {"offload"}),
                         noun=hw.gpu.noun, case=rec.case)
    if explain_breaks and rec.row is not None:
        rec = replace(rec, breaks=_breaks(rec, model, replace(run, recompute=rec.recompute), hw, gb, efficiency,
                                          offload, allowed, facts, calibration, precision_for, knobs))
    elif explain_breaks and run.recompute != "full" and run.training and "recompute" not in knobs:
        full = plan_for(model, replace(run, recompute="full"), hw, global_batch=gb, efficiency=efficiency,
                        offload=offload, allowed=allowed, explain_breaks=False, facts=facts,
                        calibration=calibration, precision_for=precision_for,
                        knobs=("offload",) if offload else (), variants=False, answer_only=()).recommendation.row
        if full is not None:
            rec = replace(rec, breaks=(f"With recompute='full' (checkpoint every block) {full.name} fits at "
                                       f"{format_bytes(full.memory.total, binary=True)} per GPU and takes "
                                       f"{format_seconds(full.time.seconds)} per step.",))
    if rec.row is not None and variants:
        rec = _with_variants(rec, model, run, hw, gb, rates, choose)
    if rec.row is not None:
        how = {"precision": rec.row.precision, "recompute": rec.recompute, "compile": rec.compile, "fp8": rec.fp8}
        rec = replace(rec, command=launch_command(rec.row.candidate, hw, **how),
                      accelerator=accelerator_call(rec.row.candidate, **how))
    return Plan(model=model, run=run, hardware=hw, global_batch=gb, efficiency=efficiency, rows=tuple(rows),
                single_gpu=single, recommendation=rec, calibration=calibration, time_model=rates.kind,
                time_note=_time_note(rates, time_note) + _corrected_note(applied), observations=applied)


def _with_variants(rec: Recommendation, model: ModelSpec, run: RunSpec, hw: Hardware, gb: int, rates: Rates,
                   choose: Collection[str]) -> Recommendation:
    """``rec`` with its layout priced eager, compiled and compiled + float8 (``convoy.plan.variants``), and the
    fastest of them that fits chosen for the axes in ``choose`` (the others as ``run`` has them)."""
    row = rec.row
    assert row is not None
    own = replace(run, precision=row.precision or run.precision, recompute=row.recompute)
    asked = {axis: getattr(run, axis) for axis in AXES if axis not in choose}
    options = compare(model, own, row.candidate.layout, hw, global_batch=gb, rates=rates, asked=asked)
    best, why = choose_variant(options, hw=hw, asked=asked)
    if best is None:  # as the rows were costed
        return replace(rec, variants=options, compile=run.compile, fp8=run.fp8)
    return replace(rec, variants=options, compile=best.compile, fp8=best.fp8,
                   reasons=(*rec.reasons, why) if why else rec.reasons)


@dataclass(frozen=True, kw_only=True)
class _Costing:
    """The candidates of one plan costed at a run: what ``plan_for`` asks for each recompute level it tries."""

    model: ModelSpec
    hw: Hardware
    gb: int
    rates: Rates
    offload: bool
    allowed: Collection[str] | None
    facts: TrainerFacts
    precision_for: Callable[[Candidate], str] | None
    observed: Mapping[str, Observation]
    _costed: dict[tuple[RunSpec, frozenset[str] | None], tuple[list[Row], dict[str, Observation]]] = field(
        default_factory=dict, repr=False)
    """``rows`` per run (and ``read``) already asked for (``turn_knobs`` asks again for the run the plan was costed
    at)."""
    _candidates: dict[int, tuple[Candidate, ...]] = field(default_factory=dict, repr=False)
    """The candidates per micro-batch (what they depend on of the run): the same at every recompute level."""

    def rows(self, run: RunSpec, *, read: frozenset[str] | None = None) -> tuple[list[Row], dict[str, Observation]]:
        """One ``Row`` per candidate the trainer runs and ``allowed`` keeps, costed at ``run``, and the
        measurements applied (candidate name -> observation); the same lists again for the same run (read them,
        do not change them). ``read``: the names of the rows the caller reads besides those that fit (None: all):
        a row that does not fit and is not named is not timed (its ``time`` is ``UNTIMED``)."""
        for key in ((run, None), (run, read)):  # rows timed in full serve any caller
            if key in self._costed:
                return self._costed[key]
        self._costed[run, read] = self._rows(run, read)
        return self._costed[run, read]

    def _candidates_at(self, micro_batch: int) -> tuple[Candidate, ...]:
        if micro_batch not in self._candidates:
            alone = {"zero3" if name == "fsdp" else name for name in self.allowed or ()} & {"zero1", "zero2", "zero3"}
            self._candidates[micro_batch] = tuple(enumerate_candidates(
                self.model, self.hw, global_batch=self.gb, micro_batch=micro_batch, offload=self.offload, alone=alone,
                facts=self.facts))
        return self._candidates[micro_batch]

    def _rows(self, run: RunSpec, read: frozenset[str] | None) -> tuple[list[Row], dict[str, Observation]]:
        model, hw, gb = self.model, self.hw, self.gb
        rows: list[Row] = []
        applied: dict[str, Observation] = {}
        uneven: set[int] = set()
        for cand in self._candidates_at(run.micro_batch):
            if self.allowed is not None and not _allowed(cand, self.allowed):
                continue
            if gb % (run.micro_batch * cand.layout.dims.dp):  # each dp rank runs whole micro-batches, equally many
                uneven.add(cand.layout.dims.dp)
                continue
            own = replace(run, precision=self.precision_for(cand)) if self.precision_for is not None else run
            if cand.layout.dims.pp_enabled:  # the pipeline schedule it runs with (convoy.plan.schedules): in its layout
                cand = replace(cand, layout=choose_schedule(model, own, cand.layout, hw, global_batch=gb,
                                                            rates=self.rates))
            mem = _memory(model, own, cand.layout)
            fits = mem.total <= hw.gpu.memory_bytes
            if not fits and read is not None and cand.name not in read:
                rows.append(Row(candidate=cand, memory=mem, time=UNTIMED, fits=False, precision=own.precision,
                                recompute=run.recompute, compile=run.compile, fp8=run.fp8))
                continue
            t = step_time(model, own, cand.layout, hw, global_batch=gb, rates=self.rates)
            seen = self.observed.get(case_key(model, own, cand.layout, hw))
            if seen is not None and impossible(seen, t, hw):  # no GPU measures that: one warning, the model's time
                seen = None
            if seen is not None:  # this job ran here: its measured step, the model's breakdown scaled to it
                t = replace(t, correction=seen.measured_s / t.seconds)
                applied[cand.name] = seen
            rows.append(Row(candidate=cand, memory=mem, time=t, fits=fits,
                            precision=own.precision, recompute=run.recompute, compile=run.compile, fp8=run.fp8,
                            launch_args=launch_args(cand, hw, precision=own.precision, recompute=run.recompute,
                                                    compile=run.compile, fp8=run.fp8)))
        if not rows and uneven:
            raise PlanError(f"global batch {gb} cannot be split evenly: every layout on {hw.describe()} has a "
                            f"data-parallel degree ({', '.join(map(str, sorted(uneven)))}) x micro-batch "
                            f"{run.micro_batch} that does not divide it; use a global batch that is a multiple of "
                            f"{min(uneven) * run.micro_batch}")
        if not rows:
            allowed = sorted(self.allowed or ())
            only = set(allowed) <= {"tp", "pp", "cp", "offload"}  # what goes beside a data-parallel strategy, alone
            hint = (": tp, pp and offload go beside a data-parallel strategy; list one with them, e.g. --strategies "
                    f"zero3,{','.join(allowed)}") if allowed and only else ""
            raise PlanError(f"no candidate layout is allowed ({', '.join(allowed)}) on {hw.describe()}{hint}")
        return rows, applied


#: the time of a row nobody reads (``plan_for``'s ``answer_only``, the levels ``turn_knobs`` tries): its layout does
#: not fit, so no choice weighs its step; infinite compute, so that none could prefer it
UNTIMED = StepTime(compute=math.inf, bubble=0.0, dp_comm=0.0, tp_comm=0.0, pp_comm=0.0, offload=0.0, exposed_dp=0.0,
                   comm_bytes=0.0, tokens=0, world_size=1, model_flops=0.0, peak_flops=0.0)

#: ``memory_per_gpu`` remembered for the plans of one answer (``_breaks`` re-plans the same case on other links
#: and networks, where the memory is the same); a pure function of frozen records, so only its time is saved
_memory = functools.lru_cache(maxsize=2048)(memory_per_gpu)


#: a value in an error message (``convoy.errors.shown``)
_show = functools.partial(shown, huge="<a number too large>")


def _positive_number(key: str, value: Any) -> None:
    """``PlanError`` unless ``value`` is None or a finite number > 0 (no bool, no string, no nan or inf)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise PlanError(f"{key}={_show(value)}: give a finite number > 0")


def _check_scale(hw: Hardware) -> None:
    if hw.gpus_per_node > MAX_DEVICES_PER_NODE or hw.world_size > MAX_GPUS:
        raise PlanError(f"{hw.gpus_per_node} GPUs per node x {hw.nodes} nodes is beyond what the planner compares "
                        f"(at most {MAX_DEVICES_PER_NODE} per node and {MAX_GPUS} in all)")


def _allowed(cand: Candidate, allowed: Collection[str]) -> bool:
    """``cand`` is among ``allowed`` (strategy names, ``fsdp`` for zero3, and ``tp``, ``pp``, ``offload``): its
    strategy (a layout without data parallelism, strategy ``parallel``, by its axes alone), and each axis it
    splits over."""
    d = cand.layout.dims
    ok = (cand.strategy in allowed or (cand.strategy == "zero3" and "fsdp" in allowed)
          or cand.strategy == "parallel")
    return ok and (not d.tp_enabled or "tp" in allowed) and (not d.pp_enabled or "pp" in allowed) and (
        not cand.layout.offload or "offload" in allowed) and (not d.cp_enabled or "cp" in allowed)


def _breaks(rec: Recommendation, model, run, hw, gb, efficiency, offload, allowed, facts,
            calibration=None, precision_for=None, knobs=KNOBS) -> tuple[str, ...]:
    """What would change the answer: twice the sequence length, (on NVLink machines) PCIe instead, and (on
    several nodes) the network speed, when it decides."""
    name = rec.row.name  # type: ignore[union-attr]

    def again(run_: RunSpec, hw_: Hardware) -> Plan:
        return plan_for(model, run_, hw_, global_batch=gb, efficiency=efficiency, offload=offload, allowed=allowed,
                        explain_breaks=False, facts=facts, calibration=calibration, precision_for=precision_for,
                        knobs=knobs, variants=False, answer_only=(name,))

    out = []
    longer = replace(run, seq_len=run.seq_len * 2)
    alt = again(longer, hw)
    same = next((r for r in alt.rows if r.name == name), None)
    pick = alt.recommendation.row
    if same is not None and not same.fits:
        then = f"; {_with_knobs(alt.recommendation)} would be chosen" if pick else "; nothing would fit"
        needs = format_bytes(same.memory.total, binary=True)
        out.append(f"At sequence length {longer.seq_len} {name} needs {needs} per GPU and no longer fits{then}.")
    elif pick is not None and pick.name != name:
        out.append(f"At sequence length {longer.seq_len} {_with_knobs(alt.recommendation)} would be faster than "
                   f"{name}.")
    else:
        out.append(f"At sequence length {longer.seq_len} {name} still fits and stays the choice.")
    if hw.intra == "nvlink" and hw.gpus_per_node > 1:
        alt = again(run, replace(hw, intra="pcie", intra_gbs=None))
        pick = alt.recommendation.row
        same = next((r for r in alt.rows if r.name == name), None)
        slower = f" and takes {format_seconds(same.time.seconds)} per step" if same else ""
        if pick is not None and pick.name != name:
            out.append(f"Without NVLink (PCIe only) {_with_knobs(alt.recommendation)} would be chosen instead; {name} "
                       f"slows down{slower}.")
        else:
            out.append(f"Without NVLink (PCIe only) {name} stays the choice{slower}.")
    if hw.nodes > 1:
        out += _network_breaks(rec, hw, lambda gbps: again(run, replace(hw, inter_gbps=gbps)))
    if rec.knob and run.training and hw.world_size > 1 and not facts.context_parallel and allowed is None:
        out += _context_parallel_break(rec, plan_for(
            model, run, hw, global_batch=gb, efficiency=efficiency, offload=offload, allowed=None, explain_breaks=False,
            facts=replace(facts, context_parallel=True), calibration=calibration, precision_for=precision_for,
            knobs=knobs, variants=False, answer_only=()))
    return tuple(out)


def _context_parallel_break(rec: Recommendation, alt: Plan) -> list[str]:
    """Nothing fitted as asked: what splitting each sequence (context parallel, a layout the loop must ask for)
    would be chosen instead, when it would."""
    pick = alt.recommendation.row
    if pick is None or not pick.candidate.layout.dims.cp_enabled:
        return []
    if rec.row is None:
        return []
    fits = " fits as asked (no knob turned) and" if not alt.recommendation.knob else ""
    return [f"At sequence length {alt.run.seq_len} context parallelism{fits} would be chosen: "
            f"{_with_knobs(alt.recommendation)} (cp={pick.candidate.layout.dims.cp}), "
            f"{format_seconds(pick.time.seconds)} per step against {format_seconds(rec.row.time.seconds)}; plan it "
            f"with --strategies ...,cp (the loop splits each sequence in accelerator.maybe_context_parallel)."]


#: the network speeds a multi-node plan is compared at: one 400 Gbit/s NIC per node (the default) and a DGX
#: H100's eight
NETWORK_GBPS = (400.0, 3200.0)


def _network_breaks(rec: Recommendation, hw: Hardware, at: Callable[[float], Plan]) -> list[str]:
    """A line when the network speed between nodes decides the answer: the plan again at the other of
    ``NETWORK_GBPS`` (or at 8x less, above them), naming what would be chosen there."""
    name = rec.row.name  # type: ignore[union-attr]
    other = next((g for g in NETWORK_GBPS if g > hw.inter_gbps), hw.inter_gbps / 8)
    alt = at(other)
    pick = alt.recommendation.row
    if pick is None or pick.name == name:
        return []
    word = "faster" if other > hw.inter_gbps else "slower"
    return [f"The network between nodes decides it: this plan assumes {hw.inter_gbps:,g} Gbit/s per node "
            f"(--inter-gbps); on a {word} one, {other:,g} Gbit/s, {_with_knobs(alt.recommendation)} would be chosen "
            f"instead."]


def _with_knobs(rec: Recommendation) -> str:
    """The choice's name, with the knob turned to reach it: ``zero3+offload with recompute='full'``."""
    name = rec.row.name if rec.row else "nothing"
    return f"{name} with recompute={rec.recompute!r}" if "recompute" in rec.knob else name


def plan(model: Any = None, *, hardware: str | Hardware | None = None, inventory: Any = None, nodes: int = 1,
         intra: str | None = None, intra_gbs: float | None = None, inter_gbps: float = 400.0,
         gpu_memory_gib: float | None = None, peak_tflops: float | None = None,
         seq_len: int = 2048, micro_batch: int = 1, global_batch: int | None = None, precision: str = "bf16",
         optimizer: str = "adamw", recompute: str = "none", attention: str = "flash", dropout: bool = False,
         efficiency: float | None = None, offload: bool = True, allowed: Collection[str] | None = None,
         params: float | None = None, calibrate: bool = False, compile: str | None = None, fp8: str | None = None,
         **shape: Any) -> Plan:
    """Plan ``model`` (config.json path or dict, ``module:function``, ``nn.Module``, ``ModelSpec``, or ``params=``
    with ``layers=``/``hidden=``/``heads=``/``vocab=``/``ffn=``) on ``hardware``.

    ``hardware``: ``"8xH100-80GB"`` or a ``Hardware``; else ``inventory`` (a path or a ``convoy.devices``
    ``Inventory``); else this machine's detected inventory (``convoy.devices.discovery.discover()``).
    ``calibrate``: measure the planned GPU here (when one is visible; cached per device and torch version,
    ``convoy.plan.speed.records``) and time every candidate with the measured rates.
    ``compile`` (``"none"``, ``"blocks"``, ``"model"``) and ``fp8`` (``"none"``, ``"tensorwise"``, ``"rowwise"``,
    ``"rowwise_with_gw_hp"``): run the layout so; None (the default) lets the plan choose the fastest of eager,
    compile and compile + float8 tensorwise (float8 only on a board with float8 tensor cores).
    ``precision="fp8"`` is bf16 with ``fp8="tensorwise"`` (or the ``fp8`` recipe given).
    """
    for key, value in (("seq_len", seq_len), ("micro_batch", micro_batch), ("global_batch", global_batch),
                       ("nodes", nodes)):
        if value is None and key == "global_batch":  # None: micro_batch x data-parallel degree
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= 2**31:
            raise PlanError(f"{key}={_show(value)}: give a whole number from 1 to {2**31}")
    if inter_gbps is None:  # a default, not a "detect it" None
        raise PlanError("inter_gbps=None: give a finite number > 0 (or leave it out for the default)")
    if efficiency is not None:
        _positive_number("efficiency", efficiency)
        if efficiency > 1:
            raise PlanError(f"efficiency={_show(efficiency)} is a fraction of the peak; give a number in (0, 1], "
                            "or leave it out for the device's rates")
    for key, amount in (("inter_gbps", inter_gbps), ("intra_gbs", intra_gbs),
                        ("gpu_memory_gib", gpu_memory_gib), ("peak_tflops", peak_tflops)):
        _positive_number(key, amount)
    for key, value in (("offload", offload), ("calibrate", calibrate)):
        if not isinstance(value, bool):  # offload='no' is truthy: it planned with offload on
            raise PlanError(f"{key}={_show(value)} is a {type(value).__name__}; give True or False")
    if allowed is not None and (isinstance(allowed, (str, bytes)) or not all(isinstance(a, str) for a in allowed)):
        raise PlanError(f"allowed={_show(allowed)}: give a collection of strategy names such as ['ddp', 'fsdp']")
    precision, compile, fp8 = _speedup_settings(precision, compile, fp8)
    here = None  # this machine's devices, when probed: for the hardware, a calibration and what jobs measured
    if hardware is None and inventory is None:
        from convoy.devices.discovery import discover

        inventory = here = discover()
    # the hardware first: "no accelerator detected" is said before a model is built (seconds for a factory)
    hw = resolve_hardware(hardware, inventory=inventory, nodes=nodes, intra=intra, intra_gbs=intra_gbs,
                          inter_gbps=inter_gbps, gpu_memory_gib=gpu_memory_gib, peak_tflops=peak_tflops)
    spec = resolve_model(model, params=params, **shape)
    run = RunSpec(seq_len=seq_len, micro_batch=micro_batch, global_batch=global_batch, precision=precision,
                  optimizer=optimizer, recompute=recompute, attention=attention, dropout=dropout,
                  compile=compile or "none", fp8=fp8 or "none")
    chosen = tuple(axis for axis, value in (("compile", compile), ("fp8", fp8)) if value is None)
    calibration, note = None, ""
    if calibrate:
        from convoy.plan.speed.measure import resolve_calibration

        calibration, why = resolve_calibration(hw, spec, run, inventory=here)
        if calibration is None:
            note = f"{why}; step times use {rates_for(hw.gpu, efficiency=efficiency).describe()}"
    # the cases jobs measured on this GPU (convoy.plan.speed.observed); none under efficiency=, which asks for the
    # datasheet model alone
    observed = observations_here(hw, inventory=here) if efficiency is None else {}
    return plan_for(spec, run, hw, efficiency=efficiency, offload=offload, allowed=allowed, calibration=calibration,
                    time_note=note, observed=observed, choose=chosen)


def _speedup_settings(precision: str, compile: str | None, fp8: str | None) -> tuple[str, str | None, str | None]:
    """(precision, compile, fp8) as ``RunSpec`` takes them: ``precision="fp8"`` is bf16 with float8 (tensorwise
    unless ``fp8`` names a recipe); ``PlanError`` for a value that is none of the choices."""
    if compile is not None and compile not in COMPILE:
        raise PlanError(f"compile={_show(compile)} is not one of: {', '.join(COMPILE)}")
    if fp8 is not None and fp8 not in FP8_RECIPES:
        raise PlanError(f"fp8={_show(fp8)} is not one of: {', '.join(FP8_RECIPES)}")
    if precision == "fp8":
        if fp8 == "none":
            raise PlanError("precision='fp8' with fp8='none': give a float8 recipe, or another precision")
        return "bf16", compile, fp8 or "tensorwise"
    return precision, compile, fp8


def resolve_hardware(hardware: str | Hardware | None = None, *, inventory: Any = None, nodes: int = 1,
                     intra: str | None = None, intra_gbs: float | None = None, inter_gbps: float = 400.0,
                     gpu_memory_gib: float | None = None, peak_tflops: float | None = None) -> Hardware:
    """A ``Hardware`` from a description, an inventory (file or object), or this machine."""
    if isinstance(hardware, Hardware):
        return hardware
    if hardware is not None and not isinstance(hardware, str):
        raise PlanError(f"hardware={_show(hardware)} is a {type(hardware).__name__}; give 'COUNTxGPU' such as "
                        f"'8xH100-80GB' (or inventory=)")
    if hardware:
        count = re.match(r"\s*([^xX*\s]+)\s*[xX*]\s*(.*)", hardware)
        if count and not re.fullmatch(r"[0-9]{1,7}", count.group(1)) or count and int(count.group(1)) < 1:
            raise PlanError(f"hardware {_show(hardware)}: the GPU count must be a whole number from 1 to "
                            f"{MAX_GPUS_PER_NODE} per node (give more nodes with --nodes)")
        if count and int(count.group(1)) > MAX_GPUS_PER_NODE:
            raise PlanError(_one_node_too_many(int(count.group(1)), count.group(2).strip(), nodes))
        return parse_hardware(hardware, nodes=nodes, intra=intra, intra_gbs=intra_gbs, inter_gbps=inter_gbps,
                              memory_gib=gpu_memory_gib, peak_tflops=peak_tflops)
    if isinstance(inventory, str) or is_pathlib_path(inventory):
        from convoy.devices.inventory import load_inventory

        inventory = load_inventory(inventory)
    if inventory is None:
        from convoy.devices.discovery import discover

        inventory = discover()
    if not getattr(inventory, "devices", ()):
        raise PlanError("no accelerator detected on this machine; describe the target with --hardware, "
                        "e.g. --hardware 8xH100-80GB (or --inventory box.json)")
    hw = hardware_from_inventory(inventory, nodes=nodes, intra=intra, inter_gbps=inter_gbps, peak_tflops=peak_tflops,
                                 memory_gib=gpu_memory_gib)
    if gpu_memory_gib is not None or peak_tflops is not None or intra_gbs is not None:
        from convoy.plan.hardware import override_gpu

        hw = replace(hw, gpu=override_gpu(hw.gpu, memory_gib=gpu_memory_gib, peak_tflops=peak_tflops),
                     intra_gbs=intra_gbs)
    return hw


def _one_node_too_many(count: int, gpu: str, nodes: int) -> str:
    """The message for ``--hardware 32xH100-80GB``: no node has that many GPUs; the ``--nodes`` spelling of it."""
    per_node = 8 if count % 8 == 0 else max(d for d in range(1, MAX_GPUS_PER_NODE + 1) if count % d == 0)
    total = count // per_node * nodes
    return (f"hardware {count}x{gpu} is {count} GPUs in one node (no node has more than {MAX_GPUS_PER_NODE}); "
            f"for {total} nodes of {per_node} write --hardware {per_node}x{gpu} --nodes {total}")


def _time_note(rates: Rates, given: str = "") -> str:
    """The one sentence every plan shows about its step times: ``given`` (why a calibration was not used, said
    by the caller), else where ``rates`` come from."""
    return given or f"step times use {rates.describe()}"


def _corrected_note(applied: Mapping[str, Observation]) -> str:
    """What the time line adds for rows a job measured on this machine (marked * in the table)."""
    if not applied:
        return ""
    rows = ", ".join(f"{name} ({format_seconds(o.measured_s)} measured over {o.steps} steps, the model said "
                     f"{format_seconds(o.planned_s)})" for name, o in applied.items())
    return f"; corrected by a measurement of this job on this machine (marked *): {rows}"


def recommend_for_module(module: Any, *, world_size: int, device_memory_bytes: int, precision: str = "bf16",
                         seq_len: int = 2048, micro_batch: int = 1, optimizer: str = "adamw",
                         gpu: str | GpuSpec | None = None, peak_tflops: float | None = None,
                         gpus_per_node: int | None = None,
                         nodes: int = 1, allowed: Collection[str] | None = STRATEGY_NAMES,
                         facts: TrainerFacts = TrainerFacts(), knobs: Collection[str] = KNOBS, recompute: str = "none",
                         calibration: Calibration | None = None,
                         precision_for: Callable[[Candidate], str] | None = None, compile: str = "none",
                         fp8: str = "none", **shape: Any) -> Recommendation:
    """The layout to use for ``module`` (an ``nn.Module``, a config, or a ``ModelSpec``) on ``world_size``
    devices of ``device_memory_bytes`` each: the planner's recommendation among the ``allowed`` candidates,
    ``plan_for``'s for the same case.

    ``gpu``: a table name or NVML device name for peak FLOPs, links and the shipped profile, or a ``GpuSpec``
    (``convoy.plan.hardware.CPU`` for CPU processes); default: a generic PCIe device with 100 TFLOPs.
    ``allowed``: candidate strategy names (default: the data-parallel ones; add ``"tp"``, ``"pp"``, ``"offload"``
    for those layouts; None: all). ``facts``: what the trainer can run of this model and loop (``TrainerFacts``).
    ``knobs``: what may be turned when nothing fits as asked (``convoy.plan.knobs``). ``precision_for``: each
    candidate's precision recipe where it differs from ``precision`` (see ``plan_for``). ``calibration``: rates
    measured on this device (``convoy.plan.speed.measure.calibrate(spec, run)``); None keeps the datasheet time
    model. ``recompute``: the activation recomputation the run asks for (the knob turns it further only from
    ``"none"``). ``compile``, ``fp8``: how the run compiles and which float8 recipe it trains with; every layout is
    costed so (``convoy plan --compile --fp8``), nothing is chosen for it. Raises ``PlanError`` when no allowed
    layout fits, or for float8 on a board without float8 tensor cores.
    """
    if world_size < 1 or device_memory_bytes <= 0:
        raise PlanError(f"recommend_for_module needs world_size >= 1 and device memory > 0, got "
                        f"{world_size} and {device_memory_bytes}")
    per_node = gpus_per_node or max(1, world_size // nodes)
    if per_node * nodes != world_size:
        raise PlanError(f"{nodes} nodes x {per_node} devices per node is not the world size {world_size}")
    spec = gpu if isinstance(gpu, GpuSpec) else lookup_gpu(gpu) if gpu else GpuSpec(
        name="device", memory_bytes=device_memory_bytes, bf16_tflops=100.0, fp16_tflops=100.0, fp32_tflops=25.0,
        nvlink_gbs=None, pcie_gbs=16, source="generic device (no table row)")
    spec = replace(spec, memory_bytes=int(device_memory_bytes))
    if peak_tflops:  # the fp8 peak keeps the table's ratio to bf16
        fp8_peak = spec.fp8_tflops * peak_tflops / spec.bf16_tflops if spec.fp8_tflops and spec.bf16_tflops else None
        spec = replace(spec, bf16_tflops=peak_tflops, fp16_tflops=peak_tflops, fp32_tflops=peak_tflops,
                       fp8_tflops=fp8_peak)
    hw = Hardware(gpu=spec, gpus_per_node=per_node, nodes=nodes,
                  intra="nvlink" if spec.nvlink_gbs is not None else "pcie")
    model = resolve_model(module, **shape)
    run = RunSpec(seq_len=seq_len, micro_batch=micro_batch, precision=precision, optimizer=optimizer,
                  recompute=recompute, compile=compile, fp8=fp8)

    offload = allowed is None or "offload" in allowed
    result = plan_for(model, run, hw, offload=offload, allowed=allowed, explain_breaks=False, facts=facts,
                      calibration=calibration, precision_for=precision_for, knobs=knobs)
    rec = result.recommendation
    if rec.row is None:
        raise PlanError(" ".join(rec.reasons))
    return rec


def _variant_lines(rec: Recommendation) -> list[str]:
    """The chosen layout eager, compiled and compiled + float8 side by side: step, memory, tokens/s per GPU."""
    table = [("", "step", "memory", "tokens/s/GPU", "first step")]
    for v in rec.variants:
        mark = "*" if (v.compile, v.fp8) == (rec.compile, rec.fp8) else " "
        if v.time is None or v.memory is None:
            table.append((f"{mark} {v.name}", "-", "-", "-", v.why_not))
            continue
        first = f"+{format_seconds(v.compile_seconds)} compile (estimate)" if v.compile_seconds else ""
        table.append((f"{mark} {v.name}", format_seconds(v.time.seconds),
                      format_bytes(v.memory.total, binary=True) + ("" if v.fits else " (does not fit)"),
                      f"{v.time.tokens_per_s_per_gpu:,.0f}", first))
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    name = rec.row.name if rec.row else ""
    out = [f"compile and float8 for {name} (* = recommended; factors and sources: docs/planner.md):"]
    for row in table:
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:4], widths[1:])] + [row[4]]
        out.append(("    " + "  ".join(cells)).rstrip())
    return out
def _longer_than_the_model(p: Plan) -> list[str]:
    """A line when the planned sequence is longer than the model takes (GPT-2's 1,024 positions)."""
    most = p.model.max_positions
    if most is None or p.run.seq_len <= most:
        return []
    return [f"note      seq {p.run.seq_len} is longer than the {most:,} positions this model takes: it cannot run "
            f"it as planned; give --seq-len {most} (or less)"]


def _table(p: Plan) -> list[str]:
    """The candidates, fitting and fastest first, memory per GPU in GiB (one unit, so the table stays near 110
    columns), the recommended row marked."""
    head = ("candidate", "dp", "tp", "pp", "params", "grads", "optim", "master", "activ", "buffers", "temp",
            "total", "fits", "step", "comm", "MFU", "")
    rec = p.recommendation  # a row of this table unless its recompute was turned (then the table has none)
    chosen = rec.row.name if rec.row is not None and "recompute" not in rec.knob else None
    table: list[tuple[str, ...]] = [head]
    for r in sorted(p.rows, key=lambda r: (not r.fits, r.time.seconds)):
        d, mem = r.candidate.layout.dims, r.memory
        gib = [f"{x / GiB:.1f}" if x else "0" for x in (mem.params, mem.grads, mem.optimizer, mem.master,
                                                        mem.activations, mem.buffers, mem.temporary, mem.total,
                                                        r.time.comm_bytes)]
        table.append((r.name, str(d.dp), str(d.tp), str(d.pp), *gib[:8], "yes" if r.fits else "NO",
                      format_seconds(r.time.seconds) + ("*" if r.name in p.observations else ""), gib[8],
                      f"{r.time.mfu:.0%}", "<- recommended" if r.name == chosen else ""))
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    start = [sum(widths[:i]) + i for i in range(len(head))]  # each column's first character, one space apart
    memory, comm = "memory per GPU, GiB", "GiB/GPU"
    lines = [" " * start[4] + memory + " " * (start[14] + widths[14] - len(comm) - start[4] - len(memory)) + comm]
    for row in table:
        lines.append(" ".join(c.ljust(w) if i in (0, len(head) - 1) else c.rjust(w)
                              for i, (c, w) in enumerate(zip(row, widths))).rstrip())
    return lines


def format_plan(p: Plan) -> str:
    """The readable table ``convoy plan`` prints."""
    hw, m = p.hardware, p.model
    network = " (network: --inter-gbps)" if hw.nodes > 1 else ""
    lines = [f"model     {m.name}: {m.num_params:,} parameters ({m.source})",
             f"hardware  {hw.describe()}, {format_bytes(hw.gpu.memory_bytes, binary=True)} per GPU{network}",
             f"run       seq {p.run.seq_len} x micro-batch {p.run.micro_batch}, global batch {p.global_batch}, "
             f"{p.run.precision} {p.run.optimizer}, recompute {p.run.recompute}, attention {p.run.attention}",
             *_longer_than_the_model(p), ""]
    lines += _table(p)
    rec = p.recommendation
    lines.append("")
    lines.append(f"time: {p.time_note}")
    knob = f" with recompute={rec.recompute!r}" if "recompute" in rec.knob else ""
    lines.append(f"recommended: {rec.row.name if rec.row else 'nothing fits'}{knob}"
                 + (f"  (strategy={rec.strategy}, {rec.dims.describe()})" if rec.row else ""))
    if rec.row:
        lines.append(f"  run it:  {rec.command}")
        lines.append(f"  or:      {rec.accelerator}")
    if rec.row and rec.variants:
        lines += _variant_lines(rec)
    lines += [f"  - {s}" for s in rec.reasons]
    if rec.breaks:
        lines.append("what would change it:")
        lines += [f"  - {s}" for s in rec.breaks]
    lines.append("total = params + optim + master + buffers + max(activ + temp, grads [+ the block recomputed "
                 f"last]) + reserve\n        (CUDA context, {FRAGMENTATION:.1%} fragmentation); grads are added, "
                 "not maxed, when they "
                 "live through gradient accumulation")
    return "\n".join(lines)
