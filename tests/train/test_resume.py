"""Kill-and-resume: a rank killed part-way is restarted by ``convoy launch --max-restarts``; the run resumes
from its newest complete checkpoint and ends with exactly the parameters of a run that never failed, with no
step trained twice or skipped (the dataloader position is restored)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.distributed import cpu_env
from tests.processes import finish, start

SCRIPT = Path(__file__).parent / "scripts" / "resume_worker.py"


def _launch(project: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "convoy", "launch", "--devices=0", "--nproc-per-node=2", "--max-restarts=1",
           str(SCRIPT), "--project-dir", str(project), *extra]  # two CPU processes on every machine
    return start(cmd, env=cpu_env())


def _finish(proc: subprocess.Popen) -> tuple[int, str]:
    try:
        out = finish(proc, timeout=150)
    except subprocess.TimeoutExpired as err:
        out = err.output or ""
    return proc.returncode, out


def _trace(project: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (project / f"trace_rank{rank}.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_killed_rank_resumes_to_the_same_parameters(tmp_path):
    import torch

    clean, broken = tmp_path / "clean", tmp_path / "broken"
    runs = [_launch(clean), _launch(broken, "--kill-at", "8")]  # side by side: the imports overlap
    (ok, ok_out), (killed, killed_out) = [_finish(p) for p in runs]
    assert ok == 0, ok_out
    assert killed == 0, killed_out
    # the second attempt started from the checkpoint of step 6, the newest complete one before the kill
    assert "attempt 1 rank 0 starts at step 6 from checkpoint_1" in killed_out, killed_out
    assert "attempt 0 rank 0 starts at step 0 fresh" in killed_out

    for rank in (0, 1):
        reference = [(t["step"], t["ids"]) for t in _trace(clean, rank)]
        assert [step for step, _ in reference] == list(range(1, 13))
        trace = _trace(broken, rank)
        first = [(t["step"], t["ids"]) for t in trace if t["attempt"] == 0]
        second = [(t["step"], t["ids"]) for t in trace if t["attempt"] == 1]
        assert second[0][0] == 7, trace  # resumed right after the checkpoint: nothing skipped
        # what the final model saw: attempt 0 up to the checkpoint, then attempt 1; each step once, same batches
        assert first[:6] + second == reference
        assert first[6:] == reference[6:len(first)]  # the lost steps were the same batches, redone once

    want, got = torch.load(clean / "final.pt"), torch.load(broken / "final.pt")
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name
