"""``accelerator.plan_report()`` on one CUDA device (scripts/plan_report_cuda.py, a fresh process per case): the
measured peak is ``torch.cuda.max_memory_allocated`` over the measured steps, and the next plan of that case on
this GPU (found through NVML's uuid, no --calibrate) takes the measured step time; the line logged once says the
step and the peak beside the plan's, the step within 25 %.

    python3 -m pytest -m gpu tests/gpu/test_plan_report_gpu.py -v
"""

from __future__ import annotations

import re
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
    assert len(logged) == 1, done.output[-6000:]
    line = re.search(r"convoy: step ([0-9.]+) (us|ms|s), planned ([0-9.]+) (us|ms|s) \(plan [^)]+\); peak [0-9.]+ "
                     rf"[KMG]iB, planned [0-9.]+ [KMG]iB \(plan [^)]+\) -- {strategy} on .+, steps 3-7$", logged[0])
    assert line, logged[0]
    unit = {"us": 1e-6, "ms": 1e-3, "s": 1.0}
    ratio = float(line.group(3)) * unit[line.group(4)] / (float(line.group(1)) * unit[line.group(2)])
    assert 0.75 <= ratio <= 1.25, logged[0]  # the step planned within 25 % on a GPU
