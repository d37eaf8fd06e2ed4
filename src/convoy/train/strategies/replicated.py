"""Data parallelism as DDP means it (whole replicas, gradients all-reduced) for weights that are DTensors.

    from convoy.train.strategies.replicated import replicate_model
    replicate_model(model, None, named="dp_engine='ddp' beside tp=2", mesh=pm.dp)   # after parallelize_module

``DistributedDataParallel`` and ``ZeroRedundancyOptimizer`` take plain tensors only, so beside tensor
parallelism (``--strategy ddp --tp 2``) the replicas are kept by FSDP2's ``replicate``
(``torch.distributed._composable.replicate_with_fsdp``): the same units as ``fully_shard`` (every block, then the
root), nothing sharded, each unit's gradients all-reduced over the dp mesh as its backward ends, and the
parameters DTensors over (dp, tp) that ``full_tensor()``, DCP and the optimizer take. Measured on CPU/gloo
(dp=2 x tp=2 against one process, AdamW): the same parameters to 4e-8.
"""

from __future__ import annotations

from typing import Any

import torch

from convoy.errors import NotSupportedYetError
from convoy.train.strategies.fsdp import shard_units
from convoy.train.strategies.fsdp_outputs import close_output, open_output

__all__ = ["replicate_model"]


def replicate_model(module: torch.nn.Module, classes: Any, *, named: str, mesh: Any) -> torch.nn.Module:
    """Replicate ``module`` over the 1-D ``mesh`` with FSDP2's ``replicate``, unit by unit (``shard_units``:
    ``classes``, else every child of a ``ModuleList``), then the root; their outputs opened for its hooks as
    ``fully_shard_exposed`` does. ``named``: the layout, for the message when this torch lacks ``replicate``."""
    try:
        from torch.distributed._composable.replicate_with_fsdp import replicate
    except ImportError:  # pragma: no cover - torch before FSDP2's replicate
        raise NotSupportedYetError(f"{named} keeps whole replicas of DTensor weights with FSDP2's replicate, which "
                                   f"torch {torch.__version__} lacks; use dp_engine='fsdp' (strategy 'zero3') or a "
                                   "newer torch") from None
    for unit in [*shard_units(module, classes), module]:
        unit.register_forward_hook(_open)
        replicate(unit, mesh=mesh)
        unit.register_forward_hook(_close)
    return module


def _open(_module: Any, _args: Any, out: Any) -> Any:
    return out if isinstance(out, torch.Tensor) else open_output(out)


def _close(_module: Any, _args: Any, out: Any) -> Any:
    return out if isinstance(out, torch.Tensor) else close_output(out)
