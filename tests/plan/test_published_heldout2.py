"""The second held-out set (benchmarks/published_heldout2.py) is what its sources print: each step time follows from
the printed throughput, each model's shape gives the parameter count (or the FLOP column) its source states, each
layout fills the GPUs the source ran on, and no row repeats a run of the development table or the first held-out
set. Nothing here plans a row: the held-out rows are planned only after they were frozen."""

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

heldout = load("published_heldout2")
ROWS = heldout.ROWS
BY_KEY = {row.key: row for row in ROWS}

STACK_NAMES = set(STACKS)



def _nemo_flops_per_token(row) -> float:
    """nemo/utils/flops_formulas.py's llama2 (gated MLP: 18·f/h) and nemotron (two-matrix MLP: 12·f/h) per token,
    with full (not causal-halved) attention as the 24.07 table's TFLOP column counts it."""
    m, s = row.model, row.seq
    mlp = 18 if m.gated_mlp else 12
    kv = m.kv_heads or m.heads
    return m.num_layers * m.hidden**2 * (12 + 12 * kv / m.heads + mlp * m.ffn / m.hidden + 12 * s / m.hidden
                                         + 6 * m.vocab / (m.num_layers * m.hidden))


def test_the_rows_are_new_and_name_their_stack_and_software():
    assert 15 <= len(ROWS) <= 25
    assert len(BY_KEY) == len(ROWS)
    others = earlier_rows("published_heldout2")
    check_rows_are_new(ROWS, others)
    for row in ROWS:
        assert row.stack in STACK_NAMES and row.stack != "convoy" and row.software, row.key
        assert heldout.PRINTED[row.key] and row.key in heldout.SOURCE_PARAMS


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.key)
def test_the_layout_fills_the_gpus_the_source_ran_on(row):
    check_layout_fills_the_gpus(row)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.key)
def test_the_model_has_the_parameter_count_its_source_gives(row):
    check_parameter_count(row, heldout)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.key)
def test_the_step_time_follows_from_the_printed_throughput(row):
    p = heldout.PRINTED[row.key]
    tokens = row.global_batch * row.seq
    if "tokens_per_s" in p:  # llm-foundry prints the total and the per-GPU figure
        assert row.step_seconds * p["tokens_per_s"] == pytest.approx(tokens, rel=1e-9)
        assert p["tokens_per_s"] / gpus(row) == pytest.approx(p["tokens_per_gpu"], abs=1)
    else:
        assert row.step_seconds * p["tokens_per_gpu"] * gpus(row) == pytest.approx(tokens, rel=1e-9)
    assert row.memory_gib == p.get("memory_gib")


@pytest.mark.parametrize("key", ["NL1", "NL2", "NL3", "NN1", "NN2", "NN3"])
def test_nemo_rows_tokens_and_tflops_columns_agree_under_the_shape_taken(key):
    """The table's two columns agree under NeMo's own FLOP formula with the row's shape and vocabulary: a check of
    the transcription and of the shapes (Nemotron's 256,000-word vocabulary included) the rows take."""
    row, p = BY_KEY[key], heldout.PRINTED[key]
    assert p["tokens_per_gpu"] * _nemo_flops_per_token(row) / 1e12 == pytest.approx(p["tflops"], rel=0.005)


@pytest.mark.parametrize("key", ["FL1", "FL2", "FL3", "FL4", "FL5", "FL6"])
def test_foundry_rows_mfu_column_agrees(key):
    """MFU = T/s x (6N + 12·l·h·s) / (GPUs x bf16 peak), llm-foundry's formula with the table's NumParams."""
    row, p = BY_KEY[key], heldout.PRINTED[key]
    m = row.model
    peak = 989e12 if row.gpu.startswith("H100") else 312e12
    per_token = 6 * p["params"] + 12 * m.num_layers * m.hidden * row.seq
    assert 100 * p["tokens_per_s"] * per_token / (gpus(row) * peak) == pytest.approx(p["mfu_pct"], abs=0.05)
    assert m.num_params == p["params"]


def test_what_a_source_leaves_unstated_is_named():
    for key, what in heldout.NOT_STATED.items():
        assert key in BY_KEY and len(what) > 30
    assert {"NL1", "NN1", "TQ1", "TW1", "FL1"} <= set(heldout.NOT_STATED)
    assert all(math.isfinite(row.step_seconds) and row.step_seconds > 0 for row in ROWS)
