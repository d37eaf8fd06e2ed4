"""The sharded loader ``prepare`` returns: this process's batches of each epoch, in one process's order.

    loader = PreparedDataLoader(DataLoader(ds, batch_size=8, shuffle=True), num_shards=2, shard=0)
    shard_batches([[0, 1], [2, 3], [4]], batch_size=2, num_shards=2, shard=1, split_batches=False,
                  even_batches=True)     # [([2, 3], None)] : the last round padded for shard 0 only

The rules (Accelerate's meanings) are in ``convoy.train.data``; ``sharding.py`` chooses among this loader, its
torchdata variant (``torchdata_loader.py``) and the dispatched one (``dispatch.py``); those two build on it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence, Sized
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from convoy.errors import ConfigError, NotSupportedYetError
from convoy.train.data.loop import LoopPosition
from convoy.train.data.streams import IterableDatasetShard
from convoy.train.operations import send_to_device

__all__ = ["SeedableRandomSampler", "shard_batches", "PreparedDataLoader"]


class SeedableRandomSampler(RandomSampler):
    """A ``RandomSampler`` whose epoch ``e`` is the permutation of seed ``data_seed + e`` (Accelerate's class:
    ``use_seedable_sampler=True`` puts one in place of a loader's ``RandomSampler``). ``data_seed`` defaults
    to ``torch.initial_seed()``; each full iteration advances the epoch, ``set_epoch`` sets it."""

    def __init__(self, *args: Any, data_seed: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.initial_seed = data_seed if data_seed is not None else torch.random.initial_seed()
        self.epoch = 0

    def __iter__(self) -> Iterator[int]:
        if self.generator is None:
            self.generator = torch.Generator()
        self.generator.manual_seed(self.initial_seed + self.epoch)
        yield from super().__iter__()
        self.set_epoch(self.epoch + 1)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


def shard_batches(batches: Sequence[list[int]], *, batch_size: int, num_shards: int, shard: int,
                  split_batches: bool, even_batches: bool) -> list[tuple[list[int], int | None]]:
    """This shard's index batches for one epoch, each with the real sample count of its global step when that
    step is the epoch's short last one, padded or not (else ``None``): what ``gather_for_metrics`` keeps of it,
    Accelerate's ``len(dataset) % total_batch_size``, on one process too. Pure; ``batches`` is the whole epoch of
    the original sampler."""
    flat = [i for b in batches for i in b]
    filler = itertools.cycle(flat) if flat else iter(())
    out: list[tuple[list[int], int | None]] = []
    if split_batches:
        if batch_size % num_shards:
            raise ConfigError(f"split_batches=True needs the batch size ({batch_size}) to be divisible by the "
                              f"{num_shards} processes; use a batch size that is a multiple of {num_shards}")
        part = batch_size // num_shards
        for batch in batches:
            real = len(batch)
            if real < batch_size:
                if not even_batches:
                    size = -(-real // num_shards)
                    chunk = batch[shard * size:(shard + 1) * size]
                    if chunk:
                        out.append((chunk, real))
                    continue
                batch = batch + [next(filler) for _ in range(batch_size - real)]
            out.append((batch[shard * part:(shard + 1) * part], real if real < batch_size else None))
        return out
    rounds = [list(batches[i:i + num_shards]) for i in range(0, len(batches), num_shards)]
    for n, round_ in enumerate(rounds):
        last = n == len(rounds) - 1
        real = sum(len(b) for b in round_)
        padded = len(round_) < num_shards or any(len(b) < batch_size for b in round_)
        if last and padded and even_batches:
            round_ = [b + [next(filler) for _ in range(batch_size - len(b))] for b in round_]
            while len(round_) < num_shards:
                round_.append([next(filler) for _ in range(batch_size)])
        if shard < len(round_):
            out.append((round_[shard], real if last and padded else None))
    return out



def _identity(value: Any) -> Any:
    """Broadcast on one process."""
    return value


@dataclass
class _Cursor:
    """Where a loader is in its epochs; shared with the loaders ``skip_first_batches`` makes from it."""

    next_epoch: int = 0
    epoch: int = 0
    running: bool = False
    start: int = 0
    yielded: int = 0
    skip: int = 0
    plan: list[tuple[list[int], int | None]] = field(default_factory=list)
    epoch_rng: Any = None  # the sampler generator's state this epoch started from (replayed after load_state)
    replay_rng: Any = None
    resumed: bool = False  # the next iteration continues an epoch that load_state restored


class _RankBatchSampler:
    """The inner DataLoader's (batch) sampler: this rank's batches of the current epoch. Carries Accelerate's
    ``BatchSamplerShard`` attributes (``batch_sampler``, ``even_batches``, ``split_batches``, ...)."""

    def __init__(self, owner: PreparedDataLoader, batch_sampler: Any, *, unbatched: bool) -> None:
        self.owner, self.batch_sampler, self.unbatched = owner, batch_sampler, unbatched

    @property
    def sampler(self) -> Any:
        return getattr(self.batch_sampler, "sampler", None)

    @property
    def batch_size(self) -> int | None:
        return self.owner._batch_size

    @property
    def even_batches(self) -> bool:
        return self.owner.even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self.owner.even_batches = value

    @property
    def split_batches(self) -> bool:
        return self.owner.split_batches

    @property
    def num_processes(self) -> int:
        return self.owner.num_shards

    @property
    def process_index(self) -> int:
        return self.owner.shard

    def __len__(self) -> int:
        return len(self.owner)

    def __iter__(self) -> Iterator[Any]:  # a generator: runs at the first next(), as a plain sampler would
        owner = self.owner
        cursor = owner._cursor
        cursor.plan = owner._make_plan()
        for indices, _ in cursor.plan[cursor.start:]:
            if self.unbatched:
                yield from indices
            else:
                yield indices


def _find_random_sampler(sampler: Any) -> Any:
    for candidate in (sampler, getattr(sampler, "sampler", None)):
        if isinstance(candidate, RandomSampler):
            return candidate
    return None


def _base_kwargs(loader: Any) -> dict[str, Any]:
    kwargs = dict(num_workers=loader.num_workers, collate_fn=loader.collate_fn, pin_memory=loader.pin_memory,
                  timeout=loader.timeout, worker_init_fn=loader.worker_init_fn, generator=loader.generator,
                  multiprocessing_context=loader.multiprocessing_context,
                  persistent_workers=loader.persistent_workers,
                  pin_memory_device=getattr(loader, "pin_memory_device", ""))
    if hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    return kwargs


class PreparedDataLoader(DataLoader):
    """A ``torch.utils.data.DataLoader`` that reads this process's shard of ``loader``; iterate it like the
    original. ``broadcast`` sends rank 0's value to every rank (identity on one process)."""

    _source: Any  # the original (batch) sampler; None over an IterableDataset

    def __init__(self, loader: DataLoader, *, num_shards: int, shard: int, split_batches: bool = False,
                 even_batches: bool = True, device: torch.device | None = None, state: LoopPosition | None = None,
                 non_blocking: bool = False, broadcast: Callable[[Any], Any] = _identity,
                 source: Any = None, _cursor: _Cursor | None = None,
                 _skip_batches: int = 0) -> None:
        self.base = loader
        self.num_shards, self.shard = num_shards, shard
        self.split_batches, self.even_batches = split_batches, even_batches
        self.device, self.non_blocking = device, non_blocking
        self.state = state if state is not None else LoopPosition()
        self._broadcast = broadcast
        self._cursor = _cursor if _cursor is not None else _Cursor()
        self._skip_batches = _skip_batches
        self.end_of_dataloader, self.remainder = False, None  # Accelerate's DataLoaderShard attributes
        self._iterable = isinstance(loader.dataset, IterableDataset)
        kwargs = _base_kwargs(loader)
        if self._iterable:
            self._source, self._random = None, None
            self._batch_size = loader.batch_size
            if loader.batch_size is None:
                raise NotSupportedYetError("prepare() of a DataLoader over an IterableDataset with batch_size=None "
                                           "is not supported yet; give it a batch_size")
            part = loader.batch_size // num_shards if split_batches else loader.batch_size
            shard_ds = IterableDatasetShard(loader.dataset, loader.batch_size, loader.drop_last, num_shards, shard,
                                            split_batches, even_batches)
            super().__init__(shard_ds, batch_size=part, drop_last=loader.drop_last, **kwargs)
            return
        by_sampler = isinstance(loader.sampler, BatchSampler) and loader.batch_sampler is None
        unbatched = loader.batch_sampler is None and not by_sampler
        if source is None:
            source = loader.sampler if loader.batch_sampler is None else loader.batch_sampler
        self._source = source
        self._random = _find_random_sampler(self._source)
        if isinstance(self._random, SeedableRandomSampler) and _cursor is None:  # every rank: rank 0's seed
            self._random.initial_seed = int(broadcast(int(self._random.initial_seed)))
        self._unbatched = unbatched
        self._batch_size = 1 if unbatched else getattr(self._source, "batch_size", None)
        if self._batch_size is None and even_batches:
            raise ConfigError(f"prepare(): the batch sampler {type(self._source).__name__} has no batch_size, so its "
                              "last batches cannot be evened out; use DataLoaderConfiguration(even_batches=False)")
        rank_sampler = _RankBatchSampler(self, self._source, unbatched=unbatched)
        if unbatched or by_sampler:
            super().__init__(loader.dataset, sampler=rank_sampler, batch_size=None, **kwargs)
        else:
            super().__init__(loader.dataset, batch_sampler=rank_sampler, **kwargs)

    def skipping(self, num_batches: int) -> PreparedDataLoader:
        """A loader over the same data and position whose iterations leave out their first ``num_batches``."""
        return type(self)(self.base, num_shards=self.num_shards, shard=self.shard,
                          split_batches=self.split_batches, even_batches=self.even_batches,
                          device=self.device, state=self.state, non_blocking=self.non_blocking,
                          broadcast=self._broadcast, source=self._source,
                          _cursor=self._cursor, _skip_batches=self._skip_batches + num_batches)

    def reshard(self, *, num_shards: int, shard: int) -> None:
        """Read another shard of each batch from the next epoch on: a loader prepared before
        ``strategy="auto"`` chose a layout whose data-parallel groups are not the processes."""
        if (num_shards, shard) == (self.num_shards, self.shard):
            return
        if self._cursor.running:
            raise ConfigError(f"this DataLoader was prepared and iterated before strategy='auto' chose a layout "
                              f"with {num_shards} data-parallel groups; prepare the model first "
                              "(accelerator.prepare(model, optimizer, dataloader))")
        self.num_shards, self.shard = num_shards, shard
        if self._iterable:
            shard_ds = cast(IterableDatasetShard, self.dataset)
            shard_ds.num_processes, shard_ds.process_index = num_shards, shard

    # --- epochs and positions ------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """The epoch of the next iteration; passed on to the sampler and dataset that take one."""
        self._cursor.next_epoch = epoch
        for target in (getattr(self._source, "sampler", None), self._source, self.base.dataset):
            if target is not None and target is not self._random and hasattr(target, "set_epoch"):
                target.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self._cursor.epoch

    @property
    def global_batch_size(self) -> int:
        """Samples one step consumes across all processes."""
        size = self._batch_size or 1
        return size if self.split_batches else size * self.num_shards

    total_batch_size = global_batch_size  # Accelerate's name

    @property
    def iteration(self) -> int:
        """Accelerate's name of the epoch."""
        return self._cursor.epoch

    @property
    def total_dataset_length(self) -> int:
        return len(cast(Sized, self.base.dataset))  # a dataset without a length: a TypeError, as before

    def get_sampler(self) -> Any:
        """The sampler that orders the samples (inside the batch sampler when there is one)."""
        return self._random or getattr(self._source, "sampler", self._source)

    def _make_plan(self) -> list[tuple[list[int], int | None]]:
        """This rank's batches of the epoch that starts now (runs inside the inner loader's first ``next``)."""
        batches = self._epoch_batches()
        size = self._batch_size or max((len(b) for b in batches), default=1)  # only read with even_batches
        if self._unbatched:
            batches = [[i] for i in batches]
        return shard_batches(batches, batch_size=size, num_shards=self.num_shards, shard=self.shard,
                             split_batches=self.split_batches, even_batches=self._evens())

    def _evens(self) -> bool:
        """Pad the last round: with ``even_batches`` and other processes to even out (Accelerate does not shard,
        so does not pad, on one process)."""
        return self.even_batches and self.num_shards > 1

    def _epoch_batches(self) -> list[Any]:
        """The original sampler's whole epoch, shuffled by rank 0's generator state (see the module docstring)."""
        sampler, cursor = self._random, self._cursor
        if sampler is None:
            return list(self._source)
        if isinstance(sampler, SeedableRandomSampler):  # the epoch decides, on every rank alike
            sampler.set_epoch(cursor.epoch)
            return list(self._source)
        own = sampler.generator
        if cursor.replay_rng is not None:
            rng, cursor.replay_rng = cursor.replay_rng, None
        elif own is None:  # RandomSampler draws its seed from the global RNG: every rank draws, rank 0's wins
            rng = torch.Generator().manual_seed(self._broadcast(
                int(torch.empty((), dtype=torch.int64).random_().item()))).get_state()
        else:
            rng = self._broadcast(own.get_state())
        cursor.epoch_rng = rng.clone()
        generator = own if own is not None else torch.Generator()
        generator.set_state(rng)
        sampler.generator = generator
        try:
            return list(self._source)
        finally:
            sampler.generator = own

    def state_dict(self) -> dict[str, Any]:
        """Where the loop is: the epoch, the batches of it already consumed and the shuffling state it started
        from (for save_state)."""
        cursor = self._cursor
        if cursor.running:
            return {"epoch": cursor.epoch, "batches": cursor.yielded, "global_batch_size": self.global_batch_size,
                    "sampler_rng": cursor.epoch_rng}
        return {"epoch": cursor.next_epoch, "batches": 0, "global_batch_size": self.global_batch_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a saved position, also one saved with another number of processes or batch size."""
        samples = state["batches"] * state["global_batch_size"]
        cursor = self._cursor
        cursor.next_epoch = state["epoch"]
        cursor.skip = samples // self.global_batch_size
        cursor.replay_rng = state.get("sampler_rng") if cursor.skip else None
        cursor.resumed, cursor.running = bool(cursor.skip), False

    def skip(self, num_batches: int) -> None:
        """Make the next iteration start ``num_batches`` batches into its epoch."""
        self._cursor.skip = num_batches

    # --- iteration ---------------------------------------------------------------------------------
    def _full_len(self) -> int:
        if self._iterable:
            total = len(cast(Sized, self.base.dataset))  # a dataset without a length: a TypeError, as before
            rounds = total // self.global_batch_size if self.base.drop_last else -(-total // self.global_batch_size)
            return rounds
        n = len(self._source)
        if self.split_batches:
            return n
        return -(-n // self.num_shards) if self.even_batches else len(range(self.shard, n, self.num_shards))

    def __len__(self) -> int:
        return max(0, self._full_len() - self._skip_batches)

    @property
    def resumes_at(self) -> int:
        """The batch the next epoch's iteration starts at when ``load_state`` restored a position mid-epoch (its
        length still counts the whole epoch), else 0: where a progress bar starts (``convoy.train.progress``)."""
        return 0 if self._skip_batches or self._cursor.running else self._cursor.skip

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # a generator: for-loops need only an iterator
        cursor = self._cursor
        cursor.epoch = cursor.next_epoch
        cursor.next_epoch += 1
        # skip_first_batches(n) says where to start (n batches in), also after load_state restored a position
        start, cursor.skip = self._skip_batches or cursor.skip, 0
        cursor.start = 0 if self._iterable else start  # read by _RankBatchSampler when the inner loader starts
        cursor.yielded, cursor.running = start, True
        if self._iterable:
            cast(IterableDatasetShard, self.dataset).even_batches = self._evens()
        self.state.enter(self)
        if cursor.resumed and self.generator is None:
            # the interrupted run drew this epoch's worker seed from the global RNG before its checkpoint, whose
            # RNG state load_state restored: drawing it again would shift every later draw (dropout, shuffles)
            rng = torch.get_rng_state()
            inner: Iterator[Any] = super().__iter__()
            torch.set_rng_state(rng)
        else:
            inner = super().__iter__()
        cursor.resumed = False
        if self._iterable:
            inner = itertools.islice(inner, start, None)
        try:
            yield from self._look_ahead(inner, start)
        finally:
            self.state.leave(self)
        cursor.running = False

    def _look_ahead(self, inner: Iterator[Any], position: int) -> Iterator[Any]:
        """Yield the batches one step late, so that the last one is known as the last when it is handed out."""
        cursor = self._cursor
        current = next(inner, _END)
        while current is not _END:
            upcoming = next(inner, _END)
            last = upcoming is _END
            cursor.yielded = position + 1
            if self._iterable:
                remainder = cast(IterableDatasetShard, self.dataset).padded_real if last else None
            else:
                remainder = cursor.plan[position][1] if position < len(cursor.plan) else None
            self.state.at(self, last=last, remainder=remainder)
            yield send_to_device(current, self.device, self.non_blocking) if self.device is not None else current
            current, position = upcoming, position + 1


_END = object()
