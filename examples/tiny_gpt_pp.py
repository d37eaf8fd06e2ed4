"""The tiny GPT of ``tiny_gpt_tp.py`` trained with pipeline parallelism (``torch.distributed.pipelining``).

    convoy launch --nproc-per-node 2 --pp 2 examples/tiny_gpt_pp.py                 # pp=2, 1F1B
    convoy launch --nproc-per-node 2 --pp 2 --pp-schedule interleaved_1f1b examples/tiny_gpt_pp.py
    convoy launch --nproc-per-node 4 --dp 2 --pp 2 examples/tiny_gpt_pp.py           # zero1+pp2
    convoy launch --nproc-per-node 8 --dp 2 --tp 2 --pp 2 examples/tiny_gpt_pp.py    # 3D: zero2+tp2+pp2

The layout, the schedule and the micro-batches are the launcher's (``--pp``, ``--pp-schedule``,
``--pp-microbatches``: what ``convoy plan`` prints), which the script's ``Accelerator`` takes as it passes none of
its own; ``--schedule``/``--microbatches`` here override them, and the Accelerator says so. With pp the training
step is ``loss = model(inputs, target=labels)``: the schedule runs forward and backward of every micro-batch,
stage by stage, and returns the mean loss on every rank; ``accelerator.backward(loss)`` is then a no-op, kept so
that the loop reads like any other.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from convoy import Accelerator  # noqa: E402
from convoy.train.plan_report import trainer_layout  # noqa: E402  (the layout's name in convoy plan's table)
from tiny_gpt_tp import TinyGPT, lm_loss, make_batch  # noqa: E402  (the model is shared with the TP example)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--schedule", default=None,
                        help="gpipe, 1f1b, interleaved_1f1b, looped_bfs (default: the launcher's --pp-schedule)")
    parser.add_argument("--microbatches", type=int, default=None,
                        help="default: the launcher's --pp-microbatches, else one per stage")
    args = parser.parse_args()

    torch.manual_seed(0)  # the same initial weights on every rank before the model is cut into stages
    options = {"pp_schedule": args.schedule, "pp_microbatches": args.microbatches}
    accelerator = Accelerator(strategy_options={"loss_fn": lm_loss, **{k: v for k, v in options.items() if v}})
    model = TinyGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    strategy = accelerator.strategy
    dims = getattr(strategy, "dims", None)
    schedule = strategy.context.options.get("pp_schedule") or "1f1b"
    layout, _ = trainer_layout(strategy, accumulation=accelerator.gradient_accumulation_steps)
    accelerator.print(f"layout {layout.name} ({dims.describe() if dims else strategy.name}), schedule {schedule}")
    for step in range(args.steps):
        x, y = make_batch(step, args.batch_size, strategy.data_parallel_rank, strategy.data_parallel_size)
        loss = model(x, target=y)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if step == 0 and hasattr(model, "stage_indices"):
            print(f"rank {accelerator.process_index}: stages {model.stage_indices} of {model.num_stages}", flush=True)
        if step % 10 == 0 or step == args.steps - 1:
            accelerator.print(f"step {step:3d}  loss {loss.item():.4f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
