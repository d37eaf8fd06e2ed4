"""``strategy="auto"``: DDP when the model's training state fits one device, else sharding.

    name, reason = choose_strategy(world_size=4, num_parameters=7e9, device_bytes=80 * 2**30)
    # -> ("zero3", "the model needs ~104.3 GiB for fp32 weights, gradients and Adam state; ...")

``planner`` is the hook for ``convoy.plan``: a callable ``planner(num_parameters=, world_size=,
device_bytes=) -> (name, reason) | None``; when it answers, its answer wins, and the rule below is the
fallback.
"""

from __future__ import annotations

import os
from typing import Callable

__all__ = ["choose_strategy", "planner_hook", "training_bytes", "device_memory_bytes"]

# fp32 weights (4) + gradients (4) + Adam's two moments (8); activations come on top, hence the headroom.
BYTES_PER_PARAMETER = 16
HEADROOM = 0.8

Planner = Callable[..., "tuple[str, str] | None"]


def training_bytes(num_parameters: int) -> int:
    return int(num_parameters) * BYTES_PER_PARAMETER


def device_memory_bytes(device_type: str, local_world_size: int = 1) -> int:
    """Memory one process can use: the GPU's free memory, or this machine's RAM shared by its processes."""
    if device_type == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info()
        return int(free)
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        total = 16 * 2**30
    return int(total // max(1, local_world_size))


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def planner_hook(mixed_precision: str | None) -> Planner:
    """convoy's planner as the ``planner`` of ``choose_strategy``, for this run's precision recipe."""
    from functools import partial

    from convoy.plan.api import auto_strategy

    precision = mixed_precision if mixed_precision in ("bf16", "fp16") else "fp32"
    return partial(auto_strategy, precision=precision)


def choose_strategy(*, world_size: int, num_parameters: int, device_bytes: int,
                    planner: Planner | None = None) -> tuple[str, str]:
    """The strategy ``"auto"`` stands for, and one line saying why. Pure (given ``planner``)."""
    if planner is not None:
        answer = planner(num_parameters=num_parameters, world_size=world_size, device_bytes=device_bytes)
        if answer is not None:
            return answer
    need = training_bytes(num_parameters)
    if world_size == 1:
        return "single", f"one process; the model needs ~{_gib(need)} for weights, gradients and Adam state"
    if need <= HEADROOM * device_bytes:
        return "ddp", (f"the model needs ~{_gib(need)} for fp32 weights, gradients and Adam state, which fits "
                       f"one device ({_gib(device_bytes)} available), so each of the {world_size} processes "
                       "keeps a full replica (DDP)")
    return "zero3", (f"the model needs ~{_gib(need)} for fp32 weights, gradients and Adam state, more than "
                     f"{HEADROOM:.0%} of one device ({_gib(device_bytes)}), so it is sharded over "
                     f"{world_size} processes (FSDP2, zero3)")
