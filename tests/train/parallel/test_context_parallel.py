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


def _ok(output: str, words: str) -> int:
    return sum(line.endswith(" OK") and words in line for line in output.splitlines())


@pytest.mark.slow
def test_ring_attention_equals_full_attention_forward_and_backward():
    result = run_script(SCRIPTS / "ring_attention.py", nproc=2, timeout=120)
    assert result.returncode == 0, result.output
    for rotate in ("allgather", "alltoall"):
        for balanced in (True, False):
            assert _ok(result.output, f"ring {rotate} balanced={balanced} causal=True kv_heads=4") == 2, result.output
    assert _ok(result.output, "causal=False") == 2 and _ok(result.output, "kv_heads=2") == 2, result.output


@pytest.mark.slow
def test_cp2_trains_as_one_process_with_either_rotation_and_recompute_resumes_at_dp2_and_refuses_what_it_cannot(
        tmp_path):
    result = run_script(SCRIPTS / "cp_parity.py", nproc=2, timeout=240,
                        args=[f"--resume={tmp_path / 'ckpt'}", "cp=2", "dp=2", "cp=2", "cp=2:alltoall",
                              "cp=2::full", "cp=2:alltoall:selective"])
    assert result.returncode == 0, result.output
    assert _ok(result.output, "resume cp=2 -> dp=2") == 2, result.output
    assert _ok(result.output, "cp=2::full (FSDP+CP)") == 2, result.output  # recomputation replays the ring
    assert _ok(result.output, "cp=2:alltoall:selective (FSDP+CP)") == 2, result.output
    assert _ok(result.output, "cp=2 (FSDP+CP)") == 2 and _ok(result.output, "cp=2:alltoall (FSDP+CP)") == 2, \
        result.output
    for refusal in ("refuses MaskedAttention", "refuses EagerAttention", "refuses labels=",
                    "refuses an uneven sequence"):
        assert _ok(result.output, refusal) == 2, (refusal, result.output)


@pytest.mark.slow
def test_dp2_x_cp2_zero3_x_cp2_and_cp2_x_tp2_train_as_one_process():
    result = run_script(SCRIPTS / "cp_parity.py", nproc=4,
                        args=["dp=2,cp=2", "strategy=zero3,cp=2:alltoall", "cp=2,tp=2"], timeout=300)
    assert result.returncode == 0, result.output
    assert _ok(result.output, "cp=2,tp=2 (FSDP+CP+TP)") == 4, result.output
    assert _ok(result.output, "dp=2,cp=2 (FSDP+CP)") == 4, result.output
    assert _ok(result.output, "strategy=zero3,cp=2:alltoall (FSDP+CP)") == 4, result.output


@pytest.mark.slow
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


def test_at_cp1_maybe_context_parallel_is_a_no_op_and_the_nd_names_answer_for_one_process():
    """One script runs at every degree: at cp = 1 the buffers are left whole and attention is not replaced."""
    import torch
    import torch.nn.functional as F

    from convoy import Accelerator

    acc = Accelerator(cpu=True)
    assert acc.parallelism_config is None and acc._strategy is None  # "auto" still waits for the model
    ids = torch.arange(10).reshape(1, 10)
    sdpa = F.scaled_dot_product_attention
    with acc.maybe_context_parallel(buffers=[ids], buffer_seq_dims=[1]):
        assert ids.shape == (1, 10) and F.scaled_dot_product_attention is sdpa
    assert (acc.context_parallel_rank, acc.tensor_parallel_rank, acc.pipeline_parallel_rank) == (0, 0, 0)
    assert acc.non_data_parallel_size == 1 and acc.data_parallel_rank == 0


def test_ring_rotation_and_buffers_are_checked_before_anything_is_split():
    import torch

    from convoy.errors import ConfigError
    from convoy.train.parallel.context import _check_buffers, ring_attention

    q = torch.zeros(1, 1, 4, 2)
    with pytest.raises(ConfigError, match="cp_comm_strategy='ring': choose one of allgather, alltoall"):
        ring_attention(q, q, q, group=None, rotate="ring")
    with pytest.raises(ConfigError, match="2 buffers but 1 buffer_seq_dims"):
        _check_buffers([q, q], [2], (), 2, True)
    with pytest.raises(ConfigError, match="sequence lengths differ"):
        _check_buffers([q, torch.zeros(1, 6)], [2, 1], (), 2, True)
    with pytest.raises(ConfigError, match="no_restore_buffers must be a subset of buffers"):
        _check_buffers([q], [2], (q.clone(),), 2, True)
    with pytest.raises(ConfigError, match="buffers\\[0\\] is Parameter"):
        _check_buffers([torch.nn.Parameter(q)], [2], (), 2, True)
    assert _check_buffers([q], [2], (), 2, True) == 4


@pytest.mark.slow
def test_accelerates_cp_config_file_trains_with_a_bare_accelerator():
    """``convoy launch --config_file`` with Accelerate's parallelism_config_cp_size (FSDP2, dp_shard 2 x cp 2):
    the script's ``Accelerator()`` runs that layout, equal to one process."""
    import sys

    from tests.distributed import cpu_env
    from tests.processes import finish, start

    config = Path(__file__).parents[2] / "config" / "accelerate" / "context_parallel.yaml"
    proc = start([sys.executable, "-m", "convoy", "launch", "--devices", "0", "--config_file", str(config),
                  str(SCRIPTS / "cp_parity.py"), "launcher"], env=cpu_env())
    output = finish(proc, timeout=240)
    assert proc.returncode == 0, output[-4000:]
    assert _ok(output, "launcher (FSDP+CP)") == 4, output[-4000:]
