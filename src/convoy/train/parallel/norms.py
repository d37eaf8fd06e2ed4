"""Gradient-norm clipping over parameters split by TP (DTensor), FSDP (DTensor) and pipeline stages.

    from convoy.train.parallel.norms import clip_grad_norm_
    total = clip_grad_norm_(model.parameters(), 1.0, pp_group=pp_mesh.get_group())
    total = clip_grad_norm_(params, 1.0, pp_group=group, skip=pipe.tied_norm_skip())   # tied copies counted once

``torch.nn.utils.clip_grad_norm_`` cannot stack DTensor norms with plain-tensor norms (a TP model keeps
its norms' weights plain) nor see the other pipeline stages. Here each gradient's norm is made whole with
``DTensor.full_tensor()`` (a scalar reduction), the norms are combined, and the stages' totals are
combined with one all-reduce over the pipeline group. A weight shared by several stages (a tied embedding and
head) has a copy on each with the same summed gradient: ``skip`` names the copies left out of the norm (and
still scaled), so that it counts once.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["total_grad_norm", "clip_grad_norm_"]


def total_grad_norm(parameters: Iterable[torch.Tensor], *, norm_type: float = 2.0, pp_group: Any = None,
                    skip: Collection[int] = ()) -> torch.Tensor:
    """The norm of every gradient of the model, over all its shards and stages (same on every rank); parameters
    whose ``id`` is in ``skip`` are not counted."""
    from torch.distributed.tensor import DTensor

    norm_type = float(norm_type)
    parameters = list(parameters)
    norms = []
    for p in parameters:
        if p.grad is None or id(p) in skip:
            continue
        n = torch.linalg.vector_norm(p.grad, norm_type)
        norms.append((n.full_tensor() if isinstance(n, DTensor) else n).float())
    # A stage without gradients still joins the pp all-reduce, with a zero on the device its peers use:
    # a CPU zero among CUDA tensors would go to another backend and never meet them.
    total = (torch.linalg.vector_norm(torch.stack(norms), norm_type) if norms
             else torch.zeros((), device=_device_of(parameters)))
    if pp_group is not None:
        if math.isinf(norm_type):
            dist.all_reduce(total, op=dist.ReduceOp.MAX, group=pp_group)
        else:
            total = total ** norm_type
            dist.all_reduce(total, group=pp_group)
            total = total ** (1.0 / norm_type)
    return total


def _device_of(parameters: list[torch.Tensor]) -> torch.device:
    if parameters:
        return parameters[0].device
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def clip_grad_norm_(parameters: Iterable[torch.Tensor], max_norm: float, *, norm_type: float = 2.0,
                    pp_group: Any = None, skip: Collection[int] = ()) -> torch.Tensor:
    """Scale gradients so that their total norm is at most ``max_norm``; return the norm before (``skip``: ids of
    parameters scaled but not counted, see the module docstring)."""
    params = [p for p in parameters if p.grad is not None]
    total = total_grad_norm(params, norm_type=norm_type, pp_group=pp_group, skip=skip)
    coef = min(1.0, float(max_norm) / (float(total) + 1e-6))
    if coef < 1.0:
        for p in params:
            assert p.grad is not None  # params holds those with a gradient
            p.grad.mul_(coef)
    return total
