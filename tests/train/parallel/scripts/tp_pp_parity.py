"""tp=2 x pp=2 (3D without dp) through the Accelerator, against one process (run on 4 processes).

Each pipeline stage's modules are split over its tp pair; the gradient norm is clipped over shards and stages.
"""

import copy
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repo root, for tests.*

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from convoy.train.accelerator import Accelerator
from tests.train.parallel.tiny_gpt import (TinyConfig, TinyGPT, assert_matches_reference, batch, lm_loss,
                                          reference_run)

STEPS, BATCH, CLIP = 3, 8, 0.5


def main():
    cfg = TinyConfig()
    torch.manual_seed(0)
    start = TinyGPT(cfg)
    ref, ref_losses, ref_norms = reference_run(start, cfg, steps=STEPS, size=BATCH, clip=CLIP)

    acc = Accelerator(parallelism={"tp": 2, "pp": 2}, collective_timeout=60,
                      strategy_options={"loss_fn": lm_loss, "pp_schedule": "1f1b", "pp_microbatches": 2})
    model = copy.deepcopy(start)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    assert acc.strategy.data_parallel_size == 1
    losses, norms = [], []
    for step in range(STEPS):
        x, y = batch(cfg, size=BATCH, step=step)
        loss = model(x, target=y)
        acc.backward(loss)
        norms.append(float(acc.clip_grad_norm_(model.parameters(), CLIP)))
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    local = dict(model.named_parameters())  # this stage's parameters, the split ones as DTensors
    assert 0 < len(local) < len(ref.state_dict()), len(local)
    assert any(isinstance(p, DTensor) for p in local.values()), "no tensor-parallel parameter in the stage"
    assert all(n.startswith(("embed_tokens", "layers.0.", "layers.1.")) == (acc.strategy.mesh.pp_rank == 0)
               for n in local), sorted(local)
    diffs = assert_matches_reference("tp=2 x pp=2", acc.strategy.full_model_state_dict(model), ref, losses,
                                     ref_losses, norms, ref_norms, clip=CLIP)
    pm = acc.strategy.mesh
    print(f"rank {dist.get_rank()} tp=2 x pp=2 ({acc.strategy.distributed_type}) stage {pm.pp_rank} "
          f"tp rank {pm.tp_rank}: {diffs} OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # gloo can abort at interpreter shutdown after all work is done (pytorch/pytorch#179291): end here.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
