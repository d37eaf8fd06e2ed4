"""Bytes per GPU for one training layout: model states, activations, buffers and the framework's reserve.

    from convoy.plan.memory import Layout, memory_per_gpu, korthikanti_layer_bytes
    run = RunSpec(seq_len=2048, micro_batch=1, precision="bf16")      # convoy.plan.run
    mem = memory_per_gpu(model, run, Layout(zero_stage=3, dims=ParallelDims(dp_shard=64)))
    mem.model_states, mem.activations, mem.total

Model states follow the ZeRO paper (Rajbhandari et al. 2020, https://arxiv.org/abs/1910.02054, section 3.1): stage
1 shards the optimizer's states over the data-parallel degree, stage 2 also the gradients, stage 3 also the
weights. Activations are counted tensor by tensor (``convoy.plan.activations``); ``korthikanti_layer_bytes`` is
Korthikanti et al. 2022's table 2 (https://arxiv.org/abs/2205.05198). Buffers and the reserve are documented
estimates: docs/planner.md, "Memory per GPU", says where each comes from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from convoy.errors import PlanError
from convoy.plan.activations import block_bytes, head_saved_bytes, weight_cast_bytes
from convoy.plan.dims import ParallelDims
from convoy.plan.memo import hashed_once, remembered
from convoy.plan.model import ModelSpec
from convoy.plan.run import OPTIMIZER_STATE_BYTES, RECOMPUTE, RunSpec
from convoy.plan.schedules import check_schedule
from convoy.plan.schedules import in_flight as schedule_in_flight
from convoy.plan.stacks import Stack, stack_named
from convoy.plan.units import MiB

__all__ = ["Layout", "MemoryBreakdown", "memory_per_gpu", "korthikanti_layer_bytes", "layer_activation_bytes",
           "CUDA_CONTEXT_BYTES", "FRAGMENTATION", "RESERVED_OVER_ALLOCATED", "reported_bytes"]

#: CUDA context plus cuBLAS/cuDNN workspaces a PyTorch process holds outside the caching allocator; a typical
#: figure for recent PyTorch on Hopper/Ampere with lazy module loading (nvidia-smi minus max_memory_reserved). Not
#: yet measured here: the H100 runs of /work/shared/gpu-runs recorded allocated and reserved, not nvidia-smi.
CUDA_CONTEXT_BYTES = 600 * MiB
#: allowance for the caching allocator's fragmentation (reserved beyond allocated), as a fraction of allocated.
#: Measured on one H100 (benchmarks/planner_accuracy.py, 2026-11-25, its 18 cases: plain PyTorch and transformers
#: models, torch 2.11): max_memory_reserved exceeds max_memory_allocated by 2.9 % to 25 % (median 9.6 %, lower
#: quartile 3.5 %; FSDP2's cases 7.5-22 %) when memory is not tight. Near its limit the caching allocator frees its
#: cached blocks and retries before it raises out-of-memory, so a plan's fit charges the lower quartile;
#: ``RESERVED_OVER_ALLOCATED`` is the median, what ``max_memory_reserved`` is expected to read.
FRAGMENTATION = 0.035
#: the median measured ratio of max_memory_reserved to max_memory_allocated on the H100 runs (see FRAGMENTATION)
RESERVED_OVER_ALLOCATED = 1.096


@hashed_once
@dataclass(frozen=True, kw_only=True)
class Layout:
    """How a candidate places the model on the GPUs."""

    dims: ParallelDims = field(default_factory=ParallelDims)
    """Parallel degrees."""
    zero_stage: int = 0
    """0 = replicated (DDP), 1 = optimizer sharded, 2 = + gradients, 3 = + weights (FSDP)."""
    offload: bool = False
    """Optimizer state, master weights and gradients (and stage-3 weights) live in host memory."""
    microbatches: int = 1
    """Micro-batches per optimizer step on each pipeline (gradient accumulation steps)."""
    pp_schedule: str = "1f1b"
    """The pipeline schedule (``strategy_options["pp_schedule"]``; ``convoy.plan.schedules``): ``1f1b``,
    ``interleaved_1f1b``, ``gpipe``, ``looped_bfs``. Meaningful with pp > 1."""
    pp_stages_per_rank: int = 1
    """Pipeline stages each rank holds (``strategy_options["pp_stages_per_rank"]``): v > 1 with the interleaved and
    looped schedules."""

    def __post_init__(self) -> None:
        check_schedule(self.pp_schedule, self.pp_stages_per_rank)

    @property
    def shard_degree(self) -> int:
        """Ranks a ZeRO stage shards over: dp_shard for stage 3 (HSDP replicates across it), else all of dp; times
        cp (FSDP2 shards over dp_shard x cp: the cp ranks hold different shards of the same weights)."""
        return (self.dims.dp_shard if self.zero_stage == 3 else self.dims.dp) * self.dims.cp


@dataclass(frozen=True, kw_only=True)
class MemoryBreakdown:
    """Bytes on one GPU (the busiest one: the first pipeline stage)."""

    params: int
    grads: int
    optimizer: int
    master: int
    activations: int
    buffers: int
    reserve: int
    temporary: int = 0
    """Short-lived tensors alive at the activation peak: cross-entropy's fp32 gradients of the logits."""
    grads_at_peak: bool = True
    """False when gradients are freed between steps (``zero_grad(set_to_none=True)``, no accumulation): the
    activation peak (start of backward) and the gradient peak (end of backward) then do not coincide."""
    host: int = 0
    """Bytes this rank keeps in host memory (offload)."""
    late: int = 0
    """Bytes alive at the end of the backward next to (nearly) all gradients: under full recomputation, the
    working set of the first block, recomputed last."""

    @property
    def model_states(self) -> int:
        """Weights + gradients + optimizer states + master weights: the ZeRO paper's figure."""
        return self.params + self.grads + self.optimizer + self.master

    @property
    def allocated(self) -> int:
        """What ``torch.cuda.max_memory_allocated`` would see at the peak of a step.

        Static states + buffers, plus activations and temporaries (start of backward) or the gradients (end
        of backward), whichever is larger; both when gradients live through the step (accumulation).
        """
        return _peak(self.params + self.optimizer + self.master + self.buffers, self.activations + self.temporary,
                     grads=self.grads, late=self.late, grads_at_peak=self.grads_at_peak)

    @property
    def total(self) -> int:
        return self.allocated + self.reserve

    def as_dict(self) -> dict[str, int]:
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer, "master": self.master,
                "activations": self.activations, "buffers": self.buffers, "temporary": self.temporary,
                "reserve": self.reserve, "allocated": self.allocated, "total": self.total,
                "late": self.late, "grads_at_peak": self.grads_at_peak, "host": self.host}


def _peak(static: int, live: int, *, grads: int, late: int, grads_at_peak: bool) -> int:
    """``MemoryBreakdown.allocated`` from its parts (``memory_per_gpu`` sizes the reserve before building one)."""
    if grads_at_peak:
        return static + max(live, late) + grads
    return static + max(live, grads + late)


def korthikanti_layer_bytes(*, s: int, b: int, h: int, a: int, t: int = 1, sequence_parallel: bool = False,
                            recompute: str = "none") -> float:
    """Activation bytes of one transformer layer, exactly table 2 of Korthikanti et al. 2022.

    Assumes 16-bit activations, dropout, GELU MLP of 4h and attention that stores its s x s scores.
    """
    if recompute == "full":
        return 2 * s * b * h / (t if sequence_parallel else 1)
    if recompute == "selective":
        return s * b * h * (34 / t if sequence_parallel else 10 + 24 / t)
    if recompute != "none":
        raise PlanError(f"recompute {recompute!r} is not one of: {', '.join(RECOMPUTE)}")
    if sequence_parallel:
        return s * b * h * (34 / t + 5 * a * s / (h * t))
    return s * b * h * (10 + 24 / t + 5 * a * s / (h * t))


def layer_activation_bytes(model: ModelSpec, run: RunSpec, *, tp: int = 1, stored_only: bool = True,
                           save_list: str = "convoy") -> float:
    """Activation bytes one block keeps for backward: ``convoy.plan.activations.block_bytes``, tensor by tensor.

    For the ``generic`` family with GELU of 4h, eager attention, dropout and 16-bit activations it equals
    ``korthikanti_layer_bytes`` without recomputation and with full recomputation (sequence parallel when
    ``tp > 1``, as torch's ``SequenceParallel`` does); selective recomputation is the trainer's save list.
    ``stored_only=False`` gives what a block holds while it is recomputed (its full no-recompute set).
    """
    assert model.hidden is not None and model.heads is not None
    return block_bytes(model, run, tp=tp, stored_only=stored_only, save_list=save_list)


def _stage_params(model: ModelSpec, pp: int) -> int:
    """Parameters on the heaviest pipeline stage (its share of blocks plus the embedding or the head)."""
    if pp == 1:
        return model.num_params
    if model.layer_params is None or model.num_layers is None:
        return math.ceil(model.num_params / pp)
    blocks = math.ceil(model.num_layers / pp) * model.layer_params
    embed = (model.vocab or 0) * (model.hidden or 0)
    outside = model.non_layer_params
    return blocks + max(min(embed, outside), outside - min(embed, outside))


def local_run(run: RunSpec, dims: ParallelDims) -> RunSpec:
    """``run`` as one rank of a cp group sees it: its ``seq_len / cp`` tokens of each sequence (the activations,
    logits, GEMMs and tensor-parallel traffic scale with it; attention over the whole sequence does not)."""
    return replace(run, seq_len=max(1, run.seq_len // dims.cp)) if dims.cp_enabled else run


@remembered
def memory_per_gpu(model: ModelSpec, run: RunSpec, layout: Layout, *, stack: str | Stack = "convoy"
                   ) -> MemoryBreakdown:
    """Per-GPU bytes of ``model`` trained as ``run`` under ``layout``, on the software ``stack``
    (``convoy.plan.stacks``: its attention and selective save list; convoy's own by default). What a stack prints as
    its memory: ``reported_bytes``."""
    stack = stack_named(stack)
    run = stack.applied(run)
    dims, recipe = layout.dims, run.recipe
    psi = _stage_params(model, dims.pp) / dims.tp  # parameters this GPU's model-parallel shard owns
    dp, shard = dims.dp_cp, layout.shard_degree  # the gradients and optimizer state are sharded over dp x cp
    run = local_run(run, dims)  # activations and logits: this rank's part of each sequence
    stage = layout.zero_stage
    train = run.training
    opt_bytes = OPTIMIZER_STATE_BYTES[run.optimizer]
    master_bytes = recipe.master_bytes if train else 0
    weight = psi * recipe.weight_bytes / (shard if stage >= 3 else 1)
    # ZeRO-2 as FSDP2 runs it (convoy's zero2: fully_shard(reshard_after_forward=False)): the parameter is the fp32
    # shard the optimizer steps, and the weights gathered in the forward stay whole until the backward, beside it.
    # Recipes with separate 16-bit weights and an fp32 master (DeepSpeed's, the ZeRO paper's "bf16") keep the
    # 16-bit weights whole and only the master sharded, which the lines above count.
    # (in inference no master is counted, so the shard is the whole fp32 copy: weight + master bytes under bf16-fsdp)
    shard_bytes = recipe.weight_bytes + (0 if train else recipe.master_bytes)
    stored_shard = psi * shard_bytes / dp if stage == 2 and dp > 1 and recipe.master_bytes < 4 else 0
    # FSDP2 per pipeline stage (stage 2 with pp, convoy's dp x pp with dp_engine fsdp/zero2): the schedule turns
    # gradient sync off until the last micro-batch, so a stage accumulates its whole gradients and reduce-scatters
    # them once, at the end of the step
    pipeline_fsdp = stage == 2 and dims.pp_enabled
    grads = psi * (recipe.grad_bytes + recipe.accum_bytes) / (dp if stage >= 2 and not pipeline_fsdp else 1) \
        if train else 0.0
    optimizer = psi * opt_bytes / (dp if stage >= 1 else 1) if train else 0.0
    master = psi * master_bytes / (dp if stage >= 1 else 1)
    if stage == 3 and dims.dp_replicate_enabled:  # HSDP: every state is sharded within the shard group only
        grads, optimizer, master = (x * dp / shard for x in (grads, optimizer, master))
    host = 0.0
    if layout.offload:
        host = grads + optimizer + master + (weight if stage >= 3 else 0) + stored_shard
        grads = optimizer = master = stored_shard = 0.0
        if stage >= 3:
            weight = 0.0
    unit = min(model.largest_unit_params, psi * dims.tp) / dims.tp  # one block (or the embedding), tp-split
    buffers = 0.0
    if train and stage <= 1 and dp > 1:
        # DDP's reducer keeps its own flat buckets as large as all gradients unless gradient_as_bucket_view=True
        buffers += psi * recipe.grad_bytes
    if stage >= 2 and dp > 1:
        buffers += unit * recipe.grad_bytes  # unsharded gradients of the unit being reduce-scattered
    if stage >= 3 and shard > 1:
        buffers += 2 * unit * recipe.weight_bytes  # the gathered unit and the prefetched next one
    if layout.offload:  # the shards of the units in flight, copied up from the host before their all-gather
        buffers += 2 * unit * recipe.weight_bytes / max(1, shard if stage >= 3 else dp)
    activations, recomputing = _activations(model, run, layout, save_list=stack.save_list)
    # cross-entropy's backward makes two fp32 s x b x V tensors (grad of log-softmax, grad of the logits);
    # measured with MemTracker on CPU (docs/planner-accuracy.md); with full recomputation the first block,
    # recomputed at the end of the backward, is alive next to the gradients (``late``)
    temporary = 2 * 4 * run.seq_len * run.micro_batch * (model.vocab or 0) / dims.tp if train else 0.0
    parts = {"params": round(weight + stored_shard), "grads": round(grads), "optimizer": round(optimizer),
             "master": round(master), "activations": round(activations), "buffers": round(buffers),
             "temporary": round(temporary), "late": round(recomputing)}
    at_peak = layout.microbatches > 1
    allocated = _peak(parts["params"] + parts["optimizer"] + parts["master"] + parts["buffers"],
                      parts["activations"] + parts["temporary"], grads=parts["grads"], late=parts["late"],
                      grads_at_peak=at_peak)
    return MemoryBreakdown(**parts, reserve=round(CUDA_CONTEXT_BYTES + FRAGMENTATION * allocated),
                           grads_at_peak=at_peak, host=round(host))


def _activations(model: ModelSpec, run: RunSpec, layout: Layout, *, save_list: str) -> tuple[float, float]:
    """``_stage_activations`` of what of ``layout`` they depend on: the layouts of one model-parallel cut (ddp,
    zero1-3, offload) share them."""
    return _stage_activations(model, run, tp=layout.dims.tp, pp=layout.dims.pp, microbatches=layout.microbatches,
                              schedule=layout.pp_schedule, stages_per_rank=layout.pp_stages_per_rank,
                              save_list=save_list)


@remembered
def _stage_activations(model: ModelSpec, run: RunSpec, *, tp: int, pp: int, microbatches: int, schedule: str,
                       stages_per_rank: int, save_list: str) -> tuple[float, float]:
    """Activation bytes on the first pipeline stage (or the only one) when the backward starts -- the blocks'
    saved tensors, autocast's weight copies, the final norm / head inputs and the loss's fp32 log-softmax -- and,
    with full recomputation, the working set of the block being recomputed (which the backward reaches after
    the loss's temporaries are gone: it competes with them, it does not add to them). Selective recomputation keeps
    the trainer's per-op save list of each block and recomputes the rest of one block at a time, likewise."""
    if not model.has_shape:
        return 0.0, 0.0
    assert model.num_layers is not None
    if not run.training:  # inference: one block's working set at a time, nothing kept for backward
        return layer_activation_bytes(model, run, tp=tp, stored_only=False) / 2, 0.0
    layers = math.ceil(model.num_layers / pp)
    # micro-batches of its layers the first rank holds at its peak, by schedule (1F1B: pp of them)
    in_flight = schedule_in_flight(pp, microbatches, schedule=schedule, stages_per_rank=stages_per_rank) \
        if pp > 1 else 1
    full = layer_activation_bytes(model, run, tp=tp, stored_only=False)
    head = head_saved_bytes(model, run, tp=tp) + weight_cast_bytes(model, run, layers=0, tp=tp)
    recomputing = 0.0
    if run.recompute == "full":
        checkpointed = math.ceil(layers / run.recompute_every)  # torchtitan: every k-th block from the first
        per_mb = checkpointed * layer_activation_bytes(model, run, tp=tp) + (layers - checkpointed) * full
        kept = in_flight * per_mb
        # autocast's weight copies of checkpointed blocks are not saved; the recomputed block makes its own
        casts = weight_cast_bytes(model, run, layers=layers - checkpointed, tp=tp, head=False)
        recomputing = full + weight_cast_bytes(model, run, layers=1, tp=tp, head=False)
    elif run.recompute == "selective":  # the trainer's per-op save list (activations.block_selective)
        kept = layers * in_flight * layer_activation_bytes(model, run, tp=tp, save_list=save_list)
        casts = 0.0  # autocast's weight copies are recomputed with the rest of each block
        recomputing = full + weight_cast_bytes(model, run, layers=1, tp=tp, head=False)
    else:
        kept = layers * in_flight * layer_activation_bytes(model, run, tp=tp)
        casts = weight_cast_bytes(model, run, layers=layers, tp=tp, head=False)
    if pp == 1:
        return kept + casts + head, recomputing
    last = math.ceil(model.num_layers / pp) * layer_activation_bytes(model, run, tp=tp, save_list=save_list) + \
        casts + head
    return max(kept + casts, last), recomputing


def reported_bytes(memory: MemoryBreakdown, stack: str | Stack = "convoy") -> float:
    """The peak memory per GPU that ``stack`` prints for a step that ``memory`` plans (``Stack.memory_report``):
    the plan's total, ``max_memory_reserved`` (allocated x ``RESERVED_OVER_ALLOCATED``) or the allocated bytes."""
    report = stack_named(stack).memory_report
    if report == "reserved":
        return memory.allocated * RESERVED_OVER_ALLOCATED
    if report == "allocated":
        return float(memory.allocated)
    return float(memory.total)
