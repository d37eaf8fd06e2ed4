"""Saves rank 0 refuses (a file as the checkpoint directory, an unwritable model directory), a bad shard size and
a load of a damaged checkpoint: every rank raises the same error, none waits for the others in a collective."""
import os
import sys

import torch

from convoy import Accelerator
from convoy.errors import CheckpointError, ConfigError

accelerator = Accelerator()
net = torch.nn.Linear(4, 2)
model, optimizer = accelerator.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
calls = {"save_state": lambda: accelerator.save_state(sys.argv[1]),
         "save_model": lambda: accelerator.save_model(model, sys.argv[2]),
         "max_shard_size": lambda: accelerator.save_model(model, sys.argv[3], max_shard_size="ten")}
for what, call in calls.items():
    try:
        call()
    except (CheckpointError, ConfigError) as err:
        print(f"{what} refused on rank {accelerator.process_index}: {err}", flush=True)
good = os.path.join(sys.argv[3], "ckpt")
accelerator.save_state(good)
if accelerator.is_main_process:
    with open(os.path.join(good, "distributed", ".metadata"), "wb") as damaged:
        damaged.write(b"junk")
accelerator.wait_for_everyone()
try:
    accelerator.load_state(good)
except CheckpointError as err:
    print(f"load_state refused on rank {accelerator.process_index}: {err}", flush=True)
accelerator.wait_for_everyone()
print(f"rank {accelerator.process_index} done", flush=True)
