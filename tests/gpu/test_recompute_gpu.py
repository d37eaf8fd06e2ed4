"""``Accelerator(recompute=...)`` on one CUDA device (scripts/recompute_cuda.py, a fresh process per mode): the peak
``torch.cuda.max_memory_allocated`` falls from none to selective to full as the plan says, and each mode trains the
same parameters.

    python3 -m pytest -m gpu tests/gpu/test_recompute_gpu.py -v
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.gpu.gpu_run import SCRIPTS, run

pytestmark = pytest.mark.gpu
MODES = ("none", "selective", "full")


@pytest.mark.parametrize("strategy", ["single", "zero3"])
def test_recompute_lowers_the_peak_as_planned_and_trains_the_same_parameters(strategy, tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    reports = {}
    for mode in MODES:
        done = run([sys.executable, str(SCRIPTS / "recompute_cuda.py"), mode, strategy, str(tmp_path / f"{mode}.pt")],
                   env={"XDG_CACHE_HOME": str(tmp_path)}, timeout=300)
        assert done.returncode == 0, done.output[-6000:]
        line = next(line for line in done.output.splitlines() if line.startswith("REPORT "))
        reports[mode] = json.loads(line[len("REPORT "):])
    print(json.dumps(reports, indent=1))  # the numbers for docs/gpu.md
    for mode, report in reports.items():
        assert report["device"] == "cuda" and f"recompute {mode} " in report["case"], report
        assert report["calls_per_step"] == (1 if mode == "none" else 2), report  # the backward ran each block again
        # the plan's peak for this recomputation (planned / measured); the planner's one-GPU accuracy without
        # recomputation is within a few per cent (docs/planner-accuracy.md); a recomputing step's peak can come
        # while a block is recomputed, which the plan approximates
        assert 0.8 < report["memory_ratio"] < 1.2, (mode, report)
    measured = [reports[mode]["measured_peak_bytes"] for mode in MODES]
    planned = [reports[mode]["planned_peak_bytes"] for mode in MODES]
    assert measured[0] > measured[1] > measured[2] and planned[0] > planned[1] > planned[2], (measured, planned)
    # the run without recomputation once more: what two identical runs differ by on this GPU (the attention
    # backward's atomics; AdamW turns a gradient's noise into up to lr per step where the gradient is near 0)
    again = run([sys.executable, str(SCRIPTS / "recompute_cuda.py"), "none", strategy, str(tmp_path / "again.pt")],
                env={"XDG_CACHE_HOME": str(tmp_path)}, timeout=300)
    assert again.returncode == 0, again.output[-6000:]
    params = {mode: torch.load(tmp_path / f"{mode}.pt") for mode in (*MODES, "again")}

    def differ(mode: str) -> float:
        return max((params[mode][k] - params["none"][k]).abs().max().item() for k in params["none"])

    noise = differ("again")
    for mode in ("selective", "full"):  # recomputation replays the same kernels; bf16 autocast, 9 AdamW steps
        diff = differ(mode)
        assert diff < max(1e-4, 3 * noise), (mode, diff, noise)  # no further from eager than eager from itself
