"""Hooks that run before ``save_state``/``load_state`` (Accelerate's ``register_save_state_pre_hook``).

    def save_hook(models, weights, output_dir): ...      # e.g. write a config next to the checkpoint
                                                          # (output_dir: the checkpoint's staging directory,
                                                          # renamed into place with everything else)
    handle = accelerator.register_save_state_pre_hook(save_hook)
    handle.remove()

convoy saves every prepared model itself (one distributed checkpoint): removing items from ``models`` or
``weights`` in a hook does not keep them out of the checkpoint, unlike Accelerate.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from torch.utils.hooks import RemovableHandle

__all__ = ["StateHooks"]


class StateHooks:
    """The save and load pre-hooks of one Accelerator, in registration order."""

    def __init__(self) -> None:
        self.save: OrderedDict[int, Callable[..., Any]] = OrderedDict()
        self.load: OrderedDict[int, Callable[..., Any]] = OrderedDict()

    def register(self, table: OrderedDict[int, Callable[..., Any]], hook: Callable[..., Any]) -> Any:
        handle = RemovableHandle(table)
        table[handle.id] = hook
        return handle

    def run_save(self, models: list[Any], output_dir: str) -> None:
        """``hook(models, weights, output_dir)`` for each save hook; ``weights`` are the models' state dicts."""
        if not self.save:
            return
        weights = [m.state_dict() for m in models]
        for hook in self.save.values():
            hook(models, weights, output_dir)

    def run_load(self, models: list[Any], input_dir: str) -> None:
        """``hook(models, input_dir)`` for each load hook."""
        for hook in self.load.values():
            hook(models, input_dir)
