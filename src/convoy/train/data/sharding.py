"""Data sharding: each process reads a disjoint part of every epoch, in the order one process would read it.

    loader = DataLoader(dataset, batch_size=8, shuffle=True)
    loader = accelerator.prepare(loader)       # -> PreparedDataLoader, a torch DataLoader
    for batch in loader: ...                   # this rank's batches, already on accelerator.device

Rules (Accelerate's meanings, ``DataLoaderConfiguration``):

- ``split_batches=False``: the loader's batch size is per process; global batches are dealt round-robin,
  so one step of N processes consumes the same samples as N consecutive batches of one process.
- ``split_batches=True``: the loader's batch size is global; each global batch is cut into N equal parts.
- ``even_batches=True``: every rank gets the same number of full batches; the last round is completed with
  samples from the start of the epoch, and ``gather_for_metrics`` drops them again (``LoopPosition.remainder``).
  One process pads nothing (Accelerate does not shard there): its short last batch stays short.
- Shuffling (a ``RandomSampler`` inside): every rank draws the permutation of rank 0, made exactly as the
  sampler would make it on one process (its own generator, synchronised, or a seed drawn from the global torch
  RNG), so N processes read a seeded one-process DataLoader's order, epoch after epoch.
  ``use_seedable_sampler=True`` seeds each epoch with ``data_seed`` (else ``torch.initial_seed()``) plus the
  epoch, which ``set_epoch`` sets; the epoch also advances on each new iteration.
- An ``IterableDataset`` is read whole by every process, which keeps its slice of each global batch (as
  Accelerate's ``IterableDatasetShard``); the last, short round is completed from the first one
  (``even_batches``) or dealt as it is.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from convoy.config.schema import is_whole
from convoy.errors import ConfigError, NotSupportedYetError, shown
from convoy.train.data.loop import LoopPosition
from convoy.train.data.prepared import PreparedDataLoader, SeedableRandomSampler, _identity

__all__ = ["DataLoaderConfiguration", "SkipFirstBatches", "shard_data_loader", "is_prepared", "prepare_data_loader",
           "skip_first_batches"]


@dataclass(kw_only=True)
class DataLoaderConfiguration:
    """How prepared dataloaders shard (Accelerate 1.x's names and defaults). Not frozen: Accelerate's scripts
    assign its fields (``accelerator.dataloader_config.even_batches = False``)."""

    split_batches: bool = False
    """The loader's batch size is global and split between processes (else: per process)."""
    dispatch_batches: bool | None = None
    """True: process 0 reads every batch and sends each process its slice (``dispatch.py``). None and False:
    every process reads its own shard, IterableDatasets included (Accelerate dispatches those)."""
    even_batches: bool = True
    """Pad the last round so every process gets the same number of full batches."""
    use_seedable_sampler: bool = False
    """Shuffle each epoch with ``data_seed + epoch`` (reproducible from the seed alone, ``set_epoch``-driven)."""
    data_seed: int | None = None
    """Seed of ``use_seedable_sampler`` (default: ``torch.initial_seed()`` of rank 0)."""
    non_blocking: bool = False
    """Copy batches to the device with ``non_blocking=True`` (worth it with ``pin_memory=True``)."""
    use_stateful_dataloader: bool = False
    """Prepared loaders are torchdata's ``StatefulDataLoader`` (needs torchdata; ``torchdata_loader.py``).
    Their ``state_dict()`` is convoy's position, which save_state stores with or without this."""

    def __post_init__(self) -> None:
        if self.use_stateful_dataloader:
            from convoy.train.data.torchdata_loader import require_torchdata

            require_torchdata()


class SkipFirstBatches:
    """An iterable over a loader convoy did not prepare that leaves out its first ``num_batches`` batches."""

    def __init__(self, loader: Any, num_batches: int) -> None:
        self.loader, self.num_batches = loader, num_batches

    def __len__(self) -> int:
        return max(0, len(self.loader) - self.num_batches)

    def __iter__(self) -> Iterator[Any]:
        return itertools.islice(iter(self.loader), self.num_batches, None)

    def __getattr__(self, name: str) -> Any:
        if name in ("loader", "num_batches"):
            raise AttributeError(name)
        return getattr(self.loader, name)


def _seedable_source(loader: DataLoader, data_seed: int | None) -> Any:
    """The loader's (batch) sampler with a new ``SeedableRandomSampler`` in place of its ``RandomSampler``, as
    Accelerate's ``use_seedable_sampler=True`` makes it; None when there is nothing to replace. A plain
    ``BatchSampler`` is copied; a custom one gets the new sampler in its ``sampler`` attribute."""
    source: Any = loader.sampler if loader.batch_sampler is None else loader.batch_sampler  # a custom one: any type
    inner = source if isinstance(source, RandomSampler) else getattr(source, "sampler", None)
    if not isinstance(inner, RandomSampler):
        return None
    seedable = SeedableRandomSampler(inner.data_source, replacement=inner.replacement,
                                     num_samples=inner._num_samples, generator=inner.generator, data_seed=data_seed)
    if source is inner:
        return seedable
    if type(source) is BatchSampler:
        return BatchSampler(seedable, source.batch_size, source.drop_last)
    source.sampler = seedable
    return source


def is_prepared(loader: Any) -> bool:
    """True for a loader ``prepare`` made (sharded or dispatched)."""
    from convoy.train.data.dispatch import DispatchedDataLoader

    return isinstance(loader, (PreparedDataLoader, DispatchedDataLoader))


def shard_data_loader(loader: DataLoader, *, config: DataLoaderConfiguration, num_shards: int, shard: int,
                      device: torch.device | None, state: LoopPosition, broadcast: Callable[[Any], Any],
                      reader: bool | None = None) -> Any:
    """``loader`` sharded for this process under ``config`` (what ``Accelerator.prepare`` does); ``reader``:
    this process reads the batches for all with ``dispatch_batches`` (default: shard 0)."""
    from convoy.train.data.dispatch import DispatchedDataLoader

    if is_prepared(loader):
        return loader
    if config.dispatch_batches:
        if config.use_stateful_dataloader:
            raise NotSupportedYetError("use_stateful_dataloader=True with dispatch_batches=True is not supported "
                                       "yet; leave one False (a dispatched loader's state_dict() resumes mid-epoch)")
        return DispatchedDataLoader(loader, num_shards=num_shards, shard=shard, split_batches=config.split_batches,
                                    device=device, state=state, non_blocking=config.non_blocking,
                                    broadcast=broadcast, reader=shard == 0 if reader is None else reader)
    cls = PreparedDataLoader
    if config.use_stateful_dataloader:
        from convoy.train.data.torchdata_loader import stateful_loader_class

        cls = stateful_loader_class()
    source = None
    if config.use_seedable_sampler and not isinstance(loader.dataset, IterableDataset):
        source = _seedable_source(loader, config.data_seed)
    return cls(loader, num_shards=num_shards, shard=shard, split_batches=config.split_batches,
               even_batches=config.even_batches, device=device, state=state,
               non_blocking=config.non_blocking, broadcast=broadcast, source=source)


def _process_group() -> tuple[int, int, Callable[[Any], Any]]:
    from convoy.train import collectives

    if collectives.is_distributed():
        return dist.get_world_size(), dist.get_rank(), collectives.broadcast_object
    return 1, 0, _identity


def prepare_data_loader(dataloader: DataLoader, device: torch.device | None = None,
                        num_processes: int | None = None, process_index: int | None = None,
                        split_batches: bool = False, put_on_device: bool = False, rng_types: Any = None,
                        dispatch_batches: bool | None = None, even_batches: bool = True,
                        slice_fn_for_dispatch: Any = None, use_seedable_sampler: bool = False,
                        data_seed: int | None = None, non_blocking: bool = False,
                        use_stateful_dataloader: bool = False, torch_device_mesh: Any = None
                        ) -> PreparedDataLoader:
    """Accelerate's free ``prepare_data_loader``: ``dataloader`` sharded for process ``process_index`` of
    ``num_processes`` (default: this process group's). ``rng_types`` is not needed (shuffling always follows
    rank 0); ``torch_device_mesh`` is the strategy's business in convoy (use ``Accelerator.prepare``)."""
    if torch_device_mesh is not None:
        raise NotSupportedYetError("prepare_data_loader(torch_device_mesh=...) is not supported; prepare the "
                                   "loader with Accelerator.prepare, which shards over the data-parallel groups")
    config = DataLoaderConfiguration(split_batches=split_batches, dispatch_batches=dispatch_batches,
                                     even_batches=even_batches, use_seedable_sampler=use_seedable_sampler,
                                     data_seed=data_seed, non_blocking=non_blocking,
                                     use_stateful_dataloader=use_stateful_dataloader)
    world, rank, broadcast = _process_group()
    return shard_data_loader(dataloader, config=config, device=device if put_on_device else None,
                             num_shards=world if num_processes is None else num_processes,
                             shard=rank if process_index is None else process_index, state=LoopPosition(),
                             broadcast=broadcast)


def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
    """Accelerate's free ``skip_first_batches``: a loader whose iterations leave out the first ``num_batches``
    (a whole number >= 0; ``ConfigError`` otherwise: -1 read as a slice kept only the last batch)."""
    if not is_whole(num_batches):
        raise ConfigError(f"skip_first_batches(num_batches={shown(num_batches)}): give how many batches to skip, a "
                          "whole number >= 0")
    num_batches = int(num_batches)
    if hasattr(dataloader, "skipping"):  # PreparedDataLoader, DispatchedDataLoader
        return dataloader.skipping(num_batches)
    return SkipFirstBatches(dataloader, num_batches)
