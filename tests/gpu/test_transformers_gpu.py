"""transformers models on one CUDA device (scripts/transformers_cuda.py, each case in a fresh process): convoy's
tensor-parallel styles (Linear, Conv1D and packed q/k/v, gathered fused projections, grad-summed norms) on a 1-rank
NCCL mesh, and a causal LM's own loss through a pipeline (one stage, 2 micro-batches), against the plain model."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.gpu.gpu_run import SCRIPTS, checks, run

pytestmark = pytest.mark.gpu
SCRIPT = str(SCRIPTS / "transformers_cuda.py")


def _checks(*args: str) -> list[str]:
    done = run([sys.executable, SCRIPT, *args], timeout=300)
    assert done.returncode == 0, done.output[-6000:]
    return checks(done.output)


@pytest.mark.parametrize("family", ["llama", "gpt2", "phi3", "qwen3"])
def test_tensor_parallel_styles_of_transformers_models_on_cuda(family):
    from convoy.train.parallel.styles import packed_weights_gather

    found = _checks("styles", family)
    if family == "gpt2" and not packed_weights_gather():  # its packed c_attn, on a torch that cannot gather it
        assert found == [f"gpt2 packed weights refused on torch {torch.__version__}"], found
        return
    assert len(found) == 1 and found[0].startswith(f"{family} styles") and found[0].endswith("on cuda"), found


def test_a_causal_lm_trains_through_a_pipeline_with_its_own_loss_on_cuda():
    assert _checks("pipeline", "llama") == ["llama pipeline loss on cuda"]
