"""Data sharding: each process reads a disjoint part of every epoch, shuffled the same way everywhere.

    loader = DataLoader(dataset, batch_size=8, shuffle=True)
    loader = accelerator.prepare(loader)       # -> PreparedDataLoader
    for batch in loader: ...                   # this rank's batches, already on accelerator.device

Rules (Accelerate's meanings):

- ``split_batches=False``: the loader's batch size is per process; global batches are dealt round-robin,
  so one step of N processes consumes the same samples as N consecutive batches of one process.
- ``split_batches=True``: the loader's batch size is global; each global batch is cut into N equal parts.
- ``even_batches=True``: every rank gets the same number of full batches; the last round is completed with
  samples from the start of the epoch, and ``gather_for_metrics`` drops them again (``LoopState.remainder``).
- Shuffling: a ``RandomSampler`` is replaced by one seeded with a seed agreed by all ranks plus the epoch,
  so ranks shuffle identically and every epoch differently (``set_epoch`` semantics; the epoch advances on
  each new iteration).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from convoy.errors import ConfigError, NotSupportedYetError

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["LoopState", "EpochRandomSampler", "shard_batches", "PreparedDataLoader", "SkipFirstBatches",
           "send_to_device"]


@dataclass
class LoopState:
    """Mutable state shared by the Accelerator and its dataloaders (one per Accelerator, never global)."""

    sync_gradients: bool = True
    """False on the micro-steps of ``accumulate`` that do not synchronise or step."""
    end_of_dataloader: bool = False
    """True while the last batch of the active dataloader is being processed."""
    remainder: int | None = None
    """Real (not padding) samples in the current step's global batch when it is the last, padded one."""
    dataloaders: list[Any] = field(default_factory=list)
    """The prepared loaders being iterated, innermost last (a loop inside a loop nests them)."""

    @property
    def active_dataloader(self) -> Any:
        return self.dataloaders[-1] if self.dataloaders else None


class EpochRandomSampler:
    """A random permutation of ``range(num_samples)`` seeded by ``seed + epoch``: identical on every rank."""

    def __init__(self, num_samples: int, seed: int) -> None:
        self.num_samples = num_samples
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        import torch

        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        yield from torch.randperm(self.num_samples, generator=generator).tolist()


def shard_batches(batches: Sequence[list[int]], *, batch_size: int, num_shards: int, shard: int,
                  split_batches: bool, even_batches: bool) -> list[tuple[list[int], int | None]]:
    """This shard's index batches for one epoch, each with the real sample count of its global step when
    that step was padded (else ``None``). Pure; ``batches`` is the whole epoch of the original sampler."""
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
                        out.append((chunk, None))
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
            out.append((round_[shard], real if last and padded and even_batches else None))
    return out


def send_to_device(batch: Any, device: "torch.device") -> Any:
    """``batch`` with every tensor inside (dicts, lists, tuples, named tuples) moved to ``device``."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return type(batch)({k: send_to_device(v, device) for k, v in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(send_to_device(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(send_to_device(v, device) for v in batch)
    if hasattr(batch, "to") and callable(batch.to):  # e.g. transformers' BatchEncoding
        return batch.to(device)
    return batch


class _RankBatchSampler:
    """The batch sampler handed to the inner DataLoader: this rank's batches of the current epoch."""

    def __init__(self, owner: "PreparedDataLoader") -> None:
        self.owner = owner

    def __len__(self) -> int:
        return len(self.owner)

    def __iter__(self) -> Iterator[list[int]]:
        owner = self.owner
        for indices, _ in owner._plan[owner._start:]:
            yield indices


class PreparedDataLoader:
    """A DataLoader sharded for this process; iterate it like the original."""

    def __init__(self, loader: Any, *, num_shards: int, shard: int, split_batches: bool, even_batches: bool,
                 seed: int, device: "torch.device | None", state: LoopState) -> None:
        import torch
        from torch.utils.data import DataLoader, IterableDataset, RandomSampler

        if isinstance(loader.dataset, IterableDataset):
            raise NotSupportedYetError("prepare() of a DataLoader over an IterableDataset is not supported yet; "
                                       "use a map-style Dataset, or shard the stream yourself by process_index")
        if loader.batch_sampler is None:
            raise NotSupportedYetError("prepare() of a DataLoader with batch_size=None is not supported yet; "
                                       "give it a batch_size")
        self.base = loader
        self.dataset = loader.dataset
        self.batch_sampler = loader.batch_sampler
        self.batch_size = getattr(loader.batch_sampler, "batch_size", loader.batch_size)
        self.num_shards, self.shard = num_shards, shard
        self.split_batches, self.even_batches = split_batches, even_batches
        self.device, self.state = device, state
        if isinstance(self.batch_sampler.sampler, RandomSampler):
            self.sampler: Any = EpochRandomSampler(len(self.batch_sampler.sampler), seed)
            self.batch_sampler = torch.utils.data.BatchSampler(
                self.sampler, self.batch_sampler.batch_size, self.batch_sampler.drop_last)
        else:
            self.sampler = self.batch_sampler.sampler
        self._next_epoch = 0
        self._epoch = 0
        self._skip = 0
        self._start = 0
        self._yielded = 0
        self._running = False
        self._plan: list[tuple[list[int], int | None]] = []
        kwargs = dict(num_workers=loader.num_workers, collate_fn=loader.collate_fn,
                      pin_memory=loader.pin_memory, timeout=loader.timeout,
                      worker_init_fn=loader.worker_init_fn, generator=loader.generator,
                      multiprocessing_context=loader.multiprocessing_context,
                      persistent_workers=loader.persistent_workers)
        if loader.num_workers > 0:
            kwargs["prefetch_factor"] = loader.prefetch_factor
        self._inner = DataLoader(loader.dataset, batch_sampler=_RankBatchSampler(self), **kwargs)

    def reshard(self, *, num_shards: int, shard: int) -> None:
        """Read another shard of each batch from the next epoch on: a loader prepared before
        ``strategy="auto"`` chose a layout whose data-parallel groups are not the processes."""
        if (num_shards, shard) == (self.num_shards, self.shard):
            return
        if self._running:
            raise ConfigError(f"this DataLoader was prepared and iterated before strategy='auto' chose a layout "
                              f"with {num_shards} data-parallel groups; prepare the model first "
                              "(accelerator.prepare(model, optimizer, dataloader))")
        self.num_shards, self.shard = num_shards, shard

    # --- epochs and positions ------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """The epoch of the next iteration (shuffling seed); ``DistributedSampler.set_epoch`` semantics."""
        self._next_epoch = epoch

    @property
    def epoch(self) -> int:
        return self._epoch

    def _make_plan(self, epoch: int) -> list[tuple[list[int], int | None]]:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)
        return shard_batches(list(self.batch_sampler), batch_size=self.batch_size, num_shards=self.num_shards,
                             shard=self.shard, split_batches=self.split_batches, even_batches=self.even_batches)

    @property
    def global_batch_size(self) -> int:
        """Samples one step consumes across all processes."""
        return self.batch_size if self.split_batches else self.batch_size * self.num_shards

    def state_dict(self) -> dict[str, int]:
        """Where the loop is: the epoch and the batches of it already consumed (for save_state)."""
        if self._running:
            return {"epoch": self._epoch, "batches": self._yielded, "global_batch_size": self.global_batch_size}
        return {"epoch": self._next_epoch, "batches": 0, "global_batch_size": self.global_batch_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume at a saved position, also one saved with another number of processes or batch size."""
        samples = state["batches"] * state["global_batch_size"]
        self._next_epoch = state["epoch"]
        self._skip = samples // self.global_batch_size
        self._running = False

    def skip(self, num_batches: int) -> None:
        """Make the next iteration start ``num_batches`` batches into its epoch."""
        self._skip = num_batches

    # --- iteration ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        if not self._plan:
            n = len(self.batch_sampler)
            if self.split_batches:
                return n
            return -(-n // self.num_shards) if self.even_batches else len(range(self.shard, n, self.num_shards))
        return len(self._plan)

    def __iter__(self) -> Iterator[Any]:
        self._epoch = self._next_epoch
        self._next_epoch += 1
        self._plan = self._make_plan(self._epoch)
        start, self._skip = self._skip, 0
        self._start = start  # read by _RankBatchSampler when the inner iterator starts
        self._yielded = start
        self._running = True
        total = len(self._plan)
        self.state.end_of_dataloader = False
        self.state.dataloaders.append(self)
        try:
            for position, batch in enumerate(self._inner, start=start):
                self._yielded = position + 1
                self.state.end_of_dataloader = position == total - 1
                self.state.remainder = self._plan[position][1]
                yield send_to_device(batch, self.device) if self.device is not None else batch
        finally:
            self.state.dataloaders.remove(self)
            self.state.end_of_dataloader = False
            self.state.remainder = None
        self._running = False

    def __getattr__(self, name: str) -> Any:  # num_workers, collate_fn, ... of the original loader
        if name.startswith("_") or name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)


class SkipFirstBatches:
    """An iterable over ``loader`` that leaves out its first ``num_batches`` batches (once)."""

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
