"""Time per training step for one layout: FLOPs at a stated efficiency, ring collectives per link, overlap, bubble.

    from convoy.plan.timing import step_time, model_flops_per_token
    t = step_time(model, run, layout, hardware, global_batch=512)
    t.seconds, t.tokens_per_s_per_gpu, t.mfu, t.comm_bytes

Sources: training FLOPs per token 6N + 12·L·h·s (Kaplan et al. 2020 for 6N; the attention term and the MFU
definition from PaLM, Chowdhery et al. 2022, appendix B); full recomputation adds one forward (8N, Korthikanti
et al. 2022). Collectives use the ring (bandwidth-optimal) cost: all-reduce moves 2(n-1)/n of the buffer
through each GPU's link, all-gather and reduce-scatter (n-1)/n (Thakur, Rabenseifner & Gropp 2005; NCCL's
"bus bandwidth" doc). Megatron tensor parallelism does 4 all-reduce-equivalents of the layer's activations per
block per micro-batch (Narayanan et al. 2021); a 1F1B pipeline idles (p-1)/(m+p-1) of the time (GPipe bubble).
Data-parallel traffic overlaps with the backward; tensor-parallel and offload traffic are counted as exposed.

A model with a shape (layers, hidden, heads) is timed kernel class by kernel class, a roofline: every GEMM of
the model at its own shape (x3 for forward + two backward products, x4 with full recomputation), the fused
attention's forward + backward, memory-bound work (the saved activation bytes, each written and read, its
gradient written and read, plus a launch overhead per kernel, about three per saved tensor), and the
optimizer's reads and writes. The rates come from one of two places:

- the datasheet (default): GEMMs and attention at peak FLOPs x ``efficiency``, memory-bound work and the
  optimizer at the datasheet's memory bandwidth, no launch overhead. A model known only by its parameter
  count is timed as 6N FLOPs per token at peak x ``efficiency``.
- a ``Calibration`` (``convoy plan --calibrate``, measured on the device by ``convoy.plan.calibrate``): each
  GEMM shape at its measured FLOP/s, the fused attention's measured seconds, memory-bound work at the measured
  seconds per saved byte of a norm / GELU / SiLU / residual chain's forward + backward (else the rule above at
  the measured bandwidth and launch overhead), the optimizer at the measured bandwidth; measured peer
  bandwidth replaces the datasheet's intra-node link.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from convoy.plan.activations import block_bytes, block_saved, head_saved_bytes
from convoy.plan.calibration import Calibration, attention_key, gemm_key
from convoy.plan.hardware import GpuSpec, Hardware
from convoy.plan.memory import OPTIMIZER_STATE_BYTES, Layout, RunSpec, _stage_params
from convoy.plan.model import ModelSpec
from convoy.plan.units import GB

__all__ = ["StepTime", "step_time", "model_flops_per_token", "ring_all_reduce_seconds", "ring_gather_seconds",
           "DEFAULT_EFFICIENCY", "CPU_ADAM_PARAMS_PER_S", "gemm_shapes", "attention_shape", "compute_seconds",
           "optimizer_seconds", "datasheet_rates", "mfu_peak"]

#: fraction of peak FLOPs the matmul and attention kernels reach without a calibration: a typical large-model
#: figure (PaLM reports 46% MFU, Megatron-LM 52% on A100); a stated assumption, override with ``efficiency=``.
DEFAULT_EFFICIENCY = 0.5
#: parameters per second a CPU Adam step updates per process, for offloaded optimizers (DeepSpeed's
#: CPU-Adam reports about 1e9 on a server socket); a stated assumption.
CPU_ADAM_PARAMS_PER_S = 1.0e9


@dataclass(frozen=True, kw_only=True)
class StepTime:
    """Seconds of one optimizer step and where they go (per GPU, all GPUs in lock step)."""

    compute: float
    """Forward and backward passes (GEMMs, attention, memory-bound work), including the pipeline bubble."""
    bubble: float
    """Of which: pipeline idle time."""
    optimizer: float = 0.0
    """The optimizer step on the GPU, after the last backward (0: offloaded, or a model without a shape)."""
    dp_comm: float
    """Data-parallel collectives (all-reduce / reduce-scatter / all-gather), before overlap."""
    tp_comm: float
    """Tensor-parallel collectives (exposed)."""
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
    time_model: str = "datasheet"
    """``"datasheet"`` (``datasheet_rates``) or ``"calibrated"`` (rates measured on the device)."""

    @property
    def seconds(self) -> float:
        return self.compute + self.optimizer + self.exposed_dp + self.tp_comm + self.pp_comm + self.offload

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens / self.seconds / self.world_size

    @property
    def mfu(self) -> float:
        """Model FLOPs utilisation: model FLOPs per second over the GPUs' peak (PaLM's definition)."""
        return self.model_flops / (self.seconds * self.world_size * self.peak_flops)

    def as_dict(self) -> dict[str, float]:
        return {"seconds": self.seconds, "compute": self.compute, "bubble": self.bubble, "optimizer": self.optimizer,
                "dp_comm": self.dp_comm,
                "exposed_dp": self.exposed_dp, "tp_comm": self.tp_comm, "pp_comm": self.pp_comm,
                "offload": self.offload, "comm_bytes": self.comm_bytes,
                "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "mfu": self.mfu, "time_model": self.time_model}


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
        attention = 2 * 2 * model.num_layers * heads * head_dim * seq_len  # type: ignore[operator]  # QK^T, AV
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


def gemm_shapes(model: ModelSpec, run: RunSpec, *, tp: int = 1) -> list[tuple[int, int, int, int]]:
    """The forward GEMMs of one micro-batch as (m, k, n, count): per block (count = layers) and the head
    (count 1). Column-parallel projections split n by ``tp``, row-parallel ones k; a size ``tp`` does not divide
    is rounded up, the share of the busiest rank (rounding down let tp ranks do less than the whole model)."""
    assert model.hidden is not None and model.num_layers is not None and model.heads is not None
    m, h, L = run.seq_len * run.micro_batch, model.hidden, model.num_layers
    f, kv = model.ffn or 4 * h, h * (model.kv_heads or model.heads) // model.heads

    def split(size: int) -> int:
        return -(-size // tp)

    if model.family == "llama":
        out = [(m, h, split(h), L), (m, h, split(kv), 2 * L), (m, split(h), h, L)]
    else:
        out = [(m, h, split(h + 2 * kv), L), (m, split(h), h, L)]
    if model.gated_mlp:
        out += [(m, h, split(f), 2 * L), (m, split(f), h, L)]
    else:
        out += [(m, h, split(f), L), (m, split(f), h, L)]
    if model.vocab:
        out.append((m, h, split(model.vocab), 1))
    return out


def attention_shape(model: ModelSpec, run: RunSpec, *, tp: int = 1) -> tuple[int, int, int, int, int]:
    """(batch, heads, kv heads, seq, head dim) of one block's attention on one tensor-parallel rank."""
    a = model.heads or 1
    return (run.micro_batch, max(1, a // tp), max(1, (model.kv_heads or a) // tp), run.seq_len,
            (model.hidden or a) // a)


def _gemm_rate(cal: Calibration, m: int, k: int, n: int, dtype: str, fallback: float) -> float:
    rate = cal.gemm_flops.get(gemm_key(m, k, n, dtype))
    if rate:
        return rate
    rates = sorted(r for key, r in cal.gemm_flops.items() if key.endswith(f":{dtype}"))
    return rates[len(rates) // 2] if rates else fallback


def datasheet_rates(gpu: GpuSpec) -> Calibration:
    """The rates a datasheet promises, as a record with no measurement: the GEMMs and attention then run at
    ``compute_seconds``'s ``fallback_flops`` (peak x efficiency), memory-bound work at the board's bandwidth."""
    return Calibration(device_name=f"{gpu.name} (datasheet)", torch_version="", device_type="datasheet",
                       memory_bytes_per_s=(gpu.memory_gbs or 0.0) * GB)


def mfu_peak(gpu: GpuSpec, dtype: str, calibration: Calibration | None = None) -> float:
    """The per-GPU peak MFU is taken against: ``gpu``'s for ``dtype``, or the fastest GEMM ``calibration``
    measured in it where that is faster. A measured rate can pass a table's peak for real reasons (fp32 matmuls
    on TF32 tensor cores under ``torch.set_float32_matmul_precision("high")``, a GPU the table lacks planned as
    the generic device, ``--peak-tflops`` set low): an MFU against the lower figure would pass 100 %."""
    peak = gpu.peak_flops(dtype)
    if calibration is None:
        return peak
    measured = [rate for key, rate in calibration.gemm_flops.items() if key.rpartition(":")[2] == dtype]
    return max([peak, *measured])


def compute_seconds(model: ModelSpec, run: RunSpec, layout: Layout, cal: Calibration, *,
                    fallback_flops: float) -> float:
    """Seconds of one GPU's forward and backward passes for one optimizer step (its micro-batches; no bubble,
    no communication, no optimizer step) at ``cal``'s rates (measured, or ``datasheet_rates``).

    ``fallback_flops``: the rate for a GEMM shape the record lacks when it has none in that dtype at all.
    """
    dims, dtype = layout.dims, run.recipe.compute
    tp, pp, m = dims.tp, dims.pp, layout.microbatches
    total = model.num_layers or 1
    layers = math.ceil(total / pp)
    share = layers / total
    # full recomputation runs the forward of every recompute_every-th block again (the head is not checkpointed);
    # selective, the attention core's only
    again = math.ceil(total / run.recompute_every) / total if run.training and run.recompute == "full" else 0.0
    gemm = 0.0
    for mm, k, n, count in gemm_shapes(model, run, tp=tp):
        block = count > 1  # the head (count 1) is on one stage: count it on the busiest
        passes = (3 + (again if block else 0.0)) if run.training else 1
        gemm += passes * count * (share if block else 1.0) * 2 * mm * k * n / _gemm_rate(cal, mm, k, n, dtype,
                                                                                          fallback_flops)
    b, a, kv, s, d = attention_shape(model, run, tp=tp)
    attn_fwd_bwd = cal.attention_seconds.get(attention_key(b, a, kv, s, d, dtype))
    if attn_fwd_bwd is None:  # no measurement at this shape: 4·b·a·s²·d forward FLOPs x3 at the GEMM rate
        attn_fwd_bwd = 3 * 4 * b * a * s * s * d / _gemm_rate(cal, 0, 0, 0, dtype, fallback_flops)
    if run.attention == "eager":
        attn_fwd_bwd *= 2  # the s x s scores go through memory (a stated factor, not measured)
    attn_again = 1.0 if run.training and run.recompute == "selective" else again
    attn = layers * attn_fwd_bwd * ((1 + attn_again / 3) if run.training else 1 / 3)
    blocks = layers * block_bytes(model, replace(run, recompute="none"), tp=tp)
    saved = blocks + head_saved_bytes(model, run, tp=tp)
    if cal.pointwise_seconds_per_byte:  # measured: memory-bound forward + backward (launches included) per byte
        fwd_bwd = cal.pointwise_seconds_per_byte  # the forward is a third of it, as for the GEMMs
        memory_bound = (saved + again * blocks / 3) * fwd_bwd if run.training else saved * fwd_bwd / 3
        kernels = 0
    else:  # each saved byte written and read in the forward, its gradient written and read in the backward
        memory_bound = (4 * saved + 2 * again * blocks if run.training else 2 * saved) / (cal.memory_bytes_per_s
                                                                                        or float("inf"))
        kernels = 3 * layers * len(block_saved(model, run))  # ~3 kernels per saved tensor
    return m * (gemm + attn + memory_bound + kernels * cal.launch_seconds)


def optimizer_seconds(model: ModelSpec, run: RunSpec, layout: Layout, cal: Calibration) -> float:
    """Seconds of the optimizer step on the GPU: every byte of its gradients, state and weights read, the state
    and weights written, at ``cal``'s memory bandwidth (0 without one, and for an offloaded optimizer, which
    ``step_time`` charges to the CPU)."""
    if not run.training or layout.offload:
        return 0.0
    recipe = run.recipe
    psi = _stage_params(model, layout.dims.pp) / layout.dims.tp / (layout.shard_degree if layout.zero_stage >= 1
                                                                    else 1)
    state = OPTIMIZER_STATE_BYTES[run.optimizer] + recipe.master_bytes
    moved = psi * (recipe.grad_bytes + 2 * state + 2 * recipe.weight_bytes)  # read all, write weights + state
    return moved / (cal.memory_bytes_per_s or float("inf"))


def step_time(model: ModelSpec, run: RunSpec, layout: Layout, hw: Hardware, *, global_batch: int,
              efficiency: float = DEFAULT_EFFICIENCY, calibration: Calibration | None = None) -> StepTime:
    """Estimated seconds of one optimizer step processing ``global_batch`` sequences.

    ``calibration``: rates measured on the device (see the module docstring); None keeps the datasheet model."""
    if calibration is not None and calibration.peer_bytes_per_s and hw.gpus_per_node > 1:
        hw = replace(hw, intra_gbs=calibration.peer_bytes_per_s / 1e9)
    dims, recipe = layout.dims, run.recipe
    world = dims.world_size
    s, b, m = run.seq_len, run.micro_batch, layout.microbatches
    tokens = global_batch * s
    per_token = model_flops_per_token(model, s, training=run.training)
    model_flops = per_token * tokens
    hw_flops = model_flops
    if run.training and run.recompute == "full":
        hw_flops = model_flops * 4 / 3  # one more forward
    elif run.training and run.recompute == "selective" and model.num_layers and model.hidden:
        hw_flops = model_flops + 4 * model.num_layers * model.hidden * s * tokens  # the attention core again
    peak = hw.gpu.peak_flops(recipe.compute)
    optimizer = 0.0
    if model.has_shape:
        rates = calibration if calibration is not None else datasheet_rates(hw.gpu)
        compute = compute_seconds(model, run, layout, rates, fallback_flops=peak * efficiency)
        optimizer = optimizer_seconds(model, run, layout, rates)
    else:
        compute = hw_flops / world / (peak * efficiency)
    bubble = compute * (dims.pp - 1) / m if dims.pp > 1 else 0.0
    compute += bubble

    # data parallel: rank layout pp (outer) x dp x tp (inner), so a dp group has gpus_per_node/tp ranks per node
    psi = _stage_params(model, dims.pp) / dims.tp
    per_node = max(1, min(dims.dp, hw.gpus_per_node // dims.tp))
    dp_bw = _group_bandwidth(hw, per_node, dims.dp)
    grads, weights = psi * recipe.grad_bytes, psi * recipe.weight_bytes
    dp_comm = comm = 0.0
    if run.training and dims.dp > 1:
        if layout.zero_stage == 0:
            dp_comm, comm = ring_all_reduce_seconds(grads, dims.dp, dp_bw), 2 * (dims.dp - 1) / dims.dp * grads
        elif layout.zero_stage in (1, 2):  # reduce-scatter gradients, all-gather updated weights
            dp_comm = ring_gather_seconds(grads, dims.dp, dp_bw) + ring_gather_seconds(weights, dims.dp, dp_bw)
            comm = (dims.dp - 1) / dims.dp * (grads + weights)
        else:  # every micro-batch: gather weights for forward and backward, reduce-scatter gradients
            n = layout.shard_degree
            shard_bw = _group_bandwidth(hw, max(1, min(n, hw.gpus_per_node // dims.tp)), n)
            dp_comm = m * (2 * ring_gather_seconds(weights, n, shard_bw) + ring_gather_seconds(grads, n, shard_bw))
            comm = m * (n - 1) / n * (2 * weights + grads) if n > 1 else 0.0
            if dims.dp_replicate > 1:  # HSDP: all-reduce the shard's gradients across replicas once per step
                rep_bw = _group_bandwidth(hw, 1, dims.dp_replicate)
                dp_comm += ring_all_reduce_seconds(grads / n, dims.dp_replicate, rep_bw)
                comm += 2 * (dims.dp_replicate - 1) / dims.dp_replicate * grads / n
    # overlap: stage 0-2 hide their one exchange behind the last micro-batch's backward (2/3 of its compute);
    # stage 3 prefetches along the whole forward and backward
    window = compute - bubble if layout.zero_stage == 3 else (compute - bubble) / m * 2 / 3
    exposed_dp = max(0.0, dp_comm - window)

    tp_comm = 0.0
    if dims.tp > 1 and model.has_shape:
        layers = math.ceil(model.num_layers / dims.pp)  # type: ignore[operator]
        act = s * b * model.hidden * recipe.activation_bytes  # type: ignore[operator]
        per_layer = 4 + (2 if run.recompute == "full" else 0)
        tp_bw = _group_bandwidth(hw, min(dims.tp, hw.gpus_per_node), dims.tp)
        tp_comm = m * layers * per_layer * ring_all_reduce_seconds(act, dims.tp, tp_bw)
        comm += m * layers * per_layer * 2 * (dims.tp - 1) / dims.tp * act
    pp_comm = 0.0
    if dims.pp > 1 and model.hidden:
        act = s * b * model.hidden * recipe.activation_bytes / dims.tp
        crosses = dims.tp * dims.dp * dims.pp > hw.gpus_per_node
        bw = _group_bandwidth(hw, 1, 2) if crosses else hw.intra_bandwidth
        pp_comm = 2 * m * act / bw  # forward activations out, their gradients back
        comm += 2 * m * act
    offload = 0.0
    if layout.offload and run.training:
        shard = psi / (layout.shard_degree if layout.zero_stage >= 1 else 1)
        transfer = shard * (recipe.grad_bytes + recipe.weight_bytes)  # gradients down, updated weights up
        if layout.zero_stage == 3:
            transfer += shard * recipe.weight_bytes * 2 * (m - 1)  # weights up again every micro-batch
        offload = transfer / hw.host_bandwidth + shard / CPU_ADAM_PARAMS_PER_S
    return StepTime(compute=compute, bubble=bubble, optimizer=optimizer, dp_comm=dp_comm, tp_comm=tp_comm,
                    pp_comm=pp_comm, offload=offload, exposed_dp=exposed_dp, comm_bytes=comm, tokens=tokens,
                    world_size=world, model_flops=model_flops,
                    peak_flops=mfu_peak(hw.gpu, recipe.compute, calibration),
                    time_model="calibrated" if calibration is not None and model.has_shape else "datasheet")
