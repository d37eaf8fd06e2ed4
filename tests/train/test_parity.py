"""N processes on CPU/gloo give the same weights as one process with the global batch (issue 4, done means).

Each run combines several checks (see scripts/parity.py) to pay the process start-up once.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import processes
from tests.distributed import cpu_env, run_script
from tests.processes import side_by_side

SCRIPT = Path(__file__).parent / "scripts" / "parity.py"
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero2", "zero3"])
def test_parity_accumulation_and_data_on_two_processes(strategy):
    result = run_script(SCRIPT, nproc=2, args=["--strategy", strategy])
    assert result.returncode == 0, result.output[-4000:]
    for check in ("parity", "accumulation", "data"):
        assert result.output.count(f"CHECK {check} ok") == 2, result.output[-4000:]


def _one_process(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in cpu_env().items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}  # CPU, as the ranks
    return processes.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.mark.parametrize("strategy", ["zero3", "zero1"])
def test_checkpoint_moves_between_process_counts(strategy, tmp_path):
    two_to_one, one_to_two = tmp_path / "a", tmp_path / "b"
    two_to_one.mkdir()
    one_to_two.mkdir()

    def two_then_one():
        saved = run_script(SCRIPT, nproc=2, args=["--strategy", strategy, "--checks", "resume-save", "--out",
                                                  str(two_to_one)])
        assert saved.returncode == 0, saved.output[-4000:]
        loaded = _one_process(["--strategy", strategy, "--checks", "resume-load", "--out", str(two_to_one)])
        assert loaded.returncode == 0 and "CHECK resume-load ok" in loaded.stdout, (
            loaded.stdout + loaded.stderr[-4000:])

    def one_then_two():
        saved = _one_process(["--strategy", strategy, "--checks", "resume-save", "--out", str(one_to_two)])
        assert saved.returncode == 0, saved.stderr[-4000:]
        loaded = run_script(SCRIPT, nproc=2, args=["--strategy", strategy, "--checks", "resume-load", "--out",
                                                   str(one_to_two)])
        assert loaded.returncode == 0 and loaded.output.count("CHECK resume-load ok") == 2, loaded.output[-4000:]

    side_by_side(two_then_one, one_then_two)  # independent: a one-process step leaves a core idle
