"""A DeepSpeed config's optimizer and scheduler sections built for DummyOptim/DummyScheduler, as Accelerate's
deepspeed_with_config_support.py uses them, against a hand-built torch AdamW whose lr is set by hand each step.

    convoy launch --nproc-per-node 2 tests/train/scripts/deepspeed_sections.py WarmupCosineLR
"""

import math
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

from convoy import Accelerator, DeepSpeedPlugin
from convoy.utils import DummyOptim, DummyScheduler, set_seed

SAMPLES, BATCH, LR, DECAY, WARMUP = 64, 4, 0.05, 0.01, 3


def hand_lr(kind: str, done: int, total: int) -> float:
    """The lr DeepSpeed's schedule sets after ``done`` scheduler steps (deepspeed/runtime/lr_schedules.py, log
    warmup), with Accelerate's "auto" values: min 0, max the DummyOptim's lr."""
    it, warmup = max(done - 1, 0), max(2, WARMUP)
    rise = math.log(it + 1) / math.log(warmup)
    if kind == "WarmupCosineLR":
        if it < warmup:
            return LR * rise
        return LR * max(0.0, 1e-4 + (1 - 1e-4) * (1 + math.cos(math.pi * (it - warmup + 1) / (total - warmup))) / 2)
    if it < warmup:
        return LR * rise
    return LR * (max(0.0, (total - it) / max(1.0, total - warmup)) if kind == "WarmupDecayLR" else 1.0)


def model() -> torch.nn.Module:
    set_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def main() -> None:
    kind = sys.argv[1]
    params = {"warmup_num_steps": "auto"}
    if kind != "WarmupCosineLR":
        params |= {"warmup_min_lr": "auto", "warmup_max_lr": "auto"}
    if kind != "WarmupLR":
        params["total_num_steps"] = "auto"
    ds = {"zero_optimization": {"stage": 0},
          "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": [0.9, 0.99], "eps": 1e-8,
                                                    "weight_decay": "auto"}},
          "scheduler": {"type": kind, "params": params}}
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=ds))
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(SAMPLES, 4, generator=gen), torch.randn(SAMPLES, 1, generator=gen)
    loader = DataLoader(TensorDataset(x, y), batch_size=BATCH)
    net = model()
    optimizer = DummyOptim(net.parameters(), lr=LR, weight_decay=DECAY)
    scheduler = DummyScheduler(optimizer, total_num_steps=len(loader), warmup_num_steps=WARMUP)
    net, optimizer, loader, scheduler = accelerator.prepare(net, optimizer, loader, scheduler)
    losses, lrs = [], []
    for xb, yb in loader:
        lrs.append(optimizer.param_groups[0]["lr"])
        loss = torch.nn.functional.mse_loss(net(xb), yb)
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), "mean").item())

    # by hand: torch AdamW, the lr set before each step, the whole batch of every process at once
    total = math.ceil(len(DataLoader(x, batch_size=BATCH)) / accelerator.num_processes)
    ref = model()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=LR, betas=(0.9, 0.99), eps=1e-8, weight_decay=DECAY)
    ref_losses, ref_lrs = [], []
    for step, (xb, yb) in enumerate(DataLoader(TensorDataset(x, y), batch_size=BATCH * accelerator.num_processes)):
        for group in ref_opt.param_groups:
            group["lr"] = hand_lr(kind, step, total)
        ref_lrs.append(ref_opt.param_groups[0]["lr"])
        loss = torch.nn.functional.mse_loss(ref(xb), yb)
        loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        ref_losses.append(loss.item())
    assert type(optimizer.optimizer).__name__ == "AdamW", optimizer.optimizer
    assert len(losses) == total and lrs[0] == 0.0 and max(lrs) > 0.9 * LR, lrs
    torch.testing.assert_close(lrs, ref_lrs, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(losses, ref_losses, rtol=1e-5, atol=1e-6)
    print(f"DS SECTIONS OK {kind} steps={total} last_loss={losses[-1]:.6f} lrs={[round(v, 5) for v in lrs]}",
          flush=True)


if __name__ == "__main__":
    main()
