"""The software a training run ran on, as an input of the plan: its GEMM library, attention, data-parallel schedule,
recompute save list, what it reports as memory, whether its tensor-parallel collectives overlap the GEMMs
(Megatron-Core's userbuffers, PyTorch's AsyncTP), its fused memory-bound kernels and its float8 casts.

    from convoy.plan.stacks import STACKS, stack_named
    stack_named("megatron-2021").attention           # "fused-softmax"
    step_time(model, run, layout, hw, global_batch=512, stack="megatron-2021")   # convoy.plan.timing
    memory_per_gpu(model, run, layout, stack="torchtitan")                       # convoy.plan.memory
    reported_bytes(memory, "torchtitan")  # what its log prints (max_memory_reserved): convoy.plan.memory

A plan is for convoy's own stack (``"convoy"``, the default: what ``convoy launch`` runs); a published run of another
project states its own (``benchmarks/published_results.py``). Each ``Stack`` says how it differs from convoy's and
gives the source of each difference beside it, as ``convoy.plan.architectures`` does for the hardware. Nothing here
is fitted to the published runs the planner is checked against: a factor comes from an independent measurement (a
kernel benchmark of that library version, a paper's own single-GPU figure for that stack) or the stack's source
code, and where none was found the factor is convoy's (1.0) and its source says so. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from convoy.errors import PlanError
from convoy.plan.speedups import FACTORS

TYPE_CHECKING = False  # typing is not imported at run time: a plan starts without it
if TYPE_CHECKING:
    from convoy.plan.run import RunSpec

__all__ = ["Stack", "STACKS", "DEFAULT_STACK", "DP_SCHEDULES", "ATTENTIONS", "MEMORY_REPORTS", "TP_OVERLAPS",
           "FP8_CASTS", "CommOverlap", "TpOverlap", "stack_named"]

#: the attention implementations a stack runs: SDPA's fused kernels (no s x s matrix kept), Megatron's fused
#: scale-mask-softmax kernel (the s x s softmax output kept in 16 bits; ``activations``' eager block), eager PyTorch
ATTENTIONS = ("flash", "fused-softmax", "eager")
#: whose data-parallel collective schedule ``convoy.plan.timing`` prices: ``"torch"`` (convoy's engines: DDP's buckets
#: along the last backward, ZeroRedundancyOptimizer's broadcasts, FSDP2 per unit overlapped along the whole step),
#: ``"megatron"`` (Megatron-LM's own DDP of 2021: one all-reduce of the gradient buffer after the whole backward),
#: ``"deepspeed"`` (ZeRO-1: gradients reduced after the pipeline engine's last micro-batch, updated shards
#: all-gathered; without a pipeline, reduced along the backward as DDP's are, as its ``overlap_comm`` runs them; ZeRO-3
#: of 2021: one collective per parameter tensor), ``"fsdp1"`` (FSDP1 with ``limit_all_gathers``), ``"megatron-core"``
#: (its DDP and distributed optimizer: bucket by bucket reduce-scatters beside the last micro-batch's backward and
#: all-gathers beside the next forward)
DP_SCHEDULES = ("torch", "megatron", "deepspeed", "fsdp1", "megatron-core")
#: what a stack prints as a GPU's memory: ``"planned"`` (the plan's own total: allocated, the CUDA context and the
#: fragmentation allowance), ``"reserved"`` (``torch.cuda.max_memory_reserved``), ``"allocated"``
MEMORY_REPORTS = ("planned", "reserved", "allocated")
#: how torchao's or Transformer Engine's float8 casts are priced (``convoy.plan.speedups.fp8_cast_seconds``):
#: ``"torchao"`` (dynamic scaling: an amax pass, then the scale-and-cast, per operand and micro-batch), ``"te"``
#: (delayed scaling: the scale comes from the amax history, so the cast is one pass that records the amax as it
#: goes; fused into the LayerNorm before a column-parallel GEMM; the weights cast once per step)
FP8_CASTS = ("torchao", "te")


@dataclass(frozen=True, kw_only=True)
class CommOverlap:
    """How one kind of tensor-parallel collective is overlapped with a GEMM beside it."""

    chunks: int | None
    """Pieces the GEMM and the collective are cut into and pipelined; None: one per tp rank (a ring exchange). One
    piece's collective (or GEMM) has nothing beside it: the first chunk of a reduce-scatter, the last of an
    all-gather. Ignored when ``bulk``."""
    comm_units: int
    """Compute units (SMs) the communication kernels take from the GEMM while it runs (0: copy engines, the GEMM
    keeps every SM)."""
    bulk: bool = False
    """The whole collective runs beside a GEMM that does not wait for it (TE's 'bulk' overlap: the reduce-scatter of
    the input gradient beside the weight-gradient GEMM): no piece is exposed, only what outlasts the GEMM."""
    source: str


@dataclass(frozen=True)
class TpOverlap:
    """A stack's tensor-parallel overlap: the all-gather before each run of column-parallel GEMMs (forward; the
    output gradient's before a row-parallel dgrad), the reduce-scatter after each row-parallel GEMM (forward), and
    the backward's reduce-scatter of a column-parallel run's input gradient."""

    all_gather: CommOverlap
    reduce_scatter: CommOverlap
    input_gradient: CommOverlap


_TE_UB = ("Transformer Engine userbuffers (transformer_engine/pytorch/module/base.py initialize_ub, "
          "get_default_config; Megatron-Core --tp-comm-overlap, sequence parallel required)")
_ASYNC_TP = ("PyTorch AsyncTP ('[Distributed w/ TorchTitan] Introducing Async Tensor Parallelism in PyTorch', "
             "dev-discuss 2024; torch.distributed._symmetric_memory fused_all_gather_matmul / "
             "fused_matmul_reduce_scatter, applied by inductor's micro-pipeline pass to the forward and backward "
             "graphs; torchtitan enable_async_tensor_parallel)")
#: what each stack's tensor-parallel communication overlaps, or None (exposed)
TP_OVERLAPS: dict[str, TpOverlap | None] = {
    "none": None,
    "userbuffers": TpOverlap(
        all_gather=CommOverlap(chunks=None, comm_units=0, source=(
            f"{_TE_UB}: the all-gathers (qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad) run as a ring_exchange, "
            "num_splits = tp, one chunk per step sent peer to peer on the copy engines (use_ce) while the GEMM "
            "computes the chunk already here; set_sm_margin False: the GEMM keeps every SM")),
        reduce_scatter=CommOverlap(chunks=4, comm_units=16, source=(
            f"{_TE_UB}: the reduce-scatters (proj_fprop, fc2_fprop) run as a 'pipeline' of num_splits 4 GEMM "
            "chunks, each chunk's reduce-scatter on num_sm 16 SMs beside the next chunk's GEMM, which runs on the "
            "rest (set_sm_margin)")),
        input_gradient=CommOverlap(chunks=None, comm_units=16, bulk=True, source=(
            f"{_TE_UB}: qkv_wgrad / fc1_wgrad 'bulk': the input gradient's reduce-scatter runs whole beside the "
            "weight-gradient GEMM on num_sm 16 SMs"))),
    "async-tp": TpOverlap(
        all_gather=CommOverlap(chunks=None, comm_units=0, source=(
            f"{_ASYNC_TP}: the all-gather is cut into one piece per tp rank, each copied by the copy engines from "
            "a peer's symmetric memory while the matmul of the piece already here runs (no SM taken)")),
        reduce_scatter=CommOverlap(chunks=None, comm_units=0, source=(
            f"{_ASYNC_TP}: the matmul is cut into one piece per tp rank, each written to the peer that reduces it "
            "while the next piece computes; the last piece's transfer has nothing beside it")),
        input_gradient=CommOverlap(chunks=None, comm_units=0, source=(
            f"{_ASYNC_TP}: the backward's matmul-reduce-scatter, pipelined as the forward's"))),
}

_NONE_FOUND = "no independent measurement found: planned as convoy's"
_MAMF_GENERATION = ("the generation convoy's GEMM model was measured on (MAMF's cuBLAS 12.x of 2024-25, "
                    "convoy.plan.architectures)")
_MEGATRON_GEMMS = ("1.0, measured: Korthikanti et al. 2022 (arXiv:2205.05198) table 4, one layer of Megatron-LM's "
                   "22B GPT (hidden 6144, 64 heads, micro-batch 4, TP 8 on a DGX A100 80GB), 19.6 ms forward + "
                   "backward and 27.2 ms with full recompute: convoy's plan of that layer equals them with its GEMMs "
                   "at 1.00 of its model (benchmarks/stack_gemm_factors.py); cuBLAS 11.0 alone (NVIDIA, 'CUDA 11 "
                   "Features Revealed' 2020, figure 6) reaches 259-292 TFLOPs at m = n = k = 4096-8192, 1.08-1.10 "
                   "of convoy's model. On the A100: no measurement of this generation on the V100 was found")
_MEGATRON_2021_CODE = ("Megatron-LM 2021 (v2.x), megatron/training.py train_step: model.allreduce_gradients() runs "
                       "after forward_backward_func returns, timed as 'backward-params-all-reduce'; overlap of the "
                       "gradient reduce with the backward came with Megatron-Core's overlap_grad_reduce (2023)")
_DEEPSPEED_PIPE_CODE = ("DeepSpeed deepspeed/runtime/pipe/schedule.py TrainSchedule: ReduceGrads and OptimizerStep "
                        "are issued after the last micro-batch's backward; ZeRO-1 then all-gathers the updated "
                        "partitions (stage_1_and_2.py); ZeRO-3 of 2021 (stage3.py) gathers and reduce-scatters "
                        "parameter by parameter")
_FUSED_SOFTMAX = ("Megatron's FusedScaleMaskSoftmax (megatron/model/fused_softmax.py): the s x s softmax output is "
                  "kept in 16 bits, Korthikanti et al. 2022's 5as^2b term")
_FSDP1_DOCS = ("PyTorch FSDP1 docs (torch.distributed.fsdp.FullyShardedDataParallel, limit_all_gathers): the CPU "
               "thread is held so that only two consecutive units' memory is in use, the one computing and the one "
               "whose all-gather is prefetched; the root unit's all-gather starts the forward and its "
               "reduce-scatter ends the backward, with nothing left to overlap them (the root stays gathered from "
               "forward to backward: _runtime_utils._post_forward_reshard)")
_TORCHTITAN_SAC = ("torchtitan torchtitan/distributed/activation_checkpoint.py (Dec 2024: "
                   "models/llama3/parallelize_llama.py _save_list): per op, the outputs of mm, SDPA and the tp "
                   "reduce_scatter are saved except every second mm, counted per block's forward; the rest is "
                   "recomputed")
_TORCHTITAN_MEMORY = ("torchtitan torchtitan/metrics.py (Dec 2024; components/metrics.py later): the logged memory "
                      "is max_memory_reserved (DeviceMemoryMonitor.get_peak_stats: reserved_bytes.all.peak, "
                      "max_reserved_gib); read as allocated x convoy's measured reserved/allocated ratio "
                      "(convoy.plan.memory.RESERVED_OVER_ALLOCATED, 18 H100 runs)")

_MEGATRON_FUSIONS = ("1.0: Megatron-LM's fused kernels (megatron/model/fused_bias_gelu.py, fused_bias_dropout_add in "
                     "transformer.py, apex's FusedLayerNorm; the --bias-gelu-fusion, --bias-dropout-fusion and "
                     "masked-softmax-fusion defaults) replace what eager PyTorch already runs in one kernel each: "
                     "the linear's bias in addmm's epilogue then one F.gelu, one F.layer_norm, one residual add "
                     "(bias-dropout-add moves fewer bytes only with dropout, which these plans do not model); the "
                     "fused softmax is priced by the attention factor")
_MCORE_FUSIONS = ("Megatron-Core with Transformer Engine fuses what eager PyTorch (transformers' Llama) runs as "
                  "chains of kernels: RMSNorm in one TE kernel (TELayerNormColumnParallelLinear), rotary "
                  "(--apply-rope-fusion), SwiGLU (bias_swiglu_fusion), bias-dropout-add: the chains torch.compile "
                  "fuses in torchtitan's Llama 3 runs, so they are priced at that measurement "
                  "(convoy.plan.speedups.FACTORS['compile_memory_bound'], 0.65; no measurement of Megatron-Core's "
                  "fused against unfused kernels on the planner's terms was found). On a GPT (LayerNorm, GELU, no "
                  "rotary) the fusions replace single kernels, as Megatron-LM's of 2021 do: 1.0")
_MCORE_TP_OVERLAP = ("Megatron-Core --tp-comm-overlap (Transformer Engine userbuffers), as NVIDIA's published NeMo "
                     "runs set it: NeMo 2 performance recipes (nemo/collections/llm/recipes/llama3_70b.py "
                     "pretrain_performance_optimizations: MegatronCommOverlapCallback(tp_comm_overlap=True, "
                     "userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192)); the all-gathers as TE's ring_exchange "
                     "(one chunk per tp rank, 1 SM), the reduce-scatters as its pipeline (4 chunks, 16 SMs)")
_MCORE_DP = ("Megatron-Core's DDP and distributed optimizer with --overlap-grad-reduce --overlap-param-gather (the "
             "flags of Megatron-LM's published runs; NeMo 2's DistributedDataParallelConfig default): "
             "megatron/core/distributed/distributed_data_parallel.py (buckets of max(40e6, 1e6 x dp x cp) parameters, "
             "each reduce-scattered when its last gradient of the last micro-batch is ready; the next forward's "
             "pre-hooks dispatch each bucket's parameter all-gather) and param_and_grad_buffer.py")
_MCORE_FP8 = ("Transformer Engine's float8 (megatron/core/transformer/custom_layers/transformer_engine.py: "
              "fp8_autocast with recipe.DelayedScaling, NeMo's fp8 default in 2024): delayed scaling, the cast fused "
              "into TE's LayerNormLinear, weights cast once per step (convoy.plan.speedups "
              "FACTORS['fp8_cast_bytes_te'])")


@dataclass(frozen=True, kw_only=True)
class Stack:
    """One training software stack, as it differs from convoy's, with the source of each difference."""

    name: str
    software: str
    """What it is, in words."""
    gemm_fraction: float = 1.0
    """The fraction of convoy's GEMM model (``convoy.plan.speed.rates``) this stack's kernels reach: every GEMM's time
    is divided by it. 1.0: convoy's library generation, or no independent measurement."""
    gemm_by_architecture: tuple[tuple[str, float], ...] = ()
    """(architecture, fraction) where it differs from ``gemm_fraction`` (``convoy.plan.architectures`` names)."""
    gemm_source: str = ""
    attention: str | None = None
    """``ATTENTIONS``; None: the run's own (``RunSpec.attention``; convoy's trainer runs the model's SDPA)."""
    attention_source: str = ""
    dp_schedule: str = "torch"
    """``DP_SCHEDULES``: whose data-parallel collective schedule the step follows."""
    dp_schedule_source: str = ""
    save_list: str = "convoy"
    """What ``recompute="selective"`` keeps (``convoy.plan.activations.SAVE_LISTS``)."""
    save_list_source: str = ""
    memory_report: str = "planned"
    """``MEMORY_REPORTS``: what the stack prints as a GPU's memory."""
    memory_source: str = ""
    tp_overlap: str = "none"
    """``TP_OVERLAPS``: how its tensor-parallel all-gathers and reduce-scatters overlap the GEMMs beside them
    (``"none"``: on the critical path, as convoy's DTensor TP runs them)."""
    tp_overlap_source: str = ""
    memory_bound: float = 1.0
    """The fraction of convoy's eager memory-bound work (norms, activations, residual adds, rotary:
    ``convoy.plan.timing``) this stack's kernels take; 1.0: the same passes as eager PyTorch."""
    memory_bound_by_family: tuple[tuple[str, float], ...] = ()
    """(model family, fraction) where it differs from ``memory_bound`` (``convoy.plan.activations.FAMILIES``): a
    fused kernel saves passes only where eager PyTorch runs that op as a chain of kernels."""
    memory_bound_source: str = ""
    fp8_cast: str = "torchao"
    """``FP8_CASTS``: how its float8 training casts the GEMMs' operands."""
    fp8_cast_source: str = ""

    def __post_init__(self) -> None:
        from convoy.plan.activations import SAVE_LISTS

        for field, value, allowed in (("attention", self.attention, (None, *ATTENTIONS)),
                                      ("dp_schedule", self.dp_schedule, DP_SCHEDULES),
                                      ("save_list", self.save_list, SAVE_LISTS),
                                      ("memory_report", self.memory_report, MEMORY_REPORTS),
                                      ("tp_overlap", self.tp_overlap, tuple(TP_OVERLAPS)),
                                      ("fp8_cast", self.fp8_cast, FP8_CASTS)):
            if value not in allowed:
                raise PlanError(f"stack {self.name!r}: {field} {value!r} is not one of "
                                f"{', '.join(str(a) for a in allowed)}")
        if not 0 < self.gemm_fraction <= 2 or any(not 0 < f <= 2 for _, f in self.gemm_by_architecture):
            raise PlanError(f"stack {self.name!r}: a GEMM fraction must be in (0, 2]")
        if not 0 < self.memory_bound <= 1 or any(not 0 < f <= 1 for _, f in self.memory_bound_by_family):
            raise PlanError(f"stack {self.name!r}: a memory-bound fraction must be in (0, 1]")

    def memory_bound_on(self, family: str) -> float:
        """The fraction of convoy's eager memory-bound work this stack's kernels take on a ``family`` model."""
        return dict(self.memory_bound_by_family).get(family, self.memory_bound)

    @property
    def tp_overlapped(self) -> TpOverlap | None:
        """How its tensor-parallel collectives overlap the GEMMs, None when they are exposed."""
        return TP_OVERLAPS[self.tp_overlap]

    def gemm_fraction_on(self, architecture: str) -> float:
        """The fraction of convoy's GEMM model this stack reaches on ``architecture``."""
        return dict(self.gemm_by_architecture).get(architecture, self.gemm_fraction)

    def applied(self, run: RunSpec) -> RunSpec:
        """``run`` with this stack's attention (fused softmax keeps and costs what ``activations``' eager block
        does: the s x s softmax output in 16 bits); the save list travels beside it (``save_list``)."""
        if self.attention is None:
            return run
        attention = "flash" if self.attention == "flash" else "eager"
        return run if attention == run.attention else replace(run, attention=attention)

    def sources(self) -> dict[str, str]:
        """The source of each factor where the stack differs from convoy's (factor name -> source)."""
        out = {}
        if self.gemm_fraction != 1.0 or self.gemm_by_architecture:
            out["gemm"] = self.gemm_source
        if self.attention is not None:
            out["attention"] = self.attention_source
        if self.dp_schedule != DEFAULT_STACK.dp_schedule:
            out["dp_schedule"] = self.dp_schedule_source
        if self.save_list != DEFAULT_STACK.save_list:
            out["save_list"] = self.save_list_source
        if self.memory_report != DEFAULT_STACK.memory_report:
            out["memory"] = self.memory_source
        if self.tp_overlap != DEFAULT_STACK.tp_overlap:
            out["tp_overlap"] = self.tp_overlap_source
        if self.memory_bound != DEFAULT_STACK.memory_bound or self.memory_bound_by_family:
            out["memory_bound"] = self.memory_bound_source
        if self.fp8_cast != DEFAULT_STACK.fp8_cast:
            out["fp8_cast"] = self.fp8_cast_source
        return out


DEFAULT_STACK = Stack(
    name="convoy", software="convoy's trainer: PyTorch 2.x, DDP / ZeroRedundancyOptimizer / FSDP2, the model's SDPA "
    "(flash), cuBLAS of 2024-25, convoy's per-op save list",
    gemm_source=f"the reference: {_MAMF_GENERATION}",
    attention_source="the run's own (RunSpec.attention)",
    dp_schedule_source="convoy.plan.timing: DDP, ZeroRedundancyOptimizer and FSDP2 as convoy's trainer runs them",
    save_list_source="convoy.train.parallel.recompute.SELECTIVE_SAVES (every matmul's and the attention's output)",
    memory_source="the plan's total: allocated, the CUDA context and the fragmentation allowance (convoy.plan.memory)")

STACKS: dict[str, Stack] = {s.name: s for s in (
    DEFAULT_STACK,
    Stack(name="torchtitan", software="torchtitan (PyTorch 2.5+, FSDP2, per-op selective recompute)",
          gemm_source=f"1.0: PyTorch 2.5+ with cuBLAS 12.x, {_MAMF_GENERATION}",
          attention="flash", attention_source="torchtitan's Llama 3 runs F.scaled_dot_product_attention (flash)",
          save_list="torchtitan", save_list_source=_TORCHTITAN_SAC,
          memory_report="reserved", memory_source=_TORCHTITAN_MEMORY),
    Stack(name="fsdp1", software="PyTorch FSDP1 of 2023-24 (llm-foundry/Composer, IBM fms-fsdp, HF accelerate): "
          "limit_all_gathers, flash attention",
          gemm_source=f"1.0, {_NONE_FOUND} (PyTorch 2.0-2.2, cuBLAS 11.8-12.1)",
          attention="flash", attention_source="llm-foundry's and fms-fsdp's flash attention (FlashAttention-2 / SDPA)",
          dp_schedule="fsdp1", dp_schedule_source=_FSDP1_DOCS),
    Stack(name="megatron-2021", software="Megatron-LM of 2021 (PyTorch 1.8, CUDA/cuBLAS 11.x, fused softmax, "
          "Megatron's own DDP/TP/PP)",
          gemm_source=f"{_MEGATRON_GEMMS} (the layer ran on Megatron-LM of 2022, the figure on cuBLAS 11.0 of 2020: "
          "this stack's PyTorch 1.8 and CUDA 11.1 lie between)",
          attention="fused-softmax", attention_source=_FUSED_SOFTMAX,
          dp_schedule="megatron", dp_schedule_source=_MEGATRON_2021_CODE, memory_bound_source=_MEGATRON_FUSIONS),
    Stack(name="megatron-deepspeed", software="Megatron-DeepSpeed 2021-22 (BLOOM, MT-NLG): Megatron's 2021 kernels "
          "with DeepSpeed's ZeRO-1 and pipeline engine",
          gemm_source=_MEGATRON_GEMMS,
          attention="fused-softmax", attention_source=_FUSED_SOFTMAX,
          dp_schedule="deepspeed", dp_schedule_source=_DEEPSPEED_PIPE_CODE, memory_bound_source=_MEGATRON_FUSIONS),
    Stack(name="gpt-neox", software="EleutherAI GPT-NeoX 2022-23 (NeoX-20B, Pythia): Megatron + DeepSpeed lineage, "
          "ZeRO-1 x TP x PP",
          gemm_source=_MEGATRON_GEMMS,
          attention="fused-softmax", attention_source="GPT-NeoX's megatron/model/fused_softmax.py (Megatron's kernel)",
          dp_schedule="deepspeed", dp_schedule_source=_DEEPSPEED_PIPE_CODE, memory_bound_source=_MEGATRON_FUSIONS),
    Stack(name="deepspeed-zero3-2021", software="DeepSpeed ZeRO-3 of 2021 (one collective per parameter tensor) on "
          "Megatron's model",
          gemm_source=_MEGATRON_GEMMS,
          attention="fused-softmax", attention_source=_FUSED_SOFTMAX,
          dp_schedule="deepspeed", dp_schedule_source=_DEEPSPEED_PIPE_CODE, memory_bound_source=_MEGATRON_FUSIONS),
    Stack(name="megatron-core", software="Megatron-Core / NeMo 2023-25 (Transformer Engine, flash attention, "
          "distributed optimizer)",
          gemm_source=f"1.0, {_NONE_FOUND} (Transformer Engine's GEMMs are cuBLASLt's, {_MAMF_GENERATION})",
          attention="flash", attention_source="Transformer Engine's fused attention (cuDNN / FlashAttention-2)",
          dp_schedule="megatron-core", dp_schedule_source=_MCORE_DP,
          tp_overlap="userbuffers", tp_overlap_source=_MCORE_TP_OVERLAP,
          memory_bound_by_family=(("llama", FACTORS["compile_memory_bound"].value),),
          memory_bound_source=_MCORE_FUSIONS,
          fp8_cast="te", fp8_cast_source=_MCORE_FP8),
    Stack(name="llama3-meta", software="Meta's Llama 3 training stack (2024, 4D parallelism on H100s)",
          gemm_source=f"1.0, {_NONE_FOUND}",
          attention="flash", attention_source="Llama 3 paper (arXiv:2407.21783) section 3.3: flash attention",
          dp_schedule_source="FSDP overlapped with compute (Llama 3 paper, section 3.3.2): planned as convoy's"),
)}


def stack_named(stack: str | Stack) -> Stack:
    """The ``Stack`` ``stack`` names (``STACKS``); a ``Stack`` is returned as it is."""
    if isinstance(stack, Stack):
        return stack
    try:
        return STACKS[stack]
    except (KeyError, TypeError):
        raise PlanError(f"stack {stack!r} is not one of: {', '.join(STACKS)}") from None
