"""Two ranks on GPU 0 (one GPU is enough: no NCCL communicator is ever created between them). Rank 1 is stuck
before an NCCL all-reduce; rank 0's watched collective names it within the timeout instead of hanging.

    CUDA_VISIBLE_DEVICES=0 python -m torch.distributed.run --standalone --nproc-per-node 2 hang_nccl.py 5
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

from convoy.errors import CollectiveTimeoutError
from convoy.train.hang import watch_call

torch.cuda.set_device(0)
dist.init_process_group("cpu:gloo,cuda:nccl", timeout=datetime.timedelta(seconds=120))
rank = dist.get_rank()
if rank == 1:
    time.sleep(120)  # stuck far from the collective
grads = torch.ones(8, device="cuda")
started = time.monotonic()
try:
    watch_call("all_reduce grads", timeout=float(sys.argv[1]))  # what every Accelerator collective does first
    dist.all_reduce(grads)  # never reached while rank 1 is away: NCCL alone would wait here
except CollectiveTimeoutError as err:
    print(f"NAMED after {time.monotonic() - started:.1f}s on {grads.device}: {err}", flush=True)
    os._exit(3)
print("NOT NAMED", flush=True)
os._exit(0)
