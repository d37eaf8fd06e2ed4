"""pp=2 parity: every schedule trains the tiny GPT like one process does (run on 2 processes)."""

import copy
import datetime
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repo root, for tests.*

import torch
import torch.distributed as dist
from tests.distributed import exit_without_teardown
from tests.train.parallel.tiny_gpt import TinyConfig, TinyGPT, batch, lm_loss

from convoy.train.parallel.pipeline import PipelineConfig, PipelineModule

STEPS, BATCH = 3, 8


def reference(cfg):
    torch.manual_seed(0)
    model = TinyGPT(cfg)
    start = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for step in range(STEPS):
        x, y = batch(cfg, size=BATCH, step=step)
        loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return start, model, losses


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    cfg = TinyConfig()
    start, ref, ref_losses = reference(cfg)
    ref_params = dict(ref.named_parameters())
    schedules = sys.argv[1].split(",")
    for schedule in schedules:
        model = copy.deepcopy(start)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        pipe = PipelineModule(model, config=PipelineConfig(schedule=schedule, microbatches=4), loss_fn=lm_loss,
                              group=dist.group.WORLD)
        losses = []
        for step in range(STEPS):
            x, y = batch(cfg, size=BATCH, step=step)
            losses.append(pipe(x, target=y).item())
            opt.step()
            opt.zero_grad()
        diff = max(abs(a - b) for a, b in zip(losses, ref_losses))
        pdiff = max((p - ref_params[n]).abs().max().item() for n, p in pipe.named_parameters())
        n_local = len(list(pipe.named_parameters()))
        assert diff < 1e-5 and pdiff < 1e-5, (schedule, losses, ref_losses, pdiff)
        assert 0 < n_local < len(ref_params), n_local
        print(f"rank {dist.get_rank()} {schedule}: stages {pipe.stage_indices} loss diff {diff:.2e} "
              f"param diff {pdiff:.2e} OK", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown()
