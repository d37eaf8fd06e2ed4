"""Functions that tests/gpu run through convoy.launch(fn) (spawned ranks import them by name)."""

import datetime
import os


def nccl_all_reduce():
    """(device, sum, CUDA_VISIBLE_DEVICES, backend) after an all-reduce on this rank's GPU."""
    import torch
    import torch.distributed as dist

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=60), device_id=torch.device("cuda", local))
    t = torch.full((2,), float(dist.get_rank() + 1), device="cuda")
    dist.all_reduce(t)
    out = (str(t.device), float(t.sum().item()), os.environ.get("CUDA_VISIBLE_DEVICES"), dist.get_backend())
    dist.destroy_process_group()
    return out
