"""The layouts worth comparing for a model on a machine: DDP, ZeRO 1/2/3, HSDP, TP, PP, their products, offload.

    from convoy.plan.candidates import enumerate_candidates, TrainerFacts
    for c in enumerate_candidates(model, hw, global_batch=64, micro_batch=1):
        c.name, c.strategy, c.layout.dims.describe()      # 'zero1+tp2+pp2', 'zero1', 'dp=2,tp=2,pp=2'
    enumerate_candidates(model, hw, global_batch=64, micro_batch=1, facts=TrainerFacts(tp_degrees=(2,)))

Rules (the Hugging Face "Efficient training on multiple GPUs" guide, Megatron and torchtitan practice): tensor
parallelism stays inside one node and divides the attention heads; pipeline stages do not outnumber the layers;
ZeRO-2/3 beside a pipeline run as FSDP2 per stage; HSDP shards within a node and replicates across nodes. Every
candidate is one the trainer runs under the name ``Accelerator(strategy=...)`` and ``convoy launch --strategy``
take (a layout without data parallelism is strategy ``parallel``). ``TrainerFacts`` narrow them to what the trainer
can do with this model and loop: ``strategy="auto"`` passes them, ``convoy plan`` plans without limits.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterator
from dataclasses import dataclass

from convoy.plan.dims import ParallelDims, divisors
from convoy.plan.hardware import Hardware
from convoy.plan.memory import Layout
from convoy.plan.model import ModelSpec

__all__ = ["Candidate", "TrainerFacts", "enumerate_candidates", "STRATEGY_NAMES", "FSDP2_STRATEGIES"]

#: the candidates' strategy names, as ``Accelerator(strategy=...)`` spells them (``parallel``: tp/pp without dp).
STRATEGY_NAMES = ("single", "ddp", "zero1", "zero2", "zero3", "hsdp", "parallel")
_STAGE = {"single": 0, "ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "hsdp": 3, "parallel": 0}
#: the strategies the trainer runs with FSDP2 over data parallelism alone
FSDP2_STRATEGIES = ("zero2", "zero3", "hsdp")


@dataclass(frozen=True, kw_only=True)
class TrainerFacts:
    """What the trainer can do with this model and loop; the candidates are enumerated within it."""

    tp_degrees: tuple[int, ...] | None = None
    """The tensor-parallel degrees above 1 the model can be split by (its tp plan, its heads); None: every divisor
    of the heads that fits in a node."""
    pp_degrees: tuple[int, ...] | None = None
    """The pipeline degrees above 1 the model can be cut into; None: any up to its layers."""
    pipeline_only: bool = False
    """The loop trains with ``model(x, target=y)``, which only a pipeline runs: pipeline layouts only."""
    context_parallel: bool = False
    """The loop splits each sequence (``accelerator.maybe_context_parallel``): layouts with cp > 1 too. Off by
    default, as the loop must ask for it (``convoy plan --strategies ...,cp``); ``strategy="auto"`` never picks it."""
    fsdp: bool = True
    """False when FSDP2 cannot wrap the model (a scalar parameter, two dtypes in a unit): no layout that runs on
    it (zero2, zero3, hsdp, offload, and data parallelism beside tp, whose DTensor weights FSDP2 holds)."""

    def takes(self, candidate: Candidate) -> bool:
        """True when the trainer runs ``candidate`` for this model and loop."""
        d = candidate.layout.dims
        if self.tp_degrees is not None and d.tp_enabled and d.tp not in self.tp_degrees:
            return False
        if self.pp_degrees is not None and d.pp_enabled and d.pp not in self.pp_degrees:
            return False
        if self.pipeline_only and not d.pp_enabled:
            return False
        return self.fsdp or not uses_fsdp2(candidate)


def uses_fsdp2(candidate: Candidate) -> bool:
    """True when the trainer runs ``candidate`` on FSDP2: the sharded strategies, offload, and any data
    parallelism beside tp (``fully_shard``, or FSDP2's ``replicate`` for ddp)."""
    d = candidate.layout.dims
    return candidate.strategy in FSDP2_STRATEGIES or candidate.layout.offload or (d.tp_enabled and d.dp_enabled)


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One way to lay the model out: a name for people, a strategy for the trainer, a layout for the model."""

    name: str
    """e.g. ``"zero3"``, ``"ddp+tp4"``, ``"zero2+offload"``, ``"tp2+pp4"``."""
    strategy: str
    """The ``Accelerator(strategy=...)`` name: ``single``, ``ddp``, ``zero1``, ``zero2``, ``zero3``, ``hsdp``, or
    ``parallel`` for tp/pp without data parallelism."""
    layout: Layout
    """Degrees, ZeRO stage, offload and micro-batches."""

    @property
    def dims(self) -> ParallelDims:
        return self.layout.dims



def _name(strategy: str, dims: ParallelDims, offload: bool) -> str:
    parts = [strategy] if dims.dp_enabled or dims.is_trivial or dims.cp_enabled else []
    if dims.cp_enabled:
        parts.append(f"cp{dims.cp}")
    if dims.tp_enabled:
        parts.append(f"tp{dims.tp}")
    if dims.pp_enabled:
        parts.append(f"pp{dims.pp}")
    if offload:
        parts.append("offload")
    return "+".join(parts)


def enumerate_candidates(model: ModelSpec, hw: Hardware, *, global_batch: int, micro_batch: int,
                         offload: bool = True, alone: Collection[str] = (),
                         facts: TrainerFacts = TrainerFacts()) -> Iterator[Candidate]:
    """Every candidate layout for ``model`` on ``hw`` (all of its GPUs) that the trainer runs within ``facts``.
    ``alone``: ZeRO strategies (``zero1``, ``zero2``, ``zero3``) to plan on one GPU too, where they shard nothing but
    run (``Accelerator(strategy="zero3")`` on one process is FSDP2 over a group of one); only when asked for, since
    they never beat ``single`` there."""
    yield from (c for c in _every_candidate(model, hw, global_batch=global_batch, micro_batch=micro_batch,
                                            offload=offload, alone=alone) if facts.takes(c))
    if facts.context_parallel and hw.world_size > 1:
        yield from (c for c in _context_parallel_candidates(model, hw, global_batch=global_batch,
                                                             micro_batch=micro_batch) if facts.takes(c))


def _context_parallel_candidates(model: ModelSpec, hw: Hardware, *, global_batch: int, micro_batch: int
                                 ) -> Iterator[Candidate]:
    """zero3 over dp_shard x cp (as the trainer runs cp: FSDP2 over both), with each tp a node takes; the cp group
    is the next-innermost dimension, so it stays inside a node when cp x tp divides the node's GPUs."""
    world = hw.world_size
    tps = [1]
    if model.heads:
        tps = [t for t in divisors(model.heads) if hw.gpus_per_node % t == 0 and world % t == 0]
    for tp in tps:
        for cp in divisors(world // tp)[1:]:
            dims = ParallelDims(dp_shard=world // (tp * cp), cp=cp, tp=tp)
            m = max(1, math.ceil(global_batch / (micro_batch * dims.dp)))
            yield Candidate(name=_name("zero3", dims, False), strategy="zero3",
                            layout=Layout(dims=dims, zero_stage=3, microbatches=m))


def _every_candidate(model: ModelSpec, hw: Hardware, *, global_batch: int, micro_batch: int,
                     offload: bool, alone: Collection[str]) -> Iterator[Candidate]:
    world = hw.world_size

    def make(strategy: str, dims: ParallelDims, off: bool = False) -> Candidate:
        m = max(1, math.ceil(global_batch / (micro_batch * dims.dp)))
        layout = Layout(dims=dims, zero_stage=_STAGE[strategy], offload=off, microbatches=m)
        return Candidate(name=_name(strategy, dims, off), strategy=strategy, layout=layout)

    if world == 1:
        yield make("single", ParallelDims())
        for strategy in ("zero1", "zero2", "zero3"):
            if strategy in alone:
                microbatches = make("single", ParallelDims()).layout.microbatches
                yield Candidate(name=strategy, strategy=strategy,
                                layout=Layout(zero_stage=_STAGE[strategy], microbatches=microbatches))
        if offload:
            yield make("zero3", ParallelDims(), True)
        return
    tps = [1]
    if model.heads:
        # a tp group is t neighbouring ranks: it stays inside one node only when t divides the node's GPUs
        tps = [t for t in divisors(model.heads) if hw.gpus_per_node % t == 0 and world % t == 0]
    for tp in tps:
        for pp in divisors(world // tp):
            if pp > 1 and (model.num_layers is None or pp > model.num_layers):
                continue
            dp = world // (tp * pp)
            if dp == 1:
                yield make("single" if tp == pp == 1 else "parallel", ParallelDims(tp=tp, pp=pp))
                continue
            plain = ParallelDims(dp_replicate=dp, tp=tp, pp=pp)
            yield make("ddp", plain)
            yield make("zero1", plain)
            if pp > 1:  # FSDP2 per pipeline stage (the trainer's dp_engine fsdp/zero2 beside pp): planned as ZeRO-2
                yield make("zero2", ParallelDims(dp_shard=dp, tp=tp, pp=pp))  # with whole gradients until the last
                continue  # micro-batch (convoy.plan.memory)
            sharded = ParallelDims(dp_shard=dp, tp=tp)
            if tp == 1:
                yield make("zero2", plain)
                if offload:
                    yield make("zero2", plain, True)
            yield make("zero3", sharded)
            if tp == 1 and offload:
                yield make("zero3", sharded, True)
            per_node = hw.gpus_per_node // tp
            if hw.nodes > 1 and 1 < per_node < dp and dp % per_node == 0:
                yield make("hsdp", ParallelDims(dp_replicate=dp // per_node, dp_shard=per_node, tp=tp))
