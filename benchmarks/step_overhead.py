"""Per-step time of one training loop written four ways: plain PyTorch DDP, convoy, Accelerate, Fabric.

    convoy launch --nproc-per-node 2 benchmarks/step_overhead.py            # or torchrun --nproc-per-node 2
    python benchmarks/step_overhead.py --rounds 7 --steps 20                 # one process

Same model, data and optimizer for all; the frameworks are interleaved round by round (so drift and noise hit
them alike) and each cell is the median per-step time over rounds, printed with its ratio to plain PyTorch.
Two sizes: "tiny" (Python overhead dominates) and "medium" (a step of roughly 100 ms on 2 CPU cores).
Accelerate and Lightning are optional: a missing one is reported as n/a.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

SIZES = {"tiny": (32, 2, 8), "medium": (512, 4, 256)}  # width, depth, per-process batch


def make_model(width: int, depth: int) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))


def batches(width: int, batch: int, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, width, generator=g), torch.randn(batch, 1, generator=g)) for _ in range(n)]


def loop_plain(width, depth, data):
    model = make_model(width, depth)
    if dist.is_initialized():
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return step


def loop_convoy(width, depth, data):
    from convoy import Accelerator

    acc = Accelerator(strategy="ddp" if dist.is_initialized() else "single")
    model = make_model(width, depth)
    model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))

    def step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
    return step


def loop_accelerate(width, depth, data):
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    model = make_model(width, depth)
    model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))

    def step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
    return step


def loop_fabric(width, depth, data):
    from lightning.fabric import Fabric

    world = dist.get_world_size() if dist.is_initialized() else 1
    fabric = Fabric(accelerator="cpu", devices=world, strategy="ddp" if world > 1 else "auto")
    fabric.launch()
    model = make_model(width, depth)
    model, opt = fabric.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-3))

    def step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        fabric.backward(loss)
        opt.step()
        opt.zero_grad()
    return step


LOOPS: dict[str, Callable] = {"pytorch": loop_plain, "convoy": loop_convoy, "accelerate": loop_accelerate,
                              "fabric": loop_fabric}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--sizes", default="tiny,medium")
    args = parser.parse_args()
    if "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    rows = []
    for size in args.sizes.split(","):
        width, depth, batch = SIZES[size]
        data = batches(width, batch, args.steps)
        steps: dict[str, Callable | None] = {}
        for name, build in LOOPS.items():
            try:
                steps[name] = build(width, depth, data)
                for x, y in data[:3]:  # warm-up (and DDP's one-time dynamo import)
                    steps[name](x, y)
            except Exception as exc:  # an optional framework missing or failing is reported, not fatal
                steps[name] = None
                if rank == 0:
                    print(f"{name}: n/a ({type(exc).__name__}: {str(exc)[:80]})")
        times: dict[str, list[float]] = {n: [] for n in steps}
        for _ in range(args.rounds):
            for name, step in steps.items():
                if step is None:
                    continue
                if dist.is_initialized():
                    dist.barrier()
                start = time.perf_counter()
                for x, y in data:
                    step(x, y)
                if dist.is_initialized():
                    dist.barrier()
                times[name].append((time.perf_counter() - start) / len(data))
        base = statistics.median(times["pytorch"])
        for name, values in times.items():
            if values:
                med = statistics.median(values)
                rows.append((size, name, med * 1e3, med / base))
            else:
                rows.append((size, name, float("nan"), float("nan")))
    if rank == 0:
        world = dist.get_world_size() if dist.is_initialized() else 1
        print(f"\nper-step time, median of {args.rounds} interleaved rounds x {args.steps} steps, {world} process(es)")
        print(f"{'size':<8} {'loop':<11} {'ms/step':>9} {'vs pytorch':>11}")
        for size, name, ms, ratio in rows:
            print(f"{size:<8} {name:<11} {ms:>9.3f} {ratio:>11.3f}")
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
