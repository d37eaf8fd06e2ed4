"""convoy.plan.memo: a remembered function answers as the function does, and a record hashed once stays a record."""

from __future__ import annotations

import pickle
from dataclasses import replace

from convoy.plan.hardware import parse_hardware
from convoy.plan.memo import forget, remembered
from convoy.plan.run import RunSpec


def test_a_remembered_function_runs_once_per_arguments_and_afresh_for_what_does_not_hash() -> None:
    calls = []

    @remembered
    def area(run: RunSpec, *, tp: int = 1) -> float:
        calls.append(tp)
        return run.seq_len * run.micro_batch / tp

    run = RunSpec(seq_len=1024, micro_batch=2)
    assert area(run, tp=2) == area(replace(run), tp=2) == 1024 and calls == [2]
    assert area(run, tp=4) == 512 and calls == [2, 4]
    assert area(run) == 2048 and calls == [2, 4, 1]

    @remembered
    def total(values: list[int]) -> int:  # a list does not hash: computed each time
        calls.append(0)
        return sum(values)

    assert total([1, 2]) == total([1, 2]) == 3 and calls[-2:] == [0, 0]
    forget()
    area(run, tp=2)
    assert calls[-1] == 2


def test_a_record_hashed_once_compares_hashes_and_pickles_as_before() -> None:
    hw = parse_hardware("8xH100-80GB")
    same = parse_hardware("8xH100-80GB")
    assert hw == same and hash(hw) == hash(same) and hash(hw) == hash(hw)
    assert hw != replace(hw, nodes=2)
    copy = pickle.loads(pickle.dumps(hw))
    assert copy == hw and hash(copy) == hash(hw) and vars(copy) == vars(hw)
    assert set(vars(RunSpec())) == {f for f in RunSpec.__dataclass_fields__}
