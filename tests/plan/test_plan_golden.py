"""A faster planner prints the same plans (issue 38, item 4): the full JSON and table of several plans, pinned.

The outputs were captured from the planner before it memoized its step times; ``golden_plans.py`` lists the
cases and writes the file again when the model is meant to change.
"""

from __future__ import annotations

import json

import pytest

from tests.plan.golden_plans import CASES, GOLDEN, outputs

_PINNED = json.loads(GOLDEN.read_text())


def test_every_case_is_pinned() -> None:
    assert sorted(_PINNED) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_plan_output_is_unchanged(name: str) -> None:
    got = outputs(name)
    assert got["text"] == _PINNED[name]["text"]
    assert json.loads(got["json"]) == json.loads(_PINNED[name]["json"])
    assert got["json"] == _PINNED[name]["json"]
