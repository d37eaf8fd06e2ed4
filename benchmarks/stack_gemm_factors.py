"""The GEMM factor of the Megatron-lineage stacks (``convoy.plan.stacks``), derived from measurements of that
software generation that the published-runs table (``benchmarks/published_results.py``) does not contain.

    python benchmarks/stack_gemm_factors.py     # the derivation, as docs/planner-accuracy.md section 8 prints it

A stack's ``gemm_fraction`` divides every GEMM's time. For Megatron-LM of 2021-22 on the A100 (PyTorch 1.8-1.11,
CUDA / cuBLAS 11.x) two independent measurements are set against convoy's own model of the same work:

- **one transformer layer, Megatron-LM itself** (Korthikanti et al. 2022, arXiv:2205.05198, tables 3 and 4): the
  22B model's layer (hidden 6144, 64 heads, sequence 2048, micro-batch 4, tensor parallel 8 on one DGX A100 80GB
  node of Selene, mixed precision) takes 19.6 ms forward + backward, 27.2 ms with full recomputation. Convoy plans
  that layer (on the ``megatron-2021`` stack: fused softmax, tensor-parallel all-reduces exposed) as GEMMs +
  attention + memory-bound work + all-reduces; the factor is the one at which the plan's layer equals the
  measured one, the rest of the layer as convoy plans it: ``gemm / (measured - rest)``.
- **cuBLAS 11.0's GEMMs alone** (NVIDIA Technical Blog, "CUDA 11 Features Revealed", 2020, figure 6
  "Mixed-precision matrix multiply on A100 with cuBLAS"; reproduced in stas00/ml-engineering
  compute/accelerator/images/nvidia-a100-matmul-tflops.png): BF16 TFLOPs at m = n = k, read off its plotted points
  (about ±3 TFLOPs), over what convoy's GEMM model gives at the same shape on the A100.

Both are printed with convoy's model beside them; ``tests/plan/test_stacks.py`` keeps each Megatron-lineage stack's
factor equal to what the layer gives (to 0.03) and docs/planner-accuracy.md equal to this output.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from convoy.plan.dims import ParallelDims  # noqa: E402
from convoy.plan.hardware import Hardware, lookup_gpu  # noqa: E402
from convoy.plan.memory import Layout  # noqa: E402
from convoy.plan.model import ModelSpec, from_numbers  # noqa: E402
from convoy.plan.run import RunSpec  # noqa: E402
from convoy.plan.speed.rates import ModeledRates  # noqa: E402
from convoy.plan.stacks import STACKS  # noqa: E402
from convoy.plan.timing import step_time  # noqa: E402

KORTHIKANTI = "Korthikanti et al. 2022 (arXiv:2205.05198), table 4 (configuration: table 3, 22B)"
CUDA11_FIGURE = ("NVIDIA Technical Blog 'CUDA 11 Features Revealed' (2020), figure 6: mixed-precision matrix "
                 "multiply on A100 with cuBLAS, BF16")
#: the stacks that run Megatron's 2021-22 kernels on PyTorch 1.8-1.11 and CUDA / cuBLAS 11.x
MEGATRON_LINEAGE = ("megatron-2021", "megatron-deepspeed", "gpt-neox", "deepspeed-zero3-2021")

#: Korthikanti et al. 2022, table 3: the 22B model (48 layers; vocabulary 51,200, sequence 2048: section 6)
HIDDEN, HEADS, LAYERS, VOCAB, SEQ, MICRO_BATCH, TP = 6144, 64, 48, 51200, 2048, 4, 8
#: table 4, forward + backward of one transformer layer, ms: "Baseline no recompute", "Baseline with recompute"
LAYER_MS = {"none": 19.6, "full": 27.2}
#: figure 6, BF16 TFLOPs at m = n = k, read off the plotted points
CUBLAS_11_TFLOPS = {4096: 259, 6144: 277, 8192: 292}

A100_NODE = Hardware(gpu=lookup_gpu("A100-80GB"), gpus_per_node=8)


@dataclass(frozen=True)
class LayerFit:
    """Convoy's plan of one measured layer and the GEMM factor at which it equals the measurement."""

    recompute: str
    measured_ms: float
    gemm_ms: float
    """The layer's GEMMs at convoy's model (factor 1)."""
    rest_ms: float
    """Its attention, memory-bound work, launches and tensor-parallel all-reduces as convoy plans them."""
    allreduce_ms: float
    """One of its tensor-parallel all-reduces as convoy prices it (all exposed, in the plan of the layer and of the
    published rows alike)."""

    @property
    def planned_ms(self) -> float:
        return self.gemm_ms + self.rest_ms

    @property
    def factor(self) -> float:
        return self.gemm_ms / (self.measured_ms - self.rest_ms)


def _gpt(layers: int) -> ModelSpec:
    return replace(from_numbers(12 * layers * HIDDEN**2 + VOCAB * HIDDEN, layers=layers, hidden=HIDDEN, heads=HEADS,
                                vocab=VOCAB, ffn=4 * HIDDEN), name="GPT 22B")


def _layer_ms(recompute: str, fraction: float) -> tuple[float, float]:
    """(one layer's forward + backward, compute and tensor-parallel all-reduces; those all-reduces alone) on the
    megatron-2021 stack with GEMMs at ``fraction`` of convoy's model: the step of 48 layers less that of 47."""
    stack = replace(STACKS["megatron-2021"], gemm_fraction=fraction)
    run = RunSpec(seq_len=SEQ, micro_batch=MICRO_BATCH, precision="bf16", recompute=recompute)
    layout = Layout(dims=ParallelDims(tp=TP), zero_stage=0, microbatches=1)

    def busy(layers: int) -> tuple[float, float]:
        t = step_time(_gpt(layers), run, layout, A100_NODE, global_batch=MICRO_BATCH, stack=stack)
        return t.compute + t.tp_comm, t.tp_comm

    (whole, tp), (less, tp_less) = busy(LAYERS), busy(LAYERS - 1)
    return (whole - less) * 1e3, (tp - tp_less) * 1e3


def layer_fits() -> list[LayerFit]:
    """Korthikanti et al.'s two measured layers against convoy's plan of them."""
    fits = []
    for recompute, measured in LAYER_MS.items():
        (at_one, tp), (at_half, _) = _layer_ms(recompute, 1.0), _layer_ms(recompute, 0.5)
        gemm = at_half - at_one  # the GEMMs take twice as long at half the rate; nothing else moves
        per = 4 + (2 if recompute == "full" else 0)  # Megatron's all-reduces per layer (convoy.plan.timing)
        fits.append(LayerFit(recompute=recompute, measured_ms=measured, gemm_ms=gemm, rest_ms=at_one - gemm,
                             allreduce_ms=tp / per))
    return fits


def layer_factor(*, one_allreduce_hidden: bool = False) -> float:
    """The factor both measured layers give together: their GEMMs over what the measurement leaves them.
    ``one_allreduce_hidden``: as if one backward all-reduce ran under the weight-gradient GEMM, the overlap the
    paper describes (section 6.2) and convoy does not plan."""
    fits = layer_fits()
    hidden = [f.allreduce_ms if one_allreduce_hidden else 0.0 for f in fits]
    return sum(f.gemm_ms for f in fits) / sum(f.measured_ms - f.rest_ms + h for f, h in zip(fits, hidden))


def cublas_11_ratios() -> dict[int, tuple[float, float]]:
    """m = n = k -> (figure 6's TFLOPs, convoy's model's TFLOPs on the A100)."""
    rates = ModeledRates(A100_NODE.gpu)
    return {n: (tflops, 2 * n**3 / rates.gemm_seconds(n, n, n, "bf16") / 1e12)
            for n, tflops in CUBLAS_11_TFLOPS.items()}


def report() -> str:
    lines = ["| measurement | measured | convoy's model | GEMM factor it gives |", "|---|---|---|---|"]
    for f in layer_fits():
        what = "no recompute" if f.recompute == "none" else "full recompute"
        lines.append(f"| {KORTHIKANTI}: one layer, TP 8, {what} | {f.measured_ms:.1f} ms | {f.planned_ms:.1f} ms "
                     f"(GEMMs {f.gemm_ms:.1f}, the rest {f.rest_ms:.1f}) | {f.factor:.2f} |")
    for n, (measured, modeled) in cublas_11_ratios().items():
        lines.append(f"| {CUDA11_FIGURE}, m = n = k = {n} | {measured} TFLOPs | {modeled:.0f} TFLOPs | "
                     f"{measured / modeled:.2f} |")
    factor = layer_factor()
    stacks = ", ".join(f"`{name}` {STACKS[name].gemm_fraction_on('ampere'):.2f}" for name in MEGATRON_LINEAGE)
    lines.append("")
    allreduce = layer_fits()[0].allreduce_ms
    lines.append(f"The two measured layers together give a GEMM factor of {factor:.2f}; cuBLAS 11.0's GEMMs alone "
                 "reach at least convoy's model at large square shapes. The stacks' factors on the A100: "
                 f"{stacks}. Were one backward all-reduce per layer ({allreduce:.2f} ms as convoy prices it) "
                 "hidden under the weight-gradient GEMM, as the paper says Megatron overlaps it (section 6.2) and "
                 "convoy does not plan, in the layer or in the published rows, the layers would give "
                 f"{layer_factor(one_allreduce_hidden=True):.2f}.")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
