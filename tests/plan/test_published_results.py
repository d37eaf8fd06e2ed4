"""The planner against published multi-GPU training runs of other projects (benchmarks/published_results.py):
planning needs no GPU, so the table in docs/planner-accuracy.md is reproduced here, and every run the planner
misses by more than 25 % carries its explanation."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.plan.benchmark_tables import REPO, load

published = load("published_results")


def test_the_documented_table_is_what_the_planner_gives():
    doc = (REPO / "docs" / "planner-accuracy.md").read_text()
    for part in (published.table(), published.deviations(), published.summary()):
        assert part in doc, "rerun: python benchmarks/published_results.py, and paste its output"


def test_the_table_covers_the_layouts_users_choose_between():
    rows = published.RESULTS
    assert len(rows) >= 6
    kinds = {("fsdp" if r.zero_stage == 3 else "dp") + ("+tp" if r.dims.tp > 1 else "")
             + ("+pp" if r.dims.pp > 1 else "")
             for r in rows}
    assert {"fsdp", "dp", "dp+tp", "dp+tp+pp"} <= kinds, kinds
    assert any(r.memory_gib for r in rows) and {r.gpu for r in rows} >= {"A100-80GB", "H100-80GB"}
    assert len(rows) >= 24 and len({r.key for r in rows}) == len(rows)
    assert any(r.dims.dp_replicate > 1 and r.dims.dp_shard > 1 for r in rows)  # HSDP
    assert any(r.zero_stage == 1 and r.dims.tp > 1 for r in rows)  # ZeRO-1 x TP
    assert max(r.gpus_per_node * r.nodes for r in rows if r.dims.pp > 1) >= 2048  # DP x TP x PP at thousands


def test_most_runs_are_planned_within_10_percent_and_the_rest_say_why():
    """Every row more than 10 % off carries what the planner does not model about it."""
    for row in published.RESULTS:
        seconds, _ = published.planned(row)
        if abs(seconds / row.step_seconds - 1) > 0.10:
            assert len(row.deviation) > 80, row.key


@pytest.mark.parametrize("row", published.RESULTS, ids=lambda r: r.key)
def test_each_run_is_planned_within_25_percent_or_says_why_not(row):
    seconds, gib = published.planned(row)
    close = published.within(row) and published.memory_within(row)
    assert close or row.deviation, f"{row.key}: planned {seconds:.2f} s / {gib:.1f} GiB for {row.step_seconds:.2f} s"
    if row.deviation:
        assert len(row.deviation) > 80  # an explanation, not a label


heldout = load("published_heldout")


def _printed_mfu(row, printed) -> float:
    """MFU by the source's own FLOP formula from the row's model and the throughput the source prints."""
    m, s = row.model, row.seq
    if printed.mfu_formula == "llm-foundry":  # 3 x (2 N s + 4 l h s^2) per sequence (the README's MFU section)
        flops = (3 * 2 * m.num_params * s + 3 * 4 * m.num_layers * m.hidden * s * s) * printed.tokens_per_s / s
    else:
        assert printed.mfu_formula == "6N+12lhs", printed.mfu_formula
        flops = (6 * m.num_params + 12 * m.num_layers * m.hidden * s) * printed.tokens_per_s
    return flops / (row.gpus_per_node * row.nodes * printed.peak_tflops * 1e12)


def test_held_out_rows_are_new_and_named():
    rows = heldout.ROWS
    assert 14 <= len(rows) and len({r.key for r in rows}) == len(rows)
    assert not {r.key for r in rows} & {r.key for r in published.RESULTS}
    assert set(heldout.PRINTED) == {r.key for r in rows}
    for row in rows:
        assert row.stack in {"convoy", "torchtitan", "fsdp1"} and row.software, row.key
        assert row.global_batch % (row.micro_batch * row.dims.dp) == 0, row.key  # whole micro-batches per step


@pytest.mark.parametrize("row", heldout.ROWS, ids=lambda r: r.key)
def test_each_held_out_row_agrees_with_what_its_source_prints(row):
    """The published step time follows from the printed throughput, and the model from the printed size or MFU."""
    printed = heldout.PRINTED[row.key]
    assert row.step_seconds == pytest.approx(row.global_batch * row.seq / printed.tokens_per_s, rel=1e-9)
    gpus = row.gpus_per_node * row.nodes
    per_gpu = printed.tokens_per_s / gpus
    assert f"{printed.tokens_per_s:,.0f}" in row.derivation or f"{per_gpu:,.10g}" in row.derivation, row.derivation
    assert row.dims.dp * row.dims.tp * row.dims.pp == gpus
    assert printed.params or printed.mfu  # something of the source's checks the model
    if printed.params:
        assert abs(row.model.num_params / printed.params - 1) <= 0.03, printed.params_where
    if printed.mfu:
        assert _printed_mfu(row, printed) == pytest.approx(printed.mfu, rel=0.03)


def test_the_documented_held_out_section_is_what_the_planner_gives():
    doc = (REPO / "docs" / "planner-accuracy.md").read_text()
    section = doc[doc.index("## 8b. Held-out runs"):doc.index("## 9. ")]
    assert published.held_out_report(published.held_out_rows(), published.held_out_unstated(),
                                     published.held_out_sets(), published.held_out_seen()) in section, \
        "rerun: python benchmarks/published_results.py --held-out, and paste its output into section 8b"


def test_the_development_table_does_not_read_the_held_out_rows():
    """Only --held-out imports benchmarks/published_heldout*.py: the development loop never sees them."""
    code = ("import runpy, sys; sys.argv = ['published_results.py', '--check']\n"
            "try:\n    runpy.run_path('benchmarks/published_results.py', run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "assert not [m for m in sys.modules if m.startswith('published_heldout')], 'held-out rows imported'")
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, capture_output=True)
