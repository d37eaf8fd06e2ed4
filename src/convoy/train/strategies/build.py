"""From the settings to a running strategy, in one place: the process's device and process group, the name
(``"auto"`` chosen here, from the model's size and the planner), and the strategy object set up.

    start_job(settings)                                        # Accelerator() / PartialState(): device, group
    named_layout(settings)                                     # Accelerator(): "zero3" + tp=2 -> ("parallel", ...)
    strategy = build_strategy(settings, model=model, planner=None)   # at the first prepare()

``convoy.Accelerator`` calls ``start_job`` at construction and ``build_strategy`` once, at the first ``prepare``
(or ``accelerator.strategy``). The strategy reads the same ``TrainSettings``, with what ``"auto"`` chose
(the name, the degrees, ``dp_engine``) put in. A data-parallel strategy named beside tp/pp degrees
(``strategy="zero3"`` with ``parallelism={"tp": 2}``, or ``convoy launch --strategy zero3 --tp 2``) is built as
strategy ``"parallel"`` with that ``dp_engine`` (``named_layout``), never as a plain one that drops the degrees.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from convoy.config.schema import dp_engine_beside
from convoy.errors import StrategyError, shown
from convoy.train import collectives
from convoy.train.precision import Precision
from convoy.train.process_group import start_process_group
from convoy.train.settings import TrainSettings
from convoy.train.strategies.auto import choose_strategy, device_memory_bytes, planner_hook
from convoy.train.strategies.base import Strategy, create_strategy, strategy_class
from convoy.train.strategies.options import ParallelOptions

__all__ = ["start_job", "build_strategy", "declared_distributed_type", "named_layout"]


def start_job(settings: TrainSettings, *, one_process_group: bool = False) -> None:
    """This process's device, and the job's process group when the job has several processes (or, with
    ``one_process_group``, a one-rank group for an engine that needs one). Idempotent."""
    if settings.device_type == "cuda":
        torch.cuda.set_device(settings.local_rank)
    start_process_group(settings, always=one_process_group)


def declared_distributed_type(settings: TrainSettings) -> str:
    """The ``distributed_type`` of the strategy the settings name (``""`` for ``"auto"``, known once built)."""
    if settings.strategy == "auto":
        return ""
    kind = strategy_class(settings.strategy).distributed_type
    return kind if isinstance(kind, str) else ""


def _nodes(settings: TrainSettings) -> int:
    """The machines the job runs on, as ``"auto"`` plans them: ``WORLD_SIZE / LOCAL_WORLD_SIZE`` when the
    processes are spread evenly (torchrun's launch), else one (the planner then treats the job as one machine)."""
    per_node = settings.local_world_size
    return settings.world_size // per_node if 0 < per_node and settings.world_size % per_node == 0 else 1


def _measured_here(settings: TrainSettings) -> str | None:
    """The device whose rates ``"auto"`` measures (``planner_hook``): rank 0's GPU, as rank 0's answer is the one
    every rank builds; None on the CPU (its plan needs no rates) and on the other ranks."""
    return f"cuda:{settings.local_rank}" if settings.device_type == "cuda" and settings.rank == 0 else None


def named_layout(settings: TrainSettings) -> tuple[str, dict[str, Any]]:
    """The strategy name and options to build for the name and degrees ``settings`` ask for: a data-parallel
    strategy beside tp/pp (or HSDP) degrees is strategy ``"parallel"`` with its ``dp_engine``
    (``convoy.config.schema.dp_engine_beside``, which refuses the pairs the trainer cannot run); with tp/pp degrees,
    ``"auto"`` builds them too. ``StrategyError`` for an option of the named strategy that layout does not read
    (DDP's ``bucket_cap_mb`` beside pp), at construction rather than at ``prepare``."""
    name, dims, options = settings.strategy, settings.parallel_dims, dict(settings.options)
    hsdp = dims is not None and dims.hsdp_enabled
    if name == "auto" and dims is not None and (not dims.is_trivial or hsdp):
        return "parallel", options  # tp/pp (or HSDP) requested: strategy "parallel" builds that layout
    engine = dp_engine_beside(name, dims)
    if engine is None:
        return name, options
    reads = strategy_class("parallel").options or ()
    unread = sorted(str(key) for key in options if key not in reads)
    split = ", ".join(f"{a}={getattr(dims, a)}" for a in ("cp", "tp", "pp") if getattr(dims, a) > 1) or "HSDP"
    given = ParallelOptions.parse(options).dp_engine
    if given is not None and given != engine:
        raise StrategyError(f"strategy={name!r} beside {split} runs with dp_engine={engine!r}, not "
                            f"{shown(given)}; drop dp_engine, or give strategy 'parallel' with it")
    if unread:
        raise StrategyError(f"strategy_options: {shown(unread[0])} is not read when strategy={name!r} runs beside "
                            f"{split} (strategy 'parallel' with dp_engine={engine!r}); its options are "
                            f"{', '.join(sorted(reads))}")
    return "parallel", {**options, "dp_engine": engine}


def build_strategy(settings: TrainSettings, *, model: Any, planner: Callable[..., Any] | None,
                   precision: Precision | None = None) -> Strategy:
    """The strategy ``settings`` ask for, set up, holding ``precision`` (the Accelerator's; None: one for the
    settings' mode); ``"auto"`` picks one for ``model`` (None: by world size)."""
    name, options = named_layout(settings)
    dims = settings.parallel_dims
    if name == "auto":
        count = sum(p.numel() for p in model.parameters()) if model is not None else 0
        # every rank plans for the smallest device of the job, and builds rank 0's answer: ranks that built
        # different strategies would wait on each other's collectives for ever (free memory, a planner= of the
        # user's, or a measurement may differ per rank)
        layout = collectives.broadcast_object(choose_strategy(
            world_size=settings.world_size, num_parameters=count,
            planner=planner or planner_hook(settings.mixed_precision, device=_measured_here(settings),
                                            device_type=settings.device_type, recompute=settings.recompute,
                                            compile=settings.compile, fp8=settings.planned_fp8),
            device_bytes=min(collectives.gather_object(
                device_memory_bytes(settings.device_type, settings.local_world_size))),
            model=model, split=dims is None, options=options,  # degrees given: data parallel only
            nodes=_nodes(settings)))
        name = layout.name
        if layout.dims is not None:  # tp/pp chosen: strategy "parallel" builds these degrees
            dims = layout.dims
            options = {**({"dp_engine": layout.dp_engine} if layout.dp_engine else {}), **options}
        if layout.cpu_offload:  # the knob the planner turned: nothing fit without it
            options = {**options, "cpu_offload": True}
        if layout.recompute:  # the other knob: activation recomputation, applied as the planner costed it
            settings = replace(settings, recompute=layout.recompute)
        if settings.world_size > 1 and settings.rank == 0:
            print(f"convoy: strategy=auto chose {layout.describe()}: {layout.reason}", flush=True)
    strategy = create_strategy(name, replace(settings, strategy=name, parallel_dims=dims, options=options), precision)
    start_job(settings, one_process_group=strategy.needs_process_group)
    strategy.setup_environment()
    return strategy
