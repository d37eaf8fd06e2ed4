"""Rank 1 skips the second all_reduce (and lives on), as a rank with a wrong `if` would: raw torch, no convoy."""
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
print("default timeout", dist.distributed_c10d._get_default_timeout("gloo").total_seconds(), flush=True)
if len(sys.argv) > 1:  # only report the timeout
    sys.exit(0)
t = torch.ones(1)
dist.all_reduce(t)
if dist.get_rank() != 1:
    dist.all_reduce(t)
else:
    time.sleep(120)
