"""What keeps a plan fast without changing it (issue 38, item 4): the re-plans of "what would change it" time only
the rows they read, and answer as the full plans do. Timings are measurements (``benchmarks/cli_latency.py``),
never asserted here."""

from __future__ import annotations

import math

import pytest

from convoy.plan.api import UNTIMED, plan_for
from convoy.plan.hardware import parse_hardware
from convoy.plan.model import resolve_model
from convoy.plan.run import RunSpec

CASES = [  # (params, hardware, nodes, seq_len, recompute): nothing fits as asked, some fit, all fit, several nodes
    (70e9, "8xH100-80GB", 1, 2048, "none"),
    (70e9, "8xH100-80GB", 1, 4096, "selective"),
    (13e9, "8xA100-40GB", 1, 2048, "full"),
    (1.3e9, "4xA100-80GB", 1, 2048, "none"),
    (70e9, "8xH100-80GB", 4, 4096, "none"),
]


@pytest.mark.parametrize(("params", "hardware", "nodes", "seq_len", "recompute"), CASES)
def test_a_re_plan_answers_as_the_full_plan(params, hardware, nodes, seq_len, recompute):
    model = resolve_model(params=params)
    hw = parse_hardware(hardware, nodes=nodes)
    run = RunSpec(seq_len=seq_len, recompute=recompute)
    full = plan_for(model, run, hw, explain_breaks=False, variants=False)
    assert all(r.time is not UNTIMED for r in full.rows)  # a plan someone reads has every step time
    named = full.rows[-1].name
    brief = plan_for(model, run, hw, explain_breaks=False, variants=False, answer_only=(named,))
    assert brief.recommendation == full.recommendation
    assert [r.name for r in brief.rows] == [r.name for r in full.rows]
    for short, whole in zip(brief.rows, full.rows):
        assert short.memory == whole.memory and short.fits == whole.fits
        if short.fits or short.name == named:  # what a re-plan reads: as costed in full
            assert short.time == whole.time
        else:
            assert short.time is UNTIMED and math.isinf(short.time.seconds)
