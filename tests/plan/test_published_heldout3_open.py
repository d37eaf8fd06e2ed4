"""The third held-out set (benchmarks/published_heldout3_open.py) is what its sources print: each step time follows
from the printed throughput or MFU, each source's second figure (MFU, GPU hours, a logged TFLOP/s and tokens/s pair)
agrees with the row's shape, each model has the parameter count its source gives, each layout fills the GPUs the
source ran on, and no row repeats a run of the development table or the earlier held-out sets. Nothing here plans a
row: the held-out rows are planned only after they were frozen."""

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

heldout = load("published_heldout3_open")
ROWS = heldout.ROWS
BY_KEY = {row.key: row for row in ROWS}
NANOTRON = [row for row in ROWS if row.key.startswith("O3N")]



def test_the_rows_are_new_and_name_their_stack_and_software():
    assert 10 <= len(ROWS) <= 20
    assert len(BY_KEY) == len(ROWS) and all(key.startswith("O3") for key in BY_KEY)
    others = earlier_rows("published_heldout3_open")
    check_rows_are_new(ROWS, others)
    for row in ROWS:
        assert row.stack in STACKS and row.software and row.source and row.derivation, row.key
        assert heldout.PRINTED[row.key] and row.key in heldout.SOURCE_PARAMS and row.key in heldout.NOT_STATED


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.key)
def test_the_layout_fills_the_gpus_the_source_ran_on(row):
    check_layout_fills_the_gpus(row, pipeline=False)
    assert math.isfinite(row.step_seconds) and row.step_seconds > 0


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.key)
def test_the_model_has_the_parameter_count_its_source_gives(row):
    check_parameter_count(row, heldout)


@pytest.mark.parametrize("key", ["O3T1", "O3T2"])
def test_torchtitan_405b_rows_follow_from_wps_and_agree_with_the_mfu_column(key):
    """wps is per GPU (train.py divides by the model-parallel size); MFU = wps x (6·N_non-embedding + 12·l·h·s) over
    989 TFLOP/s, and over twice that for the Float8 row."""
    row, p = BY_KEY[key], heldout.PRINTED[key]
    assert row.global_batch == p["local_batch"] * row.dims.dp and row.micro_batch == p["local_batch"]
    assert row.step_seconds * p["wps"] * gpus(row) == pytest.approx(row.global_batch * row.seq, rel=1e-9)
    m = row.model
    per_token = 6 * (m.num_params - m.vocab * m.hidden) + 12 * m.num_layers * m.hidden * row.seq
    peak = 989e12 * (2 if row.fp8 != "none" else 1)
    assert 100 * p["wps"] * per_token / peak == pytest.approx(p["mfu_pct"], abs=0.1)


def test_tinyllama_row_follows_from_the_readme_and_its_gpu_hours_agree():
    row, p = BY_KEY["O3L1"], heldout.PRINTED["O3L1"]
    assert row.step_seconds * p["tokens_per_gpu"] * gpus(row) == pytest.approx(row.global_batch * row.seq, rel=1e-9)
    assert row.micro_batch * row.seq == p["per_gpu_batch_tokens"]
    assert row.global_batch * row.seq == 2048 * 1024  # "2 million tokens (2048 * 1024)"
    assert 300e9 / (p["gpu_hours_300b"] * 3600) == pytest.approx(p["tokens_per_gpu"], rel=0.01)


def test_megatron_deepspeed_row_follows_from_its_tflops_line():
    """throughput_calculator (megatron/utils.py at d4a1532c): 24 x 4 (activation checkpointing) x B·s·l·h² x (1 +
    s/6h + V/16lh) over GPUs x TFLOP/s, V the vocabulary padded to a multiple of 128 x TP."""
    row, p = BY_KEY["O3D1"], heldout.PRINTED["O3D1"]
    m, tp = row.model, row.dims.tp
    vocab = math.ceil(m.vocab / (128 * tp)) * 128 * tp
    flops = 96 * row.global_batch * row.seq * m.num_layers * m.hidden**2 * (
        1 + row.seq / (6 * m.hidden) + vocab / (16 * m.num_layers * m.hidden))
    assert row.step_seconds * gpus(row) * p["tflops"] * 1e12 == pytest.approx(flops, rel=1e-9)
    assert (gpus(row), row.gpus_per_node, row.inter_gbps) == (p["gpus"], p["gpus_per_node"], p["inter_gbps"])
    assert (row.dims.dp, tp, row.dims.pp, row.micro_batch, row.recompute) == (4, 4, 8, 2, "full")


def test_nanotron_flop_formula_gives_the_scaling_scripts_logged_pair():
    """scaling_benchmarks.py's TP sweep prints 363.66 TFLOPs at 14,167.25 tok/s/gpu and 345.51 at 13,460.16 for its
    3B shape: FLOPs per token that nanotron's get_flops gives the 3.57B shape at 4096 tokens (so shape, vocabulary
    and sequence are the sweep's)."""
    model = heldout.NANOTRON_MODELS["3"]
    per_token = heldout.nanotron_flops(model, 1, 4096) / 4096
    for tflops, tokens in ((363.66, 14167.25), (345.51, 13460.16)):
        assert tflops * 1e12 / tokens == pytest.approx(per_token, rel=1e-5)


@pytest.mark.parametrize("row", NANOTRON, ids=lambda r: r.key)
def test_nanotron_rows_are_the_plots_cell_and_follow_from_its_mfu(row):
    p = heldout.PRINTED[row.key]
    nodes = int(row.key.split("x")[1])
    d = row.dims
    assert (d.dp, d.tp, d.pp, row.zero_stage, row.micro_batch) == (p["dp"], p["tp"], p["pp"], p["zero"], p["mbs"])
    assert gpus(row) == 8 * nodes and row.nodes == nodes
    assert row.global_batch == p["dp"] * p["gas"] * p["mbs"] == 256 and row.seq == 4096
    flops = heldout.nanotron_flops(row.model, row.global_batch, row.seq)
    assert row.step_seconds * gpus(row) * p["mfu_pct"] / 100 * 989e12 == pytest.approx(flops, rel=1e-9)
    assert row.memory_gib is None  # the plot's memory column is not said to be allocated or reserved


def test_what_a_source_leaves_unstated_is_named():
    for key, what in heldout.NOT_STATED.items():
        assert key in BY_KEY and len(what) > 30
    assert set(heldout.NOT_STATED) == set(BY_KEY)
