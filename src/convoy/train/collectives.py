"""Collectives over nested data (tensors inside dicts, lists, tuples), as the Accelerator exposes them.

    gather(torch.tensor([rank]))                 # -> tensor([0, 1]) on every rank
    pad_across_processes(t, dim=0)               # pad to the longest t of any rank
    reduce(t, "mean"); broadcast(t, src=0)

Every function is a no-op copy when no process group is running (one process).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from convoy.errors import ConfigError, DistributedOperationError

__all__ = ["is_distributed", "gather", "gather_object", "pad_across_processes", "reduce", "broadcast",
           "broadcast_object", "truncate", "map_tensors", "all_tensors", "split"]


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def map_tensors(fn: Callable[[torch.Tensor], Any], data: Any) -> Any:
    """Apply ``fn`` to every tensor in ``data``, keeping the container structure."""

    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, dict):
        return type(data)({k: map_tensors(fn, v) for k, v in data.items()})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(map_tensors(fn, v) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(map_tensors(fn, v) for v in data)
    return data


def all_tensors(data: Any) -> bool:
    """``data`` is a tensor, or a non-empty nest of dicts/lists/tuples holding only tensors."""

    if isinstance(data, torch.Tensor):
        return True
    if isinstance(data, dict):
        return all(all_tensors(v) for v in data.values())
    if isinstance(data, (list, tuple)):
        return len(data) > 0 and all(all_tensors(v) for v in data)
    return False


def split(inputs: Any, n: int, index: int, pad: bool) -> Any:
    """Process ``index``'s contiguous share (of ``n``) of a list, tuple, tensor or dict of them; ``pad``
    repeats the last item so every share has the same length."""
    if isinstance(inputs, dict):
        return {k: split(v, n, index, pad) for k, v in inputs.items()}
    length = len(inputs)
    base, extra = divmod(length, n)
    start = index * base + min(index, extra)
    end = start + base + (1 if index < extra else 0)
    part = inputs[start:end]
    if pad and extra and index >= extra:
        last = inputs[-1:]
        if isinstance(part, (list, tuple)):
            part = part + last
        else:
            part = torch.cat([part, last])
    return part


def _gather_one(tensor: torch.Tensor) -> torch.Tensor:
    if tensor.ndim == 0:
        tensor = tensor.reshape(1)
    tensor = tensor.contiguous()
    sizes = [None] * dist.get_world_size()
    dist.all_gather_object(sizes, tuple(tensor.shape))
    if len(set(sizes)) > 1:
        raise ConfigError(f"gather() needs the same shape on every process, got {sizes}; call "
                          "pad_across_processes() first, or use gather_for_metrics()")
    parts = [torch.empty_like(tensor) for _ in sizes]
    dist.all_gather(parts, tensor)
    return torch.cat(parts, dim=0)


def gather(data: Any) -> Any:
    """Concatenate every process's tensors along the first dimension (scalars become 1-d)."""
    if not is_distributed():
        return map_tensors(lambda t: t.reshape(1) if t.ndim == 0 else t, data)
    return map_tensors(_gather_one, data)


def gather_object(obj: Any) -> list[Any]:
    """Every process's picklable ``obj``: lists, tuples and dicts (their keys, as Accelerate) are concatenated
    in rank order; other objects are collected in a list."""

    if not is_distributed():
        return list(obj) if isinstance(obj, (list, tuple, dict)) else [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    if all(isinstance(o, (list, tuple, dict)) for o in out):
        return [item for o in out for item in o]
    return out


def truncate(data: Any, length: int) -> Any:
    """Keep the first ``length`` rows of every tensor (list) in ``data``."""
    if isinstance(data, list) and not any(hasattr(x, "shape") for x in data[:1]):
        return data[:length]
    return map_tensors(lambda t: t[:length], data)


def pad_across_processes(data: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
    """Pad each tensor along ``dim`` to the largest size any process has there."""

    def pad(tensor: torch.Tensor) -> torch.Tensor:
        # one all-gather of (ndim, size along dim): ranks whose tensors differ in ndim get one clear error
        mine = torch.tensor([tensor.ndim, tensor.shape[dim] if dim < tensor.ndim else -1], dtype=torch.long,
                            device=tensor.device)  # nccl needs CUDA tensors
        every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
        dist.all_gather(every, mine)
        ndims = [int(t[0]) for t in every]
        if len(set(ndims)) > 1:
            raise DistributedOperationError(
                f"pad_across_processes: the processes passed tensors with different numbers of dimensions "
                f"({', '.join(f'process {i}: {n}' for i, n in enumerate(ndims))}); pass tensors with the same "
                "number of dimensions, differing only along dim")
        if tensor.ndim == 0 or dim >= tensor.ndim:
            return tensor
        longest = max(int(t[1]) for t in every)
        if longest == tensor.shape[dim]:
            return tensor
        shape = list(tensor.shape)
        shape[dim] = longest
        out = tensor.new_full(shape, pad_index)
        index = [slice(None)] * tensor.ndim
        length = tensor.shape[dim]
        index[dim] = slice(longest - length, longest) if pad_first else slice(0, length)
        out[tuple(index)] = tensor
        return out

    if not is_distributed():
        return data
    return map_tensors(pad, data)


#: the reductions ``reduce`` takes (Accelerate's names)
REDUCTIONS = ("sum", "mean", "max", "min", "none")


def reduce(data: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
    """All-reduce copies of the tensors: ``"sum"``, ``"mean"``, ``"max"``, ``"min"`` or ``"none"``; the result
    times ``scale``."""

    ops = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
    if reduction not in REDUCTIONS:
        raise ConfigError(f"reduction={reduction!r} is not supported; choose one of {', '.join(REDUCTIONS)}")

    def one(tensor: torch.Tensor) -> torch.Tensor:
        out = tensor.clone()
        if reduction != "none" and is_distributed():
            dist.all_reduce(out, op=ops[reduction])
            if reduction == "mean":
                out = out / dist.get_world_size()
        return out * scale if scale != 1.0 else out

    return map_tensors(one, data)


def broadcast(data: Any, src: int = 0) -> Any:
    """Every tensor replaced (in place) by process ``src``'s; returns ``data``."""

    if not is_distributed():
        return data

    def one(tensor: torch.Tensor) -> torch.Tensor:
        dist.broadcast(tensor, src=src)
        return tensor

    return map_tensors(one, data)


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Process ``src``'s picklable ``obj`` on every process."""

    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
