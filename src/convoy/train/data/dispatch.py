"""``dispatch_batches=True``: process 0 reads every batch and each process gets its slice of it.

    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(dispatch_batches=True))
    loader = accelerator.prepare(loader)     # a DispatchedDataLoader

For datasets only one process can read (a stream, a queue). Each step, process 0 reads ``num_processes``
batches (one with ``split_batches``), joins them along dim 0 and broadcasts the global batch; process ``r``
keeps rows ``[r * b, (r + 1) * b)``. A short last batch is completed with the first rows of the epoch and
``gather_for_metrics`` drops them again; ``drop_last`` drops it. Batches travel pickled (``broadcast_object``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from convoy.errors import ConfigError

__all__ = ["DispatchedDataLoader", "join_batches", "slice_batch", "batch_rows"]


def join_batches(batches: list[Any]) -> Any:
    """The batches as one, along dim 0 (tensors), per key (dicts), per position (tuples, lists of tensors)."""
    first = batches[0]
    if isinstance(first, torch.Tensor):
        try:
            return torch.cat(batches, dim=0)
        except RuntimeError as error:
            raise ConfigError("dispatch_batches=True needs batches of one shape past dim 0; use "
                              "dispatch_batches=False, or split_batches=True") from error
    if isinstance(first, dict):
        return type(first)({k: join_batches([b[k] for b in batches]) for k in first})
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(join_batches(list(parts)) for parts in zip(*batches)))
    if isinstance(first, (list, tuple)) and first and isinstance(first[0], (torch.Tensor, dict, list, tuple)):
        return type(first)(join_batches(list(parts)) for parts in zip(*batches))
    if isinstance(first, list):
        return [item for b in batches for item in b]
    return first


def batch_rows(batch: Any) -> int:
    """Rows (dim 0) of the first tensor or list in ``batch``."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, dict):
        return batch_rows(next(iter(batch.values())))
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], (torch.Tensor, dict, list, tuple)):
        return batch_rows(batch[0])
    return len(batch)


def slice_batch(batch: Any, rows: slice) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch[rows]
    if isinstance(batch, dict):
        return type(batch)({k: slice_batch(v, rows) for k, v in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(slice_batch(v, rows) for v in batch))
    if isinstance(batch, (list, tuple)) and batch and isinstance(batch[0], (torch.Tensor, dict, list, tuple)):
        return type(batch)(slice_batch(v, rows) for v in batch)
    if isinstance(batch, list):
        return batch[rows]
    return batch


class DispatchedDataLoader(DataLoader):
    """The user's loader, read on process 0 only; every process iterates it and gets its slice."""

    def __init__(self, loader: DataLoader, *, num_shards: int, shard: int, split_batches: bool, device: Any,
                 state: Any, non_blocking: bool, broadcast: Callable[[Any], Any], reader: bool,
                 _skip_batches: int = 0) -> None:
        from convoy.train.data.prepared import _base_kwargs

        self.base, self.num_shards, self.shard, self.split_batches = loader, num_shards, shard, split_batches
        self.device, self.state, self.non_blocking = device, state, non_blocking
        self._broadcast, self._reader, self._skip_batches = broadcast, reader, _skip_batches
        self._next_epoch = self._epoch = self._yielded = self._skip = 0
        self._running = False
        self.end_of_dataloader, self.remainder = False, None
        kwargs = _base_kwargs(loader)
        if isinstance(loader.dataset, IterableDataset) or loader.batch_sampler is None:
            super().__init__(loader.dataset, batch_size=loader.batch_size, sampler=None if isinstance(
                loader.dataset, IterableDataset) else loader.sampler, drop_last=loader.drop_last, **kwargs)
        else:
            super().__init__(loader.dataset, batch_sampler=loader.batch_sampler, **kwargs)
        self._drop_last = loader.drop_last

    @property
    def global_batch_size(self) -> int:
        size = self.base.batch_size or getattr(self.base.batch_sampler, "batch_size", None) or 1
        return size if self.split_batches else size * self.num_shards

    total_batch_size = global_batch_size

    def __len__(self) -> int:
        whole = len(self.base)
        n = whole if self.split_batches else (whole // self.num_shards if self._drop_last
                                              else -(-whole // self.num_shards))
        return max(0, n - self._skip_batches)

    def set_epoch(self, epoch: int) -> None:
        self._next_epoch = epoch
        for target in (getattr(self.base.batch_sampler, "sampler", None), self.base.sampler, self.base.dataset):
            if target is not None and hasattr(target, "set_epoch"):
                target.set_epoch(epoch)
                break

    def skipping(self, num_batches: int) -> DispatchedDataLoader:
        return DispatchedDataLoader(self.base, num_shards=self.num_shards, shard=self.shard,
                                    split_batches=self.split_batches, device=self.device, state=self.state,
                                    non_blocking=self.non_blocking, broadcast=self._broadcast, reader=self._reader,
                                    _skip_batches=self._skip_batches + num_batches)

    def reshard(self, *, num_shards: int, shard: int) -> None:
        self.num_shards, self.shard = num_shards, shard

    def skip(self, num_batches: int) -> None:
        self._skip = num_batches

    def state_dict(self) -> dict[str, int]:
        batches = self._yielded if self._running else 0
        epoch = self._epoch if self._running else self._next_epoch
        return {"epoch": epoch, "batches": batches, "global_batch_size": self.global_batch_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._next_epoch = state["epoch"]
        self._skip = state["batches"] * state["global_batch_size"] // self.global_batch_size

    def _fetch(self, iterator: Iterator[Any] | None) -> Any:
        """Process 0's next global batch (None at the end), on every process."""
        batch = None
        if self._reader:
            batches = []
            for _ in range(1 if self.split_batches else self.num_shards):
                item = next(iterator, _END)  # type: ignore[arg-type]
                if item is _END:
                    break
                batches.append(item)
            if batches and not (self._drop_last and len(batches) < (1 if self.split_batches else self.num_shards)):
                batch = join_batches(batches)
        return self._broadcast(batch)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # a generator: for-loops need only an iterator
        from convoy.train.operations import send_to_device

        self._epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        start, self._skip = self._skip_batches or self._skip, 0
        self._yielded, self._running = start, True
        iterator = super().__iter__() if self._reader else None
        for _ in range(start):
            self._fetch(iterator)
        self.state.enter(self)
        first, current = None, self._fetch(iterator)
        try:
            while current is not None:
                upcoming = self._fetch(iterator)
                first = current if first is None else first
                rows = batch_rows(current)
                remainder = None
                if rows % self.num_shards:
                    if self._drop_last:
                        break
                    remainder = rows
                    current = join_batches([current, slice_batch(first, slice(0, self.num_shards))])
                part = -(-rows // self.num_shards)
                mine = slice_batch(current, slice(self.shard * part, (self.shard + 1) * part))
                self._yielded += 1
                self.state.at(self, last=upcoming is None, remainder=remainder)
                yield send_to_device(mine, self.device, self.non_blocking) if self.device is not None else mine
                current = upcoming
        finally:
            self.state.leave(self)
        self._running = False


_END = object()
