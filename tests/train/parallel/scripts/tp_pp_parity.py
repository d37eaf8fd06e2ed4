"""tp=2 x pp=2 through the Accelerator, plain and with sequence_parallel=True, against one process (4 processes).

Each pipeline stage's modules are split over its tp pair; the gradient norm is clipped over shards and stages.
With sequence parallelism each tp rank holds its half of the sequence between blocks, so what a stage sends
to the next is a [micro-batch, seq / 2, dim] shard (the whole sequence without it); the script checks that
shape on the stage boundary, where each parameter sits, and that training matches. One ``OK`` line per
variant and rank.
"""

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repo root, for tests.*

import torch
import torch.distributed as dist
from tests.distributed import exit_without_teardown
from tests.train.parallel.tiny_gpt import TinyConfig, TinyGPT, assert_matches_reference, batch, lm_loss, reference_run
from torch.distributed.tensor import DTensor

from convoy.train.accelerator import Accelerator

STEPS, BATCH, CLIP, MICRO = 3, 8, 0.5, 2


def check(start, cfg, ref, ref_losses, ref_norms, *, sp: bool) -> None:
    acc = Accelerator(parallelism={"tp": 2, "pp": 2}, collective_timeout=60,
                      strategy_options={"loss_fn": lm_loss, "sequence_parallel": sp, "pp_schedule": "1f1b",
                                        "pp_microbatches": MICRO})
    model = copy.deepcopy(start)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    assert acc.strategy.data_parallel_size == 1
    pm = acc.strategy.mesh
    received: list[tuple[int, ...]] = []
    losses, norms = [], []
    for step in range(STEPS):
        x, y = batch(cfg, size=BATCH, step=step)
        loss = model(x, target=y)
        if step == 0 and pm.pp_rank == 1:  # stage 1's inputs come from stage 0: record what arrived
            (stage_module,) = model.stage_modules()
            stage_module.register_forward_pre_hook(lambda _, args: received.append(tuple(args[0].shape)))
        acc.backward(loss)
        norms.append(float(acc.clip_grad_norm_(model.parameters(), CLIP)))
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    if pm.pp_rank == 1:
        seq = cfg.seq // 2 if sp else cfg.seq
        assert received and set(received) == {(BATCH // MICRO, seq, cfg.dim)}, received
    local = dict(model.named_parameters())  # this stage's parameters, the split ones as DTensors
    assert 0 < len(local) < len(ref.state_dict()), len(local)
    assert any(isinstance(p, DTensor) for p in local.values()), "no tensor-parallel parameter in the stage"
    assert all(n.startswith(("embed_tokens", "layers.0.", "layers.1.")) == (pm.pp_rank == 0)
               for n in local), sorted(local)  # every module (norms too) sits only in the stage that runs it
    norm_names = [n for n in local if n.endswith("layernorm.weight") or n == "norm.weight"]
    assert norm_names and all(isinstance(local[n], DTensor) == sp for n in norm_names), norm_names  # SequenceParallel
    name = f"tp=2 x pp=2 sp={sp}"
    diffs = assert_matches_reference(name, acc.strategy.full_model_state_dict(model), ref, losses, ref_losses,
                                     norms, ref_norms, clip=CLIP)
    print(f"rank {dist.get_rank()} {name} ({acc.strategy.distributed_type}) stage {pm.pp_rank} "
          f"tp rank {pm.tp_rank}: {diffs} OK", flush=True)


def main():
    cfg = TinyConfig()
    torch.manual_seed(0)
    start = TinyGPT(cfg)
    ref, ref_losses, ref_norms = reference_run(start, cfg, steps=STEPS, size=BATCH, clip=CLIP)
    for sp in (False, True):
        check(start, cfg, ref, ref_losses, ref_norms, sp=sp)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown()
