"""Train a linear layer under a progress bar long enough for the plan line, which comes while the bar is drawn.

    convoy launch --nproc-per-node 1 tests/train/scripts/plan_line_under_bar.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repo root, for tests.*

import torch
from tests.distributed import exit_without_teardown
from torch import nn

from convoy.train.accelerator import Accelerator
from convoy.train.progress import progress_bar


def main() -> None:
    acc = Accelerator()
    model, opt = acc.prepare(nn.Linear(8, 8), torch.optim.SGD(nn.Linear(8, 8).parameters(), lr=0.1))
    for _ in progress_bar(range(12), mininterval=0):
        loss = model(torch.randn(4, 8, device=acc.device)).sum()
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
    acc.print("done")


if __name__ == "__main__":
    main()
    exit_without_teardown()
