"""Run by tests/train/test_watched_collectives.py on 2 CPU processes with Accelerator(collective_timeout=3):
the Accelerator's collectives in step, then out of step, save_state on the main process only, then rank 1
skips a gather."""
import os
import sys
import tempfile
import time

import torch

from convoy import Accelerator, CollectiveTimeoutError

accelerator = Accelerator(collective_timeout=3)
rank = accelerator.process_index
mine = torch.tensor([float(rank)])
assert accelerator.gather(mine).tolist() == [0.0, 1.0]
assert accelerator.gather_for_metrics({"x": mine})["x"].tolist() == [0.0, 1.0]
assert accelerator.reduce(mine, "sum").tolist() == [1.0]
assert accelerator.broadcast(mine.clone(), from_process=1).tolist() == [1.0]
assert accelerator.pad_across_processes(torch.ones(rank + 1)).tolist() == ([1.0, 1.0] if rank else [1.0, 0.0])
accelerator.wait_for_everyone()
print(f"IN STEP rank {rank}", flush=True)

try:  # rank 0 gathers while rank 1 reduces: both are told who is where, instead of a mismatched collective
    accelerator.gather(mine) if rank == 0 else accelerator.reduce(mine)
except CollectiveTimeoutError as err:
    print(f"MISMATCH rank {rank}: {err}", flush=True)

try:  # save_state under `if accelerator.is_main_process:` is named at once (it waited out the timeout in a broadcast)
    accelerator.save_state(tempfile.mkdtemp()) if rank == 0 else accelerator.wait_for_everyone()
except CollectiveTimeoutError as err:
    print(f"MAIN ONLY rank {rank}: {err}", flush=True)

if rank == 1:  # rank 1 skips the next gather and is busy elsewhere
    time.sleep(60)
    print("RANK 1 WOKE UP", flush=True)
started = time.monotonic()
try:
    accelerator.gather_for_metrics(mine)
except CollectiveTimeoutError as err:
    print(f"SKIPPED rank {rank} after {time.monotonic() - started:.1f}s: {err}", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(3)
print(f"NO TIMEOUT rank {rank}", flush=True)
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
