"""Accelerate's helpers under convoy, in one process, beside the installed ``accelerate``'s own where it runs:
out-of-memory detection and the batch-size search, the ``is_*_available`` checks, ``tqdm``, ``patch_environment``,
``LocalSGD``'s refusal where processes hold different parts of the model."""

from __future__ import annotations

import os

import pytest
import torch

import convoy.utils
from convoy import Accelerator, PartialState
from convoy.errors import ConfigError, NotSupportedYetError
from convoy.local_sgd import LocalSGD
from convoy.train.process_group import stop_process_group
from convoy.utils import find_executable_batch_size, patch_environment, should_reduce_batch_size, tqdm

accelerate_utils = pytest.importorskip("accelerate.utils")
accelerate_memory = pytest.importorskip("accelerate.utils.memory")

ERRORS = [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1125899906842624 bytes."),
    RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)"),
    RuntimeError("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if ..."),
    RuntimeError("some other failure"),
    RuntimeError("CUDA out of memory.", "a second argument"),
    ValueError("CUDA out of memory."),
    KeyboardInterrupt(),
]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: f"{type(e).__name__}:{str(e)[:20]}")
def test_out_of_memory_is_what_accelerate_calls_it(error):
    assert should_reduce_batch_size(error) == accelerate_memory.should_reduce_batch_size(error)


def test_a_real_cpu_allocator_failure_reduces_the_batch_size():
    with pytest.raises(RuntimeError) as err:
        torch.empty(2**50, dtype=torch.uint8)
    assert should_reduce_batch_size(err.value)


def test_the_batch_size_search_retries_smaller_and_keeps_other_errors():
    tried = []

    @find_executable_batch_size(starting_batch_size=64, reduce_batch_size_fn=lambda: tried[-1] // 2)
    def halving(batch_size, scale):
        tried.append(batch_size)
        if batch_size > 10:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")
        return batch_size * scale

    assert halving(3) == 24 and tried == [64, 32, 16, 8]
    with pytest.raises(TypeError, match="batch size was passed"):
        halving(8, 3)

    @find_executable_batch_size(starting_batch_size=4)
    def broken(batch_size):
        raise ValueError("not memory")

    with pytest.raises(ValueError, match="not memory"):
        broken()

    @find_executable_batch_size(starting_batch_size=2)
    def never(batch_size):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory")

    with pytest.raises(RuntimeError, match="No executable batch size found, reached zero."):
        never()
    with pytest.raises(ConfigError, match=r"starting_batch_size=0\): give the first batch size"):
        find_executable_batch_size(lambda batch_size: None, starting_batch_size=0)


def test_availability_checks_answer_as_accelerates():
    names = [n for n in convoy.utils.__all__ if n.startswith("is_") and n.endswith("_available")]
    assert len(names) >= 30
    # Accelerate's package checks answer None for a missing package: a falsy value, as False is
    answers = {n: (getattr(convoy.utils, n)(), bool(getattr(accelerate_utils, n)())) for n in names
               if hasattr(accelerate_utils, n)}
    assert {n: a for n, a in answers.items() if a[0] != a[1]} == {}
    assert convoy.utils.is_tqdm_available() and not convoy.utils.is_npu_available()


def test_tqdm_shows_on_the_local_main_process_only(monkeypatch):
    assert not tqdm(range(2)).disable
    assert tqdm(range(2), disable=True).disable
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert tqdm(range(2)).disable and not tqdm(range(2), main_process_only=False).disable
    with pytest.raises(ConfigError, match="main_process_only= as a keyword"):
        tqdm(True, range(2))


def test_patch_environment_restores_what_was_there(monkeypatch):
    monkeypatch.setenv("CONVOY_TEST_KEPT", "before")
    monkeypatch.delenv("CONVOY_TEST_NEW", raising=False)
    with patch_environment(convoy_test_kept=1, CONVOY_TEST_NEW="x"):
        assert os.environ["CONVOY_TEST_KEPT"] == "1" and os.environ["CONVOY_TEST_NEW"] == "x"
    assert os.environ["CONVOY_TEST_KEPT"] == "before" and "CONVOY_TEST_NEW" not in os.environ


def test_local_sgd_is_a_no_op_on_one_process_and_refused_where_processes_hold_parts():
    PartialState._reset_state()
    try:
        accelerator = Accelerator()
        model = accelerator.prepare(torch.nn.Linear(2, 2))
        with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=2) as local_sgd:
            local_sgd.step()
        assert not local_sgd.enabled and local_sgd.num_steps == 1
        with pytest.raises(ConfigError, match=r"LocalSGD\(local_sgd_steps=0\)"):
            LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=0)
        stop_process_group()
        PartialState._reset_state()
        sharded = Accelerator(strategy="fsdp")
        model = sharded.prepare(torch.nn.Linear(2, 2))
        with pytest.raises(NotSupportedYetError, match="LocalSGD averages whole replicas of the model; this job "
                                                       "runs FSDP"):
            LocalSGD(accelerator=sharded, model=model, local_sgd_steps=2)
    finally:
        PartialState._reset_state()
        stop_process_group()
