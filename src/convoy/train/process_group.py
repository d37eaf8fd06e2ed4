"""The job's default process group: started once from the settings, destroyed at the end.

    start_process_group(settings)                # gloo on CPU, nccl on CUDA; no-op for one process
    start_process_group(settings, always=True)   # a one-rank group too (DDP and FSDP need one)
    stop_process_group()                         # only a group started here; idempotent

The group's timeout is the settings' collective timeout; its rendezvous is torchrun's (``MASTER_ADDR``,
``MASTER_PORT``, set by ``convoy launch``).
"""

from __future__ import annotations

import atexit
import datetime
import time

import torch.distributed as dist

from convoy.devices.vendors import process_group_backend
from convoy.train.settings import TrainSettings

__all__ = ["start_process_group", "stop_process_group"]


_owned_group = False
_generation = 0  # process groups this process has started over a store (see start_process_group)


def start_process_group(settings: TrainSettings, *, always: bool = False) -> bool:
    """Start the default process group for this job if there is none; True when this call started it.

    ``always`` starts a one-process group (an in-memory store) even when the job has a single process,
    for strategies whose engine needs a group (DDP, FSDP).
    """
    global _owned_group, _generation
    if dist.is_initialized():
        return False
    if settings.world_size == 1 and not always:
        return False
    timeout = datetime.timedelta(seconds=settings.collective_timeout_s)
    backend = settings.backend or _default_backend(settings.device_type)
    if settings.world_size == 1 and settings.master_addr is None:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    elif _generation == 0:
        dist.init_process_group(backend, rank=settings.rank, world_size=settings.world_size, timeout=timeout)
    else:
        # A group started again in this process (end_training(), then a new Accelerator): torch keys the default
        # group's rendezvous "default_pg/0/..." every time, and the store (kept alive on loopback by rank 0) still
        # holds the previous group's addresses, so a rank could dial a dead one ("connectFullMesh failed"). Every
        # rank starts its groups in the same order, so a per-process count gives each generation its own keys.
        store, _, _ = next(dist.rendezvous("env://", settings.rank, settings.world_size, timeout=timeout))
        store.set_timeout(timeout)
        dist.init_process_group(backend, store=dist.PrefixStore(f"convoy_group_{_generation}", store),
                                rank=settings.rank, world_size=settings.world_size, timeout=timeout)
    _generation += 1
    _owned_group = True
    # A group still alive at interpreter shutdown leaves gloo's worker threads holding tensors, and the
    # process aborts (SIGABRT, "terminate called without an active exception") after all its work is done
    # (pytorch/pytorch#179291). Destroying it while the interpreter is alive avoids that; a no-op after
    # end_training().
    atexit.register(stop_process_group)
    return True


def _default_backend(device_type: str) -> str:
    """gloo for CPU tensors, and the vendor's backend for the device's (``"cpu:gloo,cuda:nccl"``)."""
    cpu = process_group_backend("cpu")
    if device_type == "cpu":
        return cpu
    return f"cpu:{cpu},{device_type}:{process_group_backend(device_type)}"


def stop_process_group() -> None:
    """Destroy the default process group if ``start_process_group`` started it. Idempotent."""
    global _owned_group
    if _owned_group and dist.is_initialized():
        # gloo's worker threads may still be dropping the last collective's Python tensors; if the
        # interpreter is already shutting down they abort the process (pytorch/pytorch#179291). A short
        # pause took an unmodified Accelerate script from 5 crashes in 25 runs to none.
        time.sleep(0.05)
        dist.destroy_process_group()
    _owned_group = False
