"""Strategy "parallel"'s FSDP engine under ``mixed_precision="bf16"`` trains as FSDP2 with a bf16
``MixedPrecisionPolicy`` does (what zero3 runs), bit for bit: 16-bit gathered weights, fp32 gradient reduction.

    convoy launch --devices 0 --nproc-per-node 2 tests/train/parallel/scripts/fsdp_mixed_precision.py

Every rank prints ``gathers bf16 OK`` and ``matches FSDP2 with a bf16 MixedPrecisionPolicy OK``.
"""

import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repo root, for tests.*

import torch
import torch.distributed as dist
from tests.distributed import exit_without_teardown
from tests.train.parallel.tiny_gpt import TinyConfig, TinyGPT, batch, lm_loss
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from convoy.train.accelerator import Accelerator

STEPS, BATCH = 3, 8


def main() -> None:
    acc = Accelerator(strategy="parallel", parallelism={"dp": 2}, mixed_precision="bf16",
                      strategy_options={"dp_engine": "fsdp"}, collective_timeout=60)
    rank = dist.get_rank()
    torch.manual_seed(0)
    cfg = TinyConfig()
    start = TinyGPT(cfg)
    model = copy.deepcopy(start)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)

    # the same layout by hand: every block, then the root, gathered in bf16 and reduced in fp32, under autocast
    ref = copy.deepcopy(start)
    mesh = init_device_mesh("cpu", (2,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in ref.layers:
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(ref, mesh=mesh, mp_policy=mp)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)

    seen = []
    hook = model.layers[0].register_forward_pre_hook(lambda m, args: seen.append(m.self_attn.q_proj.weight.dtype))
    for step in range(STEPS):
        x, y = batch(cfg, size=BATCH, step=step)
        x, y = x.chunk(2)[rank], y.chunk(2)[rank]
        loss = lm_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = ref(x)
        ref_loss = lm_loss(out.float(), y)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        assert torch.equal(loss.detach(), ref_loss.detach()), (step, loss.item(), ref_loss.item())
    hook.remove()
    assert seen == [torch.bfloat16] * STEPS, seen
    print(f"rank {rank}: gathers bf16 OK", flush=True)
    for (name, got), (_, want) in zip(model.named_parameters(), ref.named_parameters()):
        assert got.dtype == torch.float32 and torch.equal(got.to_local(), want.to_local()), name
    print(f"rank {rank}: matches FSDP2 with a bf16 MixedPrecisionPolicy OK", flush=True)


if __name__ == "__main__":
    main()
    exit_without_teardown()
