"""Accelerator.wait_for_everyone() names the rank that never arrives instead of hanging."""

from pathlib import Path

import pytest

from tests.distributed import run_script

SCRIPT = Path(__file__).parent / "scripts" / "late_rank.py"


@pytest.mark.slow
def test_wait_for_everyone_names_the_late_rank_within_the_timeout():
    result = run_script(SCRIPT, nproc=2, env={"CONVOY_COLLECTIVE_TIMEOUT": "4"}, timeout=150)
    assert result.returncode != 0, result.output
    assert "[rank0]: LATE after" in result.output, result.output
    assert "rank 1 of 2 did not arrive" in result.output
    seconds = float(result.output.split("[rank0]: LATE after ")[1].split("s:")[0])
    assert seconds < 60, result.output  # the 4 s timeout, not the late rank's 120 s sleep
    assert "NO TIMEOUT" not in result.output
