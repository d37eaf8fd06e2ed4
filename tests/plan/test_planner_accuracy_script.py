"""benchmarks/planner_accuracy.py: refuses without a GPU in one line; its tiny CPU variant prints the table."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "planner_accuracy.py"


def test_without_a_gpu_it_refuses_in_one_line(capsys):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: the script would run")
    sys.path.insert(0, str(SCRIPT.parent))
    import planner_accuracy

    assert planner_accuracy.main([]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("\n") == 1
    assert "needs a CUDA GPU" in out.err and "--cpu" in out.err


def test_cpu_variant_prints_planner_against_measured_with_ratios(capsys, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # the calibration cache
    sys.path.insert(0, str(SCRIPT.parent))
    import planner_accuracy

    # pythia-tiny-fsdp: FSDP2 with bf16 MixedPrecisionPolicy on a one-process gloo group, planned as bf16-fsdp
    assert planner_accuracy.main(["--cpu", "--steps", "3", "--cases", "llama-tiny-gqa,pythia-tiny-fsdp"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| llama") or line.startswith("| pythia")]
    assert len(rows) == 2
    for row in rows:
        alloc = float(re.search(r"MB \((\d+\.\d+)x\)", row).group(1))
        assert 0.95 <= alloc <= 1.05, row  # MemTracker's peak against memory_per_gpu, CPU autocast
        # measured, then the profile (none for a CPU: the model), the shape-aware model and the calibration
        assert re.search(r"ms / (\d+\.\d+ ms \(\d+\.\d+x\)( / )?){3} \|$", row), row
    assert "worst peak allocated error" in out and "worst step (calibrated) error" in out
    assert (tmp_path / "convoy" / "calibration.json").exists()
    with pytest.raises(SystemExit):
        planner_accuracy.main(["--cpu", "--cases", "nope"])
