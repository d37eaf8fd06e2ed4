"""What PyTorch keeps for backward in one transformer block, tensor by tensor, per precision recipe and family.

    from convoy.plan.activations import block_saved, block_selective, block_bytes
    [(t.what, t.bytes_per_token) for t in block_saved(model, run)]     # one block, one token
    [(t.what, t.bytes_per_token) for t in block_selective(model, run)] # what recompute="selective" keeps
    block_bytes(model, run, tp=1)                                      # x seq_len x micro_batch / tp

Each block is the list of tensors autograd saves when the family's modeling code runs (Hugging Face
``transformers`` for ``gpt2``, ``llama`` (Llama/Mistral/Qwen2/Qwen3) and ``gpt_neox`` (Pythia); Megatron/nanoGPT
blocks, Korthikanti et al. 2022's breakdown, for ``generic``), under one of four regimes (``regime``: ``fp32``,
``autocast``, ``pure16``, ``autocast16``); a tensor saved by several ops is counted once. ``"full"`` recomputation
keeps each block's input only, ``"selective"`` the trainer's per-op save list (``block_selective``). The regimes,
the per-family totals and how they were checked: docs/planner.md, "Memory per GPU".
"""

from __future__ import annotations

from dataclasses import dataclass

from convoy.plan.memo import remembered
from convoy.plan.speedups import compiled_saved_fraction

TYPE_CHECKING = False  # typing is not imported at run time: a plan starts without it
if TYPE_CHECKING:  # memory.py imports this module
    from convoy.plan.model import ModelSpec
    from convoy.plan.run import RunSpec

__all__ = ["Saved", "FAMILIES", "block_saved", "block_selective", "block_bytes", "weight_cast_bytes",
           "head_saved_bytes", "regime", "matmuls_kept", "SAVE_LISTS"]

FAMILIES = ("generic", "gpt2", "llama", "gpt_neox")
#: whose per-op list ``recompute="selective"`` keeps (``block_selective``): convoy's trainer's (every matmul's
#: output), torchtitan's (every other matmul's output; a software stack's, ``convoy.plan.stacks``)
SAVE_LISTS = ("convoy", "torchtitan")
LN_STATS = 8  # LayerNorm's fp32 mean and rstd per token
RMS_STATS = 4  # RMSNorm's fp32 rsqrt per token


@dataclass(frozen=True)
class Saved:
    """One tensor a block keeps for backward."""

    what: str
    bytes_per_token: float
    """Bytes per token (per sequence position of one sequence); s x s tensors give a·s·bytes here."""
    whole: bool = False
    """Kept whole on every tensor-parallel rank (a row-parallel matmul's partial sums), not divided by tp."""


def regime(run: RunSpec) -> str:
    """``"fp32"``, ``"autocast"``, ``"autocast16"`` or ``"pure16"`` for the run's precision recipe."""
    recipe = run.recipe
    if recipe.autocast:
        return "autocast" if recipe.weight_bytes == 4 else "autocast16"
    return "fp32" if recipe.activation_bytes == 4 else "pure16"


def _bytes(run: RunSpec) -> tuple[int, int, bool]:
    """(residual-stream bytes, matmul-activation bytes, fp32 ops of CUDA autocast's list?)."""
    mode = regime(run)
    return (2 if mode in ("pure16", "autocast16") else 4), run.recipe.activation_bytes, mode.startswith("autocast")


def _layer_norm_input(run: RunSpec) -> int:
    """Bytes per element a ``layer_norm`` saves of its input: the residual stream, or under ``autocast16`` the
    fp32 copy autocast makes of the 16-bit stream."""
    res, _, fp32_ops = _bytes(run)
    return 4 if fp32_ops else res


def _casts_matmul_inputs(run: RunSpec) -> bool:
    """A matmul fed by an fp32 tensor saves its own 16-bit cast (fp32 weights under autocast: Llama's RMSNorm
    then returns fp32, and each of q/k/v casts it anew)."""
    return regime(run) == "autocast"


def _dropout(model: ModelSpec, run: RunSpec) -> bool:
    return run.dropout or model.dropout > 0


def _attention(model, run, *, q_bytes: float, k_bytes: float, v_bytes: float, softmax: str) -> list[Saved]:
    """Q, K, V, the core, and the output projection's input. ``softmax``: ``"fp32"`` (HF's
    ``softmax(dtype=float32)``, or CUDA autocast's rule), or ``"native"`` (in the activation dtype)."""
    s, a = run.seq_len, model.heads
    h, lo = model.hidden, run.recipe.activation_bytes
    drop = _dropout(model, run)
    out = [Saved("q", q_bytes), Saved("k", k_bytes), Saved("v", v_bytes)]
    if run.attention == "flash":  # SDPA's fused kernels: q, k, v, out, fp32 logsumexp; dropout via RNG state
        out += [Saved("attention output (= out-proj input)", lo * h), Saved("logsumexp", 4 * a)]
        return out
    probs = 4 if softmax == "fp32" else lo
    out.append(Saved("softmax output", probs * a * s))
    if drop:
        out += [Saved("attention dropout mask", 1 * a * s), Saved("attention dropout output", lo * a * s)]
    elif probs != lo:  # the 16-bit cast the AV matmul takes
        out.append(Saved("softmax output, 16-bit cast", lo * a * s))
    out.append(Saved("out-proj input", lo * h))
    return out


def _generic(model, run) -> list[Saved]:
    """Megatron / nanoGPT block: LayerNorm, fused QKV, attention, out-proj, LayerNorm, GELU (or SwiGLU) MLP."""
    h, f, r = model.hidden, model.ffn or 4 * model.hidden, _kv_frac(model)
    _, lo, cast = _bytes(run)
    ln = _layer_norm_input(run)
    drop = _dropout(model, run)
    out = [Saved("norm 1 input", ln * h), Saved("qkv input", lo * h)]
    out += _attention(model, run, q_bytes=lo * h, k_bytes=lo * h * r, v_bytes=lo * h * r,
                      softmax="fp32" if cast else "native")
    if drop:
        out.append(Saved("attention residual dropout mask", 1 * h))
    out += [Saved("norm 2 input", ln * h), Saved("mlp input", lo * h)]
    if model.gated_mlp:
        out += [Saved("gate output", lo * f), Saved("up output", lo * f), Saved("silu output", lo * f),
                Saved("down-proj input", lo * f)]
    else:
        out += [Saved("gelu input", lo * f), Saved("down-proj input", lo * f)]
    if drop:
        out.append(Saved("mlp dropout mask", 1 * h))
    return out


def _gpt2(model, run) -> list[Saved]:
    """transformers' GPT2Block: LayerNorm, Conv1D (addmm) c_attn, attention, c_proj, LayerNorm, gelu_new MLP."""
    h, f = model.hidden, model.ffn or 4 * model.hidden
    _, lo, cast = _bytes(run)
    ln = _layer_norm_input(run)
    drop = _dropout(model, run)
    out = [Saved("ln_1 input", ln * h), Saved("ln_1 mean/rstd", LN_STATS), Saved("c_attn input", lo * h),
           Saved("qkv (c_attn output; q, k, v are views)", 3 * lo * h)]
    core = _attention(model, run, q_bytes=0, k_bytes=0, v_bytes=0,
                      softmax="fp32" if cast else "native")
    out += [c for c in core if c.bytes_per_token]
    if drop:
        out.append(Saved("resid_dropout mask (attention)", 1 * h))
    out += [Saved("ln_2 input", ln * h), Saved("ln_2 mean/rstd", LN_STATS), Saved("c_fc input", lo * h)]
    if model.activation == "gelu_new":  # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * pow(x, 3))))
        wide = 4 if cast else lo  # pow runs in fp32 under CUDA autocast, and promotes what follows
        out += [Saved("pow input (c_fc output" + (", fp32 cast)" if cast else ")"), wide * f),
                Saved("tanh output", wide * f), Saved("0.5 * x", lo * f), Saved("1 + tanh", wide * f),
                Saved("c_proj input" + (" (16-bit cast of the fp32 product)" if cast else ""), lo * f)]
    else:  # fused F.gelu: its input and output
        out += [Saved("gelu input", lo * f), Saved("c_proj input", lo * f)]
    if drop:
        out.append(Saved("resid_dropout mask (mlp)", 1 * h))
    return out


def _rms_norm(name: str, res: int, h: int) -> list[Saved]:
    """LlamaRMSNorm: x.to(fp32) (kept by pow and mul), the normalised x in the input dtype (kept by weight *)."""
    return [Saved(f"{name} input as fp32", 4 * h), Saved(f"{name} normalised (input dtype)", res * h),
            Saved(f"{name} rsqrt", RMS_STATS)]


def _llama(model, run) -> list[Saved]:
    """transformers' LlamaDecoderLayer (Mistral, Qwen2/3 alike): RMSNorm, q/k/v/o, rotary, SDPA or eager, SwiGLU."""
    h, f, r = model.hidden, model.ffn or 4 * model.hidden, _kv_frac(model)
    res, lo, _ = _bytes(run)
    cast = _casts_matmul_inputs(run)
    casts = 3 if cast else 1  # autocast casts the (fp32) normed input once per projection
    out = _rms_norm("input_layernorm", res, h) + [Saved(f"q/k/v input ({casts}x)", casts * lo * h)]
    if run.attention == "flash":
        kq, kk = lo * h, lo * h * r
    else:  # eager: repeat_kv copies K and V to every head before the matmuls
        kq, kk = lo * h, lo * h
    out += _attention(model, run, q_bytes=kq, k_bytes=kk, v_bytes=kk, softmax="fp32")
    out += _rms_norm("post_attention_layernorm", res, h)
    out += [Saved(f"gate/up input ({2 if cast else 1}x)", (2 if cast else 1) * lo * h),
            Saved("gate output", lo * f), Saved("silu output", lo * f), Saved("up output", lo * f),
            Saved("down_proj input", lo * f)]
    return out


def _gpt_neox(model, run) -> list[Saved]:
    """transformers' GPTNeoXLayer (Pythia): LayerNorms, fused QKV, partial rotary, parallel residual, GELU."""
    h, f = model.hidden, model.ffn or 4 * model.hidden
    res, lo, _ = _bytes(run)
    ln = _layer_norm_input(run)
    drop = _dropout(model, run)
    # with a parallel residual both norms read the same stream: one saved tensor, unless autocast casts it
    # for each of them (autocast16)
    copies = 2 if model.parallel_residual and ln != res else 1
    out = [Saved(f"input_layernorm input{' (x2: a cast per norm)' if copies == 2 else ''}", copies * ln * h),
           Saved("layernorm mean/rstd (x2)", 2 * LN_STATS),
           Saved("query_key_value input", lo * h)]
    if run.attention == "flash":  # SDPA keeps v, a view of the whole qkv output
        out.append(Saved("qkv output (v is a view)", 3 * lo * h))
    # q and k are new tensors (rotary + cat); eager's matmul copies the strided v view
    out += _attention(model, run, q_bytes=lo * h, k_bytes=lo * h, v_bytes=0 if run.attention == "flash" else lo * h,
                      softmax="fp32")
    if not model.parallel_residual:
        out.append(Saved("post_attention_layernorm input", ln * h))
    out += [Saved("dense_h_to_4h input", lo * h), Saved("gelu input", lo * f), Saved("dense_4h_to_h input", lo * f)]
    if drop:
        out.append(Saved("hidden dropout masks (x2)", 2 * h))
    return [x for x in out if x.bytes_per_token]


_BUILDERS = {"generic": _generic, "gpt2": _gpt2, "llama": _llama, "gpt_neox": _gpt_neox}


def _kv_frac(model) -> float:
    return (model.kv_heads or model.heads) / model.heads


@remembered
def block_saved(model: ModelSpec, run: RunSpec) -> tuple[Saved, ...]:
    """The tensors one block keeps for backward (no recomputation), per token."""
    return tuple(_BUILDERS[model.family if model.family in _BUILDERS else "generic"](model, run))


@remembered
def block_selective(model: ModelSpec, run: RunSpec, *, tp: int = 1, save_list: str = "convoy") -> tuple[Saved, ...]:
    """The tensors one block keeps under ``recompute="selective"``, per token: the trainer's save list
    (``convoy.train.parallel.recompute.SELECTIVE_SAVES``), or another stack's (``save_list``, ``SAVE_LISTS``:
    torchtitan's keeps every other matmul's output, ``matmuls_kept``). The block's input (the checkpoint keeps it),
    every kept block GEMM's output (``gemm_shapes``; a row-parallel one's partial sums whole on each tp rank), the
    attention kernel's outputs (fused: its output and fp32 logsumexp; eager: the AV product, the s x s scores being
    recomputed), and with ``tp`` > 1 the reduced output of each row-parallel matmul."""
    from convoy.plan.shapes import gemm_shapes

    assert model.num_layers is not None and model.heads is not None and model.hidden is not None
    res, lo, _ = _bytes(run)
    h, a = model.hidden, model.heads
    out = [Saved("block input (kept by the checkpoint)", res * h)]
    # the same GEMMs in the same order at tp=2: those whose k is split are row-parallel (out- and down-projection)
    kept_counts = matmuls_kept(model, run, save_list)
    for (_, k, n, count), (_, k2, _, _), (kept, _) in zip(gemm_shapes(model, run), gemm_shapes(model, run, tp=2),
                                                           kept_counts):
        if count == 1 or not kept:  # the output head, outside the blocks; a matmul the save list recomputes
            continue
        per = f" (x{kept})" if kept > 1 else ""
        out.append(Saved(f"matmul output {k} -> {n}{per}", lo * n * kept, whole=tp > 1 and k2 != k))
    if run.attention == "flash":
        out += [Saved("attention output", lo * h), Saved("logsumexp", 4 * a)]
    else:  # the s x s scores are recomputed from the kept q and k, as Korthikanti et al. recompute the core
        out.append(Saved("attention output (AV)", lo * h))
    if tp > 1:  # the all-reduce (reduce-scatter with sequence parallelism) after the out- and down-projection
        out.append(Saved("reduced row-parallel outputs (x2)", 2 * lo * h))
    return tuple(out)


@remembered
def matmuls_kept(model: ModelSpec, run: RunSpec, save_list: str = "convoy") -> tuple[tuple[int, int], ...]:
    """(outputs kept, matmuls) per block for each GEMM of ``convoy.plan.shapes.gemm_shapes`` in its order (the block's
    call order: q, k, v, o, gate, up, down), under ``recompute="selective"`` with ``save_list``: convoy's keeps every
    matmul's output; torchtitan's every other one, counting the block's matmuls from 1 and keeping the odd ones (its
    policy recomputes ``mm`` when the count is even: Llama's k, o and up projections). The head is not in a block:
    (0, 1)."""
    from convoy.plan.shapes import gemm_shapes

    L = model.num_layers or 0  # callers pass a model with a shape
    out, index = [], 0
    for _, _, _, count in gemm_shapes(model, run):
        if count == 1:
            out.append((0, 1))
            continue
        per = count // L
        if save_list == "torchtitan":
            kept = sum(1 for i in range(index + 1, index + per + 1) if i % 2 == 1)
        else:
            kept = per
        index += per
        out.append((kept, per))
    return tuple(out)


@remembered
def block_bytes(model: ModelSpec, run: RunSpec, *, tp: int = 1, stored_only: bool = True, save_list: str = "convoy"
                ) -> float:
    """Bytes one block keeps for backward at ``run``'s s x b, divided by ``tp`` (tensor + sequence parallel).

    ``recompute="full"``: only the block's input (the residual stream); ``"selective"``: ``block_selective`` with
    ``save_list``;
    ``stored_only=False``: the full set (what a block holds while it is recomputed). Compiled (``run.compile``),
    a block keeps ``convoy.plan.speedups.compiled_saved_fraction`` of that.
    """
    s, b = run.seq_len, run.micro_batch
    recompute = run.recompute if stored_only else "none"
    # what a compiled block keeps of the eager block's
    compiled = compiled_saved_fraction(run, recompute) if run.compile != "none" else 1.0
    if recompute == "full":
        res, _, _ = _bytes(run)
        return compiled * res * s * b * int(model.hidden) / tp  # type: ignore[arg-type]  # a model with a shape
    saved = block_selective(model, run, tp=tp, save_list=save_list) if recompute == "selective" else \
        block_saved(model, run)
    return compiled * sum(x.bytes_per_token * (1 if x.whole else 1 / tp) for x in saved) * s * b


def weight_cast_bytes(model: ModelSpec, run: RunSpec, *, layers: int, tp: int = 1, head: bool = True) -> float:
    """The 16-bit weight copies autocast makes (one per weight, cached for the autocast region and saved by
    every matmul's backward): 2 bytes per block parameter, plus the output head. 0 outside autocast."""
    if regime(run) != "autocast" or model.layer_params is None:
        return 0.0
    head_params = (model.vocab or 0) * (model.hidden or 0) if head else 0
    return run.recipe.activation_bytes * (layers * model.layer_params + head_params) / tp


def head_saved_bytes(model: ModelSpec, run: RunSpec, *, tp: int = 1) -> float:
    """The final norm's and the output head's saved inputs, plus the loss's fp32 log-softmax (s·b·V·4)."""
    s, b, h = run.seq_len, run.micro_batch, int(model.hidden)  # type: ignore[arg-type]  # a model with a shape
    res, lo, _ = _bytes(run)
    norm = (4 + res) * h if model.family == "llama" else _layer_norm_input(run) * h
    extra = 0.0 if model.family == "generic" else (norm + lo * h) * s * b  # generic: Korthikanti's 4sbV only
    return extra / tp + 4 * s * b * (model.vocab or 0) / tp
