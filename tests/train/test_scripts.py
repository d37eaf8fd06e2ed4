"""End-to-end scripts: Accelerate's quick tour with only the import changed; a kill during save_state."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import processes
from tests.distributed import cpu_env, run_script

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.mark.slow
def test_accelerate_quick_tour_runs_on_two_cpu_processes():
    result = run_script(SCRIPTS / "quick_tour.py", nproc=2)
    assert result.returncode == 0, result.output[-4000:]
    assert "QUICK TOUR OK" in result.output


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in cpu_env().items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}  # CPU, as the ranks
    return processes.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=120)


def test_kill_during_save_state_leaves_last_checkpoint_loadable(tmp_path):
    killed = _python(str(SCRIPTS / "kill_save.py"), str(tmp_path))
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert "NOT REACHED" not in killed.stdout
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert "checkpoint_0" in names and "checkpoint_1" not in names, names  # only a staging dir is left
    loaded = _python(str(SCRIPTS / "kill_save.py"), str(tmp_path), "--load")
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert "LOADED checkpoint_0 8.0 False" in loaded.stdout, loaded.stdout  # weights of 1.0 (4x2), not 2.0
