"""benchmarks/step_throughput.py at a tiny size on the CPU: the raw torchtitan-style recipe and convoy's
Accelerator with the same options train the same model (eager bf16, and compiled with float8 tensorwise in
torchao's emulation), and the table has a number in every cell; the GPU review runs it at the 8B shape."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.distributed import cpu_env
from tests.processes import finish, start

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "step_throughput.py"


@pytest.mark.slow
def test_raw_and_convoy_train_the_same_model_and_the_table_is_whole(tmp_path):
    pytest.importorskip("torchao")
    proc = start([sys.executable, str(SCRIPT), "--size", "tiny", "--steps", "2", "--warmup", "1",
                  "--rows", "eager,compile+fp8-tensorwise"],
                 env=cpu_env({"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "MASTER_PORT": "0"}))
    output = finish(proc, timeout=600)
    assert proc.returncode == 0, output
    cells = re.findall(r"^(eager|compile\+fp8-tensorwise)\s+(raw|convoy)\s+([\d,]+)\s", output, re.M)
    assert sorted((row, side) for row, side, _ in cells) == [
        ("compile+fp8-tensorwise", "convoy"), ("compile+fp8-tensorwise", "raw"), ("eager", "convoy"),
        ("eager", "raw")], output
    assert all(int(tokens.replace(",", "")) > 0 for _, _, tokens in cells), output
    assert re.search(r"^compile\+fp8-tensorwise\s+convoy\s+[\d,]+\s+n/a\s+nan\s+\d+\.\d\d\s", output, re.M), output
    losses = {(row, side): [float(x) for x in rest.split()] for row, side, rest in
              re.findall(r"^  (\S+)\s+(raw|convoy)\s+([\d. ]+)$", output, re.M)}
    for row, tolerance in (("eager", 1e-3), ("compile+fp8-tensorwise", 5e-3)):
        raw, ours = losses[row, "raw"], losses[row, "convoy"]
        assert len(raw) == len(ours) == 3, output
        assert max(abs(a - b) / abs(a) for a, b in zip(raw, ours)) < tolerance, (row, raw, ours)
