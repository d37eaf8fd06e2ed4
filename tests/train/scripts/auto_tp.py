"""``Accelerator(strategy="auto")`` choosing tp=2 for a tiny GPT, trained against one process.

    convoy launch --nproc-per-node 2 tests/train/scripts/auto_tp.py

The planner is convoy's own (``auto_strategy``) told that each device has 607 MiB: with the planner's 600 MiB
CUDA-context reserve only the tp=2 layout fits (DDP and ZeRO need ~609 MiB, tp2 ~605 MiB), so auto must choose
strategy "parallel" with tp=2. Every rank prints ``rank <r> <distributed type> <diffs> OK``.
"""

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repo root, for tests.*

import torch
from tests.distributed import exit_without_teardown
from tests.train.parallel.tiny_gpt import TinyConfig, TinyGPT, assert_matches_reference, batch, lm_loss, reference_run

from convoy.train.accelerator import Accelerator
from convoy.train.strategies.auto import auto_strategy

STEPS, BATCH, CLIP = 3, 8, 0.5
DEVICE_BYTES = 607 * 2**20


def small_device_planner(**kwargs):
    """convoy's planner, as if each process had a 607 MiB device."""
    return auto_strategy(**{**kwargs, "device_bytes": DEVICE_BYTES, "precision": "fp32"})


def main():
    cfg = TinyConfig()
    torch.manual_seed(0)
    start = TinyGPT(cfg)
    ref, ref_losses, ref_norms = reference_run(start, cfg, steps=STEPS, size=BATCH, clip=CLIP)
    acc = Accelerator(strategy="auto", planner=small_device_planner, collective_timeout=60)
    model = copy.deepcopy(start)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    strategy = acc.strategy
    assert strategy.name == "parallel" and strategy.dims.tp == 2 and strategy.dims.dp == 1, strategy.dims
    assert strategy.data_parallel_size == 1
    losses, norms = [], []
    for step in range(STEPS):
        x, y = batch(cfg, size=BATCH, step=step)  # dp = 1: both tp ranks see the whole batch
        loss = lm_loss(model(x), y)
        acc.backward(loss)
        norms.append(float(acc.clip_grad_norm_(model.parameters(), CLIP)))
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    diffs = assert_matches_reference("auto tp2", strategy.full_model_state_dict(model), ref, losses, ref_losses,
                                     norms, ref_norms, clip=CLIP)
    print(f"rank {acc.process_index} {strategy.distributed_type} {diffs} OK", flush=True)


if __name__ == "__main__":
    main()
    exit_without_teardown()
