"""tp=2 parity (plain and sequence parallel), and a checkpoint saved at tp=2 resumed at tp=1 (2 processes)."""

import copy
import datetime
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repo root, for tests.*

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from tests.distributed import exit_without_teardown
from tests.train.parallel.tiny_gpt import TinyConfig, TinyGPT, batch, lm_loss
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor

from convoy.plan.dims import ParallelDims
from convoy.train.parallel.mesh import build_mesh
from convoy.train.parallel.tensor import apply_tensor_parallel, resolve_tp_plan

STEPS, MORE, BATCH = 3, 2, 4


def train(model, opt, cfg, steps, first=0):
    losses = []
    for step in range(first, first + steps):
        x, y = batch(cfg, size=BATCH, step=step)
        loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def full(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    ckpt = sys.argv[1]
    pm = build_mesh(ParallelDims(tp=2))
    cfg = TinyConfig()
    torch.manual_seed(0)
    start = TinyGPT(cfg)
    ref = copy.deepcopy(start)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    ref_losses = train(ref, ref_opt, cfg, STEPS)
    ref_more = train(ref, ref_opt, cfg, MORE, first=STEPS)
    for sp in (False, True):
        model = copy.deepcopy(start)
        plan = resolve_tp_plan(model, sequence_parallel=sp)
        apply_tensor_parallel(model, pm.tp, plan)
        assert model.layers[0].self_attn.num_heads == cfg.heads // 2
        assert isinstance(model.layers[0].self_attn.q_proj.weight, DTensor)
        assert isinstance(model.embed_tokens.weight, DTensor) and isinstance(model.lm_head.weight, DTensor)
        assert model.layers[0].self_attn.q_proj.weight.to_local().shape[0] == cfg.dim // 2
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        losses = train(model, opt, cfg, STEPS)
        if not sp:
            msd, osd = get_state_dict(model, opt)
            dcp.save({"model": msd, "optim": osd}, checkpoint_id=ckpt)
        losses += train(model, opt, cfg, MORE, first=STEPS)
        diff = max(abs(a - b) for a, b in zip(losses, ref_losses + ref_more))
        ref_params = dict(ref.named_parameters())
        pdiff = max((full(p) - ref_params[n]).abs().max().item() for n, p in model.named_parameters())
        assert diff < 1e-5 and pdiff < 1e-5, (sp, losses, ref_losses + ref_more, pdiff)
        print(f"rank {dist.get_rank()} tp=2 sp={sp} ({plan.source} plan, {len(plan.styles)} modules): "
              f"loss diff {diff:.2e} param diff {pdiff:.2e} OK", flush=True)
    dist.barrier()
    if dist.get_rank() == 0:  # tp=1: a plain model in one process reads the tp=2 checkpoint
        model = TinyGPT(cfg)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=ckpt, no_dist=True)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        resumed = train(model, opt, cfg, MORE, first=STEPS)
        diff = max(abs(a - b) for a, b in zip(resumed, ref_more))
        assert diff < 1e-5, (resumed, ref_more)
        print(f"resume tp=2 -> tp=1: loss diff {diff:.2e} OK", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown()
