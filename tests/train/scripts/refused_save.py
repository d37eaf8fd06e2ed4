"""save_state into a path rank 0 refuses (a file): every rank raises the same CheckpointError, none waits."""
import sys

import torch

from convoy import Accelerator
from convoy.errors import CheckpointError

accelerator = Accelerator()
model, optimizer = accelerator.prepare(torch.nn.Linear(4, 2), torch.optim.SGD(torch.nn.Linear(4, 2).parameters()))
for what in ("save_state", "save_model"):
    try:
        getattr(accelerator, what)(*((sys.argv[1],) if what == "save_state" else (model, sys.argv[2])))
    except CheckpointError as err:
        print(f"{what} refused on rank {accelerator.process_index}: {err}", flush=True)
accelerator.wait_for_everyone()
print(f"rank {accelerator.process_index} done", flush=True)
