"""Context parallel on CPU/gloo: the ring equals full SDPA (forward and backward, both rotations, head-tail
balanced or not, grouped K/V heads), and the tiny GPT trained under cp=2, dp=2 x cp=2, zero3 x cp=2 and cp=2 x tp=2
through the Accelerator equals one process (and resumes at dp=2 from a cp=2 checkpoint); transformers Llama and
Qwen2 with their own loss too; what the ring cannot compute is refused in one line.

Each test is one launch running several checks; the scripts print one ``OK`` line per check and rank.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed import run_script

SCRIPTS = Path(__file__).parent / "scripts"
pytestmark = pytest.mark.slow


def _ok(output: str, words: str) -> int:
    return sum(line.endswith(" OK") and words in line for line in output.splitlines())


def test_ring_attention_equals_full_attention_forward_and_backward():
    result = run_script(SCRIPTS / "ring_attention.py", nproc=2, timeout=120)
    assert result.returncode == 0, result.output
    for rotate in ("allgather", "alltoall"):
        for balanced in (True, False):
            assert _ok(result.output, f"ring {rotate} balanced={balanced} causal=True kv_heads=4") == 2, result.output
    assert _ok(result.output, "causal=False") == 2 and _ok(result.output, "kv_heads=2") == 2, result.output


def test_cp2_trains_as_one_process_with_either_rotation_resumes_at_dp2_and_refuses_what_the_ring_cannot_compute(
        tmp_path):
    result = run_script(SCRIPTS / "cp_parity.py", nproc=2, timeout=240,
                        args=[f"--resume={tmp_path / 'ckpt'}", "cp=2", "dp=2", "cp=2", "cp=2:alltoall"])
    assert result.returncode == 0, result.output
    assert _ok(result.output, "resume cp=2 -> dp=2") == 2, result.output
    assert _ok(result.output, "cp=2 (FSDP+CP)") == 2 and _ok(result.output, "cp=2:alltoall (FSDP+CP)") == 2, \
        result.output
    for refusal in ("refuses MaskedAttention", "refuses EagerAttention", "refuses labels=",
                    "refuses an uneven sequence"):
        assert _ok(result.output, refusal) == 2, (refusal, result.output)


def test_dp2_x_cp2_zero3_x_cp2_and_cp2_x_tp2_train_as_one_process():
    result = run_script(SCRIPTS / "cp_parity.py", nproc=4,
                        args=["dp=2,cp=2", "strategy=zero3,cp=2:alltoall", "cp=2,tp=2"], timeout=300)
    assert result.returncode == 0, result.output
    assert _ok(result.output, "cp=2,tp=2 (FSDP+CP+TP)") == 4, result.output
    assert _ok(result.output, "dp=2,cp=2 (FSDP+CP)") == 4, result.output
    assert _ok(result.output, "strategy=zero3,cp=2:alltoall (FSDP+CP)") == 4, result.output


def test_transformers_llama_and_qwen2_train_under_cp2_with_their_own_loss_and_refuse_what_the_ring_cannot_compute():
    """labels shifted before the split, positions split with the ids: the models' own ``.loss`` equals one process;
    labels= alone, no position_ids, packed documents, padding, eager attention and a sliding window are refused."""
    pytest.importorskip("transformers")
    result = run_script(SCRIPTS / "hf_cp_parity.py", nproc=2, args=["llama", "qwen2"], timeout=240)
    assert result.returncode == 0, result.output
    for family in ("llama", "qwen2"):
        assert _ok(result.output, f"{family} cp=2") == 2, result.output
        for refusal in ("labels=", "without position_ids", "packed documents", "padding", "eager attention"):
            assert _ok(result.output, f"refuses {family} {refusal}") == 2, (family, refusal, result.output)
    assert _ok(result.output, "refuses granite_swa sliding window") == 2, result.output
