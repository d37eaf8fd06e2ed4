"""Activation recomputation: each block of a model keeps less for its backward and recomputes the rest there.

    from convoy.train.parallel.recompute import apply_recompute, recompute_units, SELECTIVE_SAVES
    apply_recompute(model, "full")            # every block keeps its input only, its forward runs again
    apply_recompute(model, "selective")       # every block keeps its matmul, attention and tp-collective outputs
    apply_recompute(stage, "full", names=[n for n, _ in recompute_units(model)])   # a pipeline stage, by name

What ``Accelerator(recompute=...)``, ``convoy launch --recompute`` and ``CONVOY_RECOMPUTE`` turn on; each strategy
calls ``apply_recompute`` where it prepares the model: after tensor parallelism, before FSDP2 or DDP (torchtitan's
order: tp, activation checkpointing, data parallelism), and on each pipeline stage once it is built.

* ``"full"``: PyTorch's non-reentrant checkpointing of every block: its forward runs inside
  ``torch.utils.checkpoint.checkpoint``, the call torchtitan's and Accelerate's ``checkpoint_wrapper`` makes, so a
  recomputed block compiles with ``fullgraph=True`` (``convoy.train.parallel.compile``; the composable in-place
  ``checkpoint`` this replaced could not be compiled: its hooks hold a context manager dynamo cannot rebuild). The
  call is put on the block itself (its ``forward``), not around it as ``checkpoint_wrapper`` does, so parameter
  names, state dicts (convoy's and Accelerate's keys), optimizers built before ``prepare()`` and tp plans are
  unchanged.
* ``"selective"``: the same with per-op selective checkpointing (``create_selective_checkpoint_contexts``): the
  outputs of the ops in ``SELECTIVE_SAVES`` are kept (matrix multiplies, attention kernels and the collectives
  that end a tensor-parallel matmul), the rest (norms, activations, rotary, dropout, casts, and eager attention's
  s x s scores) is recomputed in the backward, so no GEMM runs twice. ``convoy.plan`` plans exactly this list
  (``convoy.plan.activations.block_selective``).

Blocks are the model's FSDP units: the entries of its ``nn.ModuleList``\\ s (or ``strategy_options["auto_wrap"]``'s
classes where a strategy reads it), outermost only. A transformers model checkpoints its own decoder layers
(``activation_checkpointing_enable``, non-reentrant, with the same save list), which also turns off its KV cache
while training, as a recomputed layer must not append to a cache twice. Dropout draws the same masks when
recomputed (the RNG state is kept), so training is bit for bit what it is without recomputation.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from convoy.errors import NotSupportedYetError, StrategyError

__all__ = ["MODES", "SELECTIVE_SAVES", "apply_recompute", "checkpoint_block", "recompute_units", "selective_saves",
           "checkpoints_itself", "refuse_recompute"]

#: the modes, as the settings key ``recompute`` takes them (``convoy.config.schema.RECOMPUTE_MODES``)
MODES = ("none", "selective", "full")
#: what ``"selective"`` keeps: the outputs of these ops (``aten`` and ``_c10d_functional`` overload packets; those a
#: torch build lacks are skipped). Matrix multiplies as autograd runs ``nn.Linear``, ``Conv1D`` and ``@``; every fused
#: attention kernel of ``F.scaled_dot_product_attention``; the all-reduce and reduce-scatter that end a
#: row-parallel matmul under tensor parallelism, so that the backward never communicates to recompute.
SELECTIVE_SAVES = (
    "aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm", "aten._scaled_mm",
    "aten._scaled_dot_product_flash_attention", "aten._scaled_dot_product_flash_attention_for_cpu",
    "aten._scaled_dot_product_efficient_attention", "aten._scaled_dot_product_cudnn_attention",
    "aten._scaled_dot_product_fused_attention_overrideable", "aten._flash_attention_forward",
    "aten._efficient_attention_forward",
    "_c10d_functional.all_reduce", "_c10d_functional.reduce_scatter_tensor",
)


@functools.cache
def selective_saves() -> frozenset:
    """The ``OpOverload``\\ s of ``SELECTIVE_SAVES`` this torch has (every overload of each)."""
    found: set[Any] = set()  # OpOverloads
    for name in SELECTIVE_SAVES:
        namespace, _, op = name.partition(".")
        packet = getattr(getattr(torch.ops, namespace), op, None)
        if packet is None:
            continue
        found.update(getattr(packet, overload) for overload in packet.overloads())
    return frozenset(found)


def _scores(func: Any, args: tuple) -> bool:
    """True for a batched matmul whose output is larger than both its operands: eager attention's s x s scores
    (QK^T), which ``"selective"`` recomputes as Korthikanti et al. 2022 do, where the AV product (s x d) is kept.
    The output's size is read off the operands' shapes (``(b, n, k) @ (b, k, m)`` gives ``b n m``): the policy
    runs before the op, and torch before 2.12 gives it no output."""
    name = getattr(func, "__name__", "")
    if not name.startswith(("bmm", "baddbmm")):
        return False
    left, right = args[1:3] if name.startswith("baddbmm") else args[:2]
    if not all(isinstance(t, torch.Tensor) and t.dim() == 3 for t in (left, right)):
        return False
    output = left.shape[0] * left.shape[1] * right.shape[2]
    return output > left.numel() and output > right.numel()


def _policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    if func in selective_saves() and not _scores(func, args):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts() -> tuple[Any, Any]:
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_policy)


def recompute_units(module: nn.Module, classes: Iterable[type] | None = None) -> list[tuple[str, nn.Module]]:
    """(name, block) for each block of ``module``, in model order: instances of ``classes`` if given, else the
    entries of every ``nn.ModuleList`` (FSDP's units, ``convoy.train.strategies.fsdp.shard_units``), the
    outermost only (a block's own list of experts is recomputed with it). A model without such a list whose blocks
    are entries of an ``nn.Sequential`` (the model itself, else the outermost ones): the entries of a type that
    repeats and holds parameters (``Sequential(Embedding, Block, Block, Linear)``: the two ``Block``)."""
    wanted: tuple[type[Any], ...] | None = tuple(classes) if classes else None
    found = _units(module, wanted)
    if wanted is None and not found:
        found = _sequential_units(module)
    return found


def _sequential_units(module: nn.Module) -> list[tuple[str, nn.Module]]:
    found: list[tuple[str, nn.Module]] = []
    inside: set[int] = set()
    for name, child in module.named_modules():
        if id(child) in inside or not isinstance(child, nn.Sequential):
            continue
        entries = [(key, entry) for key, entry in child.named_children()
                   if any(True for _ in entry.parameters())]
        counts = Counter(type(entry) for _, entry in entries)
        take = [(f"{name}.{key}" if name else key, entry) for key, entry in entries if counts[type(entry)] > 1]
        if take:
            inside.update(id(m) for m in child.modules())
            found.extend(take)
    return found


def _units(module: nn.Module, wanted: tuple[type[Any], ...] | None) -> list[tuple[str, nn.Module]]:
    found: list[tuple[str, nn.Module]] = []
    inside: set[int] = set()
    for name, child in module.named_modules():
        if id(child) in inside or child is module:
            continue
        take: list[tuple[str, nn.Module]]
        if wanted is not None:
            take = [(name, child)] if isinstance(child, wanted) else []
        elif isinstance(child, nn.ModuleList):
            take = [(f"{name}.{key}", entry) for key, entry in child.named_children()]
        else:
            take = []
        for _, block in take:
            inside.update(id(m) for m in block.modules())
        found.extend(take)
    return found


def apply_recompute(module: nn.Module, mode: str, *, classes: Iterable[type] | None = None,
                    names: Sequence[str] | None = None, named: str = "the model") -> int:
    """Checkpoint the blocks of ``module`` in place for ``mode`` (``"none"``: nothing) and return how many.

    ``names``: the blocks' names (in a pipeline stage, which keeps the model's names but not its lists), else
    ``recompute_units(module, classes)``. ``StrategyError`` when a model that trains has no block (its
    forward would be recomputed whole, which saves nothing), or already checkpoints its layers itself
    (transformers' ``gradient_checkpointing_enable()``); ``named`` says which model in the message."""
    if mode not in MODES:
        raise StrategyError(f"recompute={mode!r} is not one of {', '.join(MODES)}")
    if mode == "none" or not any(p.requires_grad for p in module.parameters()):
        return 0  # no backward to save memory for (a frozen teacher, an EMA copy)
    if checkpoints_itself(module):
        raise StrategyError(f"recompute={mode!r}: {named} already checkpoints its layers (transformers' "
                            "gradient_checkpointing_enable()); use one of the two: recompute='full' does the same")
    if names is None and getattr(module, "supports_gradient_checkpointing", False) and hasattr(
            module, "gradient_checkpointing_enable"):
        return _transformers_layers(module, mode)
    if names is not None:
        present = dict(module.named_modules())
        blocks = [(name, present[name]) for name in names if name in present]
    else:
        blocks = recompute_units(module, classes)
    if not blocks and names is None:
        raise StrategyError(f"recompute={mode!r}: {type(module).__name__} has no blocks to checkpoint (convoy "
                            "checkpoints the entries of its nn.ModuleLists, as FSDP shards them, or the repeated "
                            "entries of an nn.Sequential); hold the blocks in an nn.ModuleList, or use "
                            "recompute='none'")
    for _, block in blocks:
        checkpoint_block(block, mode)
    return len(blocks)


def checkpoint_block(block: nn.Module, mode: str) -> None:
    """Run ``block``'s forward inside ``torch.utils.checkpoint.checkpoint`` (non-reentrant; per-op selective for
    ``"selective"``), in place: what ``checkpoint_wrapper(block, context_fn=...)`` runs, without the wrapper module
    that would rename every parameter (``layers.0._checkpoint_wrapped_module.attn.weight``)."""
    if isinstance(block.__dict__.get("forward"), _Checkpointed):
        return  # checkpointed already (a pipeline stage that holds the model's block)
    context_fn = _selective_contexts if mode == "selective" else None
    block.forward = _Checkpointed(block.forward, context_fn)


class _Checkpointed:
    """A block's forward run through ``torch.utils.checkpoint.checkpoint``; torch.compile traces it (as the
    ``tag_activation_checkpoint`` higher-order op) into the block's graph."""

    def __init__(self, forward: Any, context_fn: Any) -> None:
        self.forward = forward
        self.context_fn = context_fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from torch.utils.checkpoint import checkpoint

        if self.context_fn is None:
            return checkpoint(self.forward, *args, use_reentrant=False, **kwargs)
        return checkpoint(self.forward, *args, use_reentrant=False, context_fn=self.context_fn, **kwargs)


def checkpoints_itself(module: nn.Module) -> bool:
    """A transformers model whose gradient checkpointing is on (``is_activation_checkpointing``, earlier
    ``is_gradient_checkpointing``)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if isinstance(getattr(type(module), name, None), property):
            return getattr(module, name) is True
    return False


def _transformers_layers(model: nn.Module, mode: str) -> int:
    """A transformers model checkpoints its own decoder layers (``gradient_checkpointing_enable``): it checkpoints
    each layer's ``forward``, inside FSDP2's hooks, and turns the KV cache off while it trains, which a layer
    recomputed with a cache would append to twice. Non-reentrant, with the save list for ``"selective"``."""
    kwargs: dict[str, Any] = {"use_reentrant": False}
    if mode == "selective":
        kwargs["context_fn"] = _selective_contexts
    if hasattr(model, "activation_checkpointing_enable"):  # transformers 5's name; the old one warns there
        model.activation_checkpointing_enable(  # type: ignore[operator]  # transformers' method, not a submodule
            activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(  # type: ignore[operator]  # transformers' method, not a submodule
            gradient_checkpointing_kwargs=kwargs)
    on = [m for m in model.modules() if m is not model and getattr(m, "gradient_checkpointing", False) is True]
    return sum(1 for m in on if not any(getattr(c, "gradient_checkpointing", False) is True  # the layers, not the
                                        for c in m.modules() if c is not m))               # base model above them


def refuse_recompute(mode: str, strategy: str, why: str) -> None:
    """``NotSupportedYetError`` for a strategy that cannot recompute yet (``mode`` other than none)."""
    if mode != "none":
        raise NotSupportedYetError(f"recompute={mode!r} with strategy={strategy!r} is not supported yet ({why}); "
                                   "use recompute='none'")
