"""Train a tiny GPT in each layout given as the ranks' ``CONVOY_*`` settings, one after the other, against one process.

    convoy launch --devices 0 --nproc-per-node 8 tests/plan/scripts/train_as_planned.py \
        '[["ddp+tp2", {"CONVOY_STRATEGY": "ddp", "CONVOY_PARALLELISM": "dp=4,tp=2"}]]'

Each layout's variables are those ``convoy launch`` sets for a plan's ``launch_args``
(``tests/plan/test_plan_runs.py`` turns them into these with the launcher's own ``build_request`` and
``convoy_env``), so one launch trains several layouts. The script is what a user writes from the plan's
``Accelerator(...)`` line: ``Accelerator()`` with the layout from the launcher, and with a pipeline (pp > 1) the
pipeline's loop (``strategy_options={"loss_fn": ...}``, ``loss = model(x, target=y)``), each step's batch run as
the plan's micro-batches (``--gradient-accumulation-steps`` under ``accumulate``, or the pipeline's
``--pp-microbatches``). Three AdamW steps with clipping; every rank prints one line ending in ``OK`` per layout
when the parameters, losses and gradient norms match ``reference_run``.
"""

import copy
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repo root, for tests.*

import torch
import torch.distributed as dist
from tests.distributed import exit_without_teardown
from tests.train.parallel.tiny_gpt import TinyConfig, TinyGPT, assert_matches_reference, batch, lm_loss, reference_run

from convoy.plan.dims import ParallelDims
from convoy.train.accelerator import Accelerator

STEPS, BATCH, CLIP = 3, 8, 0.5


def train(label, start, cfg, ref, ref_losses, ref_norms):
    pipeline = ParallelDims.parse(os.environ.get("CONVOY_PARALLELISM", "")).pp > 1
    acc = Accelerator(collective_timeout=60, strategy_options={"loss_fn": lm_loss} if pipeline else None)
    model = copy.deepcopy(start)
    model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    dp_rank, dp = acc.strategy.data_parallel_rank, acc.strategy.data_parallel_size
    # the plan's micro-batches: a pipeline cuts the batch itself (pp_microbatches), else they are accumulated
    micro = 1 if pipeline else acc.gradient_accumulation_steps
    losses, norms = [], []
    for step in range(STEPS):
        x, y = batch(cfg, size=BATCH, step=step)
        x, y = x.chunk(dp)[dp_rank].to(acc.device), y.chunk(dp)[dp_rank].to(acc.device)
        total = 0.0
        for xs, ys in zip(x.chunk(micro), y.chunk(micro), strict=True):
            with acc.accumulate(model):
                loss = model(xs, target=ys) if pipeline else lm_loss(model(xs), ys)
                acc.backward(loss)
                total += loss.item() / micro
                if acc.sync_gradients:
                    norms.append(float(acc.clip_grad_norm_(model.parameters(), CLIP)))
                opt.step()
                opt.zero_grad()
        mean = torch.tensor(total, device=acc.device)
        dist.all_reduce(mean)
        losses.append(mean.item() / dist.get_world_size())
    diffs = assert_matches_reference(label, acc.strategy.full_model_state_dict(model), ref, losses, ref_losses,
                                     norms, ref_norms, clip=CLIP)
    cut = getattr(model, "microbatches", 1)  # a PipelineModule's
    print(f"rank {dist.get_rank()} {label} ({acc.strategy.distributed_type}, {micro} x {cut} micro-batches): "
          f"{diffs} OK", flush=True)


def main() -> None:
    cfg = TinyConfig()
    torch.manual_seed(0)
    start = TinyGPT(cfg)
    ref, ref_losses, ref_norms = reference_run(start, cfg, steps=STEPS, size=BATCH, clip=CLIP)
    for label, env in json.loads(sys.argv[1]):
        os.environ.update(env)
        train(label, start, cfg, ref, ref_losses, ref_norms)
        for key in env:
            del os.environ[key]


if __name__ == "__main__":
    main()
    exit_without_teardown()
