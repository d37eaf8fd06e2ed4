"""A run started with Hugging Face Accelerate, continued under convoy from Accelerate's save_state.

    python accelerate_resume.py --lib accelerate --steps 5 --save-at 3 --save DIR --out ref.json
    python accelerate_resume.py --lib convoy --load DIR --resume-step 3 --steps 2 --out c.json

The Accelerate run saves its state after step 3 (to DIR with safetensors, to DIR_bin with pytorch_model.bin;
saving leaves the run unchanged) and goes on uninterrupted to step 5: the reference.

The training loop is the same for both libraries (only the import differs): two models with their own AdamW
optimizers, a LambdaLR scheduler, dropout (so the RNG state matters), a registered object. Rank 0 writes the
parameters to ``--out``; tests/train/checkpoint/test_accelerate.py compares them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset


class Counter:  # registered for checkpointing: custom_checkpoint_0.pkl
    def __init__(self) -> None:
        self.seen = 0

    def state_dict(self) -> dict[str, int]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seen = state["seen"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lib", choices=["accelerate", "convoy"], required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--resume-step", type=int, default=0)
    parser.add_argument("--save")
    parser.add_argument("--save-at", type=int)
    parser.add_argument("--load")
    parser.add_argument("--out", required=True)
    parser.add_argument("--strategy", help="convoy's strategy (default: auto)")
    args = parser.parse_args()
    if args.lib == "accelerate":
        from accelerate import Accelerator

        acc = Accelerator(cpu=True)
    else:
        from convoy import Accelerator

        acc = Accelerator(strategy=args.strategy)
    torch.manual_seed(0)
    body = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3))
    head = torch.nn.Linear(16, 1)
    opt_body = torch.optim.AdamW(body.parameters(), lr=1e-2)
    opt_head = torch.optim.AdamW(head.parameters(), lr=2e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt_body, lambda step: 1.0 / (1 + step))
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))
    # its own generator: the seed a new iteration draws for workers leaves the global RNG (dropout) alone, so an
    # interrupted run draws the same dropout masks as an uninterrupted one
    loader = DataLoader(data, batch_size=4, generator=torch.Generator().manual_seed(2))
    body, head, opt_body, opt_head, sched, loader = acc.prepare(body, head, opt_body, opt_head, sched, loader)
    counter = Counter()
    acc.register_for_checkpointing(counter)
    if args.load:
        acc.load_state(args.load)
        assert counter.seen == args.resume_step, counter.seen
    batches = acc.skip_first_batches(loader, args.resume_step) if args.resume_step else loader
    for step, (x, y) in enumerate(batches):
        if step == args.save_at:
            acc.save_state(args.save)
            acc.save_state(args.save + "_bin", safe_serialization=False)
        if step == args.steps:
            break
        loss = torch.nn.functional.mse_loss(head(body(x)), y)
        acc.backward(loss)
        opt_body.step()
        opt_head.step()
        sched.step()
        opt_body.zero_grad()
        opt_head.zero_grad()
        counter.seen += 1
    params = [t.tolist() for m in (body, head) for t in acc.get_state_dict(m).values()]  # collective
    state = {"params": params, "lr": sched.get_last_lr(), "rand": torch.rand(3).tolist()}
    if acc.is_main_process:
        with open(args.out, "w") as f:
            json.dump(state, f)
    acc.wait_for_everyone()
    if args.lib == "accelerate":
        # The reference run's result is written. Under torchrun with torch 2.13 on the CPU, a rank of this
        # Accelerate run aborts in the interpreter's C++ teardown now and then ("terminate called without an
        # active exception", no Python frame; about 1 run in 6 here, and more with destroy_process_group()):
        # leave without it, so that what the test compares is all a failure can mean.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
