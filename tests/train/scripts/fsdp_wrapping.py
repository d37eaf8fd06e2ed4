"""What FSDP2 could not wrap or see, under ``mixed_precision="bf16"`` on every strategy ``auto`` may pick.

    convoy launch --nproc-per-node 2 tests/train/scripts/fsdp_wrapping.py

1. Outputs: a model whose blocks and whole forward return a ``types.SimpleNamespace`` or a dataclass trains under
   ddp, zero3 and zero2 to the very weights it reaches returning a tuple (under zero3 the SimpleNamespace failed
   the backward with "setStorage: ... storage of size 0"), and a forward hook of its own sees the object it
   returns. Each rank prints ``<strategy> <kind> OK``.
2. Scalar parameters (Accelerate's ``RegressionModel``: ``y = a * x + b``, ``a`` and ``b`` 0-dim): ``auto`` picks
   a layout that wraps it and it learns ``a``, ``b`` (``auto scalars <name> OK``); ``strategy="zero3"`` is one
   ``StrategyError`` at ``prepare`` (``zero3 scalars refused OK``).
"""

import copy
import dataclasses
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repo root, for tests.*

import torch
import torch.distributed as dist
import torch.nn.functional as F
from tests.distributed import exit_without_teardown
from torch import nn

from convoy.errors import StrategyError
from convoy.train.accelerator import Accelerator

STEPS, BATCH = 3, 8


@dataclasses.dataclass(frozen=True)
class Output:
    loss: torch.Tensor
    logits: torch.Tensor


def wrap(kind, loss, logits):
    if kind == "namespace":
        return types.SimpleNamespace(loss=loss, logits=logits)
    return Output(loss=loss, logits=logits) if kind == "dataclass" else (loss, logits)


class Block(nn.Module):
    def __init__(self, kind):
        super().__init__()
        self.kind, self.fc = kind, nn.Linear(16, 16)

    def forward(self, h):
        out = h + torch.relu(self.fc(h))
        return types.SimpleNamespace(hidden=out) if self.kind == "namespace" else out


class Net(nn.Module):
    """Blocks in a ModuleList (sharded one by one) and weights of its own (the root unit)."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.embed = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(Block(kind) for _ in range(2))
        self.head = nn.Linear(16, 4)

    def forward(self, x, y):
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
            h = h.hidden if self.kind == "namespace" else h
        logits = self.head(h)
        return wrap(self.kind, loss=F.cross_entropy(logits, y), logits=logits)


def train(strategy, kind, start):
    acc = Accelerator(strategy=strategy, mixed_precision="bf16", collective_timeout=60)
    model = Net(kind)
    model.load_state_dict(start.state_dict())
    seen = []  # a hook of the user's, registered before prepare(), sees the object the model returns
    model.register_forward_hook(lambda _m, _args, out: seen.append(type(out)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    gen = torch.Generator().manual_seed(1)
    for _ in range(STEPS):
        x, y = torch.randn(BATCH, 8, generator=gen), torch.randint(0, 4, (BATCH,), generator=gen)
        x, y = x.chunk(acc.num_processes)[acc.process_index], y.chunk(acc.num_processes)[acc.process_index]
        out = model(x, y)
        loss = out[0] if kind == "tuple" else out.loss
        assert out[1].requires_grad if kind == "tuple" else out.logits.requires_grad
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
    assert acc.strategy.name == strategy, acc.strategy.name
    assert set(seen) == {type(out)}, (seen, type(out))
    return acc.strategy.full_model_state_dict(model)


def check_outputs(start):
    for strategy in ("ddp", "zero3", "zero2"):
        want = train(strategy, "tuple", start)
        moved = max((want[k] - v).abs().max().item() for k, v in start.state_dict().items())
        assert moved > 1e-3, moved  # it trained
        for kind in ("namespace", "dataclass"):
            got = train(strategy, kind, start)
            for name, value in want.items():
                assert torch.equal(got[name], value), (strategy, kind, name, (got[name] - value).abs().max())
            print(f"rank {dist.get_rank()} {strategy} {kind} OK", flush=True)


class Scalars(nn.Module):
    """Accelerate's ``RegressionModel`` (accelerate/test_utils/training.py): two 0-dim parameters."""

    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.tensor(0.0))
        self.b = nn.Parameter(torch.tensor(0.0))

    def forward(self, x):
        return x * self.a + self.b


def check_scalars():
    acc = Accelerator(strategy="auto", mixed_precision="bf16", collective_timeout=60)
    model = Scalars()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    gen = torch.Generator().manual_seed(acc.process_index)
    for _ in range(60):
        x = torch.randn(16, generator=gen)
        loss = F.mse_loss(model(x), 2 * x + 3)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
    learnt = acc.strategy.full_model_state_dict(model)
    assert abs(learnt["a"].item() - 2) < 0.1 and abs(learnt["b"].item() - 3) < 0.1, learnt
    print(f"rank {acc.process_index} auto scalars {acc.strategy.name} OK", flush=True)
    try:
        Accelerator(strategy="zero3", mixed_precision="bf16").prepare(Scalars())
    except StrategyError as err:
        assert "parameter 'a' is a scalar" in str(err) and "'ddp' or 'zero1'" in str(err), err
        print(f"rank {acc.process_index} zero3 scalars refused OK", flush=True)


def main():
    torch.manual_seed(0)
    check_outputs(copy.deepcopy(Net("tuple")))
    check_scalars()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown()
