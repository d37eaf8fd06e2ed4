"""Tensor parallelism: which module gets which DTensor style, and applying it with ``parallelize_module``.

    from convoy.train.parallel.tensor import resolve_tp_plan, apply_tensor_parallel
    plan = resolve_tp_plan(model)                                   # the model's own plan, or the default one
    plan = resolve_tp_plan(model, {"layers.*.attn.wq": "colwise", "layers.*.attn.wo": "rowwise"})
    apply_tensor_parallel(model, tp_mesh, plan)                      # in place; returns the model

Where the plan comes from, first match wins: the ``plan`` argument (module-name patterns, ``*`` stands for
one name component such as a layer number), the model's declared plan (Hugging Face models carry
``config.base_model_tp_plan`` for the base model and ``_tp_plan`` for heads such as ``lm_head``), or
convoy's default for common transformer names (q/k/v/o projections, MLP up/gate/down, token embedding,
LM head; ``nn.Linear``/``nn.Embedding`` only). Modules sharing a weight (a tied embedding and LM head) are split
alike (both over the vocabulary, one ``DTensor`` after splitting) or left whole; a user's plan that splits them
differently is refused (``convoy.train.parallel.ties``).

Styles (``STYLES``, in ``styles.py``): every dense style transformers declares, under its names (``colwise``,
``rowwise``, ``colwise_gather_output``, ``rowwise_split_input``, ``embedding_rowwise``, ``embedding_colwise``,
``packed_colwise``, ``packed_rowwise``, ``sequence_parallel``, ``replicated_with_grad_allreduce``, ``all_reduce``,
``mla_kv_a_proj``, ``replicate``, and the earlier ``local_*`` spellings), plus convoy's ``packed_qkv`` for fused
``[q | k | v]`` projections; ``nn.Linear``, ``nn.Embedding`` and transformers' ``Conv1D``. Mixture-of-experts styles
are refused (``NotSupportedYetError``), unknown ones too (``StrategyError``), each naming the entry and where the
plan came from. Models that declare no plan but that convoy knows (GPT-2: ``Conv1D`` projections, fused
``c_attn``) get convoy's plan for them (``builtin_plan``). With ``sequence_parallel=True`` the activations between
blocks are split along the sequence dimension: every norm must then be in the plan as ``sequence_parallel`` (the
default plan does this). Attention modules whose projections are split have their head-count attributes
(``num_heads``, ``n_heads``, ...; for a packed q/k/v projection also the per-part width ``split_size``) divided by
tp, as their local head count.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

from convoy.errors import NotSupportedYetError, StrategyError
from convoy.train.parallel.styles import (
    STYLES,
    canonical_style,
    is_conv1d,
    packed_parts,
    packed_weights_gather,
    parameter_dim,
    split_dim,
    style_object,
)
from convoy.train.parallel.ties import find_ties, module_kinds, reconcile_tp_styles, retie

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["STYLES", "TPPlan", "resolve_tp_plan", "builtin_plan", "check_tp_plan", "check_beside_fsdp",
           "apply_tensor_parallel", "model_num_heads",
           "tracing_stand_ins"]

_DEFAULT_LEAF_STYLES = {
    **{name: "colwise" for name in ("q_proj", "k_proj", "v_proj", "wq", "wk", "wv", "query", "key", "value",
                                    "gate_proj", "up_proj", "w1", "w3", "fc1")},
    **{name: "rowwise" for name in ("o_proj", "out_proj", "wo", "down_proj", "w2", "fc2")},
}
_DEFAULT_EMBEDDINGS = ("embed_tokens", "wte", "tok_embeddings", "tok_emb", "word_embeddings")
_DEFAULT_HEADS = ("lm_head", "output")
#: attributes holding head counts (on a Hugging Face config or on attention modules); tp must divide each
HEAD_ATTRS = ("num_heads", "n_heads", "n_head", "num_attention_heads", "num_key_value_heads", "n_kv_heads",
              "num_kv_heads")
#: attributes holding one part's width beside a packed q/k/v projection (GPT-2's ``split_size``)
_PACKED_WIDTH_ATTRS = ("split_size",)
#: styles whose split output feeds attention heads: their parent's head counts become local
_HEAD_SPLITTING = ("colwise", "packed_qkv")
#: convoy's plans for models that declare none: model_type -> (base-model plan, head plan)
_BUILTIN_PLANS: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    "gpt2": ({"wte": "embedding", "h.*.attn.c_attn": "packed_qkv", "h.*.attn.c_proj": "rowwise",
              "h.*.mlp.c_fc": "colwise", "h.*.mlp.c_proj": "rowwise"}, {"lm_head": "colwise_rep"}),
}


@dataclass(frozen=True)
class TPPlan:
    """A resolved plan: concrete module names and their styles."""

    styles: tuple[tuple[str, str], ...]
    """(module name, style) pairs, in the model's module order."""
    source: str
    """Where the plan came from: "user", "model" or "default"."""
    sequence_parallel: bool = False
    """Split activations between blocks along the sequence dimension (dim 1)."""
    notes: tuple[str, ...] = ()
    """Decisions worth telling the user (e.g. a tied embedding and head split alike)."""
    parameters: tuple[tuple[str, int], ...] = ()
    """(parameter name, dimension split) for entries that name single parameters (attention sinks)."""

    def as_dict(self) -> dict[str, str]:
        return dict(self.styles)


def _pattern(text: str) -> re.Pattern[str]:
    return re.compile("".join("[^.]+" if part == "*" else re.escape(part) for part in re.split(r"(\*)", text)))


def _prefixed(model: nn.Module, base: Mapping[str, str]) -> dict[str, str]:
    """Base-model patterns under the model's ``base_model_prefix`` (when the model holds its base model there)."""
    prefix = getattr(model, "base_model_prefix", "") or ""
    has_prefix = bool(prefix) and any(name == prefix for name, _ in model.named_children())
    return {f"{prefix}.{pattern}" if has_prefix else pattern: style for pattern, style in base.items()}


def _declared_plan(model: nn.Module) -> dict[str, str]:
    """The Hugging Face-style plan a model declares, with base-model entries prefixed."""
    config = getattr(model, "config", None)
    declared = _prefixed(model, dict(getattr(config, "base_model_tp_plan", None) or {}))
    declared.update(dict(getattr(model, "_tp_plan", None) or {}))
    return declared


def builtin_plan(model: nn.Module) -> dict[str, str]:
    """convoy's plan for a model that declares none but whose layout convoy knows (by ``config.model_type``:
    GPT-2), with base-model entries prefixed; empty for the others."""
    found = _BUILTIN_PLANS.get(getattr(getattr(model, "config", None), "model_type", ""))  # "": none of them
    if found is None:
        return {}
    base, head = found
    return {**_prefixed(model, base), **head}


def _default_plan(model: nn.Module, sequence_parallel: bool) -> tuple[dict[str, str], list[str]]:
    plan: dict[str, str] = {}
    notes: list[str] = []
    embeddings, heads = [], []
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if isinstance(module, nn.Linear) and leaf in _DEFAULT_LEAF_STYLES:
            plan[name] = _DEFAULT_LEAF_STYLES[leaf]
        elif isinstance(module, nn.Embedding) and leaf in _DEFAULT_EMBEDDINGS:
            embeddings.append(name)
        elif isinstance(module, nn.Linear) and leaf in _DEFAULT_HEADS and "." not in name:
            heads.append(name)
        elif sequence_parallel and type(module).__name__.endswith("Norm"):
            plan[name] = "sequence_parallel"
    # a tied embedding and head get the same split (their vocabulary): see ties.reconcile_tp_styles
    plan.update({e: "embedding" for e in embeddings})
    plan.update({h: "colwise_rep" for h in heads})
    return plan, notes


def resolve_tp_plan(model: nn.Module, plan: Mapping[str, str] | None = None, *,
                    sequence_parallel: bool = False) -> TPPlan:
    """Resolve patterns to the model's module names; raise ``StrategyError`` for a pattern that matches none
    (in a plan given here), and one line for a style that cannot run, naming the entry and the plan's origin."""
    names = [name for name, _ in model.named_modules() if name]
    notes: list[str] = []
    if plan is not None:
        patterns, source, strict = dict(plan), "user", True
    else:
        patterns, source, strict = _declared_plan(model), "model", False
        if not patterns:
            patterns, source = builtin_plan(model), "builtin"
        if not patterns:
            patterns, notes = _default_plan(model, sequence_parallel)
            source = "default"
    owner = type(model).__name__
    resolved: dict[str, str] = {}
    on_parameters: list[tuple[str, str]] = []
    for pattern, style in patterns.items():
        regex = _pattern(pattern)
        hits = [n for n in names if regex.fullmatch(n)]
        if not hits:
            if style != "replicate" and any(regex.fullmatch(p) for p, _ in model.named_parameters()):
                on_parameters.append((pattern, style))
            elif strict:
                raise StrategyError(f"tp plan pattern {pattern!r} matches no module of {owner}; module names look "
                                    f"like {names[1] if len(names) > 1 else names[:1]!r}")
            continue
        style = canonical_style(style, entry=pattern, origin=source, owner=owner)
        for hit in hits:
            resolved.setdefault(hit, style)
    split_parameters: dict[str, int] = {}
    for pattern, style in on_parameters:  # after the module entries: an expert layer is refused as one
        regex = _pattern(pattern)
        for pname, param in model.named_parameters():
            if regex.fullmatch(pname):
                dim = parameter_dim(param, style, entry=pattern, origin=source, owner=owner)
                if dim is not None:
                    split_parameters.setdefault(pname, dim)
    if source == "builtin":
        notes = _leave_tied_whole(model, resolved)
    if sequence_parallel and source in ("model", "builtin"):
        for name, module in model.named_modules():
            if type(module).__name__.endswith("Norm") and name not in resolved:
                resolved[name] = "sequence_parallel"
    # modules sharing a weight (a tied embedding and head) are left whole or split alike, or a user's plan refused
    resolved, tie_notes = reconcile_tp_styles(resolved, find_ties(model), module_kinds(model), source=source)
    notes += tie_notes
    order = {name: i for i, name in enumerate(names)}
    styles = tuple(sorted(((n, s) for n, s in resolved.items() if s != "replicate"), key=lambda p: order[p[0]]))
    if not styles:
        raise StrategyError(f"no tensor-parallel plan for {owner}: it declares none and no "
                            f"module has a common projection name (q_proj, o_proj, up_proj, ...); pass "
                            f"tp_plan={{'<module pattern>': 'colwise' | 'rowwise', ...}}")
    owners = {name.rpartition(".")[0] for name in split_parameters}
    unrun = sorted(o for o in owners if resolved.get(o) != "local_params")
    if unrun:
        raise StrategyError(f"tp plan splits parameters of {unrun[0]!r} ({owner}) but does not give that module "
                            f"'local_params', which runs it on their shards; add {{{unrun[0]!r}: 'local_params'}}")
    return TPPlan(styles=styles, source=source, sequence_parallel=sequence_parallel, notes=tuple(notes),
                  parameters=tuple(sorted(split_parameters.items())))


def _leave_tied_whole(model: nn.Module, resolved: dict[str, str]) -> list[str]:
    """Drop from ``resolved`` the modules whose weight another module shares (an embedding tied to the LM head):
    splitting one would untie them. Returns a note per pair."""
    holders: dict[int, list[str]] = {}
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, nn.Parameter):
            holders.setdefault(id(weight), []).append(name)
    notes = []
    for group in holders.values():
        if len(group) > 1 and any(name in resolved for name in group):
            for name in group:
                resolved.pop(name, None)
            notes.append(f"{' and '.join(group)} share their weight: left replicated")
    return notes


def check_beside_fsdp(model: nn.Module, plan: TPPlan) -> None:
    """``NotSupportedYetError`` for a packed weight split along dim 0, the dimension FSDP2 shards too: the two
    strided layouts do not compose (an ``nn.Linear``'s packed_colwise, a ``Conv1D``'s packed_rowwise)."""
    for name, style in plan.styles:
        found = split_dim(model.get_submodule(name), style)
        if packed_parts(style) > 1 and found is not None and found[0] == 0:
            raise NotSupportedYetError(f"tp style {style!r} on {name!r} beside FSDP2 data parallelism is not "
                                       f"supported yet (FSDP2 shards the same dimension of its weight); run tp "
                                       f"without data parallelism, or give {name!r} 'colwise_gather_output' in "
                                       f"strategy_options['tp_plan']")


def model_num_heads(model: nn.Module) -> int | None:
    """The attention head count from a Hugging Face-style config, when the model has one."""
    config = getattr(model, "config", None)
    for attr in ("num_attention_heads", "n_head", "n_heads", "num_heads"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def check_tp_plan(model: nn.Module, plan: TPPlan, tp: int) -> None:
    """Raise ``StrategyError`` unless tp divides every split dimension and the heads; ``NotSupportedYetError``
    for packed weights on a torch whose DTensor cannot gather them (``styles.packed_weights_gather``)."""

    heads = model_num_heads(model)
    if heads is not None and heads % tp:
        divisors = [d for d in range(1, heads + 1) if heads % d == 0]
        raise StrategyError(f"tp={tp} does not divide the model's {heads} attention heads; choose tp in {divisors}")
    for name, style in plan.styles:
        module = model.get_submodule(name)
        if style == "sequence_parallel" and not plan.sequence_parallel:
            raise StrategyError(f"tp plan gives {name!r} 'sequence_parallel' but sequence_parallel is off; "
                                f"turn it on or use 'replicate'")
        try:
            found = split_dim(module, style)
        except StrategyError as err:
            raise StrategyError(f"tp plan gives {name!r}: {err}") from None
        if found is None:
            continue
        _, size, what = found
        if packed_parts(style) > 1 and not packed_weights_gather():
            raise NotSupportedYetError(
                f"tp plan gives {name!r} {style!r}, a packed weight (a _StridedShard DTensor), which torch "
                f"{torch.__version__}'s DTensor cannot gather or checkpoint ('cannot be interpreted into a "
                f"corresponding shard_order'); use torch 2.13 or later, or train this model with fsdp/zero3")
        step = tp * packed_parts(style)
        if size % step:
            parts = f" ({packed_parts(style)} packed parts)" if packed_parts(style) > 1 else ""
            raise StrategyError(f"tp={tp} does not divide the {size} {what} of {name!r}{parts} evenly; choose a "
                                f"tp dividing {size // packed_parts(style)}")
    for pname, dim in plan.parameters:
        size = model.get_parameter(pname).shape[dim]
        if size % tp:
            raise StrategyError(f"tp={tp} does not divide dim {dim} ({size}) of parameter {pname!r}; choose a tp "
                                f"dividing {size}")
    for parent, attr, value in _split_head_counts(model, plan):  # what _localize_head_counts will divide
        if value % tp:
            raise StrategyError(f"tp={tp} does not divide {parent or 'model'}.{attr}={value}; choose a tp "
                                f"dividing {value}")
    if plan.sequence_parallel:
        missing = [n for n, m in model.named_modules() if type(m).__name__.endswith("Norm") and n not in plan.as_dict()]
        if missing:
            raise StrategyError(f"sequence parallelism needs every norm in the plan as 'sequence_parallel'; "
                                f"missing {missing[0]!r}")


def _split_head_counts(model: nn.Module, plan: TPPlan) -> list[tuple[str, str, int]]:
    """(module, attribute, count) of the head counts on modules whose projections ``plan`` splits colwise (and
    the per-part widths beside a packed q/k/v projection)."""
    found = []
    for parent in sorted({name.rpartition(".")[0] for name, style in plan.styles if style in _HEAD_SPLITTING}):
        module = model.get_submodule(parent)
        packed = any(style == "packed_qkv" and name.rpartition(".")[0] == parent for name, style in plan.styles)
        for attr in HEAD_ATTRS + (_PACKED_WIDTH_ATTRS if packed else ()):
            value = getattr(module, attr, None)
            if isinstance(value, int) and not isinstance(value, bool):
                found.append((parent, attr, value))
    return found


def _localize_head_counts(model: nn.Module, plan: TPPlan, tp: int) -> None:
    """Divide head-count attributes of modules whose projections were split colwise (their local heads);
    ``check_tp_plan`` has checked that tp divides each."""
    for parent, attr, value in _split_head_counts(model, plan):
        setattr(model.get_submodule(parent), attr, value // tp)


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, plan: TPPlan) -> nn.Module:
    """Split ``model`` in place over ``tp_mesh`` (1-D) following ``plan``; returns ``model``."""
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.parallel import parallelize_module

    tp = tp_mesh.size()
    check_tp_plan(model, plan, tp)
    ties = find_ties(model)  # before parallelize_module, which gives each split module a parameter of its own
    reconcile_tp_styles(plan.as_dict(), ties, module_kinds(model), source="user")  # refuses a tie split apart
    for pname, dim in plan.parameters:  # entries naming single parameters; their modules run local_params
        parent, _, leaf = pname.rpartition(".")
        module, param = model.get_submodule(parent), model.get_parameter(pname)
        module.register_parameter(leaf, nn.Parameter(distribute_tensor(param.detach(), tp_mesh, [Shard(dim)]),
                                                     requires_grad=param.requires_grad))
    styles = {name: style_object(style, model.get_submodule(name), plan.sequence_parallel)
              for name, style in plan.styles}
    parallelize_module(model, tp_mesh, styles)
    retie(model, ties)  # split alike: the tied names share one DTensor again
    _localize_head_counts(model, plan, tp)
    return model


def tracing_stand_ins(model: nn.Module, plan: TPPlan) -> dict[str, nn.Module]:
    """Plain modules shaped like what each split module of ``model`` computes on this rank, for tracing.

    ``torch.export`` (and so pipeline splitting) cannot trace DTensor parameters. A tensor-parallel model is
    traced with these in place of its split modules: ``colwise``/``rowwise`` Linears take their local shard's
    shape (so the traced graph holds this rank's activation shapes and local head counts), the others
    (embeddings, gathered heads) their whole shape. Weights are left uninitialised: only shapes are traced.

    With ``plan.sequence_parallel`` each stand-in returns the shape the model's forward sees in eager mode:
    embeddings and ``rowwise``/``rowwise_rep`` Linears return this rank's sequence shard (a plain tensor, dim 1
    divided by tp), ``sequence_parallel`` modules (norms) take that shard and return the *whole* sequence (the
    real ones return a DTensor, whose ``.shape`` is global), and ``colwise`` Linears and gathered heads take
    the whole sequence as it is. So the pipeline's inter-stage activations (the residual stream) are this
    rank's ``[batch, seq / tp, ...]`` shards, and reshapes after a projection hold the whole sequence.
    """
    from torch.distributed.tensor import DTensor

    shard_linear, shard_embedding, gather = _stand_in_classes()
    if plan.parameters:
        raise NotSupportedYetError(f"tp with pp: tracing a module whose own parameters are split "
                                   f"({plan.parameters[0][0]!r}) is not supported yet; use tp or pp alone")
    tp = _tp_size(model, plan)
    stand_ins: dict[str, nn.Module] = {}
    for name, style in plan.styles:
        module = model.get_submodule(name)
        if style == "sequence_parallel":
            stand_ins[name] = gather(module, tp)
            continue
        if split_dim(module, style) is None:  # whole modules with a hook (gradient or output sums): untraceable
            stand_ins[name] = _unhooked(module)
            continue
        weight = cast(torch.Tensor, module.weight)  # split_dim found a Linear, Conv1D or Embedding
        conv1d = is_conv1d(module)
        local = style in _LOCAL_SHAPED and (isinstance(module, nn.Linear) or conv1d)
        shape = weight.to_local().shape if local and isinstance(weight, DTensor) else weight.shape
        kwargs = {"device": weight.device, "dtype": weight.dtype}
        # with sequence parallelism these return this rank's sequence shard (output_layouts=Shard(1))
        shard_seq = plan.sequence_parallel and (isinstance(module, nn.Embedding) or style.startswith("rowwise"))
        if isinstance(module, nn.Linear) or conv1d:  # a Conv1D's weight is [in, out]: traced as that Linear
            cls = shard_linear if shard_seq else nn.Linear
            features = (shape[0], shape[1]) if conv1d else (shape[1], shape[0])
            stand_in = torch.nn.utils.skip_init(cls, *features, bias=module.bias is not None, **kwargs)
        elif isinstance(module, nn.Embedding):
            cls = shard_embedding if shard_seq else nn.Embedding
            stand_in = torch.nn.utils.skip_init(cls, shape[0], shape[1], padding_idx=module.padding_idx, **kwargs)
        else:  # check_tp_plan admits only Linear and Embedding for the styles left here
            raise NotSupportedYetError(f"tp with pp: cannot trace split module {name!r} ({type(module).__name__})")
        if shard_seq:
            stand_in.tp = tp
        stand_ins[name] = stand_in
    return stand_ins


#: styles whose module computes with its local shard's shape (the others see whole inputs and outputs)
_LOCAL_SHAPED = ("colwise", "rowwise", "packed_colwise", "packed_qkv", "packed_rowwise")


def _unhooked(module: nn.Module) -> nn.Module:
    """A shallow copy of ``module`` (same parameters) without the forward or hooks a style put on it."""
    copy = nn.Module.__new__(type(module))
    copy.__dict__ = {k: v for k, v in module.__dict__.items() if k != "forward"}
    copy._forward_hooks = type(module._forward_hooks)()
    copy._forward_pre_hooks = type(module._forward_pre_hooks)()
    return copy


def _tp_size(model: nn.Module, plan: TPPlan) -> int:
    """The tp degree, read from the mesh of the first split parameter (1 before the model is split)."""
    from torch.distributed.tensor import DTensor

    for name, _ in plan.styles:
        for param in model.get_submodule(name).parameters():
            if isinstance(param, DTensor):
                return param.device_mesh.size()
    return 1


def _sequence_shard(y: torch.Tensor, tp: int) -> torch.Tensor:
    """This rank's share of dim 1 (its size is what matters for tracing, not which slice)."""
    if y.dim() < 2 or y.shape[1] % tp:
        raise StrategyError(f"sequence_parallel with tp={tp} splits activations along dim 1 (the sequence), "
                            f"but an activation has shape {tuple(y.shape)}; make the sequence length a "
                            f"multiple of {tp}")
    return y.narrow(1, 0, y.shape[1] // tp)


@functools.cache
def _stand_in_classes():
    """(Linear, Embedding, SequenceParallel) stand-in classes; defined on first use (torch loads lazily)."""

    class SequenceShardLinear(nn.Linear):
        """A Linear whose output is a sequence shard (``RowwiseParallel(output_layouts=Shard(1))``)."""

        tp = 1

        def forward(self, x):
            return _sequence_shard(super().forward(x), self.tp)

    class SequenceShardEmbedding(nn.Embedding):
        """An Embedding whose output is a sequence shard (vocabulary split, ``output_layouts=Shard(1)``)."""

        tp = 1

        def forward(self, ids):
            return _sequence_shard(super().forward(ids), self.tp)

    class SequenceGatherStandIn(nn.Module):
        """A ``SequenceParallel`` module (a norm): takes a sequence shard, returns the whole sequence's shape.

        The real module returns a DTensor sharded on dim 1, whose shape (what the model's forward reads, e.g.
        ``b, s, _ = x.shape`` in attention) is the global one. Holds uninitialised plain parameters of the
        module's names and shapes, so the traced model has the same parameter names.
        """

        def __init__(self, module: nn.Module, tp: int) -> None:
            from torch.distributed.tensor import DTensor

            super().__init__()
            self.tp = tp
            for pname, param in module.named_parameters(recurse=False):
                local = param.to_local() if isinstance(param, DTensor) else param
                self.register_parameter(pname, nn.Parameter(torch.empty_like(local), param.requires_grad))

        def forward(self, x, *args, **kwargs):
            y = x.repeat(1, self.tp, *([1] * (x.dim() - 2)))
            return y

    return SequenceShardLinear, SequenceShardEmbedding, SequenceGatherStandIn
