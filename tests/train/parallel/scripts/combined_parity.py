"""dp=2 x tp=2 (FSDP2 + TP) and dp=2 x pp=2 (ZeRO-1 + 1F1B) through the Accelerator, against one process.

Run on 4 processes. Both layouts clip gradients, so the global norm over shards and stages is checked too.
"""

import copy
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repo root, for tests.*

import torch
import torch.distributed as dist

from convoy.train.accelerator import Accelerator
from tests.train.parallel.tiny_gpt import (TinyConfig, TinyGPT, assert_matches_reference, batch, lm_loss,
                                          reference_run)

STEPS, BATCH, CLIP = 3, 8, 0.5


def world_mean(value):
    t = torch.tensor(float(value))
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def check(name, acc, model, losses, norms, ref, ref_losses, ref_norms):
    diffs = assert_matches_reference(name, acc.strategy.full_model_state_dict(model), ref, losses, ref_losses,
                                     norms, ref_norms, clip=CLIP)
    print(f"rank {dist.get_rank()} {name} ({acc.strategy.distributed_type}): {diffs} OK", flush=True)


def main():
    cfg = TinyConfig()
    torch.manual_seed(0)
    start = TinyGPT(cfg)
    ref, ref_losses, ref_norms = reference_run(start, cfg, steps=STEPS, size=BATCH, clip=CLIP)

    os.environ["CONVOY_PARALLELISM"] = "dp=2,tp=2"  # what `convoy launch --dp 2 --tp 2` sets; auto picks it up
    acc = Accelerator(collective_timeout=60)
    assert acc.strategy.name == "parallel", acc.strategy.name
    model = copy.deepcopy(start)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    dp_rank, dp = acc.strategy.data_parallel_rank, acc.strategy.data_parallel_size
    assert dp == 2
    losses, norms = [], []
    for step in range(STEPS):
        x, y = batch(cfg, size=BATCH, step=step)
        x, y = x.chunk(dp)[dp_rank], y.chunk(dp)[dp_rank]
        loss = lm_loss(model(x), y)
        acc.backward(loss)
        norms.append(float(acc.clip_grad_norm_(model.parameters(), CLIP)))
        opt.step()
        opt.zero_grad()
        losses.append(world_mean(loss.item()))
    check("dp=2 x tp=2", acc, model, losses, norms, ref, ref_losses, ref_norms)

    del os.environ["CONVOY_PARALLELISM"]
    acc = Accelerator(parallelism={"dp": 2, "pp": 2}, collective_timeout=60,
                      strategy_options={"loss_fn": lm_loss, "pp_schedule": "1f1b", "pp_microbatches": 2})
    model = copy.deepcopy(start)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    dp_rank, dp = acc.strategy.data_parallel_rank, acc.strategy.data_parallel_size
    losses, norms = [], []
    for step in range(STEPS):
        x, y = batch(cfg, size=BATCH, step=step)
        x, y = x.chunk(dp)[dp_rank], y.chunk(dp)[dp_rank]
        loss = model(x, target=y)
        acc.backward(loss)
        norms.append(float(acc.clip_grad_norm_(model.parameters(), CLIP)))
        opt.step()
        opt.zero_grad()
        losses.append(world_mean(loss.item()))
    check("dp=2 x pp=2", acc, model, losses, norms, ref, ref_losses, ref_norms)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # gloo can abort at interpreter shutdown after all work is done (pytorch/pytorch#179291): end here.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
