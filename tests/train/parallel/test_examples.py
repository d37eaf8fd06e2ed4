"""The examples train (loss falls) under ``convoy launch`` on 2 CPU processes without a warning; a tp=2
checkpoint resumes at tp=1 through the Accelerator."""

from __future__ import annotations

import re
import sys

import pytest

from tests import processes
from tests.distributed import REPO, cpu_env, run_script

pytestmark = pytest.mark.slow


#: a Python warning ("UserWarning: ...", "FutureWarning: ...") or a line of torch's C++/Python logger ("W1125 ...")
WARNING = re.compile(r"\w*Warning: |\bW\d{4} \d")


@pytest.mark.parametrize("script, args, nproc, layout", [
    ("tiny_gpt_pp.py", ["--steps", "11", "--schedule", "gpipe", "--microbatches", "2"], 2, "dp=1,tp=1,pp=2 (PP)"),
    # zero3 (FSDP2) with the docs' command line (docs/training.md)
    ("tiny_gpt.py", ["--steps", "11"], 2, "strategy=zero3 on 2 process(es)"),
    # the same pipeline script on one process: nothing to split, the loop runs unchanged (pp=1)
    ("tiny_gpt_pp.py", ["--steps", "11"], 1, "dp=1,tp=1,pp=1 (NO)"),
])
def test_example_trains(script, args, nproc, layout):
    """... and prints no warning: FSDP2's "returned a view tensor" (tiny_gpt.py's biased output layer) and the
    pytree FutureWarning of torch's pipeline tracing (tiny_gpt_pp.py) were printed on every rank."""
    result = run_script(REPO / "examples" / script, nproc=nproc, args=args)
    assert result.returncode == 0, result.output
    assert layout in result.output, result.output
    assert not WARNING.search(result.output), result.output
    losses = [float(v) for v in re.findall(r"step +\d+ +loss ([0-9.]+)", result.output)]
    assert len(losses) == 2 and losses[-1] < 0.5 * losses[0], result.output


def test_tp2_example_trains_and_its_checkpoint_resumes_in_one_plain_process(tmp_path):
    ckpt = tmp_path / "ckpt"
    result = run_script(REPO / "examples" / "tiny_gpt_tp.py", nproc=2, args=["--steps", "11", "--save", str(ckpt)])
    assert result.returncode == 0, result.output
    assert "dp=1,tp=2,pp=1 (TP)" in result.output, result.output
    losses = [float(v) for v in re.findall(r"step +\d+ +loss ([0-9.]+)", result.output)]
    assert len(losses) == 2 and losses[-1] < 0.5 * losses[0], result.output
    saved = re.search(r"next loss ([0-9.]+)", result.output)
    assert saved, result.output
    env = {k: v for k, v in cpu_env().items() if k not in ("CONVOY_PARALLELISM", "CONVOY_STRATEGY")}
    loaded = processes.run([sys.executable, str(REPO / "tests/train/parallel/scripts/load_at_tp1.py"), str(ckpt),
                             "11", "8"], capture_output=True, text=True, env={**env, "OMP_NUM_THREADS": "1"},
                            timeout=120)
    assert loaded.returncode == 0, loaded.stderr
    resumed = re.search(r"next loss ([0-9.]+)", loaded.stdout)
    assert resumed and abs(float(resumed.group(1)) - float(saved.group(1))) < 1e-5, (saved, loaded.stdout)
