"""Sequence parallelism inside pipeline stages: tp=2 x pp=2 with sequence_parallel=True matches one process.

One 4-process launch; the script asserts (stage boundary shapes, parameter placement, parity) and prints one
``OK`` line per rank.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed import run_script

SCRIPTS = Path(__file__).parent / "scripts"
pytestmark = pytest.mark.slow


def test_tp2_pp2_with_sequence_parallel_through_the_accelerator_matches_one_process():
    result = run_script(SCRIPTS / "sp_pp_parity.py", nproc=4, timeout=120)
    assert result.returncode == 0, result.output
    ok = [line for line in result.output.splitlines() if line.endswith(" OK")]
    assert sum("tp=2 x pp=2 sp=True (TP+PP)" in line for line in ok) == 4, result.output
    assert {line.split(" stage ")[1].split(":")[0] for line in ok} == {
        f"{stage} tp rank {r}" for stage in (0, 1) for r in (0, 1)}, result.output
