"""The two examples train (loss falls) under ``convoy launch`` on 2 CPU processes."""

from __future__ import annotations

import re

import pytest

from tests.distributed import REPO, run_script

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("script, args, layout", [
    ("tiny_gpt_tp.py", ["--steps", "11"], "dp=1,tp=2,pp=1 (TP)"),
    ("tiny_gpt_pp.py", ["--steps", "11", "--schedule", "gpipe", "--microbatches", "2"], "dp=1,tp=1,pp=2 (PP)"),
])
def test_example_trains_on_two_processes(script, args, layout):
    result = run_script(REPO / "examples" / script, nproc=2, args=args)
    assert result.returncode == 0, result.output
    assert layout in result.output, result.output
    losses = [float(v) for v in re.findall(r"step +\d+ +loss ([0-9.]+)", result.output)]
    assert len(losses) == 2 and losses[-1] < 0.5 * losses[0], result.output
