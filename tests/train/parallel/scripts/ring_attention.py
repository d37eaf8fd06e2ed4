"""Ring attention on the cp ranks equals full SDPA: output and dq/dk/dv, causal (head-tail balanced or not) and
unmasked, both rotations, grouped K/V heads; prints one OK line per check and rank.

    convoy launch --devices 0 --nproc-per-node 2 tests/train/parallel/scripts/ring_attention.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tests.distributed import exit_without_teardown  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402

from convoy.train.parallel.context import context_parallel  # noqa: E402


def check(mesh, *, rotate: str, balanced: bool, causal: bool, kv_heads: int) -> None:
    rank, cp = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(7)
    b, h, s, d = 2, 4, 8 * cp, 8
    q = torch.randn(b, h, s, d, generator=g, dtype=torch.float64).float()
    k, v = (torch.randn(b, kv_heads, s, d, generator=g) for _ in range(2))
    dout = torch.randn(b, h, s, d, generator=g)
    gqa = kv_heads != h
    full = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*full, is_causal=causal, enable_gqa=gqa)
    ref.backward(dout)
    # split along the sequence (dim 2) as the context does: q, k, v, dout and the reference output
    parts = [t.clone() for t in (q, k, v, dout, ref.detach())]
    with context_parallel(mesh, buffers=parts, buffer_seq_dims=[2] * 5, balanced=balanced, rotate=rotate,
                          no_restore_buffers=set(parts)):
        lq, lk, lv = (t.clone().requires_grad_() for t in parts[:3])
        out = F.scaled_dot_product_attention(lq, lk, lv, is_causal=causal, enable_gqa=gqa)
        out.backward(parts[3])
    # the reference gradients, split the same way
    grads = [t.grad.clone() for t in full]
    with context_parallel(mesh, buffers=grads, buffer_seq_dims=[2] * 3, balanced=balanced,
                          no_restore_buffers=set(grads)):
        pass
    diffs = [(out - parts[4]).abs().max().item()] + [(a.grad - r).abs().max().item()
                                                     for a, r in zip((lq, lk, lv), grads)]
    assert max(diffs) < 1e-5, (rotate, balanced, causal, diffs)
    print(f"rank {rank} ring {rotate} balanced={balanced} causal={causal} kv_heads={kv_heads} "
          f"max diff {max(diffs):.1e} OK", flush=True)


def main() -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("cp",))
    for rotate in ("allgather", "alltoall"):
        for balanced in (True, False):
            check(mesh, rotate=rotate, balanced=balanced, causal=True, kv_heads=4)
    check(mesh, rotate="allgather", balanced=True, causal=False, kv_heads=4)
    check(mesh, rotate="alltoall", balanced=True, causal=True, kv_heads=2)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    exit_without_teardown()
