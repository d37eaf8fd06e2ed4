"""The elastic engine: PyTorch's own agent (``torch.distributed.launcher.api``) for multi-node jobs and restarts.

    from convoy.launch.elastic import run_elastic
    run_elastic(plan, base_env=os.environ)     # 0, or raises RankFailedError for the root-cause rank

convoy writes no agent and no rendezvous: this module turns a ``LaunchPlan`` into a ``LaunchConfig``, runs
``elastic_launch`` with the worker command, and turns ``ChildFailedError`` into one ``RankFailedError`` for
the root-cause rank. Two fixes over plain torchrun: ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` whenever
``max_restarts > 0`` (restarted groups otherwise hang on stale peer addresses in the shared store, see
notes item 9), and Python workers start through ``convoy.launch.record`` so unmodified scripts leave their
traceback in the error file. Imports torch (the agent needs it); the direct engine does not.
"""

from __future__ import annotations

import gc
import os
import socket
import sys
import time
from contextlib import contextmanager
from typing import Iterator, Mapping

from convoy.errors import LaunchError
from convoy.launch.failures import RankFailure, failure_error
from convoy.launch.plan import LaunchPlan

__all__ = ["run_elastic", "launch_config"]


def launch_config(plan: LaunchPlan):
    """The ``LaunchConfig`` torchrun would build for the same flags."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig

    from convoy.launch.workers import parse_stream_map

    from torch.distributed.elastic.multiprocessing import Std

    redirects = parse_stream_map(plan.redirects, plan.nproc_per_node)
    # Output reaches the console through torch's tee (log file, then tailed with the "[rankN]: " prefix);
    # streams the user redirected stay in the files only.
    tee = {rank: Std(3 & ~redirects.get(rank, 0)) for rank in range(plan.nproc_per_node)}
    logs = DefaultLogsSpecs(log_dir=plan.log_dir, redirects={r: Std(v) for r, v in redirects.items()}, tee=tee,
                            local_ranks_filter=_filter(plan.local_ranks_filter))
    configs: dict[str, object] = dict(plan.rdzv_configs)
    if "rank" in configs:
        configs["rank"] = int(configs["rank"])  # static rendezvous: this node's rank
    endpoint = plan.rdzv_endpoint
    if plan.rdzv_backend == "c10d" and endpoint == "127.0.0.1:0":
        configs.setdefault("is_host", True)
    return LaunchConfig(
        min_nodes=plan.min_nodes, max_nodes=plan.max_nodes, nproc_per_node=plan.nproc_per_node,
        logs_specs=logs, run_id=plan.run_id, role=plan.role, rdzv_endpoint=endpoint,
        rdzv_backend=plan.rdzv_backend, rdzv_configs=configs, max_restarts=plan.max_restarts,
        monitor_interval=plan.monitor_interval, start_method=plan.start_method,
        log_line_prefix_template="[rank${rank}]: ", local_addr=_local_addr(plan),
    )


def _local_addr(plan: LaunchPlan) -> str | None:
    """The address this node's workers reach rank 0's store on. One node: loopback. Without it torch's agent
    publishes ``socket.getfqdn()``, and with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (restarts) every restarted
    group's ``MASTER_ADDR`` is that name, which on a container or cloud host often does not resolve to this
    machine, so the restarted ranks never meet. Several nodes: torch's default (the host name)."""
    return "127.0.0.1" if plan.max_nodes == 1 else None


def _filter(text: str) -> set[int] | None:
    return {int(item) for item in text.split(",") if item.strip()} if text else None


def _worker_command(plan: LaunchPlan) -> tuple[str, list[str]]:
    command = list(plan.command)
    if command[:2] == [sys.executable, "-u"]:
        return sys.executable, ["-u", "-m", "convoy.launch.record", *command[2:]]
    return command[0], command[1:]


@contextmanager
def _environment(extra: Mapping[str, str]) -> Iterator[None]:
    """The agent copies ``os.environ`` into each worker; set ``extra`` for the job only, then restore."""
    saved = {key: os.environ.get(key) for key in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while torch's agent is imported.

    ``import torch`` allocates hundreds of thousands of objects, which triggers full collections that find
    next to nothing: on a 2-core box the import took ~0.1 s less CPU with the collector paused (median of 5,
    1.22 -> 1.09 s; docs/launching.md). The collector's previous state is restored afterwards.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def run_elastic(plan: LaunchPlan, *, base_env: Mapping[str, str]) -> int:
    """Run ``plan`` under torch's elastic agent; 0 on success, else raise ``RankFailedError``."""
    with _gc_paused():
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.launcher.api import elastic_launch

    extra = {key: value for key, value in {**base_env, **plan.env}.items() if os.environ.get(key) != value}
    if plan.max_restarts > 0:
        extra["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # restarts hang otherwise (notes item 9)
    if plan.rdzv_backend == "static":
        extra.setdefault("MASTER_ADDR", plan.master_addr)
        extra.setdefault("MASTER_PORT", str(plan.master_port))
    entrypoint, args = _worker_command(plan)
    start = time.monotonic()
    try:
        with _environment(extra):
            elastic_launch(launch_config(plan), entrypoint)(*args)
    except ChildFailedError as err:
        raise _root_cause(err, plan, elapsed=time.monotonic() - start) from None
    except (RuntimeError, ValueError) as err:  # rendezvous errors, closed stores, ...
        raise LaunchError(f"the elastic agent failed before the workers ran: {err}") from None
    return 0


def _root_cause(err, plan: LaunchPlan, *, elapsed: float) -> Exception:
    failures = err.failures  # {global rank: ProcessFailure}
    # The agent SIGTERMs the rest after the first failure; those (-15) are consequences, not causes.
    rank, pf = min(failures.items(), key=lambda kv: (kv[1].exitcode == -15, kv[1].timestamp, kv[0]))
    message = pf.message
    text = None
    if isinstance(message, dict):
        text = (message.get("extraInfo") or {}).get("py_callstack") or message.get("message")
    elif isinstance(message, str) and "To enable traceback" not in message and message:
        text = message
    failure = RankFailure(rank=rank, local_rank=pf.local_rank, host=socket.gethostname(), returncode=pf.exitcode,
                          traceback=text, traceback_shown=text is not None, elapsed=elapsed)
    return failure_error(failure, stopped=len(failures) - 1 if len(failures) > 1 else plan.nproc_per_node - 1)
