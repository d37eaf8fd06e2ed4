"""The held-out Megatron-lineage rows (benchmarks/published_heldout_megatron.py) are what their sources print: each
step time follows from the printed numbers by the source's own formula, each model's shape gives the parameter count
its source states, each layout fills the GPUs the source ran on. Nothing here plans a row: the held-out half is
planned only after it was frozen (benchmarks/published_results.py --held-out)."""

from __future__ import annotations

import math

import pytest

from convoy.plan.stacks import STACKS
from tests.plan.benchmark_tables import load

development = load("published_results")
heldout = load("published_heldout_megatron")
ROWS = heldout.ROWS
BY_KEY = {row.key: row for row in ROWS}

STACK_NAMES = set(STACKS)


def _narayanan(batch, seq, layers, hidden, vocab):
    """Narayanan et al. 2021 equation (3), recomputation's forward counted: 96·B·s·l·h²·(1 + s/6h + V/16lh)."""
    return 96 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def _mcore_r080(batch, seq, layers, hidden, heads, ffn, vocab):
    """megatron/training/training.py num_floating_point_operations at core_r0.8.0, written out term by term
    (multi-head attention, no SwiGLU, no experts)."""
    kv_ratio = (hidden // heads) * heads / hidden
    return 3 * 2 * 2 * batch * seq * layers * hidden * hidden * (
        (1 + 1 + seq / hidden) * kv_ratio + ffn / hidden + vocab / (2 * layers * hidden))


def test_the_held_out_rows_are_new_and_name_their_stack_and_software():
    assert 12 <= len(ROWS) <= 18
    assert len(BY_KEY) == len(ROWS)
    dev = {(r.model.name, r.gpus_per_node * r.nodes, r.global_batch, r.micro_batch) for r in development._ROWS}
    assert not set(BY_KEY) & {r.key for r in development._ROWS}
    for row in ROWS:
        assert (row.model.name, row.gpus_per_node * row.nodes, row.global_batch, row.micro_batch) not in dev, row.key
        assert row.stack in STACK_NAMES, row.key
        assert row.stack != "convoy" and row.software, row.key
        assert set(heldout.PRINTED[row.key]) and row.key in heldout.SOURCE_PARAMS


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.key)
def test_the_layout_fills_the_gpus_the_source_ran_on(row):
    d = row.dims
    assert d.world_size == row.gpus_per_node * row.nodes
    assert row.global_batch % (row.micro_batch * d.dp) == 0
    assert row.model.heads % d.tp == 0 and row.seq % d.cp == 0 and row.model.num_layers >= d.pp
    if row.pp_stages_per_rank > 1:  # Megatron's interleaved schedule: equal chunks, whole rounds of micro-batches
        assert row.model.num_layers % (d.pp * row.pp_stages_per_rank) == 0
        assert (row.global_batch // (row.micro_batch * d.dp)) % d.pp == 0


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.key)
def test_the_model_has_the_parameter_count_its_source_gives(row):
    m = row.model
    assert abs(m.num_params / heldout.SOURCE_PARAMS[row.key] - 1) <= 0.03, m.num_params
    if not m.gated_mlp:  # a GPT block of 12h² + 13h, embeddings tied (vh) or untied (2vh), learned positions or not
        tied = m.num_layers * (12 * m.hidden**2 + 13 * m.hidden) + m.vocab * m.hidden
        untied = tied + m.vocab * m.hidden + row.seq * m.hidden + 2 * m.hidden
        assert 0.99 * tied <= m.num_params <= 1.01 * untied, (tied, m.num_params, untied)


def test_logged_iteration_times_are_the_step_times():
    for key in ("BS13a", "BS13b"):
        p = heldout.PRINTED[key]
        assert BY_KEY[key].step_seconds == pytest.approx(p["iteration_ms"] / 1000)
        assert BY_KEY[key].nodes == p["nodes"] and BY_KEY[key].global_batch == p["global_batch"]
    assert BY_KEY["S1a"].step_seconds == heldout.PRINTED["S1a"]["seconds"]


def test_bloom_rows_follow_the_logs_own_tflops_formula():
    """The formula reproduces the TFLOPs BLOOM's log printed beside its 15.23 s, and turns the ramp-up's stated 73
    TFLOPs into the GBS 192 step time."""
    gpus, vocab = 384, 250880
    s1a, s1b = heldout.PRINTED["S1a"], heldout.PRINTED["S1b"]
    logged = _narayanan(16, 2048, 70, 14336, vocab) / (gpus * s1a["seconds"]) / 1e12
    assert logged == pytest.approx(s1a["tflops"], abs=0.01)
    step = _narayanan(192, 2048, 70, 14336, vocab) / (gpus * s1b["tflops"] * 1e12)
    assert BY_KEY["S1b"].step_seconds == pytest.approx(step, rel=1e-9)
    assert (BY_KEY["S1a"].global_batch, BY_KEY["S1b"].global_batch) == (16, 192)


def test_the_104b_tune_up_row_agrees_with_its_tables_tflops():
    p = heldout.PRINTED["BS104"]
    tflops = p["model_b"] * 4 * 2 * 2048 * p["global_batch"] / (p["seconds"] * 128 * 1e3)
    assert tflops == pytest.approx(p["tflops"], abs=0.01)
    row = BY_KEY["BS104"]
    assert row.step_seconds == p["seconds"] and row.global_batch == p["global_batch"]
    assert row.memory_gib == p["memory_gb"]


@pytest.mark.parametrize("key", ["MC1", "MC2", "MC3", "MC4"])
def test_megatron_core_rows_follow_from_the_tables_tflops(key):
    """Step time = Megatron-Core r0.8.0's FLOPs per step over (GPUs x per-GPU TFLOP/s); the table's aggregate and
    MFU columns agree with its per-GPU column (a transcription check)."""
    row, p = BY_KEY[key], heldout.PRINTED[key]
    m, gpus = row.model, row.gpus_per_node * row.nodes
    flops = _mcore_r080(row.global_batch, row.seq, m.num_layers, m.hidden, m.heads, m.ffn, m.vocab)
    assert row.step_seconds == pytest.approx(flops / (gpus * p["tflops"] * 1e12), rel=1e-9)
    assert gpus * p["tflops"] / 1000 == pytest.approx(p["pflops"], abs=0.15)
    assert p["tflops"] / 989.4 == pytest.approx(p["mfu"], abs=0.006)


@pytest.mark.parametrize("key", ["NM1", "NM2", "NM3", "NM4", "NM5", "NM6"])
def test_nemo_rows_follow_from_tokens_per_second_per_gpu(key):
    row, p = BY_KEY[key], heldout.PRINTED[key]
    gpus = row.gpus_per_node * row.nodes
    assert row.step_seconds * p["tokens_per_gpu"] * gpus == pytest.approx(row.global_batch * row.seq, rel=1e-9)


@pytest.mark.parametrize("key", ["NM1", "NM2", "NM5", "NM6"])
def test_nemo_gpt3_rows_tokens_and_tflops_columns_agree(key):
    """For the GPT-3 rows the table's two columns agree under 6N + 12·l·h·s FLOPs per token with the row's shape (a
    check of the transcription and of the shape taken)."""
    row, p = BY_KEY[key], heldout.PRINTED[key]
    m = row.model
    per_token = 6 * m.num_params + 12 * m.num_layers * m.hidden * row.seq
    assert p["tokens_per_gpu"] * per_token / 1e12 == pytest.approx(p["tflops"], rel=0.01)


def test_what_a_source_leaves_unstated_is_named():
    for key, what in heldout.NOT_STATED.items():
        assert key in BY_KEY and len(what) > 30
    assert {"MC1", "NM1", "BS13a"} <= set(heldout.NOT_STATED)
    assert all(math.isfinite(r.step_seconds) and r.step_seconds > 0 for r in ROWS)
