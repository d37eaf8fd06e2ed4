"""Sharding rules of prepared dataloaders (pure function ``shard_batches``)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from convoy.errors import ConfigError
from convoy.train.data.prepared import shard_batches


def batches(n: int, size: int) -> list[list[int]]:
    return [list(range(i, min(i + size, n))) for i in range(0, n, size)]


@given(n=st.integers(1, 60), size=st.integers(1, 8), shards=st.integers(1, 4), split=st.booleans())
def test_even_batches_cover_everything_once_after_truncation(n, size, shards, split):
    if split:
        size *= shards
    per_rank = [shard_batches(batches(n, size), batch_size=size, num_shards=shards, shard=r,
                              split_batches=split, even_batches=True) for r in range(shards)]
    assert len({len(p) for p in per_rank}) == 1, "ranks got different numbers of batches"
    seen = []
    for step in range(len(per_rank[0])):
        gathered = [i for r in range(shards) for i in per_rank[r][step][0]]
        remainder = per_rank[0][step][1]
        seen += gathered[:remainder] if remainder is not None else gathered
    assert seen == list(range(n))  # what gather_for_metrics keeps is exactly one process's epoch, in order


def test_round_robin_without_even_batches():
    plan = [shard_batches(batches(10, 4), batch_size=4, num_shards=2, shard=r, split_batches=False,
                          even_batches=False) for r in range(2)]
    assert [b for b, _ in plan[0]] == [[0, 1, 2, 3], [8, 9]]
    assert [b for b, _ in plan[1]] == [[4, 5, 6, 7]]


def test_split_batches_needs_divisible_batch_size():
    with pytest.raises(ConfigError, match="divisible"):
        shard_batches(batches(10, 5), batch_size=5, num_shards=2, shard=0, split_batches=True, even_batches=True)


def _prepared(num_shards: int, shard: int):
    import torch
    from torch.utils.data import DataLoader

    from convoy.train.data.loop import LoopPosition
    from convoy.train.data.prepared import PreparedDataLoader

    loader = DataLoader(torch.arange(16), batch_size=2)
    return PreparedDataLoader(loader, num_shards=num_shards, shard=shard, split_batches=False, even_batches=True,
                              device=None, state=LoopPosition())


def test_a_loader_prepared_before_auto_chose_reads_its_data_parallel_shard():
    # prepared over 4 processes; auto then chose dp=2 x tp=2: this process reads dp shard 1 of 2
    early = _prepared(4, 3)
    early.reshard(num_shards=2, shard=1)
    assert [b.tolist() for b in early] == [b.tolist() for b in _prepared(2, 1)] == [[2, 3], [6, 7], [10, 11], [14, 15]]


def test_a_loader_already_iterating_cannot_change_its_shard():
    early = _prepared(4, 3)
    next(iter(early))
    with pytest.raises(ConfigError, match="prepare the model first"):
        early.reshard(num_shards=2, shard=1)
    early.reshard(num_shards=4, shard=3)  # the same shard: nothing to change


# --- prepared loaders on one process, several shards simulated (the sharding is pure) ---------------------
def _shards(make_loader, n: int = 2, **kwargs):
    import torch  # noqa: F401

    from convoy.train.data.loop import LoopPosition
    from convoy.train.data.prepared import PreparedDataLoader

    return [PreparedDataLoader(make_loader(), num_shards=n, shard=r, state=LoopPosition(), **kwargs) for r in range(n)]


def _interleave(shards) -> list[int]:
    per_rank = [[b.reshape(-1).tolist() for b in s] for s in shards]
    return [i for step in zip(*per_rank) for batch in step for i in batch]


def test_prepared_loader_is_a_dataloader_and_shuffles_like_one_process():
    import torch
    from torch.utils.data import DataLoader

    def make():
        return DataLoader(torch.arange(12), batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(4))

    shards = _shards(make)
    assert all(isinstance(s, DataLoader) for s in shards)
    one = make()
    for _ in range(3):  # epoch after epoch: the generator goes on as it would on one process
        assert _interleave(shards) == [i for b in one for i in b.tolist()]


def test_seedable_sampler_follows_set_epoch():
    import torch
    from torch.utils.data import DataLoader, RandomSampler

    from convoy.train.data import SeedableRandomSampler, prepare_data_loader

    shards = [prepare_data_loader(DataLoader(torch.arange(12), batch_size=3, shuffle=True), num_processes=2,
                                  process_index=r, use_seedable_sampler=True, data_seed=11) for r in range(2)]
    assert isinstance(shards[0].batch_sampler.batch_sampler.sampler, SeedableRandomSampler)  # as in Accelerate
    for s in shards:
        s.set_epoch(5)
    expected = list(RandomSampler(range(12), generator=torch.Generator().manual_seed(16)))
    assert _interleave(shards) == expected
    assert _interleave(shards) != expected  # the next iteration is epoch 6
    for s in shards:
        s.set_epoch(5)
    assert _interleave(shards) == expected


def test_iterable_dataset_is_sharded_and_padded_like_accelerate():
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(torch.arange(11))

        def __len__(self):
            return 11

    shards = _shards(lambda: DataLoader(Stream(), batch_size=2))
    seen = [[(b.tolist(), s.state.end_of_dataloader, s.state.remainder) for b in s] for s in shards]
    assert seen[0] == [([0, 1], False, None), ([4, 5], False, None), ([8, 9], True, 3)]
    assert seen[1] == [([2, 3], False, None), ([6, 7], False, None), ([10, 0], True, 3)]
    assert [len(s) for s in shards] == [3, 3]
    uneven = _shards(lambda: DataLoader(Stream(), batch_size=2), even_batches=False)
    assert [[b.tolist() for b in s] for s in uneven] == [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [10]]]


def test_batch_size_none_and_batch_samplers_without_sampler():
    import torch
    from torch.utils.data import BatchSampler, DataLoader

    assert [[int(x) for x in s] for s in _shards(lambda: DataLoader(torch.arange(5), batch_size=None))] == \
        [[0, 2, 4], [1, 3, 0]]
    by_sampler = _shards(lambda: DataLoader(torch.arange(10), sampler=BatchSampler(range(10), 3, False),
                                            batch_size=None))
    assert [[b.tolist() for b in s] for s in by_sampler] == [[[0, 1, 2], [6, 7, 8]], [[3, 4, 5], [9, 0, 1]]]

    class Fixed:  # batch_size but no .sampler
        batch_size = 2

        def __iter__(self):
            return iter([[4, 5], [0, 1], [2, 3]])

        def __len__(self):
            return 3

    assert [[b.tolist() for b in s] for s in _shards(lambda: DataLoader(torch.arange(6), batch_sampler=Fixed()))] \
        == [[[4, 5], [2, 3]], [[0, 1], [4, 5]]]
    Fixed.batch_size = None
    with pytest.raises(ConfigError, match="even_batches=False"):
        _shards(lambda: DataLoader(torch.arange(6), batch_sampler=Fixed()))
    assert [[b.tolist() for b in s] for s in
            _shards(lambda: DataLoader(torch.arange(6), batch_sampler=Fixed()), even_batches=False)] == \
        [[[4, 5], [2, 3]], [[0, 1]]]


def test_skip_first_batches_shortens_the_loader():
    import torch
    from torch.utils.data import DataLoader

    from convoy import Accelerator

    acc = Accelerator()
    loader = acc.prepare(DataLoader(torch.arange(10), batch_size=2))
    skipped = acc.skip_first_batches(loader, 3)
    assert isinstance(skipped, DataLoader) and len(skipped) == 2 and len(loader) == 5
    assert [b.tolist() for b in skipped] == [[6, 7], [8, 9]]
    assert len(list(loader)) == 5


@pytest.mark.parametrize("num_batches", [-1, 1.5, "2", None, True])
def test_skip_first_batches_refuses_a_count_that_is_not_a_whole_number(num_batches):
    import torch
    from torch.utils.data import DataLoader

    from convoy import Accelerator, skip_first_batches

    acc = Accelerator()
    prepared = acc.prepare(DataLoader(torch.arange(10), batch_size=2))
    for skip, loader in ((acc.skip_first_batches, prepared), (skip_first_batches, DataLoader(torch.arange(4)))):
        with pytest.raises(ConfigError, match=re.escape(f"skip_first_batches(num_batches={num_batches!r}): give how "
                                                        "many batches to skip, a whole number >= 0")):
            skip(loader, num_batches)
    # -1 read as a slice kept the last batch only; numpy's ints are counts as well
    assert [b.tolist() for b in acc.skip_first_batches(prepared, np.int64(4))] == [[8, 9]]


def test_dataloader_configuration_defaults_are_accelerates():
    from convoy.train import DataLoaderConfiguration

    config = DataLoaderConfiguration()
    assert (config.split_batches, config.dispatch_batches, config.even_batches, config.use_seedable_sampler,
            config.data_seed, config.non_blocking, config.use_stateful_dataloader) == \
        (False, None, True, False, None, False, False)


def test_a_stateful_loader_without_torchdata_names_the_install(monkeypatch):
    from convoy.errors import NotSupportedYetError
    from convoy.train import DataLoaderConfiguration
    from convoy.train.data import torchdata_loader as stateful

    monkeypatch.setattr(stateful, "StatefulDataLoader", None)  # as without torchdata installed
    with pytest.raises(NotSupportedYetError, match=r"=True\) needs torchdata.*pip install torchdata"):
        DataLoaderConfiguration(use_stateful_dataloader=True)


def test_a_stateful_loader_with_dispatched_batches_is_refused():
    pytest.importorskip("torchdata")
    from torch.utils.data import DataLoader

    from convoy.errors import NotSupportedYetError
    from convoy.train.data import DataLoaderConfiguration, shard_data_loader
    from convoy.train.data.loop import LoopPosition

    config = DataLoaderConfiguration(use_stateful_dataloader=True, dispatch_batches=True)
    with pytest.raises(NotSupportedYetError, match="dispatch_batches=True is not supported yet"):
        shard_data_loader(DataLoader(list(range(8)), batch_size=2), config=config, num_shards=1, shard=0,
                          device=None, state=LoopPosition(), broadcast=lambda v: v)


@pytest.mark.parametrize("iterable", [False, True])
def test_a_stateful_loader_is_torchdatas_and_save_state_resumes_it_mid_epoch(tmp_path, iterable):
    pytest.importorskip("torchdata")
    import torch
    from torch.utils.data import DataLoader, IterableDataset
    from torchdata.stateful_dataloader import StatefulDataLoader

    from convoy import Accelerator
    from convoy.train import DataLoaderConfiguration

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(torch.arange(20))

    def run(seed):
        acc = Accelerator(dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
        data = Stream() if iterable else torch.arange(20)
        shuffle = {} if iterable else {"shuffle": True, "generator": torch.Generator().manual_seed(seed)}
        return acc, acc.prepare(DataLoader(data, batch_size=3, **shuffle))

    acc, loader = run(1)
    assert isinstance(loader, StatefulDataLoader)
    rest = []
    for step, batch in enumerate(loader):
        if step == 2:
            acc.save_state(tmp_path / "ckpt")
        elif step > 2:
            rest.append(batch.tolist())
    acc, resumed = run(99)  # another seed: the saved shuffling state decides
    acc.load_state(tmp_path / "ckpt")
    assert [b.tolist() for b in resumed] == rest and len(rest) == 4  # 7 batches, 3 consumed
    assert len(list(resumed)) == 7  # the next epoch is whole


def test_a_saved_position_resumes_the_same_shuffled_epoch():
    import torch
    from torch.utils.data import DataLoader

    def make(seed):
        return DataLoader(torch.arange(12), batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(seed))

    first = _shards(lambda: make(1), n=1)[0]
    it = iter(first)
    consumed = [next(it).tolist() for _ in range(2)]
    saved = first.state_dict()
    rest = [b.tolist() for b in it]
    resumed = _shards(lambda: make(99), n=1)[0]  # another seed: the saved shuffling state decides
    resumed.load_state_dict(saved)
    assert [b.tolist() for b in resumed] == rest and len(consumed + rest) == 6


def test_dispatched_batches_are_sliced_from_one_reader():
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    from convoy.train.data.dispatch import DispatchedDataLoader
    from convoy.train.data.loop import LoopPosition

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(torch.arange(11))

    # one process plays both ranks: each reads (reader=True) what process 0 would broadcast
    ranks = [DispatchedDataLoader(DataLoader(Stream(), batch_size=2), num_shards=2, shard=r, split_batches=False,
                                  device=None, state=LoopPosition(), non_blocking=False, broadcast=lambda v: v,
                                  reader=True) for r in range(2)]
    seen = [[(b.tolist(), d.state.end_of_dataloader, d.state.remainder) for b in d] for d in ranks]
    assert seen[0] == [([0, 1], False, None), ([4, 5], False, None), ([8, 9], True, 3)]
    assert seen[1] == [([2, 3], False, None), ([6, 7], False, None), ([10, 0], True, 3)]
    assert isinstance(ranks[0], DataLoader)


def test_a_loop_inside_a_loop_keeps_each_loaders_end():
    import torch
    from torch.utils.data import DataLoader

    from convoy.train.data.loop import LoopPosition
    from convoy.train.data.prepared import PreparedDataLoader

    state = LoopPosition()
    outer, inner = (PreparedDataLoader(DataLoader(torch.arange(n), batch_size=2), num_shards=1, shard=0, state=state)
                    for n in (6, 4))
    seen = []
    for i, _ in enumerate(outer):
        assert state.active_dataloader is outer
        if i == 1:
            for _ in inner:
                seen.append(("inner", state.active_dataloader is inner, state.end_of_dataloader))
        seen.append(("outer", state.active_dataloader is outer, state.end_of_dataloader))
    assert seen == [("outer", True, False), ("inner", True, False), ("inner", True, True), ("outer", True, False),
                    ("outer", True, True)]
    assert state.active_dataloader is None and not state.end_of_dataloader
    for _ in outer:
        break  # leaving early: the loader is no longer active
    import gc

    gc.collect()
    assert state.active_dataloader is None


@pytest.mark.parametrize("iterable", [False, True])
def test_one_process_reads_the_short_last_batch_unpadded_as_accelerate(iterable):
    import torch
    from torch.utils.data import DataLoader, IterableDataset

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(torch.arange(7))

    data = Stream() if iterable else torch.arange(7)
    (alone,) = _shards(lambda: DataLoader(data, batch_size=3), n=1)
    assert [b.tolist() for b in alone] == [[0, 1, 2], [3, 4, 5], [6]] and alone.remainder is None
    pair = _shards(lambda: DataLoader(data, batch_size=3), n=2)  # two processes still even out the last round
    assert [[b.tolist() for b in s] for s in pair] == [[[0, 1, 2], [6, 0, 1]], [[3, 4, 5], [2, 3, 4]]]


def test_a_progress_bar_over_a_loader_resumed_mid_epoch_ends_at_its_length(tmp_path):
    """load_state put the loader 10 batches into a 40-batch epoch: the bar starts at 10 and ends at 40/40 (it ended
    at 30/40), and the next epoch's bar starts at 0."""
    import io

    import torch
    from torch.utils.data import DataLoader

    from convoy import Accelerator
    from convoy.train.progress import progress_bar

    def run():
        acc = Accelerator()
        return acc, acc.prepare(DataLoader(torch.arange(40), batch_size=1))

    acc, loader = run()
    for step, _ in enumerate(loader):
        if step == 9:
            acc.save_state(tmp_path / "ckpt")
            break
    acc, resumed = run()
    acc.load_state(tmp_path / "ckpt")
    bar = progress_bar(resumed, main_process_only=False, disable=False, file=io.StringIO())
    seen = [int(batch) for batch in bar]
    assert seen == list(range(10, 40)) and (bar.n, bar.total) == (40, 40)
    again = progress_bar(resumed, main_process_only=False, file=io.StringIO())
    assert len(list(again)) == 40 and (again.n, again.total) == (40, 40)
