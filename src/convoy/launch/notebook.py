"""``convoy.notebook_launcher``: Accelerate's name and signature for ``convoy.launch(fn)``.

    from convoy import notebook_launcher
    notebook_launcher(train, args=(1e-3,), num_processes=2)     # -> rank 0's return value

One machine only: ``num_processes`` processes, one per accelerator when this process sees accelerators (its
``CUDA_VISIBLE_DEVICES`` and the other vendors' masks apply), else CPU processes; restarted up to
``max_restarts`` times after a failure; the rendezvous arguments of Accelerate's multi-node form are refused
with what to use instead.

More processes than visible accelerators is one ``ConfigError`` before anything starts, naming what to do
(Accelerate starts them all, and every rank past the last GPU dies on a device that does not exist):

    notebook_launcher(train, num_processes=2)      # on a one-GPU machine: ConfigError
    convoy.launch(train, devices=0, nproc_per_node=2)   # 2 CPU processes there instead
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

from convoy.errors import ConfigError, NotSupportedYetError

__all__ = ["notebook_launcher"]


def notebook_launcher(function: Callable[..., Any], args: Sequence[Any] = (), num_processes: int | None = None,
                      mixed_precision: str = "no", use_port: str = "29500", master_addr: str = "127.0.0.1",
                      node_rank: int = 0, num_nodes: int = 1, rdzv_backend: str = "static", rdzv_endpoint: str = "",
                      rdzv_conf: dict | None = None, rdzv_id: str = "none", max_restarts: int = 0,
                      monitor_interval: float = 0.1, log_line_prefix_template: str | None = None,
                      **unknown: Any) -> Any:
    """Run ``function(*args)`` on ``num_processes`` processes of this machine; returns rank 0's value.

    ``max_restarts`` starts every process again after a failure, up to that many times. ``use_port``,
    ``master_addr``, the rendezvous arguments (one machine needs no rendezvous) and ``monitor_interval`` (convoy
    learns of a failed process when it happens) are accepted and unused: convoy picks a free local port."""
    from convoy.launch.function import launch

    if num_nodes != 1 or node_rank != 0:
        raise NotSupportedYetError("notebook_launcher on several nodes is not supported; run the script with "
                                   "`convoy launch --nnodes N --rdzv-endpoint HOST:PORT` on each node")
    if unknown:
        raise TypeError(f"notebook_launcher() got an unexpected keyword argument {sorted(unknown)[0]!r}")
    if log_line_prefix_template is not None:
        raise NotSupportedYetError("notebook_launcher(log_line_prefix_template=...) is not supported; convoy prefixes "
                                   "each rank's lines with [rankN]")
    if isinstance(monitor_interval, bool) or not isinstance(monitor_interval, (int, float)) or not monitor_interval > 0:
        raise ConfigError(f"notebook_launcher(monitor_interval={monitor_interval!r}): give a number of seconds > 0")
    if rdzv_backend not in ("static", "c10d", "etcd", "etcd-v2"):
        raise ConfigError(f"notebook_launcher(rdzv_backend={rdzv_backend!r}): give static, c10d, etcd or etcd-v2")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ConfigError(f"notebook_launcher(max_restarts={max_restarts!r}): give a whole number >= 0")
    return launch(function, args=args, mixed_precision=mixed_precision, max_restarts=max_restarts,
                  **_where(num_processes))


def _where(num_processes: Any) -> dict[str, Any]:
    """``convoy.launch``'s devices for ``num_processes``: that many of the visible accelerators, or CPU processes
    where none is visible."""
    if num_processes is None:
        return {"devices": "auto"}
    try:
        count = None if isinstance(num_processes, bool) else operator.index(num_processes)  # int, numpy's ints
    except TypeError:
        count = None
    if count is None or count < 1:
        raise ConfigError(f"notebook_launcher(num_processes={num_processes!r:.40}): give a whole number >= 1, "
                          f"or leave it out for one process per accelerator")
    num_processes = count
    visible = _visible_accelerators()
    if not visible:
        return {"nproc_per_node": num_processes}
    if num_processes > len(visible):
        named = ", ".join(d.label for d in visible[:4]) + (", ..." if len(visible) > 4 else "")
        raise ConfigError(f"notebook_launcher(num_processes={num_processes}) starts one process per accelerator, "
                          f"but {len(visible)} {'is' if len(visible) == 1 else 'are'} visible ({named}); give "
                          f"num_processes={len(visible)}, or for {num_processes} CPU processes call "
                          f"convoy.launch(function, args, devices=0, nproc_per_node={num_processes})")
    return {"devices": num_processes}


def _visible_accelerators() -> tuple:
    """The accelerators this process sees: the machine's, less what its visibility variables hide."""
    import os

    from convoy.devices.discovery import discover
    from convoy.devices.visibility import visible_devices

    return visible_devices(discover(os.environ), os.environ).devices
