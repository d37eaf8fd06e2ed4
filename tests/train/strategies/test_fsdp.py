"""FSDP2's limits (``fsdp_limit``: what ``fully_shard`` cannot wrap) and the outputs it cannot see into
(``fsdp_outputs``), checked before they crash a job (issue 24, items 4 and 8)."""

from __future__ import annotations

import dataclasses
import re
import types
from collections import namedtuple
from pathlib import Path

import pytest
import torch
from torch import nn

from convoy.train.strategies.fsdp import fsdp_limit
from convoy.train.strategies.fsdp_outputs import close_output, open_output
from tests.distributed import run_script

SCRIPTS = Path(__file__).parents[1] / "scripts"


@dataclasses.dataclass(frozen=True)
class Frozen:
    loss: torch.Tensor
    note: str = "x"


Pair = namedtuple("Pair", "a b")


def _tensors(x):
    """Every tensor FSDP2's walkers find: tuples, lists, dicts and namedtuples only (torch 2.6's pytree)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v)]
    if type(x) in (list, tuple) or isinstance(x, Pair):
        return [t for v in x for t in _tensors(v)]
    return []


@pytest.mark.parametrize("make", [
    lambda t: types.SimpleNamespace(loss=t, logits=t * 2),
    lambda t: Frozen(loss=t),
    lambda t: {"out": types.SimpleNamespace(loss=t), "n": 3},
    lambda t: [Pair(types.SimpleNamespace(loss=t), 1)],
])
def test_an_opened_output_shows_its_tensors_and_closes_into_the_same_object(make):
    t = torch.ones(2, requires_grad=True) * 1.0
    out = make(t)
    opened = open_output(out)
    assert any(found is t for found in _tensors(opened))  # what FSDP2 hooks for the backward
    assert _same(close_output(opened), out)


def _same(a, b) -> bool:
    """The same objects, in containers of the same kind (a tuple, list or dict around them may be a new one)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a is b


def test_outputs_every_torch_walks_are_left_alone():
    t = torch.ones(1)
    for out in (t, (t, t), [t], {"a": t}, Pair(t, 1), None, 3, "text"):
        assert open_output(out) is out and close_output(out) is out
    empty = types.SimpleNamespace(n=1)  # no tensor: nothing to hook
    assert open_output(empty) is empty


def test_a_closed_output_takes_the_tensors_fsdp_replaced():
    """Under torch.func transforms FSDP2 hands back new tensors; the object is copied with them, never mutated."""
    t, new = torch.ones(1), torch.zeros(1)
    out = Frozen(loss=t)
    holder, values = open_output(out)
    closed = close_output((holder, (new, values[1])))
    assert closed.loss is new and out.loss is t and closed.note == "x"


def test_a_cyclic_output_is_opened_once():
    out = types.SimpleNamespace(loss=torch.ones(1))
    out.me = out
    assert close_output(open_output(out)) is out


class _Blocks(nn.Module):
    def __init__(self, dtype=torch.float32):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.head = nn.Linear(4, 2).to(dtype)


def test_fsdp_limit_names_what_fully_shard_cannot_wrap():
    assert fsdp_limit(_Blocks()) is None
    scalars = _Blocks()
    scalars.scale = nn.Parameter(torch.tensor(1.0))  # Accelerate's RegressionModel has two of these
    assert re.match(r"parameter 'scale' is a scalar \(0-dim\)", fsdp_limit(scalars))
    strided = _Blocks()
    strided.head.weight = nn.Parameter(torch.ones(2, 4).t())
    assert "parameter 'head.weight' is not contiguous" in fsdp_limit(strided)
    # two dtypes in the root unit (the blocks are their own units)
    mixed = _Blocks(torch.bfloat16)
    mixed.extra = nn.Linear(4, 4)
    assert "'head.weight' (torch.bfloat16) and 'extra.weight' (torch.float32)" in fsdp_limit(mixed)
    assert "in the model" in fsdp_limit(mixed)
    assert fsdp_limit(_Blocks(torch.bfloat16)) is None  # one dtype per unit: fine
    frozen = _Blocks(torch.bfloat16)
    frozen.extra = nn.Linear(4, 4).requires_grad_(False)
    assert fsdp_limit(frozen) is None  # FSDP2 compares the trainable ones only
    with torch.device("meta"):  # checked without memory
        assert fsdp_limit(_Blocks()) is None


@pytest.mark.slow
def test_what_fsdp2_could_not_wrap_or_see_trains_under_bf16_on_two_processes():
    """A SimpleNamespace output failed zero3's backward ("setStorage: ... storage of size 0") and under zero2
    left the root's gradients unreduced; a model with scalar parameters crashed in fully_shard, which auto chose."""
    result = run_script(SCRIPTS / "fsdp_wrapping.py", nproc=2, timeout=180)
    assert result.returncode == 0, result.output
    for check in ("ddp namespace", "ddp dataclass", "zero3 namespace", "zero3 dataclass", "zero2 namespace",
                  "zero2 dataclass", "zero3 scalars refused"):
        assert sorted(re.findall(rf"rank (\d) {check} OK", result.output)) == ["0", "1"], (check, result.output)
    assert len(re.findall(r"rank \d auto scalars (ddp|zero1|single) OK", result.output)) == 2, result.output
    assert "FSDP2 layouts (zero2, zero3) were left out: it cannot shard this model (parameter 'a' is a scalar" in \
        result.output, result.output
