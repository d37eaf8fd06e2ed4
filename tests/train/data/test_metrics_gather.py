"""``gather_for_metrics`` keeps exactly what Accelerate keeps: on one process the same values at every step as
Accelerate's own (the installed package runs the same script), on 2 and 3 processes one process's epoch.

Before, one process kept the padded tail of a tensor that is not batch-sized: 10 samples, batch 4,
``gather_for_metrics(torch.ones(4))`` gave 4 + 4 + 4 elements where Accelerate gives 4 + 4 + 2, so a
perplexity computed from ``loss.repeat(batch_size)`` differed from Accelerate's.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.distributed import cpu_env, run_script
from tests.processes import finish, start

SCRIPT = Path(__file__).parent.parent / "scripts" / "metrics_gather.py"


def _cases(output: str) -> dict[tuple, list]:
    rows = [json.loads(line.partition("{")[1] + line.partition("{")[2]) for line in output.splitlines()
            if '{"case"' in line]
    return {tuple(row["case"]): row["steps"] for row in rows}


def _one_process(library: str) -> dict[tuple, list]:
    proc = start([sys.executable, str(SCRIPT), library], env=cpu_env())
    output = finish(proc, timeout=120)
    assert proc.returncode == 0, output
    return _cases(output)


def test_one_process_gathers_what_accelerate_gathers():
    ours, theirs = _one_process("convoy"), _one_process("accelerate")
    assert len(theirs) == 48
    assert ours == theirs
    assert ours[(13, False, True, "not_batch_sized")] == [4, 4, 1]  # 13 samples, batch 6: the last step keeps 1


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 3])
def test_several_processes_gather_one_processs_epoch(nproc):
    result = run_script(SCRIPT, nproc=nproc, args=["convoy"], timeout=180)
    assert result.returncode == 0, result.output
    cases = _cases(result.output)
    assert len(cases) == 24, result.output
    for (length, split, _, kind), steps in cases.items():
        total = 6 if split else 6 * nproc  # samples in one global step (batch size 6)
        if kind in ("batch", "object"):
            assert [x for step in steps for x in step] == list(range(length)), (length, split, kind, steps)
        elif kind == "not_batch_sized":
            short = length % total
            expected = [4 * nproc] * (length // total) + ([min(short, 4 * nproc)] if short else [])
            assert steps == expected, (length, split, steps)
        else:  # nested: the batch-sized members are the epoch, the other one cut like not_batch_sized's
            assert [x for step in steps for x in step[0]] == list(range(length)), (length, split, steps)
            assert [x for step in steps for x in step[1]] == [2 * x for x in range(length)], (length, split, steps)
