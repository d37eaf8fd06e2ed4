"""``convoy.notebook_launcher``: Accelerate's name and signature for ``convoy.launch(fn)``.

    from convoy import notebook_launcher
    notebook_launcher(train, args=(1e-3,), num_processes=2)     # -> rank 0's return value

One machine only: ``num_processes`` processes (one per accelerator when there are accelerators, else CPU
processes); the rendezvous arguments of Accelerate's multi-node form are refused with what to use instead.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from convoy.errors import NotSupportedYetError

__all__ = ["notebook_launcher"]


def notebook_launcher(function: Callable[..., Any], args: Sequence[Any] = (), num_processes: int | None = None,
                      mixed_precision: str = "no", use_port: str = "29500", master_addr: str = "127.0.0.1",
                      node_rank: int = 0, num_nodes: int = 1, **multi_node: Any) -> Any:
    """Run ``function(*args)`` on ``num_processes`` processes of this machine; returns rank 0's value.
    ``use_port``/``master_addr`` are accepted and unused: convoy picks a free local port."""
    from convoy.launch.function import launch

    if num_nodes != 1 or node_rank != 0 or multi_node:
        raise NotSupportedYetError("notebook_launcher on several nodes is not supported; run the script with "
                                   "`convoy launch --nnodes N --rdzv-endpoint HOST:PORT` on each node")
    if num_processes is None:
        return launch(function, args=args, devices="auto", mixed_precision=mixed_precision)
    if _accelerator_count() > 0:
        return launch(function, args=args, devices=num_processes, mixed_precision=mixed_precision)
    return launch(function, args=args, nproc_per_node=num_processes, mixed_precision=mixed_precision)


def _accelerator_count() -> int:
    from convoy.devices.discovery import discover

    return len(discover().devices)
