"""convoy.launch(fn): rank 0's value back, the real failing rank's exception raised here, nothing left over."""

from __future__ import annotations

import os

import pytest

import convoy
from convoy.errors import RankFailedError
from tests.launch import fn_targets

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def test_returns_rank_zeros_value_with_fork_and_spawn():
    assert convoy.launch(fn_targets.all_reduce_rank, args=(10,), nproc_per_node=2) == (0, 2, 21, "0")
    assert convoy.launch(fn_targets.all_reduce_rank, args=(1,), nproc_per_node=2, start_method="spawn") == \
        (0, 2, 3, "0")
    assert "RANK" not in os.environ and "MASTER_PORT" not in os.environ  # the caller's environment is untouched


def test_convoy_launch_is_callable_even_after_the_package_is_imported():
    import convoy.launch.plan  # noqa: F401 - binds the package to the name convoy.launch

    assert convoy.launch(fn_targets.env_value, args=("LOCAL_WORLD_SIZE",), nproc_per_node=1) == "1"


def test_reraises_the_failing_ranks_exception_and_reports_a_dead_rank():
    with pytest.raises(fn_targets.RankOneError, match="rank one broke") as info:
        convoy.launch(fn_targets.rank_one_raises, nproc_per_node=2)
    note = "\n".join(info.value.__notes__)
    assert note.startswith("rank 1 on host") and "in rank_one_raises" in note
    with pytest.raises(RankFailedError, match="rank 0 on host .* died with exit code 7") as info:
        convoy.launch(fn_targets.rank_zero_dies, nproc_per_node=2)
    assert info.value.rank == 0 and info.value.exitcode == 7
