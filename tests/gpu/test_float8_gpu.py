"""``mixed_precision="fp8"`` on one CUDA device (scripts/float8_cuda.py, a fresh process per recipe): on a board
with float8 tensor cores each recipe trains through ``torch._scaled_mm`` within fp8's tolerance of bf16; on one
without (A100), fp8 is refused in one line and runs emulated when asked.

    python3 -m pytest -m gpu tests/gpu/test_float8_gpu.py -v
"""

from __future__ import annotations

import sys

import pytest

from tests.gpu.gpu_run import SCRIPTS, checks, run

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "rowwise_with_gw_hp"])
def test_fp8_trains_like_bf16_on_a_float8_board_and_is_refused_elsewhere(recipe):
    pytest.importorskip("torchao.float8")
    done = run([sys.executable, str(SCRIPTS / "float8_cuda.py"), recipe], timeout=300)
    assert done.returncode == 0, done.output[-6000:]
    assert checks(done.output) in (["trains within fp8 tolerance of bf16"],
                                   ["refused below sm_89", "emulated when asked"]), done.output[-6000:]
