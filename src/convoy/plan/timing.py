"""Time per training step for one layout: the model's kernels at a device's rates, collectives, overlap, bubble.

    from convoy.plan.timing import step_time, model_flops_per_token
    t = step_time(model, run, layout, hardware, global_batch=512)
    t.seconds, t.tokens_per_s_per_gpu, t.mfu, t.comm_bytes, t.time_model   # time_model: where the rates came from

``step_time`` adds, in order: the forward and backward passes (every GEMM at its own shape, the fused attention
(with cp, as torch's ring runs it: ``convoy.plan.ring``), memory-bound work, at ``convoy.plan.speed.rates``; never
shorter than the kernels' launches; 6N FLOPs per token at the bulk rate for a model known only by its count), the
optimizer step, the data-parallel engine's own copies, the pipeline bubble (``convoy.plan.schedules``), then
data-parallel collectives (priced by ``convoy.plan.speed.collectives``, overlapped with the backward),
tensor-parallel, context-parallel and pipeline traffic and offload (exposed). Formulas and sources:
docs/planner.md, "Time per step".
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace

from convoy.plan.activations import block_bytes, block_saved, head_saved_bytes, matmuls_kept
from convoy.plan.architectures import architecture_of
from convoy.plan.hardware import GpuSpec, Hardware
from convoy.plan.memo import remembered
from convoy.plan.memory import Layout, _stage_params, local_run
from convoy.plan.model import ModelSpec
from convoy.plan.ring import RING_STEP_KERNELS, ring_exchange, ring_kernels, ring_traffic_bytes
from convoy.plan.run import OPTIMIZER_STATE_BYTES, RunSpec
from convoy.plan.schedules import critical_transfers, pipeline_bubble, transfers
from convoy.plan.shapes import attention_shape, gemm_shapes
from convoy.plan.speed.collectives import Group, collective_seconds
from convoy.plan.speed.rates import GEMM_FLOOR_S, Rates, StackGemms, rates_for
from convoy.plan.speed.records import Calibration
from convoy.plan.speedups import (
    FACTORS,
    check_fp8,
    compiled_block_launches,
    converted,
    fp8_all_gather,
    fp8_cast_seconds,
    fp8_gemm_factor,
    gathered_fraction,
)
from convoy.plan.stacks import CommOverlap, Stack, TpOverlap, stack_named

__all__ = ["StepTime", "step_time", "model_flops_per_token", "ring_all_reduce_seconds", "ring_gather_seconds",
           "CPU_ADAM_PARAMS_PER_S", "gemm_shapes", "attention_shape", "compute_seconds",
           "optimizer_seconds", "mfu_peak", "COLLECTIVE_LATENCY_S", "DDP_BUCKET_BYTES",
           "framework_seconds", "kernel_launches", "choose_schedule", "parameter_tensors",
           "NCCL_LINK_FRACTION"]

#: parameters per second a CPU Adam step updates per process, for offloaded optimizers (DeepSpeed's
#: CPU-Adam reports about 1e9 on a server socket); a stated assumption.
CPU_ADAM_PARAMS_PER_S = 1.0e9
#: seconds of a small collective, by where its ranks are: NCCL over NVLink/NVSwitch and PCIe, across nodes, and
#: gloo between CPU processes. Stated assumptions from nccl-tests' small-message all_reduce_perf on DGX-class
#: nodes (about 10 us inside a node, 15 us over PCIe, 20-30 us across InfiniBand) and gloo's TCP loopback (about
#: 100 us); they matter only for small models, where they decide between DDP and ZeRO-3.
COLLECTIVE_LATENCY_S = {"nvlink": 10e-6, "pcie": 15e-6, "inter": 25e-6, "cpu": 100e-6}
#: DDP's bucket size (``bucket_cap_mb`` = 25 MiB): one all-reduce per bucket
DDP_BUCKET_BYTES = 25 * 2**20
#: Megatron-Core's gradient buckets, in parameters: ``max(40e6, 1e6 x dp x cp)`` (megatron/core/distributed/
#: distributed_data_parallel.py: larger at large dp "so that chunks used in NCCL ring-reduce implementations are
#: large enough to remain bandwidth-bound rather than latency-bound")
MCORE_BUCKET_PARAMS, MCORE_BUCKET_PARAMS_PER_RANK = 40e6, 1e6
#: the fraction of a datasheet link NCCL's topology model credits it with (src/graph/topo.h): an NVLink at 20 GB/s
#: each way of an A100's 25 (20.6 of a Hopper's 25, 40.1 of a Blackwell's 50), a PCIe Gen3 x16 at 12 of 16, a NIC
#: at 12 GB/s per 100 Gbit/s (12.5)
NCCL_LINK_FRACTION = {"nvlink": 0.8, "pcie": 0.75, "net": 0.96}
#: bytes of an FSDP2 shard per parameter (fp32: the optimizer steps it, whatever the gathered dtype)
_SHARD_BYTES = 4


@dataclass(frozen=True, kw_only=True)
class StepTime:
    """Seconds of one optimizer step and where they go (per GPU, all GPUs in lock step)."""

    compute: float
    """Forward and backward passes (GEMMs, attention, memory-bound work), including the pipeline bubble."""
    bubble: float
    """Of which: pipeline idle time."""
    optimizer: float = 0.0
    """The optimizer step on the GPU, after the last backward (0: offloaded, or a model without a shape)."""
    overhead: float = 0.0
    """The data-parallel engine's own copies (FSDP2's flat buffers, DDP's buckets; ``framework_seconds``)."""
    dp_comm: float
    """Data-parallel collectives (all-reduce / reduce-scatter / all-gather), before overlap."""
    tp_comm: float
    """Tensor-parallel collectives (exposed), and the context-parallel ring's exposed transfers. On a stack that
    overlaps them with the GEMMs (``convoy.plan.stacks.Stack.tp_overlap``): what stays exposed, and the time the
    overlapped GEMMs lose to the SMs the communication kernels hold."""
    pp_comm: float
    """Pipeline send/recv of activations (exposed)."""
    offload: float
    """Host transfers and the CPU optimizer step (exposed)."""
    exposed_dp: float
    """The part of dp_comm the backward could not hide."""
    comm_bytes: float
    """Bytes each GPU sends per step over all collectives."""
    tokens: int
    """Tokens per optimizer step (all GPUs)."""
    world_size: int
    model_flops: float
    """Model FLOPs per step (no recomputation), the MFU numerator."""
    peak_flops: float
    """Per-GPU peak for the compute dtype."""
    time_model: str = "modeled"
    """Where the rates came from (``convoy.plan.speed.rates``): ``"calibrated"``, ``"profile"``, ``"modeled"`` or
    ``"datasheet"``."""
    correction: float = 1.0
    """Multiplies the modeled step: measured / modeled for this very case, when a job measured it on this
    machine (``convoy.plan.speed.observed``); 1 otherwise. The breakdown above stays the model's."""

    @property
    def seconds(self) -> float:
        return self.correction * (self.compute + self.optimizer + self.overhead + self.exposed_dp + self.tp_comm
                                  + self.pp_comm + self.offload)

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens / self.seconds / self.world_size

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: model FLOPs per second over the GPUs' peak (PaLM's definition)."""
        return self.model_flops / (self.seconds * self.world_size * self.peak_flops)

    def as_dict(self) -> dict[str, float | str]:
        return {"seconds": self.seconds, "compute": self.compute, "bubble": self.bubble, "optimizer": self.optimizer,
                "overhead": self.overhead,
                "dp_comm": self.dp_comm,
                "exposed_dp": self.exposed_dp, "tp_comm": self.tp_comm, "pp_comm": self.pp_comm,
                "offload": self.offload, "comm_bytes": self.comm_bytes,
                "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "mfu": self.mfu, "time_model": self.time_model,
                "correction": self.correction}


def model_flops_per_token(model: ModelSpec, seq_len: int, *, training: bool = True) -> float:
    """6N + 12·L·h·s per token for training (2N + 4·L·h·s for a forward only): the MFU numerator.

    For a model with a shape, N counts the parameters that multiply: the weights of the GEMMs the step is timed
    by (``gemm_shapes``), the output head among them. An embedding table that is only looked up, norms and
    biases cost no matmul FLOPs (Kaplan et al. 2020 count non-embedding parameters for the same reason); counted
    at 2 FLOPs each, they made the numerator larger than the work the time model charges, and an MFU above
    100 % at an efficiency of 1. Without a shape, N is the parameter count."""
    if model.has_shape:
        one = RunSpec(seq_len=seq_len)  # one sequence: every GEMM's m is seq_len tokens
        gemms = sum(2 * k * n * count for _, k, n, count in gemm_shapes(model, one))
        _, heads, _, _, head_dim = attention_shape(model, one)
        attention: float = 2 * 2 * model.num_layers * heads * head_dim * seq_len  # type: ignore[operator]  # QK^T, AV
        forward = gemms + attention
    else:
        attention = 0.0
        if model.num_layers and model.hidden:
            attention = 2 * 2 * model.num_layers * model.hidden * seq_len  # QK^T and AV, 2 FLOPs per MAC
        forward = 2 * model.num_params + attention
    return 3 * forward if training else forward


def ring_all_reduce_seconds(nbytes: float, n: int, bandwidth: float) -> float:
    """Ring all-reduce of ``nbytes`` over ``n`` ranks on links of ``bandwidth`` bytes/s."""
    return 0.0 if n <= 1 else 2 * (n - 1) / n * nbytes / bandwidth


def ring_gather_seconds(nbytes: float, n: int, bandwidth: float) -> float:
    """Ring all-gather (or reduce-scatter) of a ``nbytes`` full buffer over ``n`` ranks."""
    return 0.0 if n <= 1 else (n - 1) / n * nbytes / bandwidth


def _group_bandwidth(hw: Hardware, ranks_per_node: int, group: int) -> float:
    """Bus bandwidth a ring of ``group`` ranks gets, ``ranks_per_node`` of them on each node.

    Inside one node: the intra-node link. Across nodes every GPU of a node is in some group at once, so this
    group gets its share of the node's NICs: inter x ranks_per_node / gpus_per_node (NCCL runs one ring per NIC).
    """
    if group <= ranks_per_node or hw.nodes == 1:
        return hw.intra_bandwidth
    return min(hw.intra_bandwidth, hw.inter_bandwidth * ranks_per_node / hw.gpus_per_node)


def _group(hw: Hardware, ranks_per_node: int, ranks: int) -> Group:
    """The collective group of ``ranks`` ranks, ``ranks_per_node`` of them on each node
    (``convoy.plan.speed.collectives``), its bus bandwidth the datasheet links' at the fraction NCCL's topology model
    gives them (``NCCL_LINK_FRACTION``; a measured or given intra-node bandwidth is taken as it is)."""
    per_node = max(1, min(ranks_per_node, ranks))
    nodes = 1 if hw.nodes == 1 else max(1, math.ceil(ranks / per_node))
    link = "cpu" if hw.gpu.kind == "cpu" else ("pcie" if hw.intra == "pcie" else "nvlink")
    bus = _group_bandwidth(hw, per_node, ranks)
    if link != "cpu" and (nodes > 1 or hw.intra_gbs is None):
        bus *= NCCL_LINK_FRACTION["net" if nodes > 1 else link]
    return Group(ranks=ranks, nodes=nodes, bus_bytes_per_s=bus, link=link)


def _collective(op: str, nbytes: float, group: Group, hw: Hardware) -> float:
    """One collective on ``group``: NCCL's model on GPUs; gloo's ring with one fixed latency on CPU processes."""
    if group.ranks <= 1:
        return 0.0
    if group.link == "cpu":
        ring = ring_all_reduce_seconds if op == "all_reduce" else ring_gather_seconds
        return ring(nbytes, group.ranks, group.bus_bytes_per_s) + COLLECTIVE_LATENCY_S["cpu"]
    return collective_seconds(op, nbytes, group)


def parameter_tensors(model: ModelSpec, *, tp: int = 1, pp: int = 1) -> tuple[list[float], list[float]]:
    """Elements of each parameter tensor of one block and of the root (embedding, head, final norm) on one tp rank
    of the busiest stage: what a per-parameter ZeRO-3 gathers one collective at a time. Block GEMMs from
    ``gemm_shapes``, a bias per GEMM output outside the Llama family, two norms (LayerNorm: weight and bias)."""
    if not model.has_shape:
        return [], [float(model.num_params)]
    h, layers = model.hidden, model.num_layers
    assert h is not None and layers is not None  # has_shape
    one = RunSpec(seq_len=1)
    block: list[float] = []
    for _, k, n, count in gemm_shapes(model, one, tp=tp):
        if count > 1:
            per_block = count // layers
            block += [float(k * n)] * per_block
            if model.family != "llama":
                block += [float(n)] * per_block
    block += [float(h)] * (2 if model.family == "llama" else 4)
    root = [float((model.vocab or 0) * h / tp)] * (1 if model.family == "gpt2" else 2) + [float(h)]
    return block, root


def collective_latency(hw: Hardware, *, across_nodes: bool) -> float:
    """Seconds of one small collective among ``hw``'s ranks (``COLLECTIVE_LATENCY_S``)."""
    if hw.gpu.kind == "cpu":
        return COLLECTIVE_LATENCY_S["cpu"]
    if across_nodes and hw.nodes > 1:
        return COLLECTIVE_LATENCY_S["inter"]
    return COLLECTIVE_LATENCY_S["pcie" if hw.intra == "pcie" else "nvlink"]


def mfu_peak(gpu: GpuSpec, dtype: str, rates: Rates | None = None) -> float:
    """The per-GPU peak MFU is taken against: ``gpu``'s for ``dtype``, or the fastest GEMM ``rates`` measured in
    it where that is faster. A measured rate can pass a table's peak for real reasons (fp32 matmuls on TF32 tensor
    cores under ``torch.set_float32_matmul_precision("high")``, a GPU the table lacks planned as the generic
    device, ``--peak-tflops`` set low): an MFU against the lower figure would pass 100 %."""
    peak = gpu.peak_flops(dtype)
    return max(peak, rates.peak_seen(dtype)) if rates is not None else peak


def kernel_launches(model: ModelSpec, run: RunSpec, layout: Layout) -> int:
    """Kernels one micro-batch launches on the busiest GPU (forward and backward): three per GEMM, two per
    attention, about three per tensor a block saves for backward (compiled: the fused kernels,
    ``convoy.plan.speedups.compiled_block_launches``), and a dozen for the head and the loss."""
    return _kernel_launches(model, run, layout.dims.pp)


def _kernel_launches(model: ModelSpec, run: RunSpec, pp: int) -> int:
    if not model.has_shape:
        return 0
    assert model.num_layers is not None  # has_shape
    layers = math.ceil(model.num_layers / pp)
    per_block = sum(count for _, _, _, count in gemm_shapes(model, run) if count > 1) // model.num_layers
    if run.compile != "none":
        return layers * compiled_block_launches(per_block) + 12
    return layers * (3 * per_block + 2 + 3 * len(block_saved(model, run))) + 12


def compute_seconds(model: ModelSpec, run: RunSpec, layout: Layout, rates: Rates, *, gpu: GpuSpec | None = None,
                    save_list: str = "convoy", memory_bound: float = 1.0, fp8_cast: str = "torchao") -> float:
    """Seconds of one GPU's forward and backward passes for one optimizer step (its micro-batches; no bubble,
    no communication, no optimizer step) at ``rates``, never less than its kernel launches. Compiled
    (``run.compile``), the memory-bound work takes ``compile_memory_bound`` of its eager time; with float8
    (``run.fp8``, priced on ``gpu``'s peaks) the converted GEMMs run at the fp8 rate, plus their casts
    (``convoy.plan.speedups``). A software stack (``convoy.plan.stacks``) states its save list, the fraction of the
    eager memory-bound work its fused kernels take (``memory_bound``) and how its float8 casts run (``fp8_cast``)."""
    dims = layout.dims
    gemm, attn, pointwise, launches = _micro_batch(model, run, dims.tp, dims.pp, dims.cp, rates, gpu, save_list)
    pointwise = pointwise * memory_bound + fp8_cast_seconds(model, local_run(run, dims), layout, rates, how=fp8_cast)
    return layout.microbatches * max(gemm + attn + pointwise, launches * rates.launch_seconds)


@remembered
def _micro_batch(model: ModelSpec, run: RunSpec, tp: int, pp: int, cp: int, rates: Rates, gpu: GpuSpec | None,
                 save_list: str = "convoy") -> tuple[float, float, float, float]:
    """(GEMM, attention and memory-bound seconds before float8's casts, kernel launches) of one micro-batch's
    forward and backward on the busiest stage: ``compute_seconds``' parts that the layout's tp, pp and cp decide, the
    same for every layout, schedule, link and network a plan compares, so remembered (pure; frozen arguments)."""
    dtype = run.recipe.compute
    # with cp: this rank's seq/cp tokens (memory.local_run), its queries against every key
    whole, run = run, (replace(run, seq_len=max(1, run.seq_len // cp)) if cp > 1 else run)
    total = model.num_layers or 1
    layers = math.ceil(total / pp)
    share = layers / total
    # full recomputation runs the forward of every recompute_every-th block again (the head is not checkpointed);
    # selective (the trainer's per-op save list keeps every matmul's and the attention's output) the rest of each
    # block's forward: its memory-bound work and those kernels, no GEMM and no collective
    again = math.ceil(total / run.recompute_every) / total if run.training and run.recompute == "full" else 0.0
    selective = run.training and run.recompute == "selective"
    pointwise_again = 1.0 if selective else again
    if run.fp8 != "none":
        if gpu is None:
            raise ValueError("compute_seconds prices float8 on a board's peaks: pass gpu=")
        fp8 = fp8_gemm_factor(gpu)
        # the forward (and its recomputation) and the input gradient in float8; the weight gradient too, but in
        # 16 bits under rowwise_with_gw_hp
        fp8_backward = (1 + fp8) if run.fp8 == "rowwise_with_gw_hp" else 2 * fp8
    gemm = 0.0
    shapes = gemm_shapes(model, run, tp=tp)
    # a save list that keeps only some matmuls' outputs (torchtitan's) runs the others' forward again
    recomputed = [0.0] * len(shapes)
    if selective and save_list != "convoy":
        recomputed = [(per - saved) / per for saved, per in matmuls_kept(model, run, save_list)]
    for (mm, k, n, count), extra in zip(shapes, recomputed):
        block = count > 1  # the head (count 1) is on one stage: count it on the busiest
        forward = 1 + (again if block else 0.0)
        if block and extra:
            forward += extra
        if run.fp8 != "none" and converted(k, n, count):
            passes = forward * fp8 + (fp8_backward if run.training else 0.0)
        else:
            passes = (forward + 2) if run.training else 1
        gemm += passes * count * (share if block else 1.0) * rates.gemm_seconds(mm, k, n, dtype)
    b, a, kv, s, d = attention_shape(model, whole, tp=tp)
    if cp > 1:  # torch's ring (convoy.plan.ring): a causal step and cp - 1 non-causal ones, each its own kernel
        first, later = ring_kernels(rates, batch=b, heads=a, seq=s, head_dim=d, cp=cp, dtype=dtype)
        attn_fwd_bwd = first + (cp - 1) * later
    else:
        attn_fwd_bwd = rates.attention_seconds(b, a, kv, s, d, dtype)
    if run.attention == "eager":
        attn_fwd_bwd *= 2  # the s x s scores go through memory (a stated factor, not measured)
    # selective with eager attention recomputes the s x s scores: QK^T, half of the attention's forward
    attn_again = 0.5 if selective and run.attention == "eager" else again
    attn = layers * attn_fwd_bwd * ((1 + attn_again / 3) if run.training else 1 / 3)
    if cp > 1:  # the ring's fp32 merges and gradient accumulation, eager whatever run.compile says
        merges, grads = ring_traffic_bytes(batch=b, heads=a, seq=s, head_dim=d, cp=cp)
        traffic = merges * (1 + again) + grads if run.training else merges
        attn += layers * traffic / (rates.memory_bytes_per_s or float("inf"))
    eager = replace(run, recompute="none", compile="none")  # the eager block's traffic; compile scales it below
    blocks = layers * block_bytes(model, eager, tp=tp)
    saved = blocks + head_saved_bytes(model, run, tp=tp)
    if rates.pointwise_seconds_per_byte:  # memory-bound forward + backward (launches included) per saved byte
        fwd_bwd = rates.pointwise_seconds_per_byte  # the forward is a third of it, as for the GEMMs
        memory_bound = (saved + pointwise_again * blocks / 3) * fwd_bwd if run.training else saved * fwd_bwd / 3
    else:  # each saved byte written and read in the forward, its gradient written and read in the backward
        memory_bound = (4 * saved + 2 * pointwise_again * blocks if run.training else 2 * saved) / (
            rates.memory_bytes_per_s or float("inf"))
    if run.compile != "none":
        memory_bound *= FACTORS["compile_memory_bound"].value
    launches = _kernel_launches(model, run, pp) * (1 + again / 3 if run.training else 1 / 3)
    if cp > 1:
        forward, backward = RING_STEP_KERNELS
        launches += layers * (cp - 1) * (forward * (1 + again) + backward if run.training else forward)
    if selective:  # the forward kernel of each tensor a block saves without recomputation, again
        launches += layers * (compiled_block_launches(0) // 3 if run.compile != "none"
                              else len(block_saved(model, run)))
    return gemm, attn, memory_bound, launches


def optimizer_seconds(model: ModelSpec, run: RunSpec, layout: Layout, rates: Rates) -> float:
    """Seconds of the optimizer step on the GPU: every byte of its gradients, state and weights read, the state
    and weights written, at ``rates``' memory bandwidth (0 for an offloaded optimizer, which ``step_time``
    charges to the CPU)."""
    if not run.training or layout.offload:
        return 0.0
    recipe = run.recipe
    psi = _stage_params(model, layout.dims.pp) / layout.dims.tp / (layout.shard_degree if layout.zero_stage >= 1
                                                                    else 1)
    state = OPTIMIZER_STATE_BYTES[run.optimizer] + recipe.master_bytes
    moved = psi * (recipe.grad_bytes + 2 * state + 2 * recipe.weight_bytes)  # read all, write weights + state
    return moved / (rates.memory_bytes_per_s or float("inf"))


def framework_seconds(model: ModelSpec, run: RunSpec, layout: Layout, rates: Rates) -> float:
    """Seconds of the data-parallel engine's own copies per optimizer step on one GPU.

    FSDP2 (ZeRO-2/3 in convoy's trainer), per parameter and micro-batch: each all-gather casts and copies this
    rank's shard into the flat buffer (about (4 + 2w)/n bytes) and copies the gathered weights out (2w), twice
    for ZeRO-3 (forward, and again for the backward) and once for ZeRO-2; the reduce-scatter copies the gradient
    into its buffer in the reduce dtype (w + g). DDP, per step: gradients into the buckets and back (4g).
    Offloaded layouts move these bytes over the host link, which ``step_time`` charges instead."""
    if not run.training or layout.offload:
        return 0.0
    dims, recipe = layout.dims, run.recipe
    psi = _stage_params(model, dims.pp) / dims.tp
    w, g = recipe.weight_bytes, recipe.grad_bytes
    if layout.zero_stage >= 2:
        n = layout.shard_degree
        gathers = 2 if layout.zero_stage == 3 else 1
        moved = layout.microbatches * psi * (gathers * (2 * w + (_SHARD_BYTES + 2 * w) / n) + w + g)
    elif dims.dp_enabled:
        moved = psi * 4 * g
    else:
        return 0.0
    return moved / (rates.memory_bytes_per_s or float("inf"))


def _sharded_tensors(model: ModelSpec, layout: Layout, weights: float) -> tuple[list[float], list[float], int, float]:
    """(one block's parameter tensors, the root's, the blocks on the busiest stage, bytes per counted parameter so
    that the stage's tensors add up to its ``weights`` bytes): what FSDP's units and DeepSpeed's per-tensor
    collectives move."""
    dims = layout.dims
    block, root = parameter_tensors(model, tp=dims.tp, pp=dims.pp)
    layers = math.ceil((model.num_layers or 0) / dims.pp)
    scale = weights / max(1.0, layers * sum(block) + sum(root)) if model.has_shape else 1.0
    return block, root, layers, scale


def _shard_group(hw: Hardware, layout: Layout) -> Group:
    """The group a layout's weights are sharded over (``shard_degree`` ranks, as many per node as tp leaves)."""
    n = layout.shard_degree
    return _group(hw, max(1, min(n, hw.gpus_per_node // layout.dims.tp)), n)


def _data_parallel_collectives(model: ModelSpec, run: RunSpec, layout: Layout, hw: Hardware, *, grads: float,
                                weights: float, schedule: str) -> tuple[float, float, float]:
    """(seconds of data-parallel collectives before overlap, bytes each GPU sends, seconds after the optimizer step
    that nothing hides) per step, each collective priced by NCCL's model (``convoy.plan.speed.collectives``) at its
    own size: DDP one all-reduce per 25 MiB bucket; ZeRO-1 then the updated shards (torch: one broadcast per rank;
    DeepSpeed: one all-gather); FSDP2 per micro-batch one all-gather per unit (ZeRO-3: again for the backward) and
    one reduce-scatter, DeepSpeed's ZeRO-3 the same per parameter tensor; HSDP, hierarchically, an all-reduce of
    each unit's gradient shard across the replicas (one rank per replica group on each node). Megatron-Core's
    buckets are priced apart (``_megatron_core``)."""
    dims = layout.dims
    if not run.training or not (dims.dp_enabled or dims.cp_enabled):
        return 0.0, 0.0, 0.0
    m = layout.microbatches
    per_node = max(1, min(dims.dp, hw.gpus_per_node // dims.tp))
    dp_comm = comm = after_step = 0.0
    if layout.zero_stage <= 1:  # DDP: one all-reduce per bucket, along the last backward
        group = _group(hw, per_node, dims.dp)
        buckets = max(1, math.ceil(grads / DDP_BUCKET_BYTES))
        dp_comm = buckets * _collective("all_reduce", grads / buckets, group, hw)
        comm = 2 * (dims.dp - 1) / dims.dp * grads
        if layout.zero_stage == 1:  # the updated shards, before the next forward can start
            if schedule == "deepspeed":
                after_step = _collective("all_gather", weights, group, hw)
            else:  # torch.distributed.optim.ZeroRedundancyOptimizer.step: each rank broadcasts its shard
                after_step = dims.dp * _collective("broadcast", weights / dims.dp, group, hw)
            comm += (dims.dp - 1) / dims.dp * weights
        return dp_comm, comm, after_step
    n = layout.shard_degree
    gathers = 2 if layout.zero_stage == 3 else 1
    block, root, layers, scale = _sharded_tensors(model, layout, weights)
    # collectives by (size, fraction of it the all-gather moves: float8 all-gather sends the converted linears'
    # weights in 1 byte); many share one, each is priced once
    sizes: Counter[tuple[float, float]] = Counter()
    if not model.has_shape:
        sizes[(weights, 1.0)] = 1
    elif schedule == "deepspeed" and layout.zero_stage == 3:  # one collective per parameter tensor
        for x in block:
            sizes[(x * scale, 1.0)] += layers
        for x in root:
            sizes[(x * scale, 1.0)] += 1
    else:  # FSDP2: one unit per block and the root
        sizes[(sum(block) * scale, gathered_fraction(model, run, layout, sum(block), scale))] += layers
        sizes[(sum(root) * scale, 1.0)] += 1
    grad_ratio = grads / weights if weights else 0.0
    # FSDP2 per pipeline stage reduce-scatters once per step, after the last micro-batch (gradient sync is off
    # before it), and keeps the weights gathered from a micro-batch's forward to its backward
    reduces = 1 if dims.pp_enabled else m
    if n > 1:
        shard = _shard_group(hw, layout)
        gathered = 0.0
        for (piece, part), count in sizes.items():
            dp_comm += count * (m * gathers * _collective("all_gather", piece * part, shard, hw)
                                + reduces * _collective("reduce_scatter", piece * grad_ratio, shard, hw))
            gathered += count * piece * part
        comm = (n - 1) / n * (m * gathers * gathered + reduces * grads)
        if fp8_all_gather(run, layout):  # precompute_float8_dynamic_scale_for_fsdp: one all-reduce of the amaxes
            linears = len([s for s in gemm_shapes(model, run, tp=dims.tp) if s[3] > 1]) if model.has_shape else 0
            amaxes = 4 * max(1, layers * linears)
            after_step += _collective("all_reduce", amaxes, shard, hw)
    if dims.dp_replicate_enabled:  # HSDP: all-reduce each unit's gradient shard across replicas once per step
        replicas = _group(hw, 1, dims.dp_replicate)
        for (piece, _), count in sizes.items():
            dp_comm += count * _collective("all_reduce", piece * grad_ratio / n, replicas, hw)
        comm += 2 * (dims.dp_replicate - 1) / dims.dp_replicate * grads / n
    return dp_comm, comm, after_step


@remembered
def step_time(model: ModelSpec, run: RunSpec, layout: Layout, hw: Hardware, *, global_batch: int,
              efficiency: float | None = None, calibration: Calibration | None = None,
              rates: Rates | None = None, stack: str | Stack = "convoy") -> StepTime:
    """Estimated seconds of one optimizer step processing ``global_batch`` sequences.

    ``rates``: the device's rates (``convoy.plan.speed.rates``); by default ``rates_for(hw.gpu, calibration=,
    efficiency=)``: the flat datasheet model when ``efficiency`` is given, else ``calibration`` (measured here),
    else the GPU's shipped profile, else the shape-aware model. ``stack``: the software the step runs on
    (``convoy.plan.stacks``: its GEMM library, attention, data-parallel schedule and save list); convoy's own by
    default."""
    stack = stack_named(stack)
    run = stack.applied(run)
    if rates is None:
        rates = rates_for(hw.gpu, calibration=calibration, efficiency=efficiency)
    fraction = stack.gemm_fraction_on(architecture_of(hw.gpu).name)
    if fraction != 1.0:
        rates = StackGemms(rates, fraction)
    hw = _with_measured_link(hw, rates)
    tokens = global_batch * run.seq_len
    model_flops = model_flops_per_token(model, run.seq_len, training=run.training) * tokens
    check_fp8(hw.gpu, run)
    compute, optimizer = _passes(model, run, layout, rates, model_flops=model_flops, gpu=hw.gpu, stack=stack)
    overhead = framework_seconds(model, run, layout, rates)
    bubble = _bubble(compute, layout)
    compute += bubble
    dp_comm, exposed_dp, dp_bytes = _data_parallel(model, run, layout, hw, busy=compute - bubble,
                                                   schedule=stack.dp_schedule)
    tp_comm, tp_bytes = _tensor_parallel(model, local_run(run, layout.dims), layout, hw)
    if stack.tp_overlapped is not None and tp_comm:
        tp_comm = _tensor_parallel_overlapped(model, local_run(run, layout.dims), layout, hw, rates,
                                              stack.tp_overlapped)
    pp_comm, pp_bytes = _pipeline(model, local_run(run, layout.dims), layout, hw)
    cp_comm, cp_bytes = context_parallel_seconds(model, run, layout, hw, rates)
    tp_comm += cp_comm  # exposed ring traffic: on the critical path like tp's (StepTime.tp_comm says so)
    tp_bytes += cp_bytes
    offload = _offload(model, run, layout, hw)
    return StepTime(compute=compute, bubble=bubble, optimizer=optimizer, overhead=overhead, dp_comm=dp_comm,
                    tp_comm=tp_comm, pp_comm=pp_comm, offload=offload, exposed_dp=exposed_dp,
                    comm_bytes=dp_bytes + tp_bytes + pp_bytes, tokens=tokens, world_size=layout.dims.world_size,
                    model_flops=model_flops, peak_flops=mfu_peak(hw.gpu, run.recipe.compute, rates),
                    time_model=rates.kind)


def _with_measured_link(hw: Hardware, rates: Rates) -> Hardware:
    """``hw`` with its intra-node link at the peer-to-peer bandwidth ``rates`` measured, where they did."""
    if rates.peer_bytes_per_s and hw.gpus_per_node > 1:
        return replace(hw, intra_gbs=rates.peer_bytes_per_s / 1e9)
    return hw


def _passes(model: ModelSpec, run: RunSpec, layout: Layout, rates: Rates, *, model_flops: float,
            gpu: GpuSpec | None = None, stack: Stack) -> tuple[float, float]:
    """(seconds of one GPU's forward and backward passes, of its optimizer step) per step: kernel by kernel for a
    model with a shape, else its ``model_flops`` (plus a forward under full recomputation) at the bulk matmul
    rate."""
    if model.has_shape:
        return (compute_seconds(model, run, layout, rates, gpu=gpu, save_list=stack.save_list,
                                memory_bound=stack.memory_bound_on(model.family), fp8_cast=stack.fp8_cast),
                optimizer_seconds(model, run, layout, rates))
    hw_flops = model_flops
    if run.training and run.recompute == "full":
        hw_flops = model_flops * 4 / 3  # one more forward
    # selective recomputation runs no matmul again (its save list keeps every matmul's output): no more FLOPs.
    # Without a shape nothing memory-bound is modeled (compile changes nothing here) and float8 takes every matmul
    seconds = hw_flops / layout.dims.world_size / rates.bulk_flops(run.recipe.compute)
    if run.fp8 != "none" and gpu is not None:
        seconds *= fp8_gemm_factor(gpu)
    return seconds, 0.0


def _bubble(busy: float, layout: Layout) -> float:
    """Seconds a pipeline stage idles per step beside its ``busy`` seconds, for the layout's schedule."""
    dims = layout.dims
    return busy * pipeline_bubble(dims.pp, layout.microbatches, schedule=layout.pp_schedule,
                                  stages_per_rank=layout.pp_stages_per_rank) if dims.pp_enabled else 0.0


def _data_parallel(model: ModelSpec, run: RunSpec, layout: Layout, hw: Hardware, *, busy: float, schedule: str
                   ) -> tuple[float, float, float]:
    """(seconds of data-parallel collectives, the part of them nothing hides, bytes each GPU sends) per step, beside
    ``busy`` seconds of forward and backward passes."""
    # rank layout pp (outer) x dp x tp (inner), so a dp group has gpus_per_node/tp ranks per node
    psi = _stage_params(model, layout.dims.pp) / layout.dims.tp
    grads, weights = psi * run.recipe.grad_bytes, psi * run.recipe.weight_bytes
    if schedule == "megatron-core" and layout.zero_stage <= 1:
        return _megatron_core(run, layout, hw, params=psi, grads=grads, weights=weights, busy=busy)
    dp_comm, sent, after_step = _data_parallel_collectives(model, run, layout, hw, grads=grads, weights=weights,
                                                           schedule=schedule)
    if schedule == "fsdp1" and layout.zero_stage >= 2 and model.has_shape and layout.shard_degree > 1:
        exposed = _fsdp1_exposed(model, run, layout, hw, grads=grads, weights=weights, busy=busy) + after_step
        return dp_comm + after_step, exposed, sent
    # overlap: DDP hides its all-reduce behind the last micro-batch's backward (2/3 of its compute); FSDP2 prefetches
    # along the whole forward and backward; ZeRO-1's broadcast after the step is never hidden. Megatron's DDP of 2021
    # all-reduces after the whole backward, and DeepSpeed's pipeline engine reduces after its last micro-batch: nothing
    # hides them
    window = busy if layout.zero_stage >= 2 else busy / layout.microbatches * 2 / 3
    if layout.zero_stage <= 1 and (schedule == "megatron" or (schedule == "deepspeed" and layout.dims.pp_enabled)):
        window = 0.0
    exposed = max(0.0, dp_comm - window) + after_step
    return dp_comm + after_step, exposed, sent


def _megatron_core(run: RunSpec, layout: Layout, hw: Hardware, *, params: float, grads: float, weights: float,
                   busy: float) -> tuple[float, float, float]:
    """(seconds of data-parallel collectives, the part of them nothing hides, bytes each GPU sends) per step beside
    ``busy`` seconds of passes, under Megatron-Core's DDP with ``--overlap-grad-reduce`` and, for ZeRO-1, its
    distributed optimizer with ``--overlap-param-gather`` (megatron/core/distributed/distributed_data_parallel.py
    and param_and_grad_buffer.py). Gradients accumulate in buckets of ``max(40e6, 1e6 x n)`` parameters
    (``MCORE_BUCKET_PARAMS``; n the data- x context-parallel ranks they are reduced over), each reduce-scattered
    (all-reduced without the distributed optimizer) as soon as its last gradient of the last micro-batch is ready;
    the optimizer updates its shard, and each bucket's parameters are all-gathered in the next forward, dispatched
    by the forward pre-hook of the bucket before it. With B buckets ready evenly along that backward (forward), all
    but the last reduction (the first all-gather) run beside it; what exceeds it waits."""
    n = layout.shard_degree  # dp x cp at ZeRO-0/1: the ranks the optimizer shards over, and the gradients' group
    if not run.training or n <= 1:
        return 0.0, 0.0, 0.0
    group = _shard_group(hw, layout)
    buckets = max(1, math.ceil(params / max(MCORE_BUCKET_PARAMS, MCORE_BUCKET_PARAMS_PER_RANK * n)))
    if layout.zero_stage == 1:
        last = _collective("reduce_scatter", grads / buckets, group, hw)
        first = _collective("all_gather", weights / buckets, group, hw)
        sent = (n - 1) / n * (grads + weights)
    else:
        last, first = _collective("all_reduce", grads / buckets, group, hw), 0.0
        sent = 2 * (n - 1) / n * grads
    micro = busy / layout.microbatches  # the last micro-batch's backward (2/3), the next step's first forward (1/3)
    beside = (buckets - 1) / buckets
    exposed = (max(last, buckets * last - micro * 2 / 3 * beside)
               + (max(first, buckets * first - micro / 3 * beside) if first else 0.0))
    return buckets * (last + first), exposed, sent


def _fsdp1_exposed(model: ModelSpec, run: RunSpec, layout: Layout, hw: Hardware, *, grads: float, weights: float,
                   busy: float) -> float:
    """Seconds of FSDP1's collectives nothing hides under ``limit_all_gathers``, beside ``busy`` seconds of passes:
    each micro-batch's forward starts with the root unit's all-gather and the backward ends with its reduce-scatter
    (nothing runs beside them), and the rate limiter prefetches one unit ahead, so each block's collectives overlap
    only that block's own compute (a block whose traffic outlasts it exposes the rest)."""
    dims, m = layout.dims, layout.microbatches
    n = layout.shard_degree
    gathers = 2 if layout.zero_stage == 3 else 1
    block, root, layers, scale = _sharded_tensors(model, layout, weights)
    grad_ratio = grads / weights if weights else 0.0
    reduces = 1 if dims.pp_enabled else m
    shard = _shard_group(hw, layout)
    replicas = _group(hw, 1, dims.dp_replicate) if dims.dp_replicate_enabled else None

    def reduce(piece: float) -> float:  # the reduce-scatter, and HSDP's all-reduce of the shard across replicas
        seconds = _collective("reduce_scatter", piece * grad_ratio, shard, hw)
        if replicas is not None:
            seconds += _collective("all_reduce", piece * grad_ratio / n, replicas, hw)
        return seconds

    unit, top = sum(block) * scale, sum(root) * scale
    part = gathered_fraction(model, run, layout, sum(block), scale)
    per_block = gathers * _collective("all_gather", unit * part, shard, hw) + reduces / m * reduce(unit)
    compute = busy / (m * layers)
    return (m * (_collective("all_gather", top, shard, hw) + layers * max(0.0, per_block - compute))
            + reduces * reduce(top))


def _tensor_parallel(model: ModelSpec, run: RunSpec, layout: Layout, hw: Hardware) -> tuple[float, float]:
    """(seconds of tensor-parallel all-reduces, all exposed; bytes each GPU sends) per step: 4 per block and
    micro-batch (Megatron's two in the forward, two in the backward), 2 more under full recomputation."""
    dims = layout.dims
    if not (dims.tp_enabled and model.has_shape):
        return 0.0, 0.0
    m = layout.microbatches
    layers = math.ceil(model.num_layers / dims.pp)  # type: ignore[operator]
    act, tp_group = _tp_traffic(model, run, layout, hw)
    per_layer = 4 + (2 if run.recompute == "full" else 0)
    seconds = m * layers * per_layer * _collective("all_reduce", act, tp_group, hw)
    return seconds, m * layers * per_layer * 2 * (dims.tp - 1) / dims.tp * act


def _tp_traffic(model: ModelSpec, run: RunSpec, layout: Layout, hw: Hardware) -> tuple[float, Group]:
    """(the bytes one tensor-parallel collective moves: a micro-batch's activations, the group it runs over)."""
    act = run.seq_len * run.micro_batch * (model.hidden or 0) * run.recipe.activation_bytes
    return act, _group(hw, min(layout.dims.tp, hw.gpus_per_node), layout.dims.tp)


def _tp_segments(model: ModelSpec, run: RunSpec, tp: int) -> list[tuple[bool, list[tuple[int, int, int, float]]]]:
    """One block's forward GEMMs on a tp rank as Megatron's sequence-parallel TP runs them between its collectives:
    (column-parallel?, [(m, k, n, times per block)]) per run of consecutive column-parallel GEMMs (q, k, v; gate and
    up: fed by one all-gather of the normed input) and per row-parallel GEMM (o; down: followed by one
    reduce-scatter)."""
    layers = (model.num_layers or 0)
    segments: list[tuple[bool, list[tuple[int, int, int, float]]]] = []
    for (mm, k, n, count), (_, k1, _, _) in zip(gemm_shapes(model, run, tp=tp), gemm_shapes(model, run)):
        if count == 1:  # the output head: outside the blocks
            continue
        column = k == k1
        if column and segments and segments[-1][0]:
            segments[-1][1].append((mm, k, n, count / layers))
        else:
            segments.append((column, [(mm, k, n, count / layers)]))
    return segments


def _tensor_parallel_overlapped(model: ModelSpec, run: RunSpec, layout: Layout, hw: Hardware, rates: Rates,
                                overlap: TpOverlap) -> float:
    """Seconds of tensor-parallel communication left on the critical path per step when a stack pipelines each
    collective with its GEMM (Megatron-Core's ``--tp-comm-overlap``, PyTorch's AsyncTP; ``convoy.plan.stacks``).

    Sequence-parallel TP moves the all-reduce-equivalents ``_tensor_parallel`` prices as an all-gather before each
    run of column-parallel GEMMs and a reduce-scatter after each row-parallel GEMM: in the forward (and the
    recomputed forward) beside those GEMMs; in the backward a column-parallel run's reduce-scatter of the input
    gradient beside its weight-gradient GEMMs, a row-parallel GEMM's all-gather of the output gradient beside its
    dgrad. Cut into ``chunks`` pieces, a collective of ``c`` seconds beside a GEMM of ``g`` leaves
    ``max(0, c - g') + min(c, g') / chunks`` exposed (the piece with nothing beside it, and what outlasts the GEMM;
    a bulk overlap only the latter), and the GEMM, cut into ``chunks`` GEMMs of m / chunks rows (each priced at its
    own shape, its waves' tails included; run back to back, each piece past the first costs a kernel launch, not
    the floor of a GEMM timed alone, ``GEMM_FLOOR_S``) and run on the units the
    communication kernels leave it, takes ``g' = g_chunks x units / (units - comm_units)``; ``g' - g`` is charged
    here too. Hidden is at most the GEMM's time
    (``convoy.plan.stacks.TP_OVERLAPS`` has each stack's chunks and units, with their sources)."""
    dims = layout.dims
    m = layout.microbatches
    layers = math.ceil((model.num_layers or 0) / dims.pp)
    act, group = _tp_traffic(model, run, layout, hw)
    gather, scatter = (_collective(op, act, group, hw) for op in ("all_gather", "reduce_scatter"))
    units = hw.gpu.units or 0
    fp8 = fp8_gemm_factor(hw.gpu) if run.fp8 != "none" else 1.0
    dtype = run.recipe.compute

    def gemms(shapes: list[tuple[int, int, int, float]], chunks: int) -> float:
        """The GEMMs' seconds, each cut into ``chunks`` GEMMs of m / chunks rows (float8 ones at the fp8 rate)."""
        return sum(times * chunks * rates.gemm_seconds(-(-mm // chunks), k, n, dtype)
                   * (fp8 if run.fp8 != "none" and converted(k, n, int(times * (model.num_layers or 0))) else 1.0)
                   for mm, k, n, times in shapes)

    def exposed(comm: float, shapes: list[tuple[int, int, int, float]], how: CommOverlap) -> float:
        whole = gemms(shapes, 1)
        chunks = 1 if how.bulk else how.chunks or dims.tp
        cut = whole
        if chunks > 1:  # smaller GEMMs, back to back: their waves' tails, and a launch (not a timed GEMM's floor) each
            extra = gemms(shapes, chunks) - whole - (chunks - 1) * GEMM_FLOOR_S * len(shapes)
            cut += max(0.0, extra) + (chunks - 1) * len(shapes) * rates.launch_seconds
        slowed = cut * units / (units - how.comm_units) if units > how.comm_units and how.comm_units else cut
        piece = 0.0 if how.bulk else min(comm, slowed) / chunks
        return (slowed - whole) + max(0.0, comm - slowed) + piece

    forward = backward = 0.0
    for column, shapes in _tp_segments(model, run, dims.tp):
        if column:
            forward += exposed(gather, shapes, overlap.all_gather)
            backward += exposed(scatter, shapes, overlap.input_gradient)  # beside the wgrad GEMM
        else:
            forward += exposed(scatter, shapes, overlap.reduce_scatter)
            backward += exposed(gather, shapes, overlap.all_gather)  # the output gradient gathered beside the dgrad
    passes = forward * (2 if run.recompute == "full" else 1) + backward if run.training else forward
    return m * layers * passes


def context_parallel_seconds(model: ModelSpec, run: RunSpec, layout: Layout, hw: Hardware, rates: Rates
                             ) -> tuple[float, float]:
    """(exposed seconds of the cp ring's collectives, bytes each GPU sends) per step, as torch's ring runs them
    (``convoy.plan.ring``): each layer's forward all-gathers K and V (every query head, 16 bits) under its first,
    causal step's kernel, and again when full recomputation runs the forward again; the backward all-gathers them
    once more under its first step, and sends the fp32 dk and dv to the next rank after every step by all-to-all,
    each transfer under the next step's kernel and the last under nothing. Only what outlasts the kernel beside it
    is exposed: little on NVLink with long blocks, much across nodes or with short ones."""
    dims = layout.dims
    if not (dims.cp_enabled and model.has_shape):
        return 0.0, 0.0
    cp, m = dims.cp, layout.microbatches
    total = model.num_layers or 1
    layers = math.ceil(total / dims.pp)
    b, a, _, s, d = attention_shape(model, run, tp=dims.tp)
    first, later = ring_kernels(rates, batch=b, heads=a, seq=s, head_dim=d, cp=cp, dtype=run.recipe.compute)
    sent = ring_exchange(batch=b, heads=a, seq=s, head_dim=d, cp=cp, activation_bytes=run.recipe.activation_bytes)
    ranks_per_node = max(1, min(cp, hw.gpus_per_node // dims.tp))
    group = _group(hw, ranks_per_node, cp)
    gather = _collective("all_gather", cp * sent.kv_bytes, group, hw)
    # the all-to-all rotation: every rank sends its dk, dv to one peer at once, on its own link
    rotate = sent.gradient_bytes / group.bus_bytes_per_s + collective_latency(hw, across_nodes=group.nodes > 1)
    forward = max(0.0, gather - first / 3)  # the model's forward is a third of the kernel's forward + backward
    backward = max(0.0, gather - first * 2 / 3) + (cp - 1) * max(0.0, rotate - later * 2 / 3) + rotate
    if not run.training:
        return m * layers * forward, m * layers * (cp - 1) * sent.kv_bytes
    forwards = 1 + (math.ceil(total / run.recompute_every) / total if run.recompute == "full" else 0.0)
    seconds = m * layers * (forwards * forward + backward)
    return seconds, m * layers * ((forwards + 1) * (cp - 1) * sent.kv_bytes + cp * sent.gradient_bytes)


def _pipeline(model: ModelSpec, run: RunSpec, layout: Layout, hw: Hardware) -> tuple[float, float]:
    """(seconds of the pipeline's sends on the critical path; bytes each GPU sends) per step.

    Each send is one micro-batch's activations (or their gradient) of a tp rank, ``act``; the sends are
    asynchronous, so only those on the schedule's critical path wait (``convoy.plan.schedules.critical_transfers``:
    2(p-1) through the warm-up and cool-down, more where the schedule has no slack). A stage boundary crosses the
    network when the next stage's ranks are on another node (ranks pp outer x dp x tp inner: every boundary when a
    stage fills a node, else one in every gpus_per_node / stage boundaries), and is then priced on the sending GPU's
    NIC (its share of the node's network, one NIC per GPU on a rail-optimized node: all of a stage's ranks send at
    once) at NCCL's fraction of it, plus the network's small-message latency; inside a node on its link."""
    dims = layout.dims
    if not (dims.pp_enabled and model.hidden):
        return 0.0, 0.0
    pp = dims.pp
    act = run.seq_len * run.micro_batch * model.hidden * run.recipe.activation_bytes / dims.tp
    stage = max(1, dims.world_size // pp)  # ranks of one stage
    if hw.nodes == 1:
        crossing = 0
    elif stage >= hw.gpus_per_node:
        crossing = pp - 1
    else:
        crossing = min(pp - 1, math.ceil(pp / max(1, hw.gpus_per_node // stage)) - 1)
    nic = _group_bandwidth(hw, 1, 2) * (1.0 if hw.gpu.kind == "cpu" else NCCL_LINK_FRACTION["net"])
    over_network = act / nic + collective_latency(hw, across_nodes=True)
    inside = act / hw.intra_bandwidth + collective_latency(hw, across_nodes=False)
    per_send = (crossing * over_network + (pp - 1 - crossing) * inside) / (pp - 1)
    waits = critical_transfers(pp, layout.microbatches, schedule=layout.pp_schedule,
                               stages_per_rank=layout.pp_stages_per_rank)
    sends = transfers(pp, layout.microbatches, stages_per_rank=layout.pp_stages_per_rank)
    return waits * per_send, sends * act


def _offload(model: ModelSpec, run: RunSpec, layout: Layout, hw: Hardware) -> float:
    """Seconds of an offloaded optimizer per step, all exposed: gradients to the host and updated weights back
    (ZeRO-3: the weights again at every micro-batch), and the CPU's Adam step."""
    if not (layout.offload and run.training):
        return 0.0
    recipe, m = run.recipe, layout.microbatches
    psi = _stage_params(model, layout.dims.pp) / layout.dims.tp
    shard = psi / (layout.shard_degree if layout.zero_stage >= 1 else 1)
    transfer = shard * (recipe.grad_bytes + recipe.weight_bytes)  # gradients down, updated weights up
    if layout.zero_stage == 3:
        transfer += shard * recipe.weight_bytes * 2 * (m - 1)  # weights up again every micro-batch
    return transfer / hw.host_bandwidth + shard / CPU_ADAM_PARAMS_PER_S


@remembered
def choose_schedule(model: ModelSpec, run: RunSpec, layout: Layout, hw: Hardware, *, global_batch: int,
                    rates: Rates | None = None) -> Layout:
    """``layout`` with the pipeline schedule the planner runs it with: of the schedules its degrees and
    micro-batches can run (``convoy.plan.schedules.schedule_options``: 1F1B, interleaved 1F1B with v = 2, 4, 8),
    the fastest whose memory fits ``hw``'s GPU, else the one needing least memory. A layout without pp, or with a
    schedule other than the default already set, is returned as it is."""
    from convoy.plan.memory import memory_per_gpu
    from convoy.plan.schedules import DEFAULT_SCHEDULE, schedule_options

    if not layout.dims.pp_enabled or (layout.pp_schedule, layout.pp_stages_per_rank) != (DEFAULT_SCHEDULE, 1):
        return layout
    options = [replace(layout, pp_schedule=name, pp_stages_per_rank=v)
               for name, v in schedule_options(pp=layout.dims.pp, microbatches=layout.microbatches,
                                               layers=model.num_layers)]
    if len(options) == 1:
        return layout
    # only the schedules that fit are timed: when none does, the least memory decides
    needs = [(memory_per_gpu(model, run, o).total, o) for o in options]
    fitting = [o for total, o in needs if total <= hw.gpu.memory_bytes]
    if fitting:
        return min(fitting, key=lambda o: step_time(model, run, o, hw, global_batch=global_batch, rates=rates).seconds)
    return min(needs, key=lambda c: c[0])[1]
