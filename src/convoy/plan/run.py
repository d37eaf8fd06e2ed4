"""What one training step processes and how: sequence, batch, precision recipe, optimizer, recomputation.

    from convoy.plan.run import RunSpec, PRECISIONS
    run = RunSpec(seq_len=2048, micro_batch=1, precision="bf16-autocast", recompute="full")
    run.recipe.weight_bytes, run.training          # 4, True

The lowest record of the planner's formulas: ``activations``, ``memory``, ``shapes`` and ``timing`` all read it,
and it reads none of them. Bytes per parameter follow the ZeRO paper (Rajbhandari et al. 2020, section 3.1).
"""

from __future__ import annotations

from dataclasses import dataclass

from convoy.errors import PlanError
from convoy.plan.memo import hashed_once

__all__ = ["Precision", "PRECISIONS", "OPTIMIZER_STATE_BYTES", "RECOMPUTE", "ATTENTION", "COMPILE", "FP8_RECIPES",
           "RunSpec"]


@dataclass(frozen=True, kw_only=True)
class Precision:
    """Bytes per parameter a precision recipe keeps, before any sharding (optimizer states are separate)."""

    name: str
    weight_bytes: int
    """Working weights the forward reads (2 for 16-bit, 4 for fp32)."""
    grad_bytes: int
    """Gradients as the backward writes and the collectives reduce them."""
    master_bytes: int
    """fp32 master copy of the weights kept for the optimizer (0 when the weights are already fp32)."""
    accum_bytes: int = 0
    """A separate fp32 gradient-accumulation buffer (Megatron's main_grad), 0 when none."""
    compute: str = "bf16"
    """Matmul dtype: sets the peak FLOPs used for time."""
    activation_bytes: int = 2
    """Bytes per matmul activation element (Korthikanti's formulas assume 2)."""
    autocast: bool = False
    """Runs under ``torch.autocast``: with fp32 weights (``weight_bytes`` 4) an fp32 residual stream and norms and
    16-bit casts for every matmul; with 16-bit weights (FSDP2's param_dtype) only the fp32 ops of autocast's list."""
    description: str = ""


PRECISIONS: dict[str, Precision] = {p.name: p for p in (
    Precision(name="fp32", weight_bytes=4, grad_bytes=4, master_bytes=0, compute="fp32", activation_bytes=4,
              description="everything fp32: 4 + 4 bytes per parameter plus the optimizer"),
    Precision(name="bf16", weight_bytes=2, grad_bytes=2, master_bytes=4, compute="bf16",
              description="bf16 weights and gradients, fp32 master weights (as the ZeRO paper counts: 16 B/param "
                          "with Adam)"),
    Precision(name="fp16", weight_bytes=2, grad_bytes=2, master_bytes=4, compute="fp16",
              description="fp16 weights and gradients, fp32 master weights (16 B/param with Adam)"),
    Precision(name="bf16-fp32-grads", weight_bytes=2, grad_bytes=4, master_bytes=4, compute="bf16",
              description="bf16 weights, fp32 gradients and master weights (18 B/param with Adam)"),
    Precision(name="bf16-fp32-accum", weight_bytes=2, grad_bytes=2, master_bytes=4, accum_bytes=4, compute="bf16",
              description="bf16 weights and gradients plus an fp32 accumulation buffer (20 B/param with Adam)"),
    Precision(name="bf16-autocast", weight_bytes=4, grad_bytes=4, master_bytes=0, compute="bf16", autocast=True,
              description="fp32 weights under torch.autocast(bf16), as Accelerate's mixed_precision='bf16' "
                          "(16 B/param with Adam)"),
    Precision(name="fp16-autocast", weight_bytes=4, grad_bytes=4, master_bytes=0, compute="fp16", autocast=True,
              description="fp32 weights under torch.autocast(float16) with a GradScaler (16 B/param with Adam)"),
    # FSDP2 keeps fp32 weight shards and fp32 gradient shards (reduce_dtype) and gathers 16-bit weights: counted as
    # 2 (gathered, and the all-gather) + 4 (gradients, and the reduce-scatter) + 2 (the rest of the fp32 weight
    # shard), the same 8 bytes per parameter before the optimizer
    Precision(name="bf16-fsdp", weight_bytes=2, grad_bytes=4, master_bytes=2, compute="bf16", autocast=True,
              description="FSDP2's MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) under torch.autocast, as "
                          "convoy's zero2/zero3/fsdp with mixed_precision='bf16' (16 B/param with Adam)"),
    Precision(name="fp16-fsdp", weight_bytes=2, grad_bytes=4, master_bytes=2, compute="fp16", autocast=True,
              description="FSDP2's MixedPrecisionPolicy(param_dtype=float16, reduce_dtype=fp32) under torch.autocast "
                          "(16 B/param with Adam)"),
)}

#: fp32 optimizer state bytes per parameter. "none" means inference: no gradients and no optimizer either.
OPTIMIZER_STATE_BYTES: dict[str, int] = {"adamw": 8, "adam": 8, "sgd-momentum": 4, "sgd": 0, "none": 0}

RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("flash", "eager")
#: ``Accelerator(compile=...)``: eager, each repeated block compiled in place (torchtitan's recipe), the whole model
COMPILE = ("none", "blocks", "model")
#: torchao float8 recipes (``Accelerator(mixed_precision="fp8", fp8_recipe=...)``), ``"none"`` for 16-bit GEMMs
FP8_RECIPES = ("none", "tensorwise", "rowwise", "rowwise_with_gw_hp")


@hashed_once
@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """What one training step processes and how."""

    seq_len: int = 2048
    """Tokens per sequence s."""
    micro_batch: int = 1
    """Sequences per GPU per forward b."""
    global_batch: int | None = None
    """Sequences per optimizer step; default: micro_batch x the world size (no accumulation for pure DP)."""
    precision: str = "bf16"
    """A key of ``PRECISIONS``."""
    optimizer: str = "adamw"
    """A key of ``OPTIMIZER_STATE_BYTES``; ``"none"`` plans inference."""
    recompute: str = "none"
    """Activation checkpointing as the trainer runs it: none, selective (each block keeps its matmul and attention
    outputs, ``activations.block_selective``) or full (each block keeps its input)."""
    attention: str = "flash"
    """``"flash"`` (SDPA's fused kernels keep no s x s matrix) or ``"eager"`` (Korthikanti's 5as^2b term)."""
    dropout: bool = False
    """Force dropout masks (1 byte per element) even when the model's config has no dropout."""
    recompute_every: int = 1
    """With ``recompute="full"``: checkpoint every k-th block only (1 = every block, torchtitan's
    per-layer selective AC uses k = 2)."""
    compile: str = "none"
    """``torch.compile`` as the trainer applies it (``COMPILE``): fused memory-bound work and fewer saved tensors
    (``convoy.plan.speedups``)."""
    fp8: str = "none"
    """torchao float8 training recipe (``FP8_RECIPES``) on top of the 16-bit ``precision``: the block linears'
    GEMMs at the board's fp8 rate (``convoy.plan.speedups``)."""

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise PlanError(f"precision {self.precision!r} is not one of: {', '.join(PRECISIONS)}")
        if self.optimizer not in OPTIMIZER_STATE_BYTES:
            raise PlanError(f"optimizer {self.optimizer!r} is not one of: {', '.join(OPTIMIZER_STATE_BYTES)}")
        if self.recompute not in RECOMPUTE:
            raise PlanError(f"recompute {self.recompute!r} is not one of: {', '.join(RECOMPUTE)}")
        if self.attention not in ATTENTION:
            raise PlanError(f"attention {self.attention!r} is not one of: {', '.join(ATTENTION)}")
        if self.compile not in COMPILE:
            raise PlanError(f"compile {self.compile!r} is not one of: {', '.join(COMPILE)}")
        if self.fp8 not in FP8_RECIPES:
            raise PlanError(f"fp8 recipe {self.fp8!r} is not one of: {', '.join(FP8_RECIPES)}")
        if self.fp8 != "none" and self.recipe.compute != "bf16":
            raise PlanError(f"fp8 trains on top of bf16 (its high-precision copies are bf16); precision "
                            f"{self.precision!r} computes in {self.recipe.compute}: use a bf16 recipe with fp8")
        for name in ("seq_len", "micro_batch", "recompute_every"):
            if getattr(self, name) < 1:
                raise PlanError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.global_batch is not None and self.global_batch < self.micro_batch:
            raise PlanError(f"global batch {self.global_batch} is smaller than the micro-batch {self.micro_batch}")

    @property
    def training(self) -> bool:
        return self.optimizer != "none"

    @property
    def recipe(self) -> Precision:
        return PRECISIONS[self.precision]
