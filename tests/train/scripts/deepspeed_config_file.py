"""Accelerate's ``examples/by_feature/deepspeed_with_config_support.py`` flow, small: the optimizer and schedule are
``DummyOptim`` / ``DummyScheduler`` exactly when ``accelerator.state.deepspeed_plugin.deepspeed_config`` has the
sections, which come from the launcher's Accelerate file (``deepspeed_config_file``); rank 0 writes what was built.

    convoy launch --devices 0 --config_file ds.yaml tests/train/scripts/deepspeed_config_file.py --out run.json
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repo root, for tests.*

import torch
from tests.distributed import exit_without_teardown
from torch.utils.data import DataLoader, TensorDataset

from convoy import Accelerator
from convoy.utils import DummyOptim, DummyScheduler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--learning_rate", type=float, default=1.0)  # the JSON's lr wins over it
    parser.add_argument("--num_warmup_steps", type=int, default=50)  # the JSON's warmup wins over it
    args = parser.parse_args()
    accelerator = Accelerator()
    ds = accelerator.state.deepspeed_plugin
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(24, 4, generator=generator), torch.randn(24, 1, generator=generator)
    loader = DataLoader(TensorDataset(x, y), batch_size=2)
    # as the example: DummyOptim when the config has an optimizer section, else torch's AdamW
    optimizer_cls = (torch.optim.AdamW if ds is None or "optimizer" not in ds.deepspeed_config else DummyOptim)
    optimizer = optimizer_cls(model.parameters(), lr=args.learning_rate)
    accumulation = ds.deepspeed_config["gradient_accumulation_steps"] if ds is not None else 1
    max_train_steps = len(loader) // accumulation
    if ds is None or "scheduler" not in ds.deepspeed_config:
        lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda n: 1.0)
    else:
        lr_scheduler = DummyScheduler(optimizer, total_num_steps=max_train_steps,
                                      warmup_num_steps=args.num_warmup_steps)
    model, optimizer, loader, lr_scheduler = accelerator.prepare(model, optimizer, loader, lr_scheduler)
    inner = optimizer.optimizer
    lrs = []
    for inputs, targets in loader:
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad()
        lrs.append(inner.param_groups[0]["lr"])
    if accelerator.is_main_process:
        group = inner.param_groups[0]
        Path(args.out).write_text(json.dumps({
            "plugin": ds is not None and accelerator.deepspeed_plugin is ds,
            "zero_stage": getattr(ds, "zero_stage", None),
            "optimizer": type(getattr(inner, "optim", inner)).__name__,  # within ZeRO-1's ZeroRedundancyOptimizer
            "initial_lr": group.get("initial_lr", group["lr"]),
            "betas": list(group["betas"]), "weight_decay": group["weight_decay"], "lrs": lrs,
            "processes": accelerator.num_processes, "strategy": accelerator.strategy.name}))
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
    exit_without_teardown()
