"""Tensor-parallel styles: every dense style transformers declares, each with DTensor parameters.

    from convoy.train.parallel.styles import canonical_style, style_object
    style = canonical_style("colwise_gather_output", entry="lm_head", origin="model", owner="LlamaForCausalLM")
    parallelize_module(model, tp_mesh, {"lm_head": style_object(style, model.lm_head, sequence_parallel=False)})

The names are transformers' (its registry: ``ALL_PARALLEL_STYLES`` in ``transformers/distributed/
tensor_parallel.py``, 5.24), plus ``packed_qkv`` for fused q/k/v projections; an entry may name a single parameter
(``self_attn.sinks``: ``colwise`` splits dim 0, ``rowwise`` the last) whose module then runs ``local_params``. Each
split weight becomes a DTensor on the tp mesh (``Shard``, or ``_StridedShard`` for packed weights, whose global view
keeps the model's own layout, so state dicts and checkpoints read as the unsplit model's). ``nn.Linear`` and
``nn.Embedding`` take torch's ``ColwiseParallel``/``RowwiseParallel``; transformers' ``Conv1D`` (GPT-2: weight
``[in, out]``, transposed against ``nn.Linear``) and packed weights run the module's matmul on the local shards,
with the collectives between.

Mixture-of-experts styles (``moe_tp_experts``, ``grouped_gemm``, ``ep_dispatch_experts``, ...) are refused with
``NotSupportedYetError``; a style no table here knows, with ``StrategyError`` naming where the entry came from.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast, overload

import torch
import torch.distributed as dist
from torch import nn

from convoy.errors import NotSupportedYetError, StrategyError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["STYLES", "ALIASES", "EXPERT_STYLES", "PARAMETER_STYLES", "canonical_style", "parameter_dim",
           "style_object", "is_conv1d", "split_dim",
           "packed_parts", "packed_weights_gather", "plain_shards", "strided_like"]

#: the styles convoy applies (canonical names), with what each does
STYLES: dict[str, str] = {
    "colwise": "split the output features; output stays split",
    "rowwise": "split the input features of a split input; output summed to every rank (Embedding: the vocabulary)",
    "colwise_rep": "split the output features, then gather the output on every rank",
    "rowwise_rep": "split the input features of a replicated input; output summed to every rank",
    "embedding": "split an Embedding's vocabulary; ids replicated, output summed",
    "embedding_colwise": "split an Embedding's hidden size; output gathered",
    "packed_colwise": "a fused [gate | up] projection: each rank gets its share of both parts; output stays split",
    "packed_qkv": "a fused [q | k | v] projection (equal parts): each rank gets its heads' q, k and v",
    "packed_rowwise": "split the input features of a packed, split input ([gate | up] shares); output summed",
    "sequence_parallel": "norm/dropout running on a sequence shard (only with sequence_parallel=True)",
    "replicated_with_grad_allreduce": "whole on every rank, fed split activations: its gradient is summed over tp",
    "all_reduce": "whole module whose output is a partial sum: the output is summed over tp",
    "mla_kv_a_proj": "whole MLA kv_a projection: gradients of its rotary part summed over tp",
    "local_params": "a module whose own parameters other entries split (e.g. attention sinks) runs on their shards",
    "replicate": "leave the module whole on every rank",
}
#: styles an entry naming a single parameter takes (the dimension split: 0, or the last)
PARAMETER_STYLES = {"colwise": 0, "local_colwise": 0, "rowwise": -1, "local_rowwise": -1, "replicate": None}
#: other names for them: transformers' current and earlier spellings
ALIASES: dict[str, str] = {
    "colwise_gather_output": "colwise_rep",
    "rowwise_split_input": "rowwise_rep",
    "embedding_rowwise": "embedding",
    "local_colwise": "colwise",
    "local_rowwise": "rowwise",
    "local_packed_rowwise": "packed_rowwise",
    "gather": "all_reduce",
}
#: styles that split mixture-of-experts layers (experts, routers, expert-parallel dispatch)
EXPERT_STYLES = ("moe_tp_experts", "moe_identity_expert", "grouped_gemm", "ep_dispatch_experts", "ep_router",
                 "local", "isolated")
#: dense styles transformers has that convoy does not run yet: what each needs
_NOT_YET: dict[str, str] = {}
_PACKED_PARTS = {"packed_colwise": 2, "packed_qkv": 3, "packed_rowwise": 2}
_COLWISE = ("colwise", "colwise_rep", "packed_colwise", "packed_qkv")
_ROWWISE = ("rowwise", "rowwise_rep", "packed_rowwise")


def canonical_style(style: Any, *, entry: str, origin: str, owner: str) -> str:
    """``style``'s canonical name, or one line saying why it cannot run and what to do.

    ``origin`` is where the plan came from ("user": ``strategy_options["tp_plan"]``; "model": the model's own
    ``_tp_plan``/``base_model_tp_plan``; "builtin"/"default": convoy's); ``owner`` is the model's class name.
    """
    where = {"user": "strategy_options['tp_plan']", "model": f"{owner}'s own tp plan (_tp_plan)",
             "builtin": f"convoy's plan for {owner}"}.get(origin, "convoy's default plan")
    override = ("" if origin == "user" else
                "; override the plan with strategy_options={'tp_plan': {'<module pattern>': '<style>', ...}}")
    if not isinstance(style, str):
        raise StrategyError(f"tp plan entry {entry!r} from {where}: style {style!r} is not a string; use one of "
                            f"{', '.join(STYLES)}")
    if style in EXPERT_STYLES:
        raise NotSupportedYetError(f"tp plan entry {entry!r} from {where}: style {style!r} splits mixture-of-experts "
                                   f"layers, which convoy's tensor parallelism does not run yet; train this model "
                                   f"with fsdp/zero3 or pp{override}")
    if style in _NOT_YET:
        raise NotSupportedYetError(f"tp plan entry {entry!r} from {where}: style {style!r} ({_NOT_YET[style]}) is not "
                                   f"supported yet{override}")
    if style not in STYLES and style not in ALIASES:
        raise StrategyError(f"tp plan entry {entry!r} from {where}: unknown style {style!r}; convoy runs "
                            f"{', '.join(STYLES)} (and transformers' names {', '.join(ALIASES)}){override}")
    return ALIASES.get(style, style)


def parameter_dim(param: torch.Tensor, style: str, *, entry: str, origin: str, owner: str) -> int | None:
    """The dimension an entry naming a single parameter splits (``None``: left whole); one line otherwise."""
    canonical_style(style, entry=entry, origin=origin, owner=owner)  # experts and unknown styles, by name
    if style not in PARAMETER_STYLES:
        raise NotSupportedYetError(f"tp plan entry {entry!r} names a parameter of {owner}: style {style!r} on a "
                                   f"single parameter is not supported yet; parameters take "
                                   f"{', '.join(PARAMETER_STYLES)}")
    dim = PARAMETER_STYLES[style]
    return None if dim is None else dim % max(param.dim(), 1)


def is_conv1d(module: nn.Module) -> bool:
    """transformers' ``Conv1D`` (GPT-2, GPT): ``weight`` is ``[in, out]``, the transpose of ``nn.Linear``'s."""
    weight = getattr(module, "weight", None)
    return (type(module).__name__ == "Conv1D" and isinstance(weight, torch.Tensor) and weight.dim() == 2
            and tuple(weight.shape) == (getattr(module, "nx", -1), getattr(module, "nf", -1)))


def packed_parts(style: str) -> int:
    """How many equal parts a packed style's split dimension holds (1 for the others)."""
    return _PACKED_PARTS.get(style, 1)


def split_dim(module: nn.Module, style: str) -> tuple[int, int, str] | None:
    """(weight dim split, its size, what it is) for a style that splits ``module``'s weight; ``None`` if none.

    ``StrategyError`` when the style cannot apply to this kind of module."""
    if style in ("sequence_parallel", "replicated_with_grad_allreduce", "all_reduce", "mla_kv_a_proj", "local_params",
                 "replicate"):
        return None
    if isinstance(module, nn.Embedding):
        if style in ("rowwise", "embedding", "rowwise_rep"):
            return 0, module.num_embeddings, "vocabulary size"
        if style == "embedding_colwise":
            return 1, module.embedding_dim, "embedding size"
        raise StrategyError(f"style {style!r} does not apply to an Embedding; embeddings take 'embedding' "
                            f"(embedding_rowwise) or 'embedding_colwise'")
    if style == "embedding_colwise" or style == "embedding":
        raise StrategyError(f"style {style!r} applies to an Embedding, not a {type(module).__name__}")
    colwise = style in _COLWISE
    if isinstance(module, nn.Linear):
        dim = 0 if colwise else 1
    elif is_conv1d(module):
        dim = 1 if colwise else 0
    else:
        raise StrategyError(f"style {style!r} splits Linear, Conv1D and Embedding modules, not a "
                            f"{type(module).__name__}")
    weight = cast(torch.Tensor, module.weight)  # a Linear's or Conv1D's (is_conv1d checked it is a tensor)
    return dim, weight.shape[dim], "output features" if colwise else "input features"


# --- activations between ranks -------------------------------------------------------------------------


def _group(mesh: DeviceMesh) -> Any:
    return mesh.get_group()


class _CopyToTP(torch.autograd.Function):
    """Identity forward; backward sums the gradient over tp (a replicated input feeding split work)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """Forward sums partial outputs over tp; backward passes the (replicated) gradient on."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    """Forward gathers the last dimension's shards (``parts`` interleaved blocks each); backward keeps this
    rank's share of the gradient."""

    @staticmethod
    def forward(ctx, x, group, parts):
        ctx.group, ctx.parts = group, parts
        return _gather(x, group, parts)

    @staticmethod
    def backward(ctx, grad):
        return _share(grad, ctx.group, ctx.parts), None, None


def _gather(x: torch.Tensor, group: Any, parts: int) -> torch.Tensor:
    """The whole last dimension from every rank's share (``_share``'s inverse)."""
    size = dist.get_world_size(group)
    pieces = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(pieces, x.contiguous(), group=group)
    blocks = [piece.chunk(parts, dim=-1) for piece in pieces]
    return torch.cat([blocks[r][k] for k in range(parts) for r in range(size)], dim=-1)


def _share(x: torch.Tensor, group: Any, parts: int) -> torch.Tensor:
    """This rank's share of the last dimension: its slice of each of ``parts`` equal blocks."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    return torch.cat([block.chunk(size, dim=-1)[rank] for block in x.chunk(parts, dim=-1)], dim=-1).contiguous()


class _ShareFromTP(torch.autograd.Function):
    """Forward keeps this rank's share of a replicated last dimension; backward gathers the gradient."""

    @staticmethod
    def forward(ctx, x, group, parts):
        ctx.group, ctx.parts = group, parts
        return _share(x, group, parts)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, ctx.group, ctx.parts), None, None


@overload
def _local(t: torch.Tensor) -> torch.Tensor: ...
@overload
def _local(t: None) -> None: ...
def _local(t: torch.Tensor | None) -> torch.Tensor | None:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _plain_input(x: Any, style: str) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    if isinstance(x, DTensor):  # only sequence parallelism hands DTensors between modules; refused before
        raise NotSupportedYetError(f"tp style {style!r} on a DTensor input (sequence parallelism) is not "
                                   f"supported yet; turn sequence_parallel off")
    return x


# --- the styles ------------------------------------------------------------------------------------------


def packed_weights_gather() -> bool:
    """Whether this torch's DTensor can redistribute a lone ``_StridedShard`` (gather a packed weight, save it).
    torch 2.11 reads every ``_StridedShard`` as a shard order and raises where one cannot be one (any dim, any
    split factor; measured on an H200 with torch 2.11.0); torch 2.13 falls back to a general path, which it marks
    with ``_StridedShardNotDecodableError``. Earlier torch has neither field nor fallback, and no such reading."""
    from torch.distributed.tensor import _dtensor_spec

    reads_shard_order = "use_strided_shard_as_shard_order" in getattr(_dtensor_spec.DTensorSpec,
                                                                      "__dataclass_fields__", {})
    return not reads_shard_order or hasattr(_dtensor_spec, "_StridedShardNotDecodableError")


def _weight_placement(module: nn.Module, style: str) -> Any:
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    found = split_dim(module, style)
    assert found is not None  # the styles built here all split the weight
    dim = found[0]
    parts = packed_parts(style)
    return _StridedShard(dim, split_factor=parts) if parts > 1 else Shard(dim)


@functools.cache
def _style_classes() -> tuple[type, ...]:
    """The ParallelStyle subclasses, defined on first use (torch's parallel package loads lazily)."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ParallelStyle

    class LocalShardStyle(ParallelStyle):
        """A Linear or Conv1D split column- or row-wise (packed or not), computed on the local shards.

        Weights (and a colwise bias; a packed one stays whole, each rank adding its share) are DTensors on the
        tp mesh; the forward runs the module's own matmul on their local shards between explicit collectives:
        colwise takes a replicated input (its gradient summed over tp) and leaves its output split, or gathers it
        (``colwise_rep``); rowwise takes a split input (or keeps its share of a replicated one, ``rowwise_rep``),
        sums the partial outputs, then adds the bias once.
        """

        def __init__(self, style: str) -> None:
            super().__init__()
            self.style = style
            self.parts = packed_parts(style)

        def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
            colwise = self.style in _COLWISE
            weight_placement = _weight_placement(module, self.style)
            for name, param in list(module.named_parameters(recurse=False)):
                if name == "weight":
                    placement = weight_placement
                elif colwise and self.parts == 1:  # the bias follows the output features
                    placement = Shard(0)
                else:  # a packed bias stays whole, each rank adding its share: a 1-D _StridedShard would meet
                    placement = Replicate()  # FSDP2's own split of dim 0, which the two cannot compose
                dtensor = distribute_tensor(param.detach(), device_mesh, [placement], src_data_rank=self.src_data_rank)
                module.register_parameter(name, nn.Parameter(dtensor, requires_grad=param.requires_grad))
            group = _group(device_mesh)
            conv1d = is_conv1d(module)
            style, parts = self.style, self.parts

            def forward(x: torch.Tensor) -> torch.Tensor:
                x = _plain_input(x, style)
                weight, bias = _local(cast(torch.Tensor, module.weight)), _local(getattr(module, "bias", None))
                if colwise:
                    x = _CopyToTP.apply(x, group)
                elif style == "rowwise_rep":
                    x = _ShareFromTP.apply(x, group, 1)
                y = x @ weight if conv1d else x @ weight.t()
                if not colwise:
                    y = _ReduceFromTP.apply(y, group)
                if bias is not None and colwise and parts > 1:
                    bias = _ShareFromTP.apply(bias, group, parts)
                if bias is not None:
                    y = y + bias
                if style == "colwise_rep":
                    y = _GatherFromTP.apply(y, group, parts)
                return y

            module.forward = forward
            return module

    class GradientSumStyle(ParallelStyle):
        """Whole module fed this rank's share of an activation (e.g. per-head q/k norms after a colwise
        projection): each use of its parameters sums their gradient over tp, so every rank steps the same."""

        def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
            group = _group(device_mesh)
            original = module.forward

            def forward(*args: Any, **kwargs: Any) -> Any:
                saved = dict(module._parameters)
                try:
                    for name, param in saved.items():
                        if param is not None and param.requires_grad and torch.is_grad_enabled():
                            module._parameters[name] = _CopyToTP.apply(param, group)
                    return original(*args, **kwargs)
                finally:
                    module._parameters.update(saved)

            module.forward = forward
            return module

    class OutputSumStyle(ParallelStyle):
        """Whole module whose output is this rank's partial sum (``all_reduce``); or, with ``rotary``, an MLA
        kv_a projection whose last ``rotary`` features go on to split heads: their gradient is summed."""

        def __init__(self, rotary: bool = False) -> None:
            super().__init__()
            self.rotary = rotary

        def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
            group = _group(device_mesh)
            rotary = self.rotary

            def hook(mod: nn.Module, args: Any, output: Any) -> Any:
                if output is None:
                    return None
                if not rotary:
                    return _ReduceFromTP.apply(output, group)
                width = _rope_width(mod)
                passed, rope = output.split([output.shape[-1] - width, width], dim=-1)
                return torch.cat([passed, _CopyToTP.apply(rope, group)], dim=-1)

            module.register_forward_hook(hook)
            return module

    class LocalParamsStyle(ParallelStyle):
        """A module whose own parameters other entries split (attention sinks, one per head): its forward runs
        on their local shards (its split projections give it this rank's heads)."""

        def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
            original = module.forward

            def forward(*args: Any, **kwargs: Any) -> Any:
                saved = dict(module._parameters)
                try:
                    for name, param in saved.items():
                        if param is not None:
                            module._parameters[name] = _local(param)  # type: ignore[assignment]
                    return original(*args, **kwargs)
                finally:
                    module._parameters.update(saved)

            module.forward = forward
            return module

    return LocalShardStyle, GradientSumStyle, OutputSumStyle, LocalParamsStyle


def _rope_width(module: nn.Module) -> int:
    for holder in (module, getattr(module, "config", None)):
        width = getattr(holder, "qk_rope_head_dim", None)
        if isinstance(width, int):
            return width
    raise StrategyError(f"tp style 'mla_kv_a_proj' on a {type(module).__name__} needs qk_rope_head_dim (on the "
                        f"module or its config) to find the rotary part of its output")


def style_object(style: str, module: nn.Module, sequence_parallel: bool) -> Any:
    """The DTensor ``ParallelStyle`` that applies canonical ``style`` to ``module``."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    local_shard, gradient_sum, output_sum, local_params = _style_classes()
    seq = Shard(1) if sequence_parallel else Replicate()
    if style == "sequence_parallel":
        return SequenceParallel()
    if style == "local_params":
        return local_params()
    if style == "replicated_with_grad_allreduce":
        return gradient_sum()
    if style in ("all_reduce", "mla_kv_a_proj"):
        return output_sum(rotary=style == "mla_kv_a_proj")
    if isinstance(module, nn.Embedding):
        if style == "embedding_colwise":
            return ColwiseParallel(input_layouts=Replicate(), output_layouts=seq)
        return RowwiseParallel(input_layouts=Replicate(), output_layouts=seq)
    if packed_parts(style) > 1 or not isinstance(module, nn.Linear):
        if sequence_parallel:
            raise NotSupportedYetError(f"tp style {style!r} on a {type(module).__name__} with sequence_parallel "
                                       f"is not supported yet; turn sequence_parallel off")
        return local_shard(style)
    from convoy.train.parallel.float8 import float8_tp_styles

    # a tensorwise Float8Linear (mixed_precision="fp8") takes torchao's styles: its activations cross in float8
    colwise, rowwise = float8_tp_styles(module) or (ColwiseParallel, RowwiseParallel)
    if style == "colwise":
        return colwise(input_layouts=seq)
    if style == "colwise_rep":
        return colwise(input_layouts=seq, output_layouts=Replicate())
    if style == "rowwise":
        return rowwise(output_layouts=seq)
    if style == "rowwise_rep":
        return rowwise(input_layouts=Replicate(), output_layouts=seq)
    raise AssertionError(f"unhandled style {style}")  # canonical_style admits only the styles above


# --- checkpoints of packed weights -------------------------------------------------------------------------


def _strided(placements: Any) -> bool:
    from torch.distributed.tensor.placement_types import _StridedShard

    return any(isinstance(p, _StridedShard) for p in placements)


def plain_shards(state: Any) -> Any:
    """``state`` (nested dicts/lists) with every packed DTensor re-laid out as plain ``Shard`` pieces of the
    same global tensor: ``torch.distributed.checkpoint`` cannot save ``_StridedShard`` chunks (it reports them
    as overlapping). Collective over each such tensor's mesh; other entries are returned as they are."""
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    def plain(t: Any) -> Any:
        if isinstance(t, DTensor) and _strided(t.placements):
            placements = [Shard(p.dim) if isinstance(p, _StridedShard) else p for p in t.placements]
            return t.redistribute(placements=placements)
        return t

    return _tree_map(plain, state)


def strided_like(reference: Callable[[str], Any], state: dict[str, Any]) -> dict[str, Any]:
    """``state`` (a model state dict, or an optimizer's with a ``"state"`` per parameter name) with each DTensor
    laid out as ``reference(name)`` (the model's tensor of that name) is, where that is packed: what
    ``plain_shards`` did to a checkpoint, undone after loading it."""
    from torch.distributed.tensor import DTensor

    def placed(name: str, t: Any) -> Any:
        target = reference(name)
        if (isinstance(t, DTensor) and isinstance(target, DTensor) and _strided(target.placements)
                and tuple(t.placements) != tuple(target.placements)):
            return t.redistribute(placements=target.placements)
        return t

    if isinstance(state.get("state"), dict):  # an optimizer state dict keyed by parameter name
        per_param = {name: {k: placed(name, v) for k, v in entry.items()} if isinstance(entry, dict) else entry
                     for name, entry in state["state"].items()}
        return {**state, "state": per_param}
    return {k: placed(k, v) for k, v in state.items()}


def _tree_map(fn: Callable[[Any], Any], value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _tree_map(fn, v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tree_map(fn, v) for v in value]
    return fn(value)
