"""Accelerate's free operations (``accelerate.utils``), with its signatures and defaults, on convoy's
process group: ``convoy.gather``, ``convoy.reduce``, ``convoy.set_seed``, ...

    from convoy import gather, reduce, broadcast, pad_across_processes, set_seed
    set_seed(42)                                 # python, numpy and torch on this process
    total = reduce(loss, "mean")                 # Accelerate's default reduction is "mean"
    padded = pad_across_processes(t, dim=1)      # ranks whose tensors differ in ndim: DistributedOperationError

Each works on nested dicts/lists/tuples of tensors and is a copy (or no-op) with one process. With
``PartialState().debug = True`` (Accelerate's ``ACCELERATE_DEBUG_MODE``), ``reduce`` and ``broadcast`` first
check that every process passes tensors of the same shapes, and raise ``DistributedOperationError``
naming them; ``pad_across_processes`` always checks the number of dimensions.
"""

from __future__ import annotations

import random
from typing import Any, cast

import torch
import torch.distributed as dist

from convoy.errors import ConfigError, DistributedOperationError
from convoy.train import collectives
from convoy.train.logging import process_rank

__all__ = ["set_seed", "synchronize_rng_states", "gather", "gather_object", "broadcast", "broadcast_object_list",
           "reduce", "pad_across_processes", "send_to_device", "copy_tensor_to_devices",
           "DistributedOperationException"]

#: Accelerate's name of the error its operations raise on mismatched shapes.
DistributedOperationException = DistributedOperationError

REDUCTIONS = collectives.REDUCTIONS


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed ``random``, numpy and torch (all devices); ``device_specific`` adds the process index."""
    import numpy as np

    if device_specific:
        seed += process_rank()  # the process group's rank, else RANK
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device
    if deterministic:
        torch.use_deterministic_algorithms(True)


def synchronize_rng_states(rng_types: list[str], generator: torch.Generator | None = None) -> None:
    """Give every process rank 0's random state for each of ``rng_types`` ("torch", "cuda", "generator")."""

    if not collectives.is_distributed():
        return
    for kind in rng_types:
        if kind == "torch":
            torch.set_rng_state(collectives.broadcast_object(torch.get_rng_state()))
        elif kind == "cuda":
            torch.cuda.set_rng_state(collectives.broadcast_object(torch.cuda.get_rng_state()))
        elif kind == "generator":
            if generator is None:
                raise ConfigError("synchronize_rng_states(['generator']) needs generator=<the torch.Generator>")
            generator.set_state(collectives.broadcast_object(generator.get_state()))
        else:
            raise ConfigError(f"synchronize_rng_states: unknown rng type {kind!r}; use 'torch', 'cuda' or 'generator'")


def gather(tensor: Any) -> Any:
    """Every process's tensors concatenated along the first dimension (scalars become 1-d)."""
    return collectives.gather(tensor)


def gather_object(obj: Any) -> Any:
    """Every process's picklable ``obj``: iterables (lists, tuples, dicts' keys) concatenated in rank order,
    as Accelerate does; other objects (convoy's extension) collected in a list."""
    return collectives.gather_object(obj)


def broadcast(tensor: Any, from_process: int = 0) -> Any:
    """Every tensor replaced (in place) by process ``from_process``'s; returns ``tensor``."""
    _check_same_shapes("broadcast", tensor)
    return collectives.broadcast(tensor, src=from_process)


def broadcast_object_list(object_list: list[Any], from_process: int = 0) -> list[Any]:
    """``object_list`` filled in place with process ``from_process``'s items; returns it."""
    if collectives.is_distributed():
        dist.broadcast_object_list(object_list, src=from_process)
    return object_list


def reduce(tensor: Any, reduction: str = "mean", scale: float = 1.0) -> Any:
    """All-reduced copies: ``"mean"`` (the default, as in Accelerate), ``"sum"``, ``"max"``, ``"min"`` or
    ``"none"``; the result times ``scale``."""
    if reduction not in REDUCTIONS:
        raise ConfigError(f"reduction={reduction!r} is not supported; choose one of {', '.join(REDUCTIONS)}")
    _check_same_shapes("reduce", tensor)
    return collectives.reduce(tensor, reduction=reduction, scale=scale)


def pad_across_processes(tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
    """Pad each tensor along ``dim`` to the largest size any process has there."""
    return collectives.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)


def send_to_device(tensor: Any, device: torch.device | str, non_blocking: bool = False,
                   skip_keys: list[str] | str | None = None) -> Any:
    """Move every tensor (and anything with ``.to``) in a nested structure to ``device``."""

    skip = {skip_keys} if isinstance(skip_keys, str) else set(skip_keys or ())
    if isinstance(tensor, dict):
        return type(tensor)({k: v if k in skip else send_to_device(v, device, non_blocking, skip_keys)
                             for k, v in tensor.items()})
    if isinstance(tensor, tuple) and hasattr(tensor, "_fields"):
        return type(tensor)(*(send_to_device(v, device, non_blocking, skip_keys) for v in tensor))
    if isinstance(tensor, (list, tuple)):
        return type(tensor)(send_to_device(v, device, non_blocking, skip_keys) for v in tensor)
    if isinstance(tensor, torch.Tensor) or hasattr(tensor, "to"):
        try:
            return tensor.to(device, non_blocking=non_blocking)
        except TypeError:
            return tensor.to(device)
    return tensor


def copy_tensor_to_devices(tensor: torch.Tensor | None = None) -> torch.Tensor:
    """Process 0's ``tensor`` on every process (the others pass ``None``), on each one's device."""

    from convoy.train.process_view import PartialState

    if not collectives.is_distributed():
        return cast(torch.Tensor, tensor)  # a lone process is process 0, which passes the tensor
    meta = collectives.broadcast_object((tuple(tensor.shape), tensor.dtype) if tensor is not None else None)
    out = tensor if tensor is not None else torch.empty(meta[0], dtype=meta[1], device=PartialState().device)
    return collectives.broadcast(out, src=0)


def _check_same_shapes(operation: str, data: Any) -> None:
    """With ``PartialState().debug``: every process passes tensors of the same shapes, or one clear error."""
    from convoy.train.process_view import PartialState

    if not (collectives.is_distributed() and PartialState._shared_state.get("debug")):
        return
    shapes = collectives.map_tensors(lambda t: tuple(t.shape), data)
    every = collectives.gather_object([shapes])
    if any(s != every[0] for s in every):
        raise DistributedOperationError(
            f"{operation}: the processes passed tensors of different shapes: "
            + "; ".join(f"process {i}: {s}" for i, s in enumerate(every))
            + f"; {operation} needs the same shapes on every process")
