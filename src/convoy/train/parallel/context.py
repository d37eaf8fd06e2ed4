"""Context parallelism: each sequence split over the cp ranks, attention computed as torch's ring.

    from convoy.train.parallel.context import context_parallel, ring_attention
    with context_parallel(pm.cp, buffers=[ids, labels], buffer_seq_dims=[1, 1], rotate="allgather"):
        loss = loss_fn(model(ids), labels)     # ids, labels: this rank's part of each sequence
        loss.backward()                        # F.scaled_dot_product_attention ran as ring attention

``accelerator.maybe_context_parallel(...)`` calls this with the job's cp mesh. Inside, the buffers are this rank's
part of the sequence (in place, head-tail load balanced: with cp ranks the sequence is cut into 2 x cp chunks and
rank r keeps chunks r and 2cp-1-r, so every rank does the same causal work), and
``torch.nn.functional.scaled_dot_product_attention`` is replaced by ``ring_attention``; both are restored on
exit. The ring is torch's own (``_templated_ring_attention`` and its backward, private torch API that torchtitan
depends on too), driven here through an ``autograd.Function`` with the SDPA kernel of the device: the CPU flash
kernel on CPU (which torch's public ``context_parallel`` does not map), flash (16-bit) or memory-efficient
attention on CUDA. K/V blocks rotate by ``allgather`` (default) or ``alltoall``.

What the ring cannot express is refused in one line naming the layer, never replaced: an ``attn_mask`` tensor
(padding, sliding window, chunked or packed-document masks), dropout in attention, a query shorter than its keys
(a KV cache), and a forward of the model that ran no ``scaled_dot_product_attention`` at all (eager attention,
which would see only this rank's keys).
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor.experimental._context_parallel import _attention as cp_attention
from torch.distributed.tensor.experimental._context_parallel._load_balancer import _HeadTailLoadBalancer

from convoy.errors import ConfigError, NotSupportedYetError, shown

__all__ = ["ROTATIONS", "context_parallel", "ring_attention"]

#: how K/V blocks travel around the ring (torch's ``set_rotate_method`` names)
ROTATIONS = ("allgather", "alltoall")
_ROTATE = {"allgather": cp_attention._RotateMethod.ALL_GATHER, "alltoall": cp_attention._RotateMethod.ALL_TO_ALL}
_SEQ_DIM = 2  # (batch, heads, sequence, head_dim): SDPA's layout
_aten = torch.ops.aten


@contextlib.contextmanager
def _ring_options(rotate: str, balanced: bool) -> Iterator[None]:
    """torch's ring reads its options from a module global: set them for one call, then put them back."""
    options = cp_attention._cp_options
    saved = (options.rotate_method, options.enable_load_balance)
    options.rotate_method, options.enable_load_balance = _ROTATE[rotate], balanced
    try:
        yield
    finally:
        options.rotate_method, options.enable_load_balance = saved


def _kernel(query: torch.Tensor) -> str:
    if query.device.type == "cpu":
        return "cpu_flash"
    return "flash" if query.dtype in (torch.float16, torch.bfloat16) else "efficient"


def _forward(kernel: str, group: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool,
             scale: float | None) -> tuple[torch.Tensor, ...]:
    """(out, logsumexp, *what the kernel's backward needs)."""
    ring = functools.partial(cp_attention._templated_ring_attention, group, _SEQ_DIM)
    if kernel == "cpu_flash":
        return ring(_aten._scaled_dot_product_flash_attention_for_cpu, q, k, v, is_causal=is_causal, dropout_p=0.0,
                    scale=scale)
    if kernel == "flash":
        return ring(_aten._scaled_dot_product_flash_attention, q, k, v, is_causal=is_causal, dropout_p=0.0,
                    scale=scale)
    return ring(_aten._scaled_dot_product_efficient_attention, q, k, v, is_causal=is_causal, attn_bias=None,
                compute_log_sumexp=True, dropout_p=0.0, scale=scale)


def _backward(kernel: str, group: Any, grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              out: torch.Tensor, lse: torch.Tensor, rest: Sequence[Any], *, is_causal: bool,
              scale: float | None) -> tuple[torch.Tensor, ...]:
    ring = functools.partial(cp_attention._templated_ring_attention_backward, group, _SEQ_DIM)
    common: dict[str, Any] = {"query": q, "key": k, "value": v, "out": out, "logsumexp": lse, "is_causal": is_causal,
              "dropout_p": 0.0, "scale": scale}
    if kernel == "cpu_flash":
        return ring(_aten._scaled_dot_product_flash_attention_for_cpu_backward.default, grad_out=grad,
                    grad_out_name="grad_out", **common)
    if kernel == "flash":
        cum_q, cum_k, max_q, max_k, seed, offset = rest[:6]
        return ring(_aten._scaled_dot_product_flash_attention_backward.default, grad_out=grad,
                    grad_out_name="grad_out", cum_seq_q=cum_q, cum_seq_k=cum_k, max_q=max_q, max_k=max_k,
                    philox_seed=seed, philox_offset=offset, **common)
    seed, offset = rest[:2]
    return ring(_aten._scaled_dot_product_efficient_attention_backward.default, grad_out=grad,
                grad_out_name="grad_out_", attn_bias=None, philox_seed=seed, philox_offset=offset,
                grad_input_mask=(True, True, True, False), **common)


class _RingAttention(torch.autograd.Function):
    """Ring attention forward and backward over ``group``; the options are fixed at forward time, so a backward
    that runs after the context has closed rotates as its forward did."""

    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, group: Any, is_causal: bool,
                scale: float | None, rotate: str, balanced: bool) -> torch.Tensor:
        kernel = _kernel(query)
        with _ring_options(rotate, balanced):
            out, lse, *rest = _forward(kernel, group, query, key, value, is_causal=is_causal, scale=scale)
        out = out.to(query.dtype)
        ctx.save_for_backward(query, key, value, out, lse)
        ctx.rest, ctx.kernel, ctx.group, ctx.is_causal = rest, kernel, group, is_causal
        ctx.scale, ctx.rotate, ctx.balanced = scale, rotate, balanced
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        query, key, value, out, lse = ctx.saved_tensors
        with _ring_options(ctx.rotate, ctx.balanced):
            dq, dk, dv, *_ = _backward(ctx.kernel, ctx.group, grad.contiguous(), query, key, value, out, lse,
                                       ctx.rest, is_causal=ctx.is_causal, scale=ctx.scale)
        return dq, dk, dv, None, None, None, None, None


def ring_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *, group: Any,
                   is_causal: bool = False, scale: float | None = None, rotate: str = "allgather",
                   balanced: bool = True) -> torch.Tensor:
    """Attention of this rank's queries over the whole sequence's keys, each rank holding its part of q, k, v
    (``[batch, heads, local_seq, head_dim]``). ``balanced``: the parts are head-tail chunks (``context_parallel``'s
    split), else contiguous blocks in rank order. Non-causal attention does not depend on the order of the keys,
    so it runs unbalanced over either split."""
    if rotate not in ROTATIONS:
        raise ConfigError(f"cp_comm_strategy={shown(rotate)}: choose one of {', '.join(ROTATIONS)}")
    out = _RingAttention.apply(query, key, value, group, is_causal, scale, rotate, balanced and is_causal)
    return out


class _CallSite:
    """Which module of the prepared models is running (for the refusals' messages), and whether any ran."""

    def __init__(self, models: Iterable[nn.Module]) -> None:
        self.names: dict[int, str] = {}
        self.roots: dict[int, nn.Module] = {}
        for model in models:
            self.roots[id(model)] = model
            for name, module in model.named_modules():
                self.names.setdefault(id(module), name or type(module).__name__)
        self.stack: list[str] = []
        self.ran_model = False
        self.attention_calls = 0

    def push(self, module: nn.Module, args: Any) -> None:
        name = self.names.get(id(module))
        if name is not None:
            self.stack.append(name)
            self.ran_model = True

    def pop(self, module: nn.Module, args: Any, output: Any) -> None:
        if id(module) in self.names and self.stack:
            self.stack.pop()

    def layer(self) -> str:
        return self.stack[-1] if self.stack else "a call outside the prepared models"

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        handles = [register_module_forward_pre_hook(self.push),
                   register_module_forward_hook(self.pop, always_call=True)]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


def _attention_under_cp(site: _CallSite, group: Any, rotate: str, balanced: bool) -> Any:
    """``F.scaled_dot_product_attention`` as the ring, for what the ring can compute; one line refusing the rest."""

    def sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: torch.Tensor | None = None,
             dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
             enable_gqa: bool = False) -> torch.Tensor:
        layer = site.layer()
        if attn_mask is not None:
            raise NotSupportedYetError(
                f"context parallel: {layer} calls scaled_dot_product_attention with an attn_mask "
                f"({tuple(attn_mask.shape)} {attn_mask.dtype}); the ring runs only causal (is_causal=True) or unmasked "
                f"attention, and a padding, sliding-window, chunked or packed-document mask is not supported yet")
        if dropout_p and torch.is_grad_enabled():
            raise NotSupportedYetError(f"context parallel: {layer} uses attention dropout (dropout_p={dropout_p}); "
                                       f"it is not supported yet under cp; set the attention dropout to 0")
        if query.size(-2) != key.size(-2):
            raise NotSupportedYetError(f"context parallel: {layer} attends {query.size(-2)} queries over "
                                       f"{key.size(-2)} keys (a KV cache); cp splits self-attention of one sequence")
        if enable_gqa and key.size(-3) != query.size(-3):  # grouped K/V heads: repeated, as SDPA's math path does
            repeat = query.size(-3) // key.size(-3)
            key, value = key.repeat_interleave(repeat, dim=-3), value.repeat_interleave(repeat, dim=-3)
        site.attention_calls += 1
        return ring_attention(query, key, value, group=group, is_causal=is_causal, scale=scale, rotate=rotate,
                              balanced=balanced)

    return sdpa


def _is_transformers_model(module: nn.Module) -> bool:
    transformers = sys.modules.get("transformers")
    return transformers is not None and isinstance(module, transformers.PreTrainedModel)


@dataclass(frozen=True)
class _BufferFacts:
    """What the refusals read of each buffer before the split, so that every rank of the ring (which holds
    the same samples) refuses alike: a refusal on one rank alone would leave the others waiting in the ring."""

    all_set: tuple[bool, ...]
    """No zero anywhere (an attention mask without padding)."""
    plain_positions: tuple[bool, ...]
    """``0 .. seq-1`` along the sequence in every row (position ids of one document per row)."""

    @classmethod
    def of(cls, buffers: Sequence[torch.Tensor], seq_dims: Sequence[int], seq: int) -> _BufferFacts:
        def plain(buffer: torch.Tensor, dim: int) -> bool:
            if buffer.is_floating_point() or buffer.dtype == torch.bool or dim % buffer.dim() != buffer.dim() - 1:
                return False
            return torch.equal(buffer, torch.arange(seq, device=buffer.device).to(buffer.dtype).expand_as(buffer))

        return cls(all_set=tuple(bool(b.ne(0).all()) for b in buffers),
                   plain_positions=tuple(plain(b, d) for b, d in zip(buffers, seq_dims)))


def _index(buffers: Sequence[torch.Tensor], value: Any) -> int | None:
    return next((i for i, b in enumerate(buffers) if value is b), None)


def _check_call(buffers: Sequence[torch.Tensor], facts: _BufferFacts, module: nn.Module, args: Any,
                kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]] | None:
    """What a prepared model's call under cp must give, refused in one line when it is missing; for a transformers
    model whose positions are one plain sequence, the all-ones ``attention_mask`` that tells it so.

    - ``labels=``: a causal LM shifts them inside, after the split, pairing each chunk's last token with the
      wrong target; ``shift_labels`` (shifted before the split) must be given with them.
    - a transformers model: ``position_ids`` among the buffers (else it numbers each rank's part from 0). Under the
      head-tail split they jump, which transformers reads as packed documents and masks as such; when they are
      this rank's part of ``0 .. seq-1`` (one document per row), the all-ones mask says so and SDPA runs causal.
      Positions that restart inside a row (really packed documents) are refused: the ring cannot keep them apart.
    """
    name = type(module).__name__
    labels = kwargs.get("labels")
    if isinstance(labels, torch.Tensor) and any(labels is b for b in buffers) and "shift_labels" not in kwargs:
        raise NotSupportedYetError(
            f"context parallel: {name}(labels=...) shifts the labels after they were split along the sequence, so "
            f"each chunk's last token gets the wrong target; shift them before the split: shift_labels = "
            f"F.pad(labels, (0, 1), value=-100)[..., 1:], put shift_labels in buffers and pass labels=shift_labels, "
            f"shift_labels=shift_labels")
    if not _is_transformers_model(module):
        return None
    implementation = getattr(module.config, "_attn_implementation", None)
    if implementation != "sdpa":
        raise NotSupportedYetError(
            f"context parallel: {name} runs attn_implementation={implementation!r}; the ring replaces SDPA only, so "
            f"load it with attn_implementation='sdpa'")
    position_ids = kwargs.get("position_ids")
    where = _index(buffers, position_ids)
    if not isinstance(position_ids, torch.Tensor) or where is None:
        raise NotSupportedYetError(
            f"context parallel: {name} was called without position_ids among the split buffers, so it would number "
            f"each rank's part of the sequence from 0; pass position_ids=torch.arange(seq).expand(batch, seq) and "
            f"put it in buffers")
    if not facts.plain_positions[where]:
        raise NotSupportedYetError(
            f"context parallel: {name}'s position_ids restart inside a sequence (packed documents); the ring attends "
            f"over the whole sequence, so documents would see each other; packing is not supported yet under cp")
    mask = kwargs.get("attention_mask")
    if isinstance(mask, torch.Tensor):
        index = _index(buffers, mask)
        if index is None or not facts.all_set[index]:
            raise NotSupportedYetError(
                f"context parallel: {name}'s attention_mask " + ("masks padding" if index is not None else
                                                                 "is not among the split buffers")
                + "; the ring runs only causal attention over whole sequences, so padding is not supported yet "
                  "under cp (pack without padding, or leave attention_mask out)")
    if mask is None:
        ids = kwargs.get("input_ids")
        shape = ids.shape[:2] if isinstance(ids, torch.Tensor) else position_ids.shape
        kwargs["attention_mask"] = torch.ones(shape, dtype=torch.long, device=position_ids.device)
    return args, kwargs


def _check_buffers(buffers: Sequence[torch.Tensor], seq_dims: Sequence[int], no_restore: Iterable[torch.Tensor],
                   cp: int, balanced: bool) -> int:
    """The sequence length the buffers share, or ``ConfigError`` naming what is wrong."""
    if len(buffers) != len(seq_dims):
        raise ConfigError(f"maybe_context_parallel: {len(buffers)} buffers but {len(seq_dims)} buffer_seq_dims; "
                          f"give one sequence dimension per buffer")
    if not buffers:
        raise ConfigError("maybe_context_parallel: no buffers; give the inputs (and labels) to split along the "
                          "sequence, e.g. buffers=[input_ids, shift_labels], buffer_seq_dims=[1, 1]")
    for i, (buffer, dim) in enumerate(zip(buffers, seq_dims)):
        if not isinstance(buffer, torch.Tensor) or isinstance(buffer, nn.Parameter):
            raise ConfigError(f"maybe_context_parallel: buffers[{i}] is {type(buffer).__name__}; give tensors "
                              f"(inputs, labels, positions), not parameters")
        if not isinstance(dim, int) or not -buffer.dim() <= dim < buffer.dim():
            raise ConfigError(f"maybe_context_parallel: buffer_seq_dims[{i}]={shown(dim)} is not a dimension of "
                              f"a tensor of shape {tuple(buffer.shape)}")
    lengths = {buffer.size(dim) for buffer, dim in zip(buffers, seq_dims)}
    if len(lengths) != 1:
        raise ConfigError(f"maybe_context_parallel: the buffers' sequence lengths differ ({sorted(lengths)}); "
                          f"split buffers of one sequence")
    for buffer in no_restore:
        if not any(buffer is b for b in buffers):
            raise ConfigError("maybe_context_parallel: no_restore_buffers must be a subset of buffers")
    seq = lengths.pop()
    chunks = 2 * cp if balanced else cp
    if seq % chunks:
        raise ConfigError(f"maybe_context_parallel: sequence length {seq} does not split into {chunks} equal chunks "
                          f"(cp={cp}{', head-tail balanced' if balanced else ''}); pad it to a multiple of {chunks}")
    return seq


def _shard(mesh: Any, buffers: Sequence[torch.Tensor], seq_dims: Sequence[int], seq: int,
           balanced: bool) -> list[torch.Tensor]:
    """This rank's part of each buffer (torch's ``_context_parallel_shard``: plain indexing, no communication)."""
    balancer = _HeadTailLoadBalancer(seq, mesh.size(), buffers[0].device) if balanced else None
    saved = (cp_attention._dispatch_mode, cp_attention._cp_options.enable_load_balance)
    try:  # the helper sets torch's module globals for its own dispatcher, which convoy does not use
        dims = [d % b.dim() for b, d in zip(buffers, seq_dims)]
        parts = cp_attention._context_parallel_shard(mesh, list(buffers), dims, load_balancer=balancer)
        return [part for part in parts if isinstance(part, torch.Tensor)]
    finally:
        cp_attention._dispatch_mode, cp_attention._cp_options.enable_load_balance = saved


@contextlib.contextmanager
def context_parallel(mesh: Any, *, buffers: Sequence[torch.Tensor], buffer_seq_dims: Sequence[int],
                     no_restore_buffers: Iterable[torch.Tensor] | None = None, rotate: str = "allgather",
                     balanced: bool = True, models: Iterable[nn.Module] = ()) -> Iterator[None]:
    """Split ``buffers`` along their sequence dimensions in place (restored on exit but for ``no_restore_buffers``)
    and run ``F.scaled_dot_product_attention`` as ring attention over ``mesh`` (the cp sub-mesh) while inside.
    ``models``: the prepared models, whose module names the refusals give (and whose forward must call SDPA)."""
    if rotate not in ROTATIONS:
        raise ConfigError(f"cp_comm_strategy={shown(rotate)}: choose one of {', '.join(ROTATIONS)}")
    if getattr(F.scaled_dot_product_attention, "_convoy_cp", False):
        raise ConfigError("maybe_context_parallel: already inside one; each step opens one context")
    no_restore = list(no_restore_buffers or ())
    seq = _check_buffers(buffers, buffer_seq_dims, no_restore, mesh.size(), balanced)
    originals = [None if any(buffer is b for b in no_restore) else buffer.clone() for buffer in buffers]
    facts = _BufferFacts.of(buffers, buffer_seq_dims, seq)  # read whole, so every cp rank decides alike
    for buffer, part in zip(buffers, _shard(mesh, buffers, buffer_seq_dims, seq, balanced)):
        part = part.clone()
        buffer.resize_(part.shape)
        buffer.copy_(part)
    site = _CallSite(models)
    check = functools.partial(_check_call, buffers, facts)
    hooks = [model.register_forward_pre_hook(check, with_kwargs=True) for model in site.roots.values()]
    sdpa = _attention_under_cp(site, mesh.get_group(), rotate, balanced)
    sdpa._convoy_cp = True
    original_sdpa = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = sdpa
    ok = False
    try:
        with site.watching():
            yield
        ok = True
    finally:
        F.scaled_dot_product_attention = original_sdpa
        for hook in hooks:
            hook.remove()
        for buffer, original in zip(buffers, originals):
            if original is not None:
                buffer.resize_(original.shape)
                buffer.copy_(original)
    if ok and site.ran_model and not site.attention_calls:
        raise NotSupportedYetError(
            "context parallel: the model ran without calling torch.nn.functional.scaled_dot_product_attention, so "
            "its attention saw only this rank's part of the sequence; use SDPA attention (transformers: "
            "attn_implementation='sdpa'); eager and flex attention are not supported yet under cp")
