"""The Accelerator on one CUDA device, each case in a fresh process (scripts/accelerator_cuda.py): precision
(fp32, bf16, fp16 with GradScaler and a skipped inf step), every strategy that runs at world size 1 against a
plain loop, save_state/load_state resuming to identical parameters, and save_model's safetensors shards."""

from __future__ import annotations

import sys

import pytest

from tests.gpu.gpu_run import SCRIPTS, checks, run

pytestmark = pytest.mark.gpu
SCRIPT = str(SCRIPTS / "accelerator_cuda.py")


def _checks(*args: str) -> list[str]:
    done = run([sys.executable, SCRIPT, *args], timeout=300)
    assert done.returncode == 0, done.output[-6000:]
    found = checks(done.output)
    assert found[0] == "device cuda:0", done.output[-6000:]
    return found[1:]


@pytest.mark.parametrize("precision", ["no", "bf16", "fp16"])
def test_precision_on_cuda(precision):
    expected = ["trains", "autocast dtype"] + (["fp16 skips an inf step"] if precision == "fp16" else [])
    assert _checks("precision", precision) == expected


@pytest.mark.parametrize("strategy", ["single", "dp", "ddp", "zero1", "zero2", "zero3", "fsdp", "tp", "pp"])
def test_strategy_at_world_size_one_matches_a_plain_loop(strategy):
    assert _checks("strategy", strategy) == [f"{strategy} matches the plain loop"]


def test_save_state_and_load_state_resume_to_identical_parameters(tmp_path):
    assert _checks("resume", str(tmp_path / "ckpt")) == ["resume to identical parameters"]


def test_save_model_safetensors_load_back(tmp_path):
    assert _checks("save_model", str(tmp_path / "model")) == ["safetensors shards load back"]


@pytest.mark.parametrize("hook", ["bf16", "fp16", "power_sgd"])
def test_ddp_communication_hook_on_nccl(hook):
    """bf16 compression, which PyTorch runs only on NCCL, and the others, on the GPU's process group."""
    assert _checks("comm_hook", hook) == [f"{hook} hook trains as the plain loop"]
