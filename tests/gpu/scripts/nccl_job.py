"""One rank per GPU on NCCL, as `convoy launch` starts it; `--fail-first` fails the first attempt (elastic restart).

Run by tests/gpu/test_launch_gpu.py. Prints ``NCCL OK ...`` with the backend, the device, the all-reduced sum
and the restart count.
"""
import datetime
import os
import sys

import torch
import torch.distributed as dist

local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=60), device_id=torch.device("cuda", local))
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
if "--fail-first" in sys.argv and restart == 0:
    raise ValueError(f"boom on attempt {restart} of rank {dist.get_rank()}")
t = torch.full((4,), float(dist.get_rank() + 1), device="cuda")
dist.all_reduce(t)
torch.cuda.synchronize()
print(f"NCCL OK backend={dist.get_backend()} device={t.device} sum={t.sum().item():g} restart={restart} "
      f"world={dist.get_world_size()} visible={os.environ.get('CUDA_VISIBLE_DEVICES')}", flush=True)
dist.destroy_process_group()
