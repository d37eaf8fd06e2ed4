"""Sharding rules of prepared dataloaders (pure function ``shard_batches``)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from convoy.errors import ConfigError
from convoy.train.data import shard_batches


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

    from convoy.train.data import LoopState, PreparedDataLoader

    loader = DataLoader(torch.arange(16), batch_size=2)
    return PreparedDataLoader(loader, num_shards=num_shards, shard=shard, split_batches=False, even_batches=True,
                              seed=0, device=None, state=LoopState())


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
