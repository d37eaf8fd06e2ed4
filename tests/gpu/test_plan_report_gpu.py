"""``accelerator.plan_report()`` on one CUDA device (scripts/plan_report_cuda.py, a fresh process per case): the
measured peak is ``torch.cuda.max_memory_allocated`` over the measured steps, and the next plan of that case on
this GPU (found through NVML's uuid, no --calibrate) takes the measured step time.

    python3 -m pytest -m gpu tests/gpu/test_plan_report_gpu.py -v
"""

from __future__ import annotations

import sys

import pytest

from tests.gpu.gpu_run import SCRIPTS, checks, run

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("strategy", ["single", "zero3"])
def test_plan_report_on_cuda(strategy, tmp_path):
    done = run([sys.executable, str(SCRIPTS / "plan_report_cuda.py"), strategy],
               env={"XDG_CACHE_HOME": str(tmp_path)}, timeout=300)
    assert done.returncode == 0, done.output[-6000:]
    assert checks(done.output) == ["measured peak is max_memory_allocated",
                                   "peak holds weights, gradients and Adam state", "ratios are planned over measured",
                                   "the next plan on this GPU takes the measured step"], done.output[-6000:]
    logged = [line for line in done.output.splitlines() if line.startswith("LOG convoy.train.plan_report: ")]
    assert len(logged) == 1 and " peak (steps 3-7); the plan for " in logged[0], done.output[-6000:]
