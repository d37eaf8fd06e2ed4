"""Step time of convoy's tp/pp/parallel strategies at degree 1 against plain FSDP2 and DDP on one device.

    convoy launch --nproc-per-node 1 benchmarks/parallel_degree1.py              # CPU, or the one GPU
    convoy launch --nproc-per-node 1 benchmarks/parallel_degree1.py --size large --rounds 7

Issue 6 asks that the parallel code path at degree 1 (one GPU) costs no more than 3% over plain
``fully_shard``/DDP. All loops train the same model on the same batches; they are interleaved round by round
(drift and noise hit them alike) and each cell is the median per-step time over rounds, with its ratio to
plain DDP in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

SIZES = {"small": (128, 2, 8, 32), "large": (1024, 8, 8, 512)}  # width, blocks, batch, sequence
VOCAB = 512


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up_proj = nn.Linear(width, 4 * width)
        self.down_proj = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down_proj(torch.nn.functional.gelu(self.up_proj(self.norm(x))))


class Model(nn.Module):
    def __init__(self, width: int, blocks: int) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, width)
        self.layers = nn.ModuleList(Block(width) for _ in range(blocks))
        self.lm_head = nn.Linear(width, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(x)


def loss_of(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))


def make(width: int, blocks: int, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return Model(width, blocks).to(device)


def plain_loop(model: nn.Module) -> Callable:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(x, y):
        loss = loss_of(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return step


def loop_ddp(width, blocks, device):
    ids = [device.index] if device.type == "cuda" else None
    return plain_loop(nn.parallel.DistributedDataParallel(make(width, blocks, device), device_ids=ids))


def loop_fully_shard(width, blocks, device):
    from torch.distributed.fsdp import fully_shard

    model = make(width, blocks, device)
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    return plain_loop(model)


def convoy_loop(strategy: str) -> Callable:
    def build(width, blocks, device):
        from convoy import Accelerator

        acc = Accelerator(strategy=strategy)
        model = make(width, blocks, device)
        model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-4))

        def step(x, y):
            acc.backward(loss_of(model(x), y))
            opt.step()
            opt.zero_grad()
        return step
    return build


LOOPS: dict[str, Callable] = {"ddp": loop_ddp, "fully_shard": loop_fully_shard, "convoy tp=1": convoy_loop("tp"),
                              "convoy pp=1": convoy_loop("pp"), "convoy parallel": convoy_loop("parallel")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", choices=SIZES, default="small")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if dist.get_world_size() != 1:
        raise SystemExit("run on one process: convoy launch --nproc-per-node 1 benchmarks/parallel_degree1.py")
    width, blocks, batch, seq = SIZES[args.size]
    g = torch.Generator().manual_seed(1)
    data = [(ids[:, :-1].to(device), ids[:, 1:].to(device))
            for ids in (torch.randint(0, VOCAB, (batch, seq + 1), generator=g) for _ in range(args.steps))]
    steps = {name: build(width, blocks, device) for name, build in LOOPS.items()}
    for step in steps.values():
        for x, y in data[:3]:  # warm-up
            step(x, y)
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.rounds):
        for name, step in steps.items():
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for x, y in data:
                step(x, y)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[name].append((time.perf_counter() - start) / len(data))
    base = statistics.median(times["ddp"])
    print(f"\n{args.size} model on {device} ({torch.cuda.get_device_name(0) if device.type == 'cuda' else 'CPU'}), "
          f"median of {args.rounds} interleaved rounds x {args.steps} steps")
    print(f"{'loop':<16} {'ms/step':>9} {'vs ddp':>8}")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:<16} {med * 1e3:>9.2f} {med / base:>8.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
