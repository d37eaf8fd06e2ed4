"""The operations ``convoy test`` runs inside each process, each verifying its own result (imports torch).

    from convoy.launch import selfcheck_ops as ops
    ops.COLLECTIVES["all_reduce"](rank, world, device)     # -> "sum over 2 ranks correct" or raises
    ops.ddp_steps(rank, world, device, steps=3)              # DDP vs a one-process reference
    ops.bus_bandwidth(world, device, size_mib=64)            # {"bus_gbps": ..., "alg_gbps": ..., "runs": ...}

Every function must be called on every rank of an initialised process group, in the same order. A wrong
result raises ``RuntimeError`` saying what was expected and what came back.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["COLLECTIVES", "ddp_steps", "bus_bandwidth"]


def _expect(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if not torch.equal(got.cpu(), want.cpu()):
        raise RuntimeError(f"{what}: expected {want.tolist()}, got {got.tolist()}")


def _all_reduce(rank: int, world: int, device: torch.device) -> str:
    t = torch.full((4,), float(rank + 1), device=device)
    dist.all_reduce(t)
    _expect(t, torch.full((4,), world * (world + 1) / 2), "all_reduce sum")
    return f"sum over {world} ranks correct"


def _broadcast(rank: int, world: int, device: torch.device) -> str:
    t = torch.arange(4, dtype=torch.float32, device=device) if rank == 0 else torch.zeros(4, device=device)
    dist.broadcast(t, src=0)
    _expect(t, torch.arange(4, dtype=torch.float32), "broadcast from rank 0")
    return f"rank 0's tensor reached all {world} ranks"


def _all_gather(rank: int, world: int, device: torch.device) -> str:
    out = torch.empty(2 * world, device=device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, torch.tensor([rank, rank + 0.5], device=device))
    _expect(out, torch.tensor([v for r in range(world) for v in (r, r + 0.5)]), "all_gather")
    return f"{world} shards gathered in rank order"


def _reduce_scatter(rank: int, world: int, device: torch.device) -> str:
    out = torch.empty(2, device=device)
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    scatter(out, torch.arange(2 * world, dtype=torch.float32, device=device))
    _expect(out, torch.tensor([2.0 * rank, 2.0 * rank + 1]) * world, "reduce_scatter sum")
    return f"each of {world} ranks got its reduced shard"


def _all_to_all(rank: int, world: int, device: torch.device) -> str:
    out = torch.empty(world, device=device)
    dist.all_to_all_single(out, torch.tensor([100.0 * rank + r for r in range(world)], device=device))
    _expect(out, torch.tensor([100.0 * r + rank for r in range(world)]), "all_to_all")
    return f"every pair of {world} ranks exchanged"


def _send_recv(rank: int, world: int, device: torch.device) -> str:
    if world == 1:
        return "one process: nothing to send"
    right, left = (rank + 1) % world, (rank - 1) % world
    got = torch.empty(3, device=device)
    ops = [dist.P2POp(dist.isend, torch.full((3,), float(rank), device=device), right),
           dist.P2POp(dist.irecv, got, left)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    _expect(got, torch.full((3,), float(left)), f"recv from rank {left}")
    return "ring of point-to-point sends (pipeline stages) correct"


COLLECTIVES: dict[str, Callable[[int, int, torch.device], str]] = {
    "all_reduce": _all_reduce,
    "broadcast": _broadcast,
    "all_gather": _all_gather,
    "reduce_scatter": _reduce_scatter,
    "all_to_all": _all_to_all,
    "send_recv": _send_recv,
}


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def ddp_steps(rank: int, world: int, device: torch.device, steps: int = 3) -> str:
    """Train a tiny model with DDP on this rank's shard and compare with one process on the whole batch."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    generator = torch.Generator().manual_seed(1)
    inputs, targets = torch.randn(4 * world, 8, generator=generator), torch.randn(4 * world, 1, generator=generator)
    reference = _model()
    ddp = DDP(_model().to(device), device_ids=[device.index] if device.type == "cuda" else None)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (reference, ddp)]
    shard = slice(4 * rank, 4 * rank + 4)
    for _ in range(steps):
        for model, opt, x, y in ((reference, optimizers[0], inputs, targets),
                                 (ddp, optimizers[1], inputs[shard].to(device), targets[shard].to(device))):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    diff = max((a.detach().cpu() - b.detach()).abs().max().item()
               for a, b in zip(ddp.module.parameters(), reference.parameters()))
    if diff > 1e-5:
        raise RuntimeError(f"after {steps} DDP steps the parameters differ from one process by {diff:.2e}")
    return f"{steps} steps match one process on the same batch (max diff {diff:.1e})"


def bus_bandwidth(world: int, device: torch.device, *, size_mib: float, runs: int = 5) -> dict[str, Any]:
    """Time ``runs`` all-reduces of ``size_mib`` MiB; bus bandwidth = algorithm bandwidth x 2(n-1)/n (the
    convention of nccl-tests, so numbers compare with theirs)."""
    numel = max(1, int(size_mib * 2**20 // 4))
    tensor = torch.ones(numel, dtype=torch.float32, device=device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(2):  # warm-up: connections, algorithms, allocator
        dist.all_reduce(tensor)
    sync()
    times = []
    for _ in range(runs):
        dist.barrier()
        started = time.perf_counter()
        dist.all_reduce(tensor)
        sync()
        times.append(time.perf_counter() - started)
    # every rank must agree on the time: take the slowest rank's median
    median = torch.tensor([statistics.median(times)], dtype=torch.float64, device=device)
    dist.all_reduce(median, op=dist.ReduceOp.MAX)
    seconds = median.item()
    alg = numel * 4 / seconds / 1e9
    return {"alg_gbps": alg, "bus_gbps": alg * 2 * (world - 1) / world, "runs": runs, "seconds": seconds}
