"""What ``prepare()`` returns for optimizers and schedulers: thin wrappers with Accelerate's meanings.

    optimizer = accelerator.prepare(optimizer)   # PreparedOptimizer: step/zero_grad skip non-sync micro-steps
    scheduler = accelerator.prepare(scheduler)   # PreparedScheduler: steps only when the optimizer stepped

- ``PreparedOptimizer.step()`` does nothing on the micro-steps of ``accumulate`` that do not synchronise;
  it steps through the run's precision (``convoy.train.precision``: with fp16, the gradient scaler) and records
  ``step_was_skipped`` (inf/nan gradients).
- ``PreparedScheduler.step()`` does nothing when the optimizer did not step; with
  ``step_scheduler_with_optimizer=True`` and ``split_batches=False`` it advances ``num_processes`` times
  per step, so that a schedule written in single-process steps ends at the same sample count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from convoy.train.data.loop import LoopPosition
from convoy.train.precision import Precision

__all__ = ["PreparedOptimizer", "PreparedScheduler"]


class PreparedOptimizer(torch.optim.Optimizer):
    """Wraps the (strategy's) optimizer; an ``isinstance(x, torch.optim.Optimizer)`` for schedulers."""

    def __init__(self, optimizer: torch.optim.Optimizer, *, state: LoopPosition, precision: Precision) -> None:
        # torch.optim.Optimizer.__init__ is deliberately not called: everything delegates to ``optimizer``.
        self.optimizer = optimizer
        self.loop_state = state
        self.precision = precision
        self.step_was_skipped = False
        self.unscaled = False
        self.before_step: Callable[[], Any] | None = None
        """Called before each real step (the Accelerator's gradient clipping from a DeepSpeed config)."""

    @property
    def scaler(self) -> Any:
        """The fp16 gradient scaler steps go through (Accelerate's ``AcceleratedOptimizer.scaler``), or None."""
        return self.precision.scaler

    # attributes schedulers and users read
    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property
    def defaults(self) -> dict[str, Any]:
        return self.optimizer.defaults

    @defaults.setter
    def defaults(self, value: dict[str, Any]) -> None:
        self.optimizer.defaults = value

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.loop_state.sync_gradients:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def unscale_gradients(self) -> None:
        """Divide the gradients by the fp16 loss scale (once per step)."""
        if not self.unscaled:
            self.precision.unscale_gradients(self.optimizer)
            self.unscaled = True

    def step(self, closure: Any = None) -> Any:
        if not self.loop_state.sync_gradients:
            return None
        if self.before_step is not None:  # e.g. the DeepSpeed config's gradient_clipping
            self.before_step()
        self.unscaled = False
        result, self.step_was_skipped = self.precision.optimizer_step(self.optimizer, closure)
        return result

    def train(self) -> None:  # schedule-free optimizers
        if hasattr(self.optimizer, "train"):
            self.optimizer.train()

    def eval(self) -> None:
        if hasattr(self.optimizer, "eval"):
            self.optimizer.eval()

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__.copy()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"PreparedOptimizer({self.optimizer!r})"


class PreparedScheduler:
    """Wraps an LR scheduler so that it follows the optimizer steps that really happened."""

    def __init__(self, scheduler: Any, optimizers: list[PreparedOptimizer], *, state: LoopPosition,
                 step_with_optimizer: bool, split_batches: bool, num_processes: int) -> None:
        self.scheduler = scheduler
        self.optimizers = optimizers
        self.loop_state = state
        self.step_with_optimizer = step_with_optimizer
        self.split_batches = split_batches
        self.num_processes = num_processes

    def step(self, *args: Any, **kwargs: Any) -> None:
        if not self.step_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not self.loop_state.sync_gradients:
            return
        if any(o.step_was_skipped for o in self.optimizers):
            return
        times = 1 if self.split_batches else self.num_processes
        for _ in range(times):
            total = getattr(self.scheduler, "total_steps", None)  # OneCycleLR refuses to pass its end
            if total is not None and self.scheduler.last_epoch >= total:
                break
            self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        return self.scheduler.get_last_lr()

    def state_dict(self) -> dict[str, Any]:
        return self.scheduler.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        if name == "scheduler":
            raise AttributeError(name)
        return getattr(self.scheduler, name)

