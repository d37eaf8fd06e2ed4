"""Print what the Accelerator of this rank resolved from the launcher, after one all-reduce over the job.

    convoy launch --devices 0 --nnodes 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:PORT \
        tests/plan/scripts/show_settings.py

``tests/plan/test_plan_runs.py`` runs a plan's multi-node line as printed, once per loopback "node".
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repo root, for tests.*

import torch
import torch.distributed as dist
from tests.distributed import exit_without_teardown

from convoy.train.accelerator import Accelerator


def main() -> None:
    acc = Accelerator(collective_timeout=60)
    total = torch.ones(1)
    dist.all_reduce(total)
    s = acc.settings
    print(f"node {os.environ['GROUP_RANK']} rank {acc.process_index} of {int(total.item())}: "
          f"mixed_precision={s.mixed_precision} gradient_accumulation_steps={s.gradient_accumulation_steps} "
          f"strategy={s.strategy}", flush=True)


if __name__ == "__main__":
    main()
    exit_without_teardown()
