"""Models whose embedding and head share one weight train as one process does under every layout (CPU/gloo):
pp=2 (1F1B, and interleaved with gradient accumulation), tp=2 with sequence parallelism, dp x pp (ZeRO-1 and
FSDP2 per stage), tp x pp, zero3 x tp, pp=4 (the tie on 2 of 4 processes); and random-weight tiny GPT-2 and
Gemma models from transformers where convoy runs them today. Before, the pipeline trained two copies apart
(parameters 3e-2 from one process after 3 steps) and a head split by tp left its embedding behind.

Each test is one launch running several layouts; the scripts assert and print one ``OK`` line per layout and rank.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.distributed import run_script

SCRIPTS = Path(__file__).parent / "scripts"
pytestmark = pytest.mark.slow


def _ok(output: str, layout: str) -> int:
    return sum(f" {layout} (" in line and line.endswith(" OK") for line in output.splitlines())


def test_a_tied_gpt_under_pp2_and_tp2_matches_one_process_and_saves_the_weight_once(tmp_path):
    layouts = ["pp=2", "pp=2::interleaved_1f1b:accumulate2", "tp=2,sp"]
    result = run_script(SCRIPTS / "tied_parity.py", nproc=2, args=[str(tmp_path), *layouts], timeout=240)
    assert result.returncode == 0, result.output
    for layout in layouts:
        assert _ok(result.output, layout) == 2, (layout, result.output)
    assert "tie: 2 copies equal" in result.output and "tie: one DTensor" in result.output, result.output


def test_a_tied_gpt_under_dp_x_pp_tp_x_pp_zero3_x_tp_and_pp4_matches_one_process(tmp_path):
    layouts = ["dp=2,pp=2", "dp=2,pp=2:fsdp:interleaved_1f1b:accumulate2", "tp=2,pp=2", "strategy=zero3,tp=2",
               "pp=4::gpipe"]
    result = run_script(SCRIPTS / "tied_parity.py", nproc=4, args=[str(tmp_path), *layouts], timeout=420)
    assert result.returncode == 0, result.output
    for layout in layouts:
        assert _ok(result.output, layout) == 4, (layout, result.output)
    assert "strategy=zero3,tp=2 (FSDP+TP)" in result.output, result.output


def test_tiny_gpt2_and_gemma_with_tied_embeddings_match_one_process_and_load_with_from_pretrained(tmp_path):
    pytest.importorskip("transformers")
    layouts = ["gpt2:pp=2", "gemma:pp=2"]
    result = run_script(SCRIPTS / "hf_tied_parity.py", nproc=2, args=[str(tmp_path), *layouts], timeout=300)
    assert result.returncode == 0, result.output
    for layout in layouts:
        assert _ok(result.output, layout) == 2, (layout, result.output)


def test_a_tied_gpt_saved_by_a_pipeline_resumes_under_tp_dp_and_pp_and_the_other_way(tmp_path):
    # round 1: saved by pp=2 (each stage's copy under its own names), resumed at tp=2, dp=2 and pp=2;
    # round 2: saved by tp=2 (one DTensor under both names), resumed by an interleaved pipeline
    rounds = ["--tied", "pp=2", "tp=2", "dp=2", "pp=2", "--", "tp=2", "pp=2::interleaved_1f1b"]
    result = run_script(SCRIPTS / "layout_resume.py", nproc=2, args=[str(tmp_path / "ckpt"), *rounds], timeout=300)
    assert result.returncode == 0, result.output
    for layout in ("tp=2", "dp=2", "pp=2", "pp=2::interleaved_1f1b"):
        assert _ok(result.output, f"resume {layout}") == 2, (layout, result.output)
