"""Processes that agree without a training step: ``join_uneven_inputs`` and the breakpoint trigger.

    with accelerator.join_uneven_inputs([model], even_batches=False):
        for batch in loader: ...
    if loss.isnan(): accelerator.set_trigger()
    if accelerator.check_trigger(): break          # True on every process when any one set it

On DDP (also on CPU processes with gloo, where Accelerate only warns and then hangs) this is PyTorch's
``torch.distributed.algorithms.Join``: a process that ran out of batches shadows the others' all-reduces.
Elsewhere it warns, as Accelerate does, and does nothing.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.distributed.algorithms import Join
from torch.utils.data import IterableDataset

from convoy.train.process_view import DistributedType

__all__ = ["join_uneven_inputs", "JOINABLE_TYPES", "Trigger"]

JOINABLE_TYPES = frozenset({DistributedType.MULTI_GPU, DistributedType.MULTI_CPU, DistributedType.MULTI_NPU,
                            DistributedType.MULTI_MLU, DistributedType.MULTI_SDAA, DistributedType.MULTI_MUSA,
                            DistributedType.MULTI_XPU, DistributedType.MULTI_HPU, DistributedType.MULTI_NEURON})


def _is_iterable_style(loader: Any) -> bool:
    return isinstance(getattr(loader, "dataset", None), IterableDataset)


@contextlib.contextmanager
def _even_batches(loaders: Sequence[Any], even_batches: bool | None) -> Iterator[None]:
    """Inside, every prepared map-style loader pads (or not) its last round as ``even_batches`` says."""
    if even_batches is None:
        yield
        return
    if any(_is_iterable_style(d) for d in loaders):
        warnings.warn("Overriding even_batches is only supported for map-style datasets, yet some dataloaders "
                      "given were iterable", UserWarning, stacklevel=4)
    targets = [t for d in loaders if not _is_iterable_style(d)
               for t in (d, getattr(d, "batch_sampler", None)) if t is not None and hasattr(t, "even_batches")]
    saved = [t.even_batches for t in targets]
    for target in targets:
        target.even_batches = even_batches
    try:
        yield
    finally:
        for target, value in zip(targets, saved):
            target.even_batches = value


@contextlib.contextmanager
def join_uneven_inputs(joinables: list[Any], *, distributed_type: DistributedType, loaders: Sequence[Any],
                       even_batches: bool | None = None) -> Iterator[None]:
    """``Join`` over ``joinables`` when the set-up is plain data parallel (``distributed_type``), with the
    prepared ``loaders`` padding (or not) as ``even_batches`` says inside; elsewhere a warning, as Accelerate."""
    if distributed_type not in JOINABLE_TYPES:
        warnings.warn("Joining uneven inputs is only supported for multi-GPU (and multi-CPU) DDP training, as a "
                      "result `join_uneven_inputs` will have no effect.", UserWarning, stacklevel=3)
        yield
        return

    with _even_batches(loaders, even_batches), Join(joinables):
        yield


class Trigger:
    """A flag any process can raise; ``check()`` is True on every process once one raised it, then resets."""

    def __init__(self) -> None:
        self.raised = False

    def set(self) -> None:
        self.raised = True

    def check(self, device: Any) -> bool:
        """Collective (one all-reduce) when several processes run."""

        from convoy.train import collectives

        flag = torch.tensor(int(self.raised), device=device)
        if collectives.is_distributed():
            flag = collectives.reduce(flag, reduction="sum")
        self.raised = False
        return int(flag.item()) >= 1
