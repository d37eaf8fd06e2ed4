"""The fourth held-out set from other sources (benchmarks/published_heldout4_other.py) is what its sources print:
each step time follows from the printed throughput or step time, each source's second column (MFU, model TFLOP/s)
agrees with the row's shape under the source's own formula, each model has the parameter count its source gives,
each layout fills the GPUs the source ran on, and no row repeats a run of the development table or the earlier
held-out sets. Nothing here plans a row: the held-out rows are planned only after they were frozen."""

from __future__ import annotations

import math

import pytest

from convoy.plan.stacks import STACKS
from tests.plan.benchmark_tables import (
    check_layout_fills_the_gpus,
    check_parameter_count,
    check_rows_are_new,
    earlier_rows,
    gpus,
    load,
)

heldout = load("published_heldout4_other")
ROWS = heldout.ROWS
BY_KEY = {row.key: row for row in ROWS}
FMS = [row for row in ROWS if row.key.startswith("O4I")]
TOGETHER = [row for row in ROWS if row.key.startswith("O4T")]



def _shape(row) -> tuple:
    """The model's shape, whatever its name: a run of another table under another name is still a repeat."""
    m = row.model
    return (m.num_layers, m.hidden, m.heads, m.kv_heads, m.ffn, m.vocab, row.gpu, gpus(row), row.global_batch,
            row.micro_batch, row.seq, row.how)


def _megatron_flops_per_sample(row) -> float:
    """Megatron-Bridge's Llama and NeMo's Nemotron formulas with causal (halved) attention, as the NeMo 26.02
    container counts them: s·(12·l·h²·(1 + G/H + s/2h) + c·l·f·h + 6·V·h), c = 18 for a gated MLP, 12 for
    Nemotron's two-matrix squared-ReLU MLP."""
    m, s = row.model, row.seq
    groups = (m.kv_heads or m.heads) / m.heads
    attention = 12 * m.num_layers * m.hidden**2 * (1 + groups + s / (2 * m.hidden))
    mlp = (18 if m.gated_mlp else 12) * m.num_layers * m.ffn * m.hidden
    return s * (attention + mlp + 6 * m.vocab * m.hidden)


def test_the_rows_are_new_and_name_their_stack_and_software():
    assert 10 <= len(ROWS) <= 20
    assert len(BY_KEY) == len(ROWS) and all(key.startswith("O4") for key in BY_KEY)
    others = earlier_rows("published_heldout4_other")
    check_rows_are_new(ROWS, others)
    seen_shapes = {_shape(row) for row in others}  # and no run of another table under another model name
    for row in ROWS:
        assert _shape(row) not in seen_shapes, row.key
        assert row.stack in STACKS and row.stack != "convoy" and row.software, row.key
        assert heldout.PRINTED[row.key] and row.key in heldout.SOURCE_PARAMS


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.key)
def test_the_layout_fills_the_gpus_the_source_ran_on(row):
    check_layout_fills_the_gpus(row, pipeline=False)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.key)
def test_the_model_has_the_parameter_count_its_source_gives(row):
    check_parameter_count(row, heldout)


@pytest.mark.parametrize("row", FMS, ids=lambda r: r.key)
def test_fms_step_time_follows_from_tokens_and_the_mfu_column_agrees(row):
    """Two per GPU of 4096 tokens over the printed tokens/s/GPU; the MFU table (nanoGPT/PaLM: 6N + 12·l·h·s per
    token over the bf16 peak) within 10 % of the row's shape, which would catch a swapped column or board."""
    p = heldout.PRINTED[row.key]
    assert row.step_seconds * p["tokens_per_gpu"] * gpus(row) == pytest.approx(row.global_batch * row.seq, rel=1e-9)
    assert row.micro_batch == 2 and row.global_batch == 2 * gpus(row)
    m = row.model
    peak = 312e12 if row.gpu.startswith("A100") else 989e12
    mfu = p["tokens_per_gpu"] * (6 * m.num_params + 12 * m.num_layers * m.hidden * row.seq) / peak
    assert mfu == pytest.approx(p["mfu"], rel=0.10)


@pytest.mark.parametrize("row", TOGETHER, ids=lambda r: r.key)
def test_together_step_time_is_printed_and_agrees_with_the_tflops_column(row):
    """The printed average step time, and the printed model TFLOP/s/GPU = GBS x FLOPs per sample / (step x GPUs)
    under the container's formula: a check of the transcription and of the shape and sequence taken."""
    p = heldout.PRINTED[row.key]
    assert row.step_seconds == pytest.approx(p["step_ms"] / 1000 if "step_ms" in p else p["step_s"], rel=1e-12)
    tflops = row.global_batch * _megatron_flops_per_sample(row) / (row.step_seconds * gpus(row)) / 1e12
    assert tflops == pytest.approx(p["tflops"], rel=0.005)


def test_what_a_source_leaves_unstated_is_named():
    for key, what in heldout.NOT_STATED.items():
        assert key in BY_KEY and len(what) > 30
    assert set(heldout.NOT_STATED) == set(BY_KEY)
    assert all(math.isfinite(row.step_seconds) and row.step_seconds > 0 for row in ROWS)
