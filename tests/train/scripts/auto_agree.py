"""``Accelerator(strategy="auto")`` builds one layout on every rank, even when a planner answers differently per rank.

    convoy launch --nproc-per-node 2 tests/train/scripts/auto_agree.py

The planner here says "ddp" on rank 0 and "zero3" on rank 1, and reports the device memory it was given. Every rank
prints ``rank <r> built <strategy> planned for <bytes> OK``: the strategy must be rank 0's answer everywhere (ranks
that built DDP beside FSDP would wait on each other's collectives until the timeout).
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repo root, for tests.*

import torch
from tests.distributed import exit_without_teardown

from convoy.train.accelerator import Accelerator

SEEN = []


def planner_per_rank(*, num_parameters, world_size, device_bytes):
    SEEN.append(device_bytes)
    rank = int(os.environ["RANK"])
    return ("ddp", "rank 0 says ddp") if rank == 0 else ("zero3", "rank 1 says zero3")


def main():
    acc = Accelerator(strategy="auto", planner=planner_per_rank, collective_timeout=60)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    loss = model(torch.ones(4, 8)).sum()
    acc.backward(loss)  # a collective both ranks must reach: DDP's all-reduce
    opt.step()
    print(f"rank {acc.process_index} built {acc.strategy.name} planned for {SEEN[0]} OK", flush=True)


if __name__ == "__main__":
    main()
    exit_without_teardown()
