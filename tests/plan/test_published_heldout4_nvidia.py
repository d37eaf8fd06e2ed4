"""The fourth held-out set (benchmarks/published_heldout4_nvidia.py) is what its sources print: each step time follows
from the printed tokens/s (or is the printed one and agrees with the printed tokens/s and MFU), each printed TFLOP/s
column follows from the row's shape under the source's own FLOP formula, each model's shape gives the parameter count
its source names, each layout fills the GPUs the source ran on, and no row repeats a run of the development table or
of the other held-out sets. Nothing here plans a row: the held-out rows are planned only after they were frozen."""

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

heldout = load("published_heldout4_nvidia")
ROWS = heldout.ROWS
BY_KEY = {row.key: row for row in ROWS}



def _flops_per_token(row) -> float:
    """The sources' formulas (``published_heldout4_nvidia.FORMULA_VOCAB``) from the row's shape: ``gpt`` (NeMo's
    flops_formulas.gpt3) 72·l·h² + 12·l·h·s + 6·V·h; ``llama`` (llama3) l·h²·(12 + 12·G/H + 18·f/h + 12·s/h +
    6·V/lh), ``llama-causal`` the same with 6·s/h; ``nemotron`` the same as ``llama`` with 12·f/h."""
    formula = heldout.FLOPS_OF[row.key]
    vocab = heldout.FORMULA_VOCAB[formula]
    m, s = row.model, row.seq
    layers, h = m.num_layers, m.hidden
    if formula == "gpt":
        return 72 * layers * h**2 + 12 * layers * h * s + 6 * vocab * h
    groups = (m.kv_heads or m.heads) / m.heads
    attention = 12 + 12 * groups + (6 if formula == "llama-causal" else 12) * s / h
    mlp = (12 if formula == "nemotron" else 18) * m.ffn / h
    return layers * h**2 * (attention + mlp + 6 * vocab / (layers * h))


def test_the_rows_are_new_and_name_their_stack_and_software():
    assert 10 <= len(ROWS) <= 20
    assert len(BY_KEY) == len(ROWS) and all(key.startswith("N4") for key in BY_KEY)
    others = earlier_rows("published_heldout4_nvidia")
    check_rows_are_new(ROWS, others, layout=True)
    for row in ROWS:
        assert row.stack in STACKS and row.stack != "convoy" and row.software, row.key
        assert heldout.PRINTED[row.key] and row.key in heldout.SOURCE_PARAMS and row.key in heldout.NOT_STATED
    assert {row.gpu for row in ROWS} == {"B200", "H100-80GB"}


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.key)
def test_the_layout_fills_the_gpus_the_source_ran_on(row):
    check_layout_fills_the_gpus(row)


# the gradient accumulation (GA) column each table prints, which the layout must give
_PRINTED_GA = {"N4B175": 32, "N4B8": 8, "N4B70": 32, "N4B15": 2, "N4B340": 8, "N4D340a": 16, "N4D340b": 16,
               "N4D15": 4, "N4M8": 16, "N4M70": 64}


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.key)
def test_the_layout_gives_the_gradient_accumulation_the_source_prints(row):
    assert row.global_batch // (row.micro_batch * row.dims.dp) == _PRINTED_GA[row.key]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.key)
def test_the_model_has_the_parameter_count_its_source_gives(row):
    check_parameter_count(row, heldout)


_DGXC = [row for row in ROWS if "step_s" in heldout.PRINTED[row.key]]
_TABLES = [row for row in ROWS if "tokens_per_gpu" in heldout.PRINTED[row.key]]


@pytest.mark.parametrize("row", _DGXC, ids=lambda r: r.key)
def test_the_step_time_is_the_printed_one_and_agrees_with_tokens_and_mfu(row):
    """dgxc-benchmarking prints the step time, tokens/s = GBS x s / step and MFU = GBS x FLOPs per sample / step /
    GPUs / peak (989 TFLOP/s BF16, 1979 FP8): the three columns agree for each row taken, to the digits printed."""
    p = heldout.PRINTED[row.key]
    assert row.step_seconds == p["step_s"]
    assert row.global_batch * row.seq / row.step_seconds == pytest.approx(p["tokens_per_s"], rel=2e-4)
    flops = heldout.MODEL_FLOPS[heldout.DGXC_FLOPS_OF[row.key]]
    peak = (1979e12 if row.fp8 != "none" else 989e12) * gpus(row)
    printed_to = 0.5 if float(p["mfu_pct"]).is_integer() else 0.05
    assert 100 * row.global_batch * flops / (row.step_seconds * peak) == pytest.approx(p["mfu_pct"], abs=printed_to)


@pytest.mark.parametrize("row", _DGXC, ids=lambda r: r.key)
def test_the_printed_flops_per_sample_follow_from_the_shape_taken(row):
    """A check of the shape (layers, hidden, FFN, query groups, vocabulary) against the README's FLOPs per sample."""
    flops = heldout.MODEL_FLOPS[heldout.DGXC_FLOPS_OF[row.key]]
    assert _flops_per_token(row) * row.seq == pytest.approx(flops, rel=0.005)


@pytest.mark.parametrize("row", _TABLES, ids=lambda r: r.key)
def test_the_step_time_follows_from_tokens_and_agrees_with_the_tflop_column(row):
    """NeMo's page and Megatron-Bridge print tokens/s/GPU and model TFLOP/s/GPU: the step time is GBS x s over the
    tokens of all GPUs, and the TFLOP column is the tokens column times the source's FLOPs per token of the row's
    shape (a check of the transcription and of the shape)."""
    p = heldout.PRINTED[row.key]
    assert row.step_seconds * p["tokens_per_gpu"] * gpus(row) == pytest.approx(row.global_batch * row.seq,
                                                                                 rel=1e-9)
    assert p["tokens_per_gpu"] * _flops_per_token(row) / 1e12 == pytest.approx(p["tflops"], rel=0.002)


def test_what_a_source_leaves_unstated_is_named():
    for key, what in heldout.NOT_STATED.items():
        assert key in BY_KEY and len(what) > 30
    assert set(heldout.NOT_STATED) == set(BY_KEY)
    assert all(math.isfinite(row.step_seconds) and row.step_seconds > 0 for row in ROWS)
