"""A GPT whose head is its embedding, at pp=2 and tp=2 on two GPUs (NCCL), against one GPU.

    convoy launch --devices 2 tests/gpu/scripts/tied_cuda.py

Run by tests/gpu/test_ties_gpu.py. Every rank prints ``CHECK <layout> ... ok`` per layout: parameters equal
one GPU's after AdamW steps with clipping, and the tie still one tensor (tp) or equal copies (pp).
"""

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repo root, for tests.*

import torch
import torch.distributed as dist
from tests.train.parallel.tiny_gpt import TinyConfig, TinyGPT, batch, lm_loss

from convoy.train.accelerator import Accelerator
from convoy.train.parallel.pipeline import PipelineModule

STEPS, BATCH, CLIP = 3, 8, 0.5


def run(layout, start, cfg):
    dims = dict((k, int(v)) for k, v in (p.split("=") for p in layout.split(",")))
    options = {"loss_fn": lm_loss, "pp_microbatches": 2} if dims.get("pp", 1) > 1 else {}
    acc = Accelerator(parallelism=dims, strategy_options=options, collective_timeout=60)
    model = copy.deepcopy(start)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    for step in range(STEPS):
        x, y = (t.to(acc.device) for t in batch(cfg, size=BATCH, step=step))
        loss = model(x, target=y) if options else lm_loss(model(x), y)
        acc.backward(loss)
        acc.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
    return acc, model


def reference(start, cfg):
    model = copy.deepcopy(start).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(STEPS):
        x, y = (t.cuda() for t in batch(cfg, size=BATCH, step=step))
        lm_loss(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
    return {k: v.cpu() for k, v in model.state_dict().items()}


def main():
    cfg = TinyConfig(tied=True)
    torch.manual_seed(0)
    start = TinyGPT(cfg)
    want = reference(start, cfg)
    for layout in ("pp=2", "tp=2"):
        acc, model = run(layout, start, cfg)
        full = acc.strategy.full_model_state_dict(model)
        diff = max((full[k].cpu() - v).abs().max().item() for k, v in want.items())
        assert diff < 1e-4, (layout, diff)
        assert full["embed_tokens.weight"] is full["lm_head.weight"]
        if isinstance(model, PipelineModule):
            mine = [s.get_parameter(n).detach().cpu() for s in model.stage_modules()
                    for n in ("embed_tokens.weight", "lm_head.weight") if n in dict(s.named_parameters())][:1]
            every = [None] * dist.get_world_size()
            dist.all_gather_object(every, mine)
            copies = [c for part in every for c in part]
            assert len(copies) == 2 and torch.equal(copies[0], copies[1]), "the stages' copies differ"
        else:
            unwrapped = acc.unwrap_model(model)
            assert unwrapped.lm_head.weight is unwrapped.embed_tokens.weight
        print(f"CHECK {layout} {acc.strategy.distributed_type} on {acc.device} param diff {diff:.1e} ok", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    import os
    os._exit(0)
