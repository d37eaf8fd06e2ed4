"""From the Accelerator's settings to a running strategy object: the name (``"auto"`` chosen here, from the
model's size and the planner), its context, its process group and environment.

    strategy = build_strategy(settings, model=model, options={}, planner=None)

``convoy.Accelerator`` calls this once, at the first ``prepare`` (or ``accelerator.strategy``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from convoy.train.auto import choose_strategy, device_memory_bytes, planner_hook
from convoy.train.process_group import start_process_group
from convoy.train.settings import TrainSettings
from convoy.train.strategies.base import Strategy, create_strategy

__all__ = ["build_strategy"]


def build_strategy(settings: TrainSettings, *, model: Any, planner: Callable[..., Any] | None) -> Strategy:
    """The strategy ``settings`` ask for, set up; ``"auto"`` picks one for ``model`` (None: by world size)."""
    name = settings.strategy
    dims = settings.parallel_dims
    options = dict(settings.options)
    if name == "auto" and dims is not None and not dims.is_trivial:
        name = "parallel"  # tp/pp requested: convoy.train.parallel's strategy builds that layout
    if name == "auto":
        count = sum(p.numel() for p in model.parameters()) if model is not None else 0
        layout = choose_strategy(
            world_size=settings.world_size, num_parameters=count,
            planner=planner or planner_hook(settings.mixed_precision),
            device_bytes=device_memory_bytes(settings.device_type, settings.local_world_size),
            model=model if dims is None else None, options=options)  # degrees given: data parallel only
        name = layout.name
        if layout.dims is not None:  # tp/pp chosen: strategy "parallel" builds these degrees
            dims = layout.dims
            options = {**({"dp_engine": layout.dp_engine} if layout.dp_engine else {}), **options}
        if settings.world_size > 1 and settings.rank == 0:
            print(f"convoy: strategy=auto chose {layout.describe()}: {layout.reason}", flush=True)
    strategy = create_strategy(name, replace(settings, strategy=name, parallel_dims=dims, options=options))
    if strategy.needs_process_group:
        start_process_group(settings, always=True)
    strategy.setup_environment()
    return strategy
