"""Any dp x tp x pp layout through the Accelerator, against one process.

    convoy launch --nproc-per-node 8 tests/train/parallel/scripts/layout_parity.py dp=2,tp=2,pp=2
    convoy launch --nproc-per-node 4 tests/train/parallel/scripts/layout_parity.py dp=2,pp=2:fsdp

Each argument is one layout (``degrees[:dp_engine[:schedule[:accumulateK]]]``, empty fields for defaults;
``sp`` among the degrees turns on sequence parallelism, ``target`` trains with the pipeline's loop
``model(x, target=y)`` at pp=1 too), trained for a few steps with clipping and
compared with ``reference_run``; every rank prints one ``<layout> (<distributed type>) ... OK`` line per layout.
A layout written ``env:dp=2,tp=2`` reaches the Accelerator only through ``CONVOY_PARALLELISM`` (what
``convoy launch --dp 2 --tp 2`` sets), with the strategy left at ``"auto"``; ``strategy=NAME`` among the degrees
names a data-parallel strategy beside them (``env:strategy=zero3,tp=2``: ``CONVOY_STRATEGY=zero3`` as well, what
``convoy launch --strategy zero3 --tp 2`` sets).
"""

import copy
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repo root, for tests.*

import torch
import torch.distributed as dist
from tests.distributed import exit_without_teardown
from tests.train.parallel.tiny_gpt import TinyConfig, TinyGPT, assert_matches_reference, batch, lm_loss, reference_run

from convoy.train.accelerator import Accelerator

STEPS, BATCH, CLIP = 3, 8, 0.5


def world_mean(value):
    t = torch.tensor(float(value))
    dist.all_reduce(t)
    return t.item() / dist.get_world_size()


def prepare(layout, start):
    """An Accelerator for ``layout`` and a copy of ``start`` prepared with AdamW: (acc, model, opt, dims)."""
    from_env = layout.startswith("env:")
    degrees, engine, schedule, accumulate = (layout.removeprefix("env:").split(":") + [None] * 3)[:4]
    options = {"loss_fn": lm_loss, "pp_schedule": schedule or "1f1b", "pp_microbatches": 2}
    steps = int(accumulate.removeprefix("accumulate")) if accumulate else 1
    if engine:
        options["dp_engine"] = engine
    parts = degrees.split(",")
    if "sp" in parts:  # sequence parallelism on the tp axis
        options["sequence_parallel"] = True
    named = {part: part.split("=")[1] for part in parts if part.startswith("strategy=")}
    dims = dict((k, int(v)) for k, v in (part.split("=") for part in parts if "=" in part and part not in named))
    if dims.get("pp", 1) == 1 and "target" not in parts:
        del options["loss_fn"]  # a plain loop: loss = loss_fn(model(x), y); accelerator.backward(loss)
    if from_env:
        os.environ["CONVOY_PARALLELISM"] = ",".join(f"{k}={v}" for k, v in dims.items())
        for strategy in named.values():
            os.environ["CONVOY_STRATEGY"] = strategy
        acc = Accelerator(collective_timeout=60, strategy_options=options, gradient_accumulation_steps=steps)
        os.environ.pop("CONVOY_PARALLELISM")
        os.environ.pop("CONVOY_STRATEGY", None)
        assert acc.strategy.name == "parallel", acc.strategy.name
    else:
        acc = Accelerator(parallelism=dims, collective_timeout=60, strategy_options=options,
                          gradient_accumulation_steps=steps, strategy=next(iter(named.values()), None))
    model = copy.deepcopy(start)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    given = [dims[k] for k in ("dp_replicate", "dp_shard") if k in dims]  # else dp is what tp x pp leave
    dp = dims.get("dp") or (math.prod(given) if given else acc.num_processes // (dims.get("tp", 1) * dims.get("pp", 1)))
    assert acc.strategy.data_parallel_size == dp, (acc.strategy.data_parallel_size, dims)
    return acc, model, opt, dims


def run_steps(acc, model, opt, dims, cfg, steps):
    """Train ``steps`` (step numbers, which pick the batches); returns the mean losses and pre-clip norms.
    With gradient accumulation each step's batch is cut into that many micro-steps under ``accumulate``."""
    dp_rank, dp = acc.strategy.data_parallel_rank, acc.strategy.data_parallel_size
    k = acc.gradient_accumulation_steps
    losses, norms = [], []
    for step in steps:
        x, y = batch(cfg, size=BATCH, step=step)
        x, y = x.chunk(dp)[dp_rank], y.chunk(dp)[dp_rank]
        parts = []
        for xs, ys in zip(x.chunk(k), y.chunk(k)):
            with acc.accumulate(model):
                # a pipeline loop (and, at pp=1, the same loop on the whole model: "target" layouts)
                target_call = "loss_fn" in acc.strategy.context.options
                loss = model(xs, target=ys) if target_call else lm_loss(model(xs), ys)
                acc.backward(loss)
                if acc.sync_gradients:
                    norms.append(float(acc.clip_grad_norm_(model.parameters(), CLIP)))
                opt.step()
                opt.zero_grad()
            parts.append(loss.item())
        losses.append(world_mean(sum(parts) / k))
    return losses, norms


def check_eval(acc, model, dims, cfg, ref):
    """Forward only after training: logits (on the last stage, for a pipeline) and a validation loss."""
    dp_rank, dp = acc.strategy.data_parallel_rank, acc.strategy.data_parallel_size
    x, y = batch(cfg, size=BATCH, step=99)
    x, y = x.chunk(dp)[dp_rank], y.chunk(dp)[dp_rank]
    k = acc.gradient_accumulation_steps  # a pipeline is traced for the micro-step's batch shape
    x, y = x.chunk(k)[0], y.chunk(k)[0]
    with torch.no_grad():
        want = ref(x)
        model.eval()
        logits = model(x)
        if dims.get("pp", 1) > 1:
            val = model(x, target=y)  # forward only under no_grad: the mean loss on every stage
            assert abs(val.item() - lm_loss(want, y).item()) < 1e-5, (val.item(), lm_loss(want, y).item())
            if not acc.strategy.mesh.pp_rank == dims["pp"] - 1:
                assert logits is None, type(logits)
                logits = want
        model.train()
    assert (logits - want).abs().max().item() < 1e-5, (logits - want).abs().max().item()


def report(acc, layout, diffs):
    pm = getattr(acc.strategy, "mesh", None)  # plain data parallel ("dp=4" alone) has no mesh
    where = f"dp {pm.dp_rank} tp {pm.tp_rank} pp {pm.pp_rank}" if pm else f"dp {acc.strategy.data_parallel_rank}"
    print(f"rank {dist.get_rank()} {layout} ({acc.strategy.distributed_type}) {where}: {diffs} OK", flush=True)


def main():
    cfg = TinyConfig()
    torch.manual_seed(0)
    start = TinyGPT(cfg)
    ref, ref_losses, ref_norms = reference_run(start, cfg, steps=STEPS, size=BATCH, clip=CLIP)
    for layout in sys.argv[1:]:
        acc, model, opt, dims = prepare(layout, start)
        losses, norms = run_steps(acc, model, opt, dims, cfg, range(STEPS))
        diffs = assert_matches_reference(layout, acc.strategy.full_model_state_dict(model), ref, losses, ref_losses,
                                         norms, ref_norms, clip=CLIP)
        check_eval(acc, model, dims, cfg, ref)
        report(acc, layout, diffs)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown()
