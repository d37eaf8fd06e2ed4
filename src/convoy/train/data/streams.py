"""Sharding an ``IterableDataset`` between processes, as Accelerate's ``IterableDatasetShard`` does.

    shard = IterableDatasetShard(stream, batch_size=4, num_processes=2, process_index=rank)
    DataLoader(shard, batch_size=4)          # this process's batches of each global batch of 8

Every process reads the whole stream and keeps its slice of each global batch; ``convoy.train.data`` builds
these for ``prepare()``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from torch.utils.data import IterableDataset

from convoy.errors import ConfigError

__all__ = ["shard_iterable", "IterableDatasetShard"]


def shard_iterable(elements: Iterable[Any], *, batch_size: int, num_shards: int, shard: int, split_batches: bool,
                   even_batches: bool, drop_last: bool, on_padding: Callable[[int], None] | None = None
                   ) -> Iterator[Any]:
    """This shard's elements of a stream: each global batch (``batch_size`` elements with ``split_batches``,
    else ``batch_size * num_shards``) is cut into ``num_shards`` consecutive slices. The short last batch is
    dropped (``drop_last``), completed from the first batch (``even_batches``; ``on_padding`` hears its real
    size) or dealt as it is."""
    if split_batches and batch_size % num_shards:
        raise ConfigError(f"split_batches=True needs the batch size ({batch_size}) to be divisible by the "
                          f"{num_shards} processes; use a batch size that is a multiple of {num_shards}")
    part = batch_size // num_shards if split_batches else batch_size
    size = part * num_shards
    mine = slice(shard * part, (shard + 1) * part)
    first: list[Any] | None = None
    current: list[Any] = []
    for element in elements:
        current.append(element)
        if len(current) == size:
            yield from current[mine]
            first = first if first is not None else current
            current = []
    if not current or drop_last:
        return
    if not even_batches:
        share = -(-len(current) // num_shards)
        yield from current[shard * share:(shard + 1) * share]
        return
    real = len(current)
    source = first if first is not None else list(current)
    current = current + list(itertools.islice(itertools.cycle(source), size - real))
    if on_padding is not None:
        on_padding(real)
    yield from current[mine]


class IterableDatasetShard(IterableDataset):
    """This process's elements of an ``IterableDataset`` (Accelerate's class and arguments; see
    ``shard_iterable``). Every process reads the whole stream."""

    def __init__(self, dataset: Any, batch_size: int = 1, drop_last: bool = False, num_processes: int = 1,
                 process_index: int = 0, split_batches: bool = False, even_batches: bool = True) -> None:
        if split_batches and batch_size > 1 and batch_size % num_processes:
            raise ConfigError(f"split_batches=True needs the batch size ({batch_size}) to be divisible by the "
                              f"{num_processes} processes; use a batch size that is a multiple of {num_processes}")
        self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
        self.num_processes, self.process_index = num_processes, process_index
        self.split_batches, self.even_batches = split_batches, even_batches
        self.epoch = 0
        self.padded_real: int | None = None
        """Real size of the last global batch when it was completed from the first one (else None)."""

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __len__(self) -> int:
        size = self.batch_size if self.split_batches else self.batch_size * self.num_processes
        rounds = len(self.dataset) // size if self.drop_last else -(-len(self.dataset) // size)
        return rounds * (self.batch_size // self.num_processes if self.split_batches else self.batch_size)

    def _padded(self, real: int) -> None:
        self.padded_real = real

    def __iter__(self) -> Iterator[Any]:
        self.padded_real = None
        return shard_iterable(self.dataset, batch_size=self.batch_size, num_shards=self.num_processes,
                              shard=self.process_index, split_batches=self.split_batches,
                              even_batches=self.even_batches, drop_last=self.drop_last, on_padding=self._padded)
