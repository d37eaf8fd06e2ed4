"""The third held-out set (benchmarks/published_heldout3_nvidia.py) is what its sources print: each step time agrees
with the printed tokens/s and MFU, each README's FLOPs per sample follow from the row's shape under the README's own
formula, each model's shape gives the parameter count its source names, each layout fills the GPUs the source ran on,
and no row repeats a run of the development table or of the other held-out sets. Nothing here plans a row: the
held-out rows are planned only after they were frozen."""

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

heldout = load("published_heldout3_nvidia")
ROWS = heldout.ROWS
BY_KEY = {row.key: row for row in ROWS}



def _flops_per_sample(row) -> float:
    """The sources' formulas (``published_heldout3_nvidia.MODEL_FLOPS``) from the row's shape, with the vocabulary
    each source's note uses: ``llama`` (llama3.1/README_*.md) s·(12·l·h²·(1 + G/H + s/h) + 18·l·f·h + 6·V·h),
    ``llama-causal`` the same with s/2h, ``gpt`` (24.11's nemotron/, nemo_megatron/) s·(24·l·h² + 12·l·h·s + 48·l·h²
    + 6·V·h), ``nemotron`` (25.04.01's nemotron/README.md) s·(12·l·h²·(1 + G/H + s/h) + 12·l·h·f + 6·V·h)."""
    _, formula, vocab = heldout.MODEL_FLOPS[heldout.FLOPS_OF[row.key]]
    m, s = row.model, row.seq
    layers, h, groups = m.num_layers, m.hidden, (m.kv_heads or m.heads) / m.heads
    if formula == "gpt":
        return s * (24 * layers * h**2 + 12 * layers * h * s + 48 * layers * h**2 + 6 * vocab * h)
    attention = 12 * layers * h**2 * (1 + groups + s / h / (2 if formula == "llama-causal" else 1))
    mlp = (12 if formula == "nemotron" else 18) * layers * m.ffn * h
    return s * (attention + mlp + 6 * vocab * h)


def test_the_rows_are_new_and_name_their_stack_and_software():
    assert 10 <= len(ROWS) <= 20
    assert len(BY_KEY) == len(ROWS) and all(key.startswith("N3") for key in BY_KEY)
    others = earlier_rows("published_heldout3_nvidia")
    check_rows_are_new(ROWS, others)
    for row in ROWS:
        assert row.stack in STACKS and row.stack != "convoy" and row.software, row.key
        assert heldout.PRINTED[row.key] and row.key in heldout.SOURCE_PARAMS and row.key in heldout.NOT_STATED


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.key)
def test_the_layout_fills_the_gpus_the_source_ran_on(row):
    check_layout_fills_the_gpus(row)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.key)
def test_the_model_has_the_parameter_count_its_source_gives(row):
    check_parameter_count(row, heldout)


_DGXC = [row for row in ROWS if "step_s" in heldout.PRINTED[row.key]]
_BRIDGE = [row for row in ROWS if "tokens_per_gpu" in heldout.PRINTED[row.key]]


@pytest.mark.parametrize("row", _DGXC, ids=lambda r: r.key)
def test_the_step_time_is_the_printed_one_and_agrees_with_tokens_and_mfu(row):
    """dgxc-benchmarking prints the step time, tokens/s = GBS x s / step and MFU = GBS x FLOPs per sample / step /
    GPUs / peak (989 TFLOP/s BF16, 1979 FP8): the three columns agree for each row taken."""
    p = heldout.PRINTED[row.key]
    assert row.step_seconds == p["step_s"]
    assert row.global_batch * row.seq / row.step_seconds == pytest.approx(p["tokens_per_s"], rel=2e-4)
    flops, _, _ = heldout.MODEL_FLOPS[heldout.FLOPS_OF[row.key]]
    peak = (1979e12 if row.fp8 != "none" else 989e12) * gpus(row)
    assert 100 * row.global_batch * flops / (row.step_seconds * peak) == pytest.approx(p["mfu_pct"], abs=0.05)


@pytest.mark.parametrize("row", _DGXC, ids=lambda r: r.key)
def test_the_printed_flops_per_sample_follow_from_the_shape_taken(row):
    """A check of the shape (layers, hidden, FFN, query groups) against the README's printed FLOPs per sample."""
    flops, _, _ = heldout.MODEL_FLOPS[heldout.FLOPS_OF[row.key]]
    assert _flops_per_sample(row) == pytest.approx(flops, rel=0.005)


@pytest.mark.parametrize("row", _BRIDGE, ids=lambda r: r.key)
def test_megatron_bridge_step_time_follows_from_tokens_and_agrees_with_tflops(row):
    p = heldout.PRINTED[row.key]
    assert row.step_seconds * p["tokens_per_gpu"] * gpus(row) == pytest.approx(row.global_batch * row.seq,
                                                                                 rel=1e-9)
    per_token = _flops_per_sample(row) / row.seq
    assert p["tokens_per_gpu"] * per_token / 1e12 == pytest.approx(p["tflops"], rel=0.005)


def test_what_a_source_leaves_unstated_is_named():
    for key, what in heldout.NOT_STATED.items():
        assert key in BY_KEY and len(what) > 30
    assert all(math.isfinite(row.step_seconds) and row.step_seconds > 0 for row in ROWS)
