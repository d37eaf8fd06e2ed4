"""What the planner knows about a model: parameter counts and the transformer shape that sets activations.

    from convoy.plan.model import ModelSpec, from_hf_config, from_factory, from_numbers
    m = from_hf_config("Llama-2-7b/config.json")    # read as JSON, closed form per architecture; 6,738,415,616
    m = from_factory("mypkg.models:build")           # built on the meta device (imports torch)
    m = from_numbers(7.5e9, layers=32, hidden=4096, heads=32, vocab=32000)

A ``config.json`` is read as plain JSON, never downloaded; the Llama family (llama, mistral, qwen2, qwen3) and gpt2
have a closed form here, any other ``model_type`` is built on the meta device when ``transformers`` is installed,
else refused with ``NotSupportedYetError``. Every value is checked (whole numbers > 0, heads that divide, at most
``MAX_PARAMS`` parameters and ``MAX_DIM`` in any dimension, a parameter count the given shape can hold:
``check_params_fit_shape``); a bad one is one ``PlanError`` naming the file and key, or the factory and its error.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import math
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from convoy.errors import NotSupportedYetError, PlanError, shown
from convoy.plan.memo import hashed_once
from convoy.plan.units import format_count
from convoy.reading import MODEL_CONFIG, is_pathlib_path, load_json

TYPE_CHECKING = False  # typing is not imported at run time: a plan starts without it
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

__all__ = ["derive_shape", "ModelSpec", "from_hf_config", "from_factory", "from_numbers", "resolve_model",
           "MAX_PARAMS", "MAX_DIM", "shape_param_range", "check_params_fit_shape", "check_heads_divide_hidden",
           "SHAPE_SLACK", "SHAPE_HEADROOM"]

_LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")
_DROPOUT_KEYS = ("attn_pdrop", "resid_pdrop", "embd_pdrop", "attention_dropout", "hidden_dropout", "dropout")
#: no model is planned past this many parameters (a quadrillion; the largest trained today are ~2e12).
MAX_PARAMS = 10**15
#: nor past this size in any one dimension (layers, hidden, heads, vocabulary, ...).
MAX_DIM = 2**31
#: how far a given parameter count may lie below the range its shape holds (``shape_param_range``): half, for
#: blocks lighter than a transformer's (Mamba-2.8B's shape as a transformer holds 1.25x its count).
SHAPE_SLACK = 2.0
#: how far above: mixture-of-experts models hold their experts beyond the dense shape the step is timed by
#: (Mixtral 8x7B 5x, DeepSeek-V3 10x), encoder-decoders a second stack; 64x more is no model of that shape.
SHAPE_HEADROOM = 64.0


@hashed_once
@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A model as the planner sees it. Shape fields are None when unknown (then activations cannot be estimated)."""

    name: str
    """What the user called it (a path, a factory, or "7.5e9 params")."""
    num_params: int
    """Total parameters."""
    num_layers: int | None = None
    """Transformer blocks (the unit pipeline stages and FSDP wrap)."""
    hidden: int | None = None
    """Hidden size h."""
    heads: int | None = None
    """Attention heads a (tensor parallelism must divide them)."""
    kv_heads: int | None = None
    """Key/value heads (grouped-query attention); None means = heads."""
    ffn: int | None = None
    """MLP inner size (4h for GPT; SwiGLU models differ)."""
    vocab: int | None = None
    """Vocabulary size V."""
    layer_params: int | None = None
    """Parameters of one block: the largest unit FSDP gathers and a GPU must hold for tp=1."""
    gated_mlp: bool = False
    """True for SwiGLU-style MLPs (three matrices), False for GELU (two)."""
    family: str = "generic"
    """Block layout for activations (``convoy.plan.activations``): gpt2, llama, gpt_neox, or generic."""
    activation: str = "gelu"
    """MLP activation as config.json names it (``gelu_new`` is GPT-2's unfused tanh GELU)."""
    dropout: float = 0.0
    """The config's largest dropout probability (masks cost memory when > 0 in training)."""
    parallel_residual: bool = False
    """GPT-NeoX's attention and MLP reading the same input (one norm input kept instead of two)."""
    max_positions: int | None = None
    """The longest sequence the model takes (config.json's ``n_positions``/``max_position_embeddings``, a
    module's position embedding); None when unknown."""
    source: str = ""
    """How these numbers were obtained."""

    def __post_init__(self) -> None:
        n = self.num_params
        if isinstance(n, bool) or not isinstance(n, int) or not 0 < n <= MAX_PARAMS:
            raise PlanError(f"model {self.name!r}: parameter count must be a whole number from 1 to {MAX_PARAMS:.0e}, "
                            f"got {_show(n)}")
        for field in ("num_layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "layer_params", "max_positions"):
            value = getattr(self, field)
            limit = MAX_PARAMS if field == "layer_params" else MAX_DIM
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= limit):
                raise PlanError(f"model {self.name!r}: {field} must be a whole number from 1 to {limit}, "
                                f"got {_show(value)}")
        if self.kv_heads is not None and self.heads is not None and self.heads % self.kv_heads:
            raise PlanError(f"model {self.name!r}: {self.kv_heads} key/value heads do not divide the {self.heads} "
                            f"attention heads; grouped-query attention needs kv_heads dividing heads "
                            f"(kv_heads <= heads)")

    @property
    def has_shape(self) -> bool:
        """True when layers, hidden and heads are known (activations can be computed)."""
        return self.num_layers is not None and self.hidden is not None and self.heads is not None

    @property
    def largest_unit_params(self) -> int:
        """Parameters of the largest piece a GPU holds whole: a block, or the embedding when it is bigger."""
        embed = (self.vocab or 0) * (self.hidden or 0)
        return max(self.layer_params or self.num_params, embed)

    @property
    def non_layer_params(self) -> int:
        """Embeddings, output head and final norm: what is left outside the blocks."""
        if self.layer_params is None or self.num_layers is None:
            return 0
        return max(0, self.num_params - self.layer_params * self.num_layers)


def param_count(params: Any) -> int:
    """``params`` (an int or float such as ``7.5e9``) as a whole number of parameters, or ``PlanError``: a
    string, a bool, nan, inf, a count below 1 or above ``MAX_PARAMS`` is refused."""
    if isinstance(params, bool) or not isinstance(params, (int, float)):
        raise PlanError(f"params={_show(params)} is a {type(params).__name__}; give a number of parameters such as "
                        f"7.5e9")
    if isinstance(params, float) and not math.isfinite(params) or not 1 <= params <= MAX_PARAMS:
        raise PlanError(f"params={_show(params)}: give a positive, finite number of parameters up to "
                        f"{MAX_PARAMS:.0e} (e.g. 7.5e9)")
    return int(round(params))


#: a value in an error message (``convoy.errors.shown``)
_show = functools.partial(shown, huge="<a number too large>")


def from_numbers(params: float, *, layers: int | None = None, hidden: int | None = None, heads: int | None = None,
                 vocab: int | None = None, ffn: int | None = None, kv_heads: int | None = None,
                 name: str | None = None) -> ModelSpec:
    """A model from bare numbers (``--params 7.5e9 --layers 32 ...``)."""
    n = param_count(params)
    for key, value in (("layers", layers), ("hidden", hidden), ("heads", heads), ("vocab", vocab), ("ffn", ffn),
                       ("kv_heads", kv_heads)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_DIM):
            raise PlanError(f"{key}={_show(value)}: give a whole number from 1 to {MAX_DIM}")
    layer_params = None
    if layers:
        outside = (vocab or 0) * (hidden or 0)
        layer_params = max(1, (n - outside) // layers)
    spec = ModelSpec(name=name or f"{format_count(n)} params", num_params=n, num_layers=layers, hidden=hidden,
                     heads=heads,
                     kv_heads=kv_heads, ffn=ffn or (4 * hidden if hidden else None), vocab=vocab,
                     layer_params=layer_params, source="numbers given by the user")
    given = {"params": params, "layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads,
             "ffn": ffn, "vocab": vocab}
    check_heads_divide_hidden(spec, given=given)
    check_params_fit_shape(spec, given={k: v for k, v in given.items() if v is not None})
    return spec


#: the shape a bare parameter count is planned with: Llama-2's block (SwiGLU MLP of 8h/3 rounded up to a
#: multiple of 256, heads of 128 dimensions, untied 32,000-word embeddings) at GPT-3's and Llama-2's aspect ratio,
#: hidden = 128 x layers (Brown et al. 2020 table 2.1: 6.7B 4096/32, 13B 5140/40, 175B 12288/96; Touvron et al.
#: 2023: 7B 4096/32, 13B 5120/40). Kaplan et al. 2020 (figure 5) find the loss insensitive to the ratio over
#: 20-200, so the count, not the ratio, is what a plan rests on; the output says the shape was derived.
DERIVED_VOCAB = 32000
DERIVED_HEAD_DIM = 128
DERIVED_ASPECT = 128


def derive_shape(params: float, *, layers: int | None = None, hidden: int | None = None, heads: int | None = None,
                 vocab: int | None = None, ffn: int | None = None, kv_heads: int | None = None,
                 name: str | None = None) -> ModelSpec:
    """A model of ``params`` parameters whose missing shape numbers are derived (``DERIVED_*``), so that its
    activations, FSDP units and tensor-parallel splits can be planned; numbers given are kept.

        derive_shape(7e9)       # 32 layers, hidden 4096, 32 heads, ffn 11008, vocab 32000 (Llama-2-7B's shape)
    """
    n = param_count(params)
    given = {"params": params, "layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads,
             "ffn": ffn, "vocab": vocab}
    for key, value in (("layers", layers), ("hidden", hidden), ("heads", heads), ("vocab", vocab), ("ffn", ffn),
                       ("kv_heads", kv_heads)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_DIM):
            raise PlanError(f"{key}={_show(value)}: give a whole number from 1 to {MAX_DIM}")
    v = DERIVED_VOCAB if vocab is None else vocab

    def block(h: int) -> int:  # q, k, v, o and a SwiGLU MLP; norms are noise
        return 4 * h * h + 3 * h * (ffn or _swiglu(h))

    def blocks_for(h: int, embed: int) -> int:
        return max(1, round((n - embed * h) / block(h))) if layers is None else layers

    def step(h: int) -> int:  # the hidden sizes models use: 128 apart below 1024, then 1/4 to 1/8 of the size
        return max(DERIVED_HEAD_DIM, 1 << max(0, h.bit_length() - 3))

    if hidden is None:  # the size whose model at the aspect ratio comes closest to n
        def at_aspect(h: int) -> int:
            return (layers or max(1, h // DERIVED_ASPECT)) * block(h) + 2 * v * h

        sizes = [DERIVED_HEAD_DIM]
        while sizes[-1] < MAX_DIM // 2 and at_aspect(sizes[-1]) < n:
            sizes.append(sizes[-1] + step(sizes[-1]))
        hidden = min(sizes[-2:], key=lambda h: abs(math.log(at_aspect(h) / n)))
    embed = 2 * v if vocab is not None or 2 * v * hidden < n / 2 else 0
    if embed == 0 and vocab is None:  # a count too small for a 32,000-word vocabulary: blocks only
        v = 0
    layers = blocks_for(hidden, embed)
    heads = heads or max(1, hidden // DERIVED_HEAD_DIM if hidden % DERIVED_HEAD_DIM == 0 else
                         max(d for d in range(1, min(hidden, 64) + 1) if hidden % d == 0))
    ffn = ffn or _swiglu(hidden)
    derived = f"layers {layers}, hidden {hidden}, heads {heads}, ffn {ffn}"
    outside = embed * hidden
    spec = ModelSpec(name=name or f"{format_count(n)} params", num_params=n, num_layers=layers, hidden=hidden,
                     heads=heads,
                     kv_heads=kv_heads, ffn=ffn, vocab=v or None, layer_params=max(1, (n - outside) // layers),
                     gated_mlp=True, family="llama",
                     source=f"shape derived from the parameter count ({derived}{f', vocab {v}' if v else ''}: "
                            "Llama-2-style blocks; hidden the size nearest 128 x layers, then as many layers as the "
                            "count takes); give --layers/--hidden/--heads or a "
                            "config.json for the real one")
    check_heads_divide_hidden(spec, given=given)
    check_params_fit_shape(spec, given={k: val for k, val in given.items() if val is not None})
    return spec


def _swiglu(h: int) -> int:
    """Llama's SwiGLU width for hidden ``h``: 8h/3 rounded up to a multiple of 256 (4096 -> 11008)."""
    return -(-(8 * h // 3) // 256) * 256


def check_heads_divide_hidden(spec: ModelSpec, *, given: Mapping[str, Any], base: str = "") -> None:
    """``PlanError`` when heads given as numbers (``--heads``, ``--hidden``, alone or over a config) do not divide
    the hidden size: the rule a config.json without ``head_dim`` is held to (``hidden_size 4096 is not a multiple
    of num_attention_heads 7``); a tensor-parallel degree divides the heads, so such a shape silently lost every
    tp layout. Numbers carry no head_dim, so the rule always applies to them."""
    h, heads = spec.hidden, spec.heads
    if not (h and heads) or h % heads == 0 or not any(given.get(k) is not None for k in ("hidden", "heads")):
        return

    def said(key: str, value: int) -> str:
        return f"--{key} {value}" if given.get(key) is not None else f"{key} {value} (of {base})"

    if given.get("heads") is not None:
        divisors = {n for d in range(1, math.isqrt(h) + 1) if h % d == 0 for n in (d, h // d)}  # sqrt(h) steps
        near = min(divisors, key=lambda d: (abs(d - heads), -d))
        fix = f"give --heads dividing {h}, such as {near}"
    else:
        fix = f"give --hidden a multiple of {heads}, such as {max(1, round(h / heads)) * heads}"
    raise PlanError(f"{said('hidden', h)} is not a multiple of {said('heads', heads)}: attention cuts the hidden "
                    f"size into equal heads (a config.json's hidden_size and num_attention_heads too); {fix}")


def shape_param_range(spec: ModelSpec) -> tuple[int, int | None] | None:
    """The fewest and the most parameters a transformer of ``spec``'s shape holds (before ``SHAPE_SLACK`` and
    ``SHAPE_HEADROOM``), as the planner reads the shape; None without a hidden size, and no upper end without the
    number of blocks or the vocabulary (an embedding table of unknown size can hold any count).

    A block holds at least its q and o projections (2h²), k and v (2h·kv, kv = h·kv_heads/heads; at least one
    head when kv_heads is not given) and a two-matrix MLP (2h·f, f = ffn, else the 4h the planner assumes), at
    most that with a gated MLP (3h·f), every bias and its norms. Embeddings: at least one V·h table, at most an
    untied pair and a final norm."""
    h = spec.hidden
    if h is None:
        return None
    f, vocab, layers = spec.ffn or 4 * h, spec.vocab or 0, spec.num_layers
    if spec.heads and spec.kv_heads:
        kv_low = kv_high = h * spec.kv_heads // spec.heads
    else:
        kv_low, kv_high = (h // spec.heads if spec.heads else 0), h
    low = vocab * h
    if layers is None:
        return low, None
    block_low = 2 * h * h + 2 * h * kv_low + 2 * h * f
    block_high = 2 * h * h + 2 * h * kv_high + 3 * h * f + (2 * h + 2 * kv_high) + (2 * f + h) + 4 * h
    high = layers * block_high + 2 * vocab * h + 2 * h if vocab else None
    return low + layers * block_low, high


def check_params_fit_shape(spec: ModelSpec, *, given: Mapping[str, Any], base: str = "") -> None:
    """``PlanError`` when ``spec.num_params`` cannot be a model of ``spec``'s shape (``shape_param_range``,
    widened by ``SHAPE_SLACK`` below and ``SHAPE_HEADROOM`` above). ``given``: the numbers the user gave (keyword ->
    value), named in the message as the command line spells them; ``base``: the config or factory the rest of the
    shape came from."""
    bounds = shape_param_range(spec)
    if bounds is None:
        return
    assert spec.hidden is not None  # shape_param_range gives bounds only with a hidden size
    low, high = bounds[0] / SHAPE_SLACK, None if bounds[1] is None else bounds[1] * SHAPE_HEADROOM
    n = spec.num_params
    if low <= n and (high is None or n <= high):
        return
    flags = " ".join(f"--{k.replace('_', '-')} " + (f"{v:.3g}" if k == "params" else f"{v}") for k, v in given.items())
    assumed = " (4 x hidden, assumed)" if "ffn" not in given and not base and spec.ffn == 4 * spec.hidden else ""
    shape = ", ".join(f"{k} {v}" + (assumed if k == "ffn" else "")
                      for k, v in (("layers", spec.num_layers), ("hidden", spec.hidden), ("heads", spec.heads),
                                   ("kv_heads", spec.kv_heads), ("ffn", spec.ffn), ("vocab", spec.vocab))
                      if v is not None)
    holds = f"{low:.3g} to {high:.3g}" if high is not None else f"at least {low:.3g}"
    if "params" in given:
        fix = f"give --params in that range, or the shape of a {n:.3g}-parameter model"
        if not base:
            fix += " (--ffn when its MLP is not 4 x hidden, --vocab for its embeddings)"
        count = f"{n:.3g}"
    else:
        changed = "/".join(f"--{k.replace('_', '-')}" for k in given)
        fix, count = f"give --params with {changed}, or leave {changed} out", f"the {n:.3g} of {base}"
    where = f" over {base}" if base else ""
    raise PlanError(f"{flags}{where} cannot describe one model: {shape} holds {holds} parameters, not {count}; {fix}")


def from_hf_config(path: str | Path | Mapping[str, Any]) -> ModelSpec:
    """A model from a Hugging Face ``config.json`` (a path, a directory holding one, or the parsed dict)."""
    if isinstance(path, Mapping):
        config, name = dict(path), str(path.get("_name_or_path") or path.get("model_type") or "config")
    else:
        from pathlib import Path  # only a config file needs it: a plan by numbers starts without it

        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        try:
            config = load_json(p, MODEL_CONFIG)  # bounded (convoy.reading): a FIFO or /dev/zero is one line
        except FileNotFoundError:
            raise PlanError(f"model config {str(p)!r} does not exist; give a config.json path, "
                            "a module:function factory, or --params") from None
        if not isinstance(config, dict):
            raise PlanError(f"model config {str(p)!r} is not a JSON object")
        name = str(p)
    if config.get("num_local_experts") or config.get("num_experts") or config.get("n_routed_experts"):
        raise NotSupportedYetError(f"{name}: mixture-of-experts configs are not planned yet; "
                                   "give --params with the dense-equivalent shape instead")
    model_type = config.get("model_type", "")
    if not isinstance(model_type, str):
        raise PlanError(f"{name}: model_type must be a string such as 'llama', got {_show(model_type)}")
    if model_type in _LLAMA_FAMILY:
        return _llama_family(_Config(config, name, model_type), name)
    if model_type == "gpt2":
        return _gpt2(_Config(config, name, model_type), name)
    if model_type == "gpt_neox":
        return _gpt_neox(_Config(config, name, model_type), name)
    if importlib.util.find_spec("transformers") is not None:
        return _transformers_meta(config, name)
    raise NotSupportedYetError(
        f"{name}: model_type {model_type!r} has no closed form yet (have: {', '.join(_LLAMA_FAMILY)}, gpt2, gpt_neox) "
        "and transformers is not installed to build it on the meta device; give --params/--layers/--hidden/--heads")


class _Config:
    """A config.json's values, read as the closed forms need them: positive whole numbers, one PlanError each."""

    def __init__(self, data: Mapping[str, Any], name: str, model_type: str) -> None:
        self.data, self.name, self.model_type = data, name, model_type

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def size(self, key: str, default: Any = ..., *, null_is_default: bool = False) -> Any:
        """``key`` as a whole number > 0; ``default`` when missing (or null, with ``null_is_default``)."""
        if key not in self.data or (self.data[key] is None and null_is_default):
            if default is ...:
                raise PlanError(f"{self.name}: config.json of model_type {self.model_type!r} lacks {key!r}")
            return default
        value = self.data[key]
        if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_DIM:
            raise PlanError(f"{self.name}: {key} must be a whole number from 1 to {MAX_DIM}, got {_show(value)}")
        return value


def _llama_family(c: _Config, name: str) -> ModelSpec:
    h, f = c.size("hidden_size"), c.size("intermediate_size")
    layers, heads = c.size("num_hidden_layers"), c.size("num_attention_heads")
    kv = c.size("num_key_value_heads", heads, null_is_default=True)
    hd = c.size("head_dim", None, null_is_default=True)
    if hd is None:
        if h % heads:
            raise PlanError(f"{name}: hidden_size {h} is not a multiple of num_attention_heads {heads} and no "
                            f"head_dim is given")
        hd = h // heads
    if heads % kv:
        raise PlanError(f"{name}: num_key_value_heads {kv} does not divide num_attention_heads {heads}")
    vocab = c.size("vocab_size")
    qkv_bias = c["model_type"] == "qwen2" or bool(c.get("attention_bias", False))
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    if qkv_bias:
        attn += heads * hd + 2 * kv * hd
    if c.get("attention_bias", False):
        attn += h  # o_proj bias
    if c["model_type"] == "qwen3":
        attn += 2 * hd  # q_norm and k_norm (RMSNorm over head_dim)
    mlp = 3 * h * f + (2 * f + h if c.get("mlp_bias", False) else 0)
    layer = attn + mlp + 2 * h  # two RMSNorms
    tied = bool(c.get("tie_word_embeddings", False))
    total = layers * layer + vocab * h * (1 if tied else 2) + h
    return ModelSpec(name=name, num_params=total, num_layers=layers, hidden=h, heads=heads, kv_heads=kv, ffn=f,
                     vocab=vocab, layer_params=layer, gated_mlp=True, family="llama",
                     max_positions=c.size("max_position_embeddings", None, null_is_default=True),
                     activation=str(c.get("hidden_act", "silu")), dropout=_config_dropout(c),
                     source=f"config.json, closed form for {c['model_type']} (Llama-style blocks)")


def _gpt2(c: _Config, name: str) -> ModelSpec:
    h, layers, heads, vocab = c.size("n_embd"), c.size("n_layer"), c.size("n_head"), c.size("vocab_size")
    if h % heads:
        raise PlanError(f"{name}: n_embd {h} is not a multiple of n_head {heads}")
    f = c.size("n_inner", 4 * h, null_is_default=True)
    layer = (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h) + 4 * h  # attn, proj, mlp, 2 LayerNorms
    positions = c.size("n_positions", 1024)
    total = layers * layer + vocab * h + positions * h + 2 * h  # tied head, final LayerNorm
    return ModelSpec(name=name, num_params=total, num_layers=layers, hidden=h, heads=heads, ffn=f, vocab=vocab,
                     layer_params=layer, family="gpt2", max_positions=positions,
                     activation=str(c.get("activation_function", "gelu_new")),
                     dropout=_config_dropout(c, default=0.1), source="config.json, closed form for gpt2")


def _gpt_neox(c: _Config, name: str) -> ModelSpec:
    """GPT-NeoX / Pythia: fused QKV with biases, two LayerNorms, GELU MLP, untied embed_out (unless tied)."""
    h, layers = c.size("hidden_size"), c.size("num_hidden_layers")
    heads, vocab = c.size("num_attention_heads"), c.size("vocab_size")
    if h % heads:
        raise PlanError(f"{name}: hidden_size {h} is not a multiple of num_attention_heads {heads}")
    f = c.size("intermediate_size", 4 * h, null_is_default=True)
    layer = (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h) + 4 * h
    tied = bool(c.get("tie_word_embeddings", False))
    total = layers * layer + vocab * h * (1 if tied else 2) + 2 * h
    return ModelSpec(name=name, num_params=total, num_layers=layers, hidden=h, heads=heads, ffn=f, vocab=vocab,
                     layer_params=layer, family="gpt_neox", activation=str(c.get("hidden_act", "gelu")),
                     max_positions=c.size("max_position_embeddings", None, null_is_default=True),
                     dropout=_config_dropout(c), parallel_residual=bool(c.get("use_parallel_residual", True)),
                     source="config.json, closed form for gpt_neox")


def _config_dropout(c: Any, default: float = 0.0) -> float:
    """The largest dropout probability a config sets (``default`` for GPT-2's keys when absent: 0.1)."""
    gpt2_keys = ("attn_pdrop", "resid_pdrop", "embd_pdrop")
    values = [c.get(k, default if k in gpt2_keys else 0.0) for k in _DROPOUT_KEYS]
    return max((float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)), default=0.0)


def _transformers_meta(config: Mapping[str, Any], name: str) -> ModelSpec:
    """Any other ``model_type`` transformers knows, built as a causal LM on the meta device (nothing allocated).
    What transformers refuses (a model_type it does not know, a field it cannot take) is one ``PlanError``."""
    model_type = config.get("model_type", "")
    try:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError as err:  # transformers is there, but it or torch does not import
        raise NotSupportedYetError(f"{name}: model_type {model_type!r} has no closed form yet, and transformers "
                                   f"cannot be imported to build it ({_first_line(err)}); give "
                                   "--params/--layers/--hidden/--heads") from None
    try:
        cfg = AutoConfig.for_model(**dict(config))
        with torch.device("meta"):
            module = AutoModelForCausalLM.from_config(cfg)
    except Exception as err:  # transformers' own checks: ValueError, KeyError, TypeError, ... per model family
        raise PlanError(f"{name}: transformers cannot build a causal LM of model_type {model_type!r} from this "
                        f"config ({type(err).__name__}: {_first_line(err)}); give --params/--layers/--hidden/--heads"
                        ) from None
    spec = describe_module(module, name=name)
    return ModelSpec(**{**spec.__dict__, "source": "config.json, built on the meta device with transformers"})


def from_factory(target: str, *, name: str | None = None) -> ModelSpec:
    """A model from ``"package.module:function"`` or ``"path/to/file.py:function"``, built on the meta device.

    As ``python -m`` (and uvicorn, gunicorn) do for ``module:function``, a package in the working directory is
    importable; a file's own folder is, as for ``python path/to/file.py``, so that it can import its neighbours.
    """
    module_name, sep, func_name = target.rpartition(":")
    if not sep or not module_name or not func_name.isidentifier():
        raise PlanError(f"model factory {target!r} is not MODULE:FUNCTION (e.g. 'mypkg.models:build')")
    from pathlib import Path

    folder = Path(module_name).resolve().parent if module_name.endswith(".py") else Path.cwd()
    with _importable(folder):
        return _build_factory(target, module_name, func_name, name=name)


@contextmanager
def _importable(folder: Path) -> Iterator[None]:
    """``folder`` first on ``sys.path`` while the factory is imported and called, then taken off again (the
    console script, unlike ``python -m``, does not put the working directory there)."""
    entry = str(folder)
    present = entry in sys.path or (folder == type(folder).cwd() and "" in sys.path)
    if not present:
        sys.path.insert(0, entry)
    try:
        yield
    finally:
        if not present and entry in sys.path:
            sys.path.remove(entry)


def _build_factory(target: str, module_name: str, func_name: str, *, name: str | None) -> ModelSpec:
    try:
        if module_name.endswith(".py"):
            from pathlib import Path

            path = Path(module_name)
            if not path.exists():
                raise PlanError(f"model factory file {module_name!r} does not exist")
            spec = importlib.util.spec_from_file_location(f"_convoy_factory_{path.stem}", path)
            mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
            sys.modules[spec.name] = mod  # type: ignore[union-attr]
            spec.loader.exec_module(mod)  # type: ignore[union-attr]
        else:
            mod = importlib.import_module(module_name)
    except PlanError:
        raise
    except Exception as err:  # the user's module: a missing package, a syntax error, an error at import
        raise PlanError(f"model factory {target!r}: cannot import {module_name!r} "
                        f"({type(err).__name__}: {_first_line(err)})") from None
    func = getattr(mod, func_name, None)
    if not callable(func):
        raise PlanError(f"model factory {target!r}: {module_name} has no function {func_name!r}")
    import torch

    try:
        with torch.device("meta"):
            module = func()
    except Exception as err:  # the user's code: name it and its error in one line (--debug is for the rest)
        raise PlanError(f"model factory {target!r} raised {type(err).__name__}: {_first_line(err)}") from None
    if not isinstance(module, torch.nn.Module):
        raise PlanError(f"model factory {target!r} returned {type(module).__name__}, not a torch.nn.Module")
    return describe_module(module, name=name or target)


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    text = lines[0] if lines else "(no message)"
    return text if len(text) <= 200 else text[:197] + "..."


def describe_module(module: Any, *, name: str) -> ModelSpec:
    """A ``ModelSpec`` from an ``nn.Module`` (real or meta): exact parameter count, blocks found by structure.

    The blocks are the longest ``ModuleList``/``Sequential`` of same-typed modules; hidden size and vocabulary come
    from the largest ``nn.Embedding``; heads and KV heads from an attribute that names them (``num_heads``,
    ``n_heads``, ``heads``, ``num_key_value_heads``, ``n_kv_heads``, ...); the MLP's width and gating from the
    largest block's ``nn.Linear`` layers (``_mlp_shape``).
    """
    import torch

    seen: set[int] = set()
    total = 0
    for p in module.parameters():
        if id(p) not in seen:  # tied weights count once
            seen.add(id(p))
            total += p.numel()
    blocks: list[Any] = []
    for sub in module.modules():
        if isinstance(sub, (torch.nn.ModuleList, torch.nn.Sequential)) and len(sub) > max(1, len(blocks)):
            kinds = {type(m) for m in sub}
            if len(kinds) == 1:
                blocks = list(sub)
    # the largest block (a model whose first blocks are dense and the rest mixtures of experts: the latter)
    sizes = [(sum(p.numel() for p in b.parameters()), b) for b in blocks]
    layer_params, largest = max(sizes, key=lambda size_block: size_block[0], default=(None, None))
    embeds = [m for m in module.modules() if isinstance(m, torch.nn.Embedding)]
    emb = max(embeds, key=lambda m: m.num_embeddings, default=None)
    heads = _count_attribute(module, ("num_heads", "n_head", "num_attention_heads", "n_heads", "heads"))
    kv_heads = _count_attribute(module, ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "kv_heads",
                                         "n_kv_head"))
    hidden = emb.embedding_dim if emb is not None else None
    ffn, gated = _mlp_shape(largest, hidden) if largest is not None and hidden else (None, False)
    # a learned position embedding (GPT-2's wpe, a 'pos' table) bounds the sequence; rotary models have none
    positions = [m.num_embeddings for n, m in module.named_modules() if isinstance(m, torch.nn.Embedding)
                 and m is not emb and any(k in n.rsplit(".", 1)[-1].lower() for k in ("pos", "wpe"))]
    return ModelSpec(name=name, num_params=int(total), num_layers=len(blocks) or None, hidden=hidden, heads=heads,
                     kv_heads=kv_heads if heads and kv_heads and heads % kv_heads == 0 else None,
                     ffn=ffn or (4 * hidden if hidden else None), vocab=emb.num_embeddings if emb is not None else None,
                     layer_params=layer_params or None, gated_mlp=gated, activation="silu" if gated else "gelu",
                     max_positions=min(positions) if positions else None,
                     source="module built on the meta device (exact parameter count)")


def _count_attribute(module: Any, names: tuple[str, ...]) -> int | None:
    """The first positive int attribute of these ``names`` on ``module`` or a submodule, in module order."""
    for sub in module.modules():
        for attr in names:
            value = getattr(sub, attr, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def _mlp_shape(block: Any, hidden: int) -> tuple[int | None, bool]:
    """(the MLP's inner width, whether it is gated) read off a block's ``nn.Linear`` layers: a width f that some
    layer maps hidden -> f and another f -> hidden; two hidden -> f layers side by side in one module (SwiGLU's gate
    and up, an expert's) make it gated, not two experts' plain ones or a fused q/k/v of that width. (None, False)
    where no such pair exists (the caller then takes 4 x hidden)."""
    import torch

    linears = [m for m in block.modules() if isinstance(m, torch.nn.Linear)]
    widths = [m.out_features for m in linears if m.in_features == hidden and m.out_features > hidden]
    back = {m.in_features for m in linears if m.out_features == hidden}
    inner = [f for f in widths if f in back]
    if not inner:
        return None, False
    ffn = max(inner)

    def into_ffn(module: Any) -> bool:
        return isinstance(module, torch.nn.Linear) and module.in_features == hidden and module.out_features == ffn

    return ffn, any(sum(map(into_ffn, parent.children())) >= 2 for parent in block.modules())


def resolve_model(model: Any = None, *, params: float | None = None, **shape: Any) -> ModelSpec:
    """One entry point for every way to name a model: a ``ModelSpec``, an ``nn.Module``, a config path or dict,
    a ``module:function`` factory, or ``params=`` with shape keywords (layers, hidden, heads, vocab, ffn).

    Shape keywords also override what a config or factory says (e.g. ``heads=`` for a module without one).
    """
    fields = _shape_fields(shape)  # validates the keywords before anything else
    if model is None:
        if params is None:
            raise PlanError("no model given; give a config.json path, a module:function factory, or --params")
        if any(shape.get(k) is None for k in ("layers", "hidden", "heads")):
            return derive_shape(params, **shape)  # a count without a full shape: the usual one, said so
        return from_numbers(params, **shape)
    if isinstance(model, ModelSpec):
        spec = model
    elif isinstance(model, Mapping):
        spec = from_hf_config(model)
    elif isinstance(model, str) or is_pathlib_path(model):
        text = str(model)
        if "\0" in text:
            raise PlanError(f"model {shown(text)}: a path or factory name cannot hold a NUL character")
        is_path = text.endswith(".json") or os.path.isdir(text) or os.path.exists(text)
        spec = from_hf_config(text) if is_path or ":" not in text else from_factory(text)
    elif "torch" in sys.modules and isinstance(model, sys.modules["torch"].nn.Module):
        spec = describe_module(model, name=type(model).__name__)
    else:
        raise PlanError(f"cannot plan a {type(model).__name__}; give a config.json path, a module:function "
                        "factory, an nn.Module, or params=")
    overrides = {k: v for k, v in fields.items() if v is not None}
    if params is not None:
        overrides["num_params"] = param_count(params)
    if not overrides:
        return spec
    out = ModelSpec(**{**spec.__dict__, **overrides})
    given = {k: v for k, v in {"params": params, **shape}.items() if v is not None}
    check_heads_divide_hidden(out, given=given, base=repr(spec.name))
    check_params_fit_shape(out, given=given, base=repr(spec.name))
    return out


def _shape_fields(shape: Mapping[str, Any]) -> dict[str, Any]:
    names = {"layers": "num_layers", "hidden": "hidden", "heads": "heads", "vocab": "vocab", "ffn": "ffn",
             "kv_heads": "kv_heads"}
    unknown = sorted(set(shape) - set(names))
    if unknown:
        raise PlanError(f"unknown model field {unknown[0]!r}; use {', '.join(names)}")
    return {names[k]: v for k, v in shape.items()}
