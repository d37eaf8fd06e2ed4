"""The kernels one micro-batch runs: every GEMM of the model at its shape, and the attention's shape.

    from convoy.plan.shapes import gemm_shapes, attention_shape
    for m, k, n, count in gemm_shapes(model, run, tp=2):   # (m, k) @ (k, n), count times per micro-batch
        ...
    batch, heads, kv_heads, seq, head_dim = attention_shape(model, run, tp=2)

What the time model charges (``convoy.plan.timing``) and what a calibration measures (``convoy.plan.speed.measure``)
are the same list, so it lives here, below both.
"""

from __future__ import annotations

from convoy.plan.model import ModelSpec
from convoy.plan.run import RunSpec

__all__ = ["gemm_shapes", "attention_shape"]


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
