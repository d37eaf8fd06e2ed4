"""The guide's decision process as an algorithm: the fastest layout that fits, with the case and the reasons.

    from convoy.plan.recommend import recommend, guide_case
    rec = recommend(rows, model=model, run=run, hardware=hw)
    rec.candidate.name, rec.case, rec.reasons

The Hugging Face guide "Efficient Training on Multiple GPUs" (https://huggingface.co/docs/transformers/
perf_train_gpu_many, "Scalability strategy") sorts a job into cases: (1) the model fits on one GPU -> DDP or
ZeRO; (2) it does not -> PP, ZeRO or TP (TP/ZeRO need NVLink to compete); (3) its largest layer does not fit
-> TP or ZeRO; and multi-node with fast links -> ZeRO or 3D, with slow links -> DP x PP x TP with ZeRO-1.
Here every candidate is costed instead of guessed, the fastest fitting one wins, and a candidate within
``TIE`` of the fastest wins the tie when it is simpler (``tie_rank``: no offload, no pipeline, no tensor
parallelism, then the guide's data parallelism for the case: DDP when the model fits one device, else ZeRO-1),
and the reason says which of these decided it.
"""

from __future__ import annotations

from dataclasses import dataclass

from convoy.plan.candidates import Candidate
from convoy.plan.commands import with_speedups
from convoy.plan.dims import ParallelDims
from convoy.plan.hardware import Hardware
from convoy.plan.memory import MemoryBreakdown, layer_activation_bytes
from convoy.plan.model import ModelSpec
from convoy.plan.run import OPTIMIZER_STATE_BYTES, RunSpec
from convoy.plan.timing import StepTime
from convoy.plan.units import format_bytes, format_seconds
from convoy.plan.variants import Variant

__all__ = ["Row", "Recommendation", "recommend", "guide_case", "tie_rank", "tie_reason", "TIE",
           "FAST_INTER_GBPS_PER_GPU", "NOT_SPLIT"]

#: step times within this fraction of the fastest count as a tie (the cost model is not finer than that).
TIE = 0.05
#: inter-node bandwidth per GPU (Gbit/s) from which the guide's "fast inter-node connectivity" applies:
#: one 100 Gbit/s NIC per GPU is where ZeRO-3 across nodes stops being network-bound for billion-scale models.
FAST_INTER_GBPS_PER_GPU = 100.0

_CASE_ADVICE = {
    "case 1": "the model fits on one {noun}, so data parallelism (DDP, or ZeRO to save memory) is the guide's choice",
    "case 2": "the model does not fit on one {noun}, so it must be split: pipeline, ZeRO or tensor parallelism",
    "case 3": "even its largest layer does not fit on one {noun}, so only tensor parallelism or ZeRO-3 can hold it",
    "multi-node fast": "several nodes with fast links: ZeRO across nodes, or DP x TP x PP",
    "multi-node slow": "several nodes with slow links: keep TP inside nodes and PP/DP (with ZeRO-1) across them",
}


@dataclass(frozen=True, kw_only=True)
class Row:
    """One candidate with its memory, time and verdict."""

    candidate: Candidate
    memory: MemoryBreakdown
    time: StepTime
    fits: bool
    """True when the per-GPU total (with reserve) is within the GPU's memory."""
    precision: str = ""
    """The precision recipe this row was costed in (``plan_for``'s ``precision_for``; else the run's)."""
    recompute: str = "none"
    """The activation recomputation this row was costed with (the run's, or a knob ``plan_for`` turned)."""
    launch_args: tuple[str, ...] = ()
    """The ``convoy launch`` arguments that run this row (``convoy.plan.commands.launch_args``)."""
    compile: str = "none"
    """The ``torch.compile`` setting this row was costed with (``RunSpec.compile``)."""
    fp8: str = "none"
    """The float8 recipe this row was costed with (``RunSpec.fp8``)."""

    @property
    def name(self) -> str:
        return self.candidate.name

    def as_dict(self) -> dict:
        d = self.candidate.layout.dims
        return {"name": self.name, "strategy": self.candidate.strategy, "zero_stage": self.candidate.layout.zero_stage,
                "offload": self.candidate.layout.offload, "dp_replicate": d.dp_replicate, "dp_shard": d.dp_shard,
                "tp": d.tp, "pp": d.pp, "microbatches": self.candidate.layout.microbatches, "fits": self.fits,
                "pp_schedule": self.candidate.layout.pp_schedule,
                "pp_stages_per_rank": self.candidate.layout.pp_stages_per_rank,
                "precision": self.precision, "recompute": self.recompute, "compile": self.compile, "fp8": self.fp8,
                "launch_args": list(self.launch_args), "model_states_bytes": self.memory.model_states,
                "memory": self.memory.as_dict(), "time": self.time.as_dict()}


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    """The chosen row (None when nothing fits), the guide's case, and why, in plain sentences."""

    row: Row | None
    case: str
    """``"case 1"``, ``"case 2"``, ``"case 3"``, ``"multi-node fast"`` or ``"multi-node slow"``."""
    reasons: tuple[str, ...]
    breaks: tuple[str, ...] = ()
    """What would change the answer (2x sequence length, no NVLink, the network), filled in by ``convoy.plan``."""
    knob: str = ""
    """What ``convoy.plan`` turned because nothing fit as asked: ``"recompute"``, ``"offload"``, both joined by
    ``+``, or ``""``."""
    command: str = ""
    """The ``convoy launch`` command line that runs the choice (``convoy.plan.commands.launch_command``)."""
    accelerator: str = ""
    """The equivalent ``Accelerator(...)`` call (``convoy.plan.commands.accelerator_call``)."""
    compile: str = "none"
    """The ``torch.compile`` setting to run the choice with (``convoy.plan.variants.choose``)."""
    fp8: str = "none"
    """The float8 recipe to run the choice with (``"none"``: 16-bit GEMMs)."""
    variants: tuple[Variant, ...] = ()
    """The choice priced eager, compiled and compiled + float8, side by side (``convoy.plan.variants``)."""

    @property
    def candidate(self) -> Candidate | None:
        return self.row.candidate if self.row else None

    @property
    def strategy(self) -> str | None:
        """The ``Accelerator(strategy=...)`` name of the choice."""
        return self.row.candidate.strategy if self.row else None

    @property
    def dims(self):
        """The ``ParallelDims`` of the choice (for ``CONVOY_PARALLELISM``)."""
        return self.row.candidate.layout.dims if self.row else None

    @property
    def cpu_offload(self) -> bool:
        return bool(self.row and self.row.candidate.layout.offload)

    @property
    def recompute(self) -> str:
        """The activation recomputation of the choice (``"none"`` when nothing is chosen)."""
        return self.row.recompute if self.row else "none"

    @property
    def launch_args(self) -> tuple[str, ...]:
        """The ``convoy launch`` arguments that run the choice, with its compile and float8 (() when nothing fits)."""
        return with_speedups(self.row.launch_args, compile=self.compile, fp8=self.fp8) if self.row else ()

    noun: str = "GPU"
    """What one device is (``GpuSpec.noun``): ``"GPU"``, or ``"CPU process"``."""

    def as_dict(self) -> dict:
        return {"candidate": self.row.name if self.row else None, "strategy": self.strategy,
                "parallelism": self.dims.describe() if self.dims else None, "cpu_offload": self.cpu_offload,
                "recompute": self.recompute, "compile": self.compile, "fp8": self.fp8,
                "compile_seconds": next((v.compile_seconds for v in self.variants
                                         if (v.compile, v.fp8) == (self.compile, self.fp8)), 0.0),
                "variants": [v.as_dict() for v in self.variants],
                "knob": self.knob, "launch_args": list(self.launch_args),
                "command": self.command, "accelerator": self.accelerator,
                "case": self.case, "advice": advice(self.case, self.noun), "reasons": list(self.reasons),
                "breaks": list(self.breaks)}


def _count(n: int) -> str:
    """A parameter count as people say it: 125.0M, 7.00B, 82.3K."""
    for size, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= size:
            return f"{n / size:.2f}{unit}" if unit == "B" else f"{n / size:.1f}{unit}"
    return str(n)


def advice(case: str, noun: str = "GPU") -> str:
    """The guide's advice for ``case``, for devices called ``noun``."""
    return _CASE_ADVICE[case].format(noun=noun)


def _where(hw: Hardware) -> str:
    """"on one GPU, whose memory is 79.6 GiB", or for CPU processes their share of this machine's memory."""
    memory = format_bytes(hw.gpu.memory_bytes, binary=True)
    if hw.gpu.kind == "cpu":
        return f"in one CPU process, whose share of this machine's memory is {memory}"
    return f"on one GPU, whose memory is {memory}"


def guide_case(model: ModelSpec, run: RunSpec, hw: Hardware, single: MemoryBreakdown) -> str:
    """Which of the guide's cases this job is (``single`` is the one-GPU, unsharded memory)."""
    if hw.nodes > 1:
        fast = hw.inter_gbps / hw.gpus_per_node >= FAST_INTER_GBPS_PER_GPU
        return "multi-node fast" if fast else "multi-node slow"
    limit = hw.gpu.memory_bytes
    if single.total <= limit:
        return "case 1"
    recipe = run.recipe
    per_param = recipe.weight_bytes + (recipe.grad_bytes + recipe.master_bytes + OPTIMIZER_STATE_BYTES[run.optimizer]
                                       if run.training else 0)
    if not model.has_shape:
        # Bare parameter counts say nothing about layer sizes; assume a layered model (the common case)
        # rather than claim that one layer cannot fit.
        return "case 2"
    layer: float = model.largest_unit_params * per_param
    if model.has_shape:
        layer += layer_activation_bytes(model, run)
    return "case 3" if layer > limit else "case 2"


def recommend(rows: list[Row], *, model: ModelSpec, run: RunSpec, hw: Hardware, single: MemoryBreakdown
              ) -> Recommendation:
    """Pick the fastest fitting row, ties toward less sharding, and say why."""
    case = guide_case(model, run, hw, single)
    states = format_bytes(single.model_states, binary=True)
    noun = hw.gpu.noun
    reasons = [f"{_count(model.num_params)} parameters with {run.precision} {run.optimizer}: "
               f"{states} of weights, gradients and optimizer state {_where(hw)}; the guide's {case}: "
               f"{advice(case, noun)}."]
    # as asked: CPU offload is a knob (``convoy.plan.knobs``) turned only when nothing else fits
    fitting = [r for r in rows if r.fits and not r.candidate.layout.offload]
    if not fitting:
        asked = [r for r in rows if not r.candidate.layout.offload] or rows  # offload is the knob, not as asked
        smallest = min(asked, key=lambda r: r.memory.total)
        reasons.append(f"No layout fits as asked: the smallest, {smallest.name}, needs "
                       f"{format_bytes(smallest.memory.total, binary=True)} per {noun}.")
        return Recommendation(row=None, case=case, reasons=tuple(reasons), noun=noun)
    # the guide's case 1 is data parallelism: a model that fits one device is not split when a replica fits
    whole = [r for r in fitting if r.candidate.layout.dims.is_trivial]
    split_faster = False
    if case == "case 1" and whole:
        quickest = min(fitting, key=lambda r: r.time.seconds)
        fitting, split_faster = whole, quickest not in whole
    fastest = min(fitting, key=lambda r: r.time.seconds)
    ties = [r for r in fitting if r.time.seconds <= fastest.time.seconds * (1 + TIE)]
    best = min(ties, key=lambda r: (tie_rank(r.candidate, case), r.time.seconds))
    t = best.time
    costed = f" (costed as {best.precision})" if best.precision and best.precision != run.precision else ""
    fits_at = format_bytes(best.memory.total, binary=True)
    reasons.append(f"{best.name} fits at {fits_at} per {noun}{costed} and takes about "
                   f"{format_seconds(t.seconds)} per step ({t.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, "
                   f"{t.mfu:.0%} MFU).")
    if best is not fastest:
        gain = 1 - fastest.time.seconds / t.seconds
        reasons.append(f"{fastest.name} is {_percent(gain)} faster on paper, within the "
                       f"{TIE:.0%} noise of this model, so {best.name} wins: "
                       f"{tie_reason(best.candidate, fastest.candidate, case)}.")
    others = sorted((r for r in fitting if r is not best), key=lambda r: r.time.seconds)
    if others and others[0] is not fastest:
        nxt = others[0]
        reasons.append(f"The next best, {nxt.name}, takes {format_seconds(nxt.time.seconds)} per step.")
    elif others and best is fastest:
        nxt = others[0]
        reasons.append(f"The next best, {nxt.name}, is {nxt.time.seconds / t.seconds - 1:.0%} slower.")
    if case == "case 1" and best.candidate.strategy not in ("ddp", "single"):
        reasons.append(_why_not_ddp(best, fastest, rows, noun))
    if split_faster:
        reasons.append(NOT_SPLIT.format(noun=noun) + ".")
    misfits = sum(not r.fits for r in rows)
    if misfits:
        reasons.append(f"{misfits} of {len(rows)} layouts {'does' if misfits == 1 else 'do'} not fit in memory.")
    exposed = t.exposed_dp + t.tp_comm + t.pp_comm + t.offload
    if exposed > 0.2 * t.seconds:
        reasons.append(f"Communication that compute cannot hide is {exposed / t.seconds:.0%} of its step; "
                       "faster links would speed it up.")
    return Recommendation(row=best, case=case, reasons=tuple(reasons), noun=noun)


#: the reason a model that fits one device (the guide's case 1) is not split, though a split layout costs less
NOT_SPLIT = ("The model fits one {noun}, so tensor and pipeline parallelism (communication in every layer, a "
             "pipeline bubble) were not used")

#: the order data-parallel strategies win a tie in, per guide case: DDP first when the model fits one device
#: (case 1), else ZeRO-1, which shards the optimizer state for DDP's traffic (the guide's "DP x PP x TP with
#: ZeRO-1"); a layout without data parallelism (parallel, single) ranks with DDP: nothing sharded
_DP_ORDER = {"case 1": ("single", "parallel", "ddp", "zero1", "zero2", "zero3", "hsdp"),
             "other": ("zero1", "single", "parallel", "ddp", "zero2", "zero3", "hsdp")}


def _percent(fraction: float) -> str:
    """``"3%"``; under half a percent ``"less than 1%"``: never "0% faster"."""
    return f"{fraction:.0%}" if fraction >= 0.005 else "less than 1%"


def tie_rank(candidate: Candidate, case: str) -> tuple[int, ...]:
    """How a candidate ranks among those within ``TIE`` of the fastest, smaller first: no CPU offload, no
    pipeline, no tensor parallelism, then the guide's data-parallel choice for ``case`` (``_DP_ORDER``); equal
    ranks go to the faster."""
    d = candidate.layout.dims
    order = _DP_ORDER["case 1" if case == "case 1" else "other"]
    return (int(candidate.layout.offload), int(d.pp_enabled), int(d.tp_enabled), order.index(candidate.strategy))


def tie_reason(best: Candidate, other: Candidate, case: str) -> str:
    """Why ``best`` wins the tie against ``other``, from the first part of ``tie_rank`` where they differ."""
    a, b = tie_rank(best, case), tie_rank(other, case)
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
    if first == 0:
        return "it needs no CPU offload"
    if first == 1:
        return "it needs no pipeline"
    if first == 2:
        return "it needs no tensor parallelism"
    if first == 3 and best.strategy == "zero1":
        return ("ZeRO-1 shards the optimizer state for the traffic of DDP, the guide's data parallelism beside "
                "pipelines and tensor parallelism and across nodes")
    if first == 3 and case == "case 1":
        return "the model fits one device, where the guide's choice is the least sharding (DDP, then ZeRO)"
    return "it shards less"


def _why_not_ddp(best: Row, fastest: Row, rows: list[Row], noun: str) -> str:
    """Why a model that fits one device is not trained with DDP, the guide's first choice: DDP does not fit
    (its replicas and buckets), or it is slower than the fastest layout beyond the noise, and by what."""
    d = best.candidate.layout.dims
    ddp = next((r for r in rows if r.candidate.strategy == "ddp"
                and r.candidate.layout.dims == ParallelDims(dp_replicate=d.dp, tp=d.tp, pp=d.pp)), None)
    if ddp is None:  # a layout without data parallelism (tp, pp): DDP over every device instead
        ddp = next((r for r in rows if r.candidate.strategy == "ddp" and r.candidate.layout.dims.is_trivial), None)
    if ddp is None:
        return f"DDP is not among the layouts compared, so {best.name} is used."
    if not ddp.fits:
        return (f"DDP would need {format_bytes(ddp.memory.total, binary=True)} per {noun} (a full replica of the "
                f"weights, gradients and optimizer state, and its gradient buckets), more than there is, so "
                f"{best.name} shards them.")
    slower = ddp.time.seconds / fastest.time.seconds - 1
    parts = {"its optimizer step": ddp.time.optimizer - best.time.optimizer,
             "communication": (ddp.time.exposed_dp - best.time.exposed_dp) + (ddp.time.overhead - best.time.overhead)}
    what, gain = max(parts.items(), key=lambda kv: kv[1])
    return (f"DDP fits too but takes {format_seconds(ddp.time.seconds)} per step, {slower:.0%} more than the fastest "
            f"({fastest.name}), beyond the {TIE:.0%} noise: {best.name} saves {format_seconds(max(gain, 0.0))} in "
            f"{what}.")
