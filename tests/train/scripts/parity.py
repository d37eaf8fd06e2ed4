"""Parity checks for one strategy, on however many processes this was launched with.

    convoy launch --nproc-per-node 2 parity.py --strategy zero3 --checks all --out DIR
    python parity.py --strategy zero3 --checks resume-load --out DIR      # one process, no launcher

Each check compares against plain PyTorch on one process with the global batch, computed here on every rank.
Prints ``CHECK <name> ok`` per passing check; any mismatch raises (non-zero exit).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repo root, for tests.*

import torch
from tests.distributed import exit_without_teardown
from torch.utils.data import DataLoader, TensorDataset

from convoy import Accelerator

B = 4  # per-process batch
STEPS = 3
N_SAMPLES = 64


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(x)


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(N_SAMPLES, 8, generator=g), torch.randn(N_SAMPLES, 1, generator=g))


def fresh() -> Net:
    torch.manual_seed(0)
    return Net()


def reference(steps: int, global_batch: int, start: int = 0) -> dict[str, torch.Tensor]:
    """Plain PyTorch, one process, batch = global batch, from step ``start`` (replaying from 0)."""
    model = fresh()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loader = DataLoader(data(), batch_size=global_batch)
    for i, (x, y) in enumerate(loader):
        if i == steps:
            break
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return {k: v.detach() for k, v in model.state_dict().items()}


def assert_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], what: str, tol: float = 2e-6) -> None:
    assert got.keys() == want.keys(), f"{what}: keys {sorted(got)} != {sorted(want)}"
    for k in want:
        diff = (got[k].float() - want[k].float()).abs().max().item()
        assert diff <= tol, f"{what}: {k} differs by {diff:.3g} (tolerance {tol})"


def train(acc: Accelerator, model, opt, loader, steps: int) -> None:
    it = loader if hasattr(loader, "__next__") else iter(loader)
    for _ in range(steps):
        x, y = next(it)
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()


def check_parity(strategy: str) -> None:
    acc = Accelerator(strategy=strategy)
    model = fresh()
    model, opt, loader = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2),
                                     DataLoader(data(), batch_size=B))
    train(acc, model, opt, loader, STEPS)
    assert_close(acc.get_state_dict(model), reference(STEPS, B * acc.num_processes), f"{strategy} parity")
    print("CHECK parity ok", flush=True)


def check_accumulation(strategy: str) -> None:
    acc = Accelerator(strategy=strategy, gradient_accumulation_steps=2)
    model = fresh()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)  # created before prepare: must keep working
    model, opt, loader = acc.prepare(model, opt, DataLoader(data(), batch_size=B // 2))
    micro = 0
    for x, y in loader:
        with acc.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
        micro += 1
        if micro == 2 * STEPS:
            break
    assert_close(acc.get_state_dict(model), reference(STEPS, B * acc.num_processes), f"{strategy} accumulation")
    print("CHECK accumulation ok", flush=True)


def check_data(strategy: str) -> None:
    acc = Accelerator(strategy=strategy)
    ids = TensorDataset(torch.arange(22))
    loader = acc.prepare(DataLoader(ids, batch_size=3, shuffle=True))
    epochs = []
    for _ in range(2):
        mine = [i for (batch,) in loader for i in batch.tolist()]
        everyone = acc.gather_for_metrics(torch.tensor(mine))  # not per batch: just collect
        epochs.append(everyone.tolist())
        per_rank = acc.gather(torch.tensor([len(mine)]))
        assert len(set(per_rank.tolist())) == 1, f"uneven batches per rank {per_rank.tolist()}"
    for order in epochs:
        assert set(order) == set(range(22)), f"epoch does not cover the data: {sorted(order)}"
    assert epochs[0] != epochs[1], "two epochs shuffled identically"
    # disjoint within an epoch apart from the padding added to even out the last round
    assert len(epochs[0]) - len(set(epochs[0])) < 3 * acc.num_processes
    # gather_for_metrics over an uneven eval set equals one process's evaluation
    model = acc.prepare(fresh())
    eval_set = TensorDataset(torch.randn(13, 8, generator=torch.Generator().manual_seed(2)))
    loader = acc.prepare(DataLoader(eval_set, batch_size=2))
    outs = []
    with torch.no_grad():
        for (x,) in loader:
            outs.append(acc.gather_for_metrics(model(x)))
    got = torch.cat(outs)
    want = fresh()(eval_set.tensors[0]).detach()
    assert got.shape == want.shape, f"gather_for_metrics gave {tuple(got.shape)} rows, want {tuple(want.shape)}"
    assert torch.allclose(got, want, atol=1e-5), "gather_for_metrics values differ from one process"
    print("CHECK data ok", flush=True)


def resume_save(strategy: str, out: Path) -> None:
    """Train 2 steps, save, train 2 more; write the final weights for resume_load to compare with."""
    acc = Accelerator(strategy=strategy)
    model = fresh()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt, loader = acc.prepare(model, opt, DataLoader(data(), batch_size=8 // acc.num_processes))
    batches = iter(loader)
    train(acc, model, opt, batches, 2)
    acc.save_state(out / "ckpt")
    train(acc, model, opt, batches, 2)
    final = acc.get_state_dict(model)
    if acc.is_main_process:
        torch.save(final, out / "final.pt")
    acc.end_training()
    print("CHECK resume-save ok", flush=True)


def resume_load(strategy: str, out: Path) -> None:
    """Load resume_save's checkpoint at another process count, train 2 steps: same weights as resume_save."""
    acc = Accelerator(strategy=strategy)
    torch.manual_seed(123)
    model = Net()  # another init: everything must come from the checkpoint
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt, loader = acc.prepare(model, opt, DataLoader(data(), batch_size=8 // acc.num_processes))
    acc.load_state(out / "ckpt")
    meta = json.loads((out / "ckpt" / "convoy_checkpoint.json").read_text())
    assert meta["world_size"] != acc.num_processes, "this check must load at another process count"
    train(acc, model, opt, loader, 2)  # the loader resumes 2 global batches into the epoch
    assert_close(acc.get_state_dict(model), torch.load(out / "final.pt"), f"{strategy} resume", tol=1e-5)
    acc.end_training()
    print("CHECK resume-load ok", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--checks", default="parity,accumulation,data")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    checks = args.checks.split(",")
    for name, fn in (("parity", check_parity), ("accumulation", check_accumulation), ("data", check_data)):
        if name in checks:
            fn(args.strategy)
    if "resume-save" in checks:
        resume_save(args.strategy, args.out)
    if "resume-load" in checks:
        resume_load(args.strategy, args.out)
    if os.environ.get("RANK") is not None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown()
