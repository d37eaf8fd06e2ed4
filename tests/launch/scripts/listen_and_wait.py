"""A torchrun-style worker: joins a gloo group, writes its pid and MASTER_PORT, waits for <dir>/stop."""
import os
import sys
import time

import torch.distributed as dist

dist.init_process_group("gloo")
dist.barrier()
path = os.path.join(sys.argv[1], f"rank{dist.get_rank()}")
with open(path + ".tmp", "w") as handle:
    handle.write(f"{os.getpid()} {os.environ['MASTER_PORT']}")
os.replace(path + ".tmp", path)
while not os.path.exists(os.path.join(sys.argv[1], "stop")):
    time.sleep(0.05)
dist.barrier()
dist.destroy_process_group()
