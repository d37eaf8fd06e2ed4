"""What ``torch.compile`` and torchao float8 training change in a step, as the planner prices them.

    from convoy.plan.speedups import FACTORS, compiled_saved_fraction, converted, fp8_cast_seconds
    FACTORS["compile_memory_bound"].value, FACTORS["compile_memory_bound"].source    # 0.65, 'torchtitan ...'
    compile_seconds(model, run)                  # the first step's one-off compile time (an estimate)

Compile (``RunSpec.compile``): the memory-bound work of the forward and backward runs in fused kernels
(``compile_memory_bound``), a block saves fewer tensors where no recomputation policy decides what it keeps
(``compiled_saved_fraction``), a block launches its GEMMs, its attention and a few fused kernels, and the first step
pays the compile (``compile_seconds``). float8 (``RunSpec.fp8``): each converted linear -- a block linear whose
dimensions are multiples of 16, never the output head, as ``convoy.train`` converts them -- runs its GEMMs at the
board's dense fp8 peak (``GpuSpec.fp8_tflops``) and pays torchao's amax and cast of its operands in memory-bound
passes; under FSDP with the tensorwise recipe the weights are all-gathered in float8 (1 byte instead of 2). Master
weights, optimizer states, gradients, reduce-scatters and activations stay as they were. Every number is in
``FACTORS`` with its source; docs/planner.md, "torch.compile and float8", shows the same table. Torch-free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TYPE_CHECKING = False  # typing is not imported at run time: a plan starts without it
if TYPE_CHECKING:  # activations (below memory, which the layouts come from) imports this module
    from typing import Any

    from convoy.plan.hardware import GpuSpec
    from convoy.plan.model import ModelSpec
    from convoy.plan.run import RunSpec

    #: a ``convoy.plan.memory.Layout`` (memory imports activations, which imports this module)
    Layout = Any
    #: a ``convoy.plan.speed.rates.Rates`` (likewise)
    Rates = Any

__all__ = ["Factor", "FACTORS", "FP8_ALIGN", "compiled_saved_fraction", "converted", "converted_block_params",
           "fp8_gemm_factor", "fp8_cast_seconds", "fp8_all_gather", "gathered_fraction", "compile_seconds", "check_fp8",
           "compiled_block_launches"]


@dataclass(frozen=True)
class Factor:
    """One number the planner prices compile or float8 with, and where it comes from."""

    value: float
    source: str
    estimate: bool = False
    """True for a stated estimate nobody has measured yet (the GPU review measures it)."""


_TITAN = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md"
_NOTE = "/work/shared/notes/compile-fp8-context-parallel.md"

#: name -> the factor and its source
FACTORS: dict[str, Factor] = {
    "compile_memory_bound": Factor(0.65, (
        f"{_TITAN}, tables 1 and 3 (Llama 3.1 8B FSDP, 8 and 128 H100s): eager -> torch.compile saves 0.387 s and "
        "0.408 s per step, 35 % and 36 % of the 1.12 s the planner charges the step's memory-bound work (research "
        f"note {_NOTE}, section 4); GEMMs and attention are the same kernels compiled or not")),
    "compile_saved_none": Factor(0.46, (
        "measured on CPU (torch 2.13, a bf16 Llama block, h=512, f=1408, s=512, no recomputation; "
        "saved_tensors_hooks): "
        "eager saves 70.5 h bytes per token, compiled 32.5 h (0.46x): AOTAutograd's min-cut partitioner recomputes "
        "pointwise ops instead of saving them (research note, t8)")),
    "compile_saved_selective": Factor(1.0, (
        "per-op selective recomputation decides what a block keeps (its save list: the matmul and attention "
        "outputs, CheckpointPolicy.MUST_SAVE) and compile keeps exactly that; torchtitan's published total falls "
        f"5.4 GiB of 82.4 (-7 %, {_TITAN} table 1) in buffers the plan does not attribute to the blocks")),
    "compile_saved_full": Factor(1.0, (
        "full recomputation keeps each block's input only, which compile cannot shrink; the block being "
        "recomputed holds compile_saved_none of its eager working set")),
    "compile_fused_kernels": Factor(6, (
        f"fused pointwise kernels per compiled block and forward (research note {_NOTE}, section 4: 'the GEMMs + "
        "attention + about 6 fused pointwise kernels'); the backward twice as many")),
    "compile_seconds_per_graph": Factor(60.0, (
        "the first step compiles one block class's forward and backward graphs (every block of a uniform model "
        "reuses them); an estimate for a GPU host, not measured: a tiny block takes 15-50 s on 2 CPU cores"),
        estimate=True),
    "compile_seconds_per_layer": Factor(10.0, (
        "compile='model' traces the whole model into one graph, each block lowered anew; an estimate per block, "
        "not measured"), estimate=True),
    "fp8_cast_bytes_compiled": Factor(3, (
        "bytes moved per element for torchao's dynamic scaling of one operand, compiled: inductor fuses the amax "
        "reduction into the kernel that produces the operand (no extra pass), and the scale-and-cast, which needs "
        "the finished amax, reads it (2 B) and writes float8 (1 B); torchao's float8 README: compile 'fuses the "
        "float8 scaling/casting kernels'")),
    "fp8_cast_bytes_eager": Factor(25, (
        "the same in eager PyTorch, each op of torchao's hp_tensor_and_scale_to_float8 path materialised: abs "
        "(2 + 2 B), max (2), upcast and scale (2 + 4), clamp (4 + 4), cast (4 + 1)")),
    "fp8_cast_bytes_te": Factor(3, (
        "bytes moved per element by Transformer Engine's cast under delayed scaling (its default recipe, "
        "transformer_engine.common.recipe.DelayedScaling, amax_history_len, as NeMo 2024 ran it): the scale comes "
        "from the amax history, so one kernel reads the 16-bit operand (2 B), writes float8 (1 B) and records its "
        "amax as it goes; the input of a GEMM after a norm is cast inside the norm (LayerNormLinear: nothing "
        "extra), and a weight is cast once per step (is_first_microbatch), not per micro-batch")),
}

#: torchao's Float8Linear runs _scaled_mm, which needs both dimensions of the weight to be multiples of 16
FP8_ALIGN = 16


def compiled_saved_fraction(run: RunSpec, recompute: str) -> float:
    """What a compiled block keeps for backward, as a fraction of the eager block's, under ``recompute``
    (``FACTORS``); 1 for an eager run."""
    if run.compile == "none":
        return 1.0
    return FACTORS[f"compile_saved_{recompute}"].value


def compiled_block_launches(gemms: int) -> int:
    """Kernels a compiled block launches per micro-batch, forward and backward: three per GEMM, two for the
    attention, and the fused pointwise kernels (``compile_fused_kernels`` forward, twice as many backward)."""
    return 3 * gemms + 2 + 3 * int(FACTORS["compile_fused_kernels"].value)


def converted(k: int, n: int, count: int) -> bool:
    """A GEMM of ``gemm_shapes`` whose linear float8 converts: a block's (the output head, count 1, stays in 16
    bits), with both weight dimensions multiples of ``FP8_ALIGN``."""
    return count > 1 and k % FP8_ALIGN == 0 and n % FP8_ALIGN == 0


def converted_block_params(model: ModelSpec, run: RunSpec, *, tp: int = 1) -> float:
    """Weights of one block (on one tp rank) in converted linears."""
    from convoy.plan.shapes import gemm_shapes

    if not model.has_shape or run.fp8 == "none":
        return 0.0
    assert model.num_layers is not None
    return sum(k * n * count / model.num_layers for _, k, n, count in gemm_shapes(model, run, tp=tp)
               if converted(k, n, count))


def fp8_gemm_factor(gpu: GpuSpec) -> float:
    """A converted GEMM's time over its bf16 time: the board's dense bf16 peak over its fp8 peak (the same
    attainable fraction of each assumed); ``PlanError`` for a board without float8 tensor cores."""
    return gpu.peak_flops("bf16") / gpu.peak_flops("fp8")


def check_fp8(gpu: GpuSpec, run: RunSpec) -> None:
    """``PlanError`` when ``run`` asks for fp8 on a board without float8 tensor cores."""
    if run.fp8 != "none":
        gpu.peak_flops("fp8")


def fp8_all_gather(run: RunSpec, layout: Layout) -> bool:
    """FSDP2 gathers the converted weights in float8 (torchao's ``enable_fsdp_float8_all_gather``): the tensorwise
    recipe, with sharded weights (convoy's zero2 and zero3 run FSDP2). Rowwise gathers in 16 bits."""
    return run.fp8 == "tensorwise" and layout.zero_stage >= 2 and layout.shard_degree > 1


def gathered_fraction(model: ModelSpec, run: RunSpec, layout: Layout, block_params: float, bytes_per_param: float
                      ) -> float:
    """The bytes FSDP gathers for one block of ``block_params`` parameters (on one tp rank), as a fraction of its
    16-bit bytes (``bytes_per_param`` each): its converted linears at 1 byte under float8 all-gather, else 1."""
    if not fp8_all_gather(run, layout) or block_params <= 0 or bytes_per_param <= 1:
        return 1.0
    fp8_params = min(block_params, converted_block_params(model, run, tp=layout.dims.tp))
    return 1 - fp8_params / block_params * (bytes_per_param - 1) / bytes_per_param


def fp8_cast_seconds(model: ModelSpec, run: RunSpec, layout: Layout, rates: Rates, *, how: str = "torchao"
                     ) -> float:
    """Seconds per micro-batch of torchao's amax-and-cast passes on one GPU: per converted linear, the input and
    (unless FSDP gathers it in float8, cast once on its shard) the weight in the forward and again for the
    backward's, and the output's gradient; rowwise scales each activation operand along both axes (the forward's
    rows, the weight gradient's columns), ``rowwise_with_gw_hp`` keeps the weight gradient in 16 bits.
    ``how="te"``: Transformer Engine's casts (``fp8_cast_bytes_te``): one pass per operand, none for a
    column-parallel linear's input (cast in the norm before it), the weights once per step."""
    from convoy.plan.shapes import gemm_shapes

    if run.fp8 == "none" or not model.has_shape:
        return 0.0
    assert model.num_layers is not None
    te = how == "te"
    per = FACTORS["fp8_cast_bytes_te" if te else "fp8_cast_bytes_compiled" if run.compile != "none"
                  else "fp8_cast_bytes_eager"].value
    tp = layout.dims.tp
    # a linear whose k tp does not split (q, k, v, gate, up, fc1) reads the normed block input: TE casts it there
    shapes = gemm_shapes(model, run, tp=tp)
    after_norm = [k == k2 for (_, k, _, _), (_, k2, _, _) in zip(gemm_shapes(model, run),
                                                               gemm_shapes(model, run, tp=2))] if te else \
        [False] * len(shapes)
    share = math.ceil(model.num_layers / layout.dims.pp) / model.num_layers
    both_axes = 2 if run.fp8 == "rowwise" else 1
    gathered = fp8_all_gather(run, layout)
    elements = 0.0
    for (m, k, n, count), normed in zip(shapes, after_norm):
        if not converted(k, n, count):
            continue
        weight = k * n / layout.shard_degree if gathered else 2 * k * n  # forward and backward, or on the shard
        if te:
            weight /= layout.microbatches
        inputs = 0 if te and normed else m * k
        activations = both_axes * (inputs + m * n) if run.training else inputs
        elements += count * share * (activations + (weight if run.training else k * n))
    return elements * per / (rates.memory_bytes_per_s or float("inf"))


def compile_seconds(model: ModelSpec, run: RunSpec) -> float:
    """The first step's one-off compile time (an estimate, ``FACTORS``): one block class's graphs for
    ``compile="blocks"`` (a uniform model's blocks share them), every block in one graph for ``"model"``."""
    if run.compile == "none":
        return 0.0
    if run.compile == "blocks":
        return FACTORS["compile_seconds_per_graph"].value
    return FACTORS["compile_seconds_per_graph"].value + (model.num_layers or 1) * FACTORS[
        "compile_seconds_per_layer"].value

