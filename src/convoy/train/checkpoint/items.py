"""What a checkpoint saves and restores, as one record: the Accelerator gathers its prepared objects into a
``CheckpointItems`` (``Accelerator._checkpoint_items()``) and the checkpoint code reads nothing else of it.

    items = CheckpointItems(get_strategy=lambda: strategy, models=(model,), optimizers=((optimizer, model),),
                            trackers=hub, hooks=hooks, process_index=0, num_processes=1, barrier=lambda: None)
    result = save_state(items, "runs/a/checkpoint")      # a CheckpointResult: what the caller's loop takes back

The record holds the objects themselves (their ``state_dict``/``load_state_dict`` are called); what a save or
load changes in the caller's own counters comes back in the ``CheckpointResult``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from convoy.errors import CheckpointError, ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from convoy.train.checkpoint.hooks import StateHooks
    from convoy.train.strategies.base import Strategy
    from convoy.train.tracking import TrackerHub

__all__ = ["CheckpointItems", "CheckpointResult"]


@dataclass(frozen=True, kw_only=True)
class CheckpointItems:
    """Everything one process's ``save_state``/``load_state``/``save_model`` reads and restores."""

    get_strategy: Callable[[], Strategy]
    """Returns the strategy that states the models and optimizers (``checkpoint_state``,
    ``load_checkpoint_state``, ``after_build``). Called only once the directory is settled:
    ``strategy="auto"`` picks its strategy at the first ``prepare``, and a refused save or load must not
    pick it earlier."""
    models: tuple[Any, ...] = ()
    """The prepared models, in ``prepare`` order (``model_<i>`` in the checkpoint)."""
    optimizers: tuple[tuple[Any, Any], ...] = ()
    """``(optimizer, model)`` in ``prepare`` order (``optimizer_<j>``): the torch optimizer, and the prepared
    model that holds its parameters (None when none does; such an optimizer cannot be saved or loaded)."""
    schedulers: tuple[Any, ...] = ()
    """The prepared schedulers."""
    scaler: Any = None
    """The fp16 gradient scaler, or None."""
    dataloaders: tuple[Any, ...] = ()
    """The prepared data loaders (their position in the epoch)."""
    custom: tuple[Any, ...] = ()
    """The objects given to ``register_for_checkpointing``."""
    trackers: TrackerHub
    """The experiment trackers; their ``state_dict`` holds the next ``log()`` step."""
    hooks: StateHooks
    """The save and load pre-hooks (``register_save_state_pre_hook``)."""
    step: int = 0
    """The loop's micro-step count (``Accelerator.step``), stored in ``state.pt``."""
    process_index: int
    """This process's rank; ``random_states_<rank>.pkl`` is its file, rank 0 writes the shared ones."""
    num_processes: int
    """The world size, recorded in the marker file."""
    project_dir: str | None = None
    """The run's root: automatic checkpoints go to ``project_dir/checkpoints/checkpoint_<n>``."""
    automatic_naming: bool = False
    """``ProjectConfiguration.automatic_checkpoint_naming``: name every save ``checkpoint_<n>``."""
    total_limit: int | None = None
    """Keep only this many newest automatic checkpoints (None: all)."""
    save_iteration: int = 0
    """The number ``n`` of the next automatic checkpoint."""
    barrier: Callable[[], None]
    """Waits for every process (``Accelerator.wait_for_everyone``, a watched barrier)."""

    def __post_init__(self) -> None:
        if not 0 <= self.process_index < self.num_processes:
            raise ConfigError(f"process_index={self.process_index} is not a rank of num_processes="
                             f"{self.num_processes}; give 0 <= process_index < num_processes")

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    def require_owned_optimizers(self, action: str) -> None:
        """A ``CheckpointError`` for the first optimizer no prepared model holds: its state has no names."""
        for j, (_, model) in enumerate(self.optimizers):
            if model is None:
                raise CheckpointError(f"optimizer {j} holds no parameter of a prepared model; prepare its model "
                                      f"together with it so that {action} can name its state")


@dataclass(frozen=True, kw_only=True)
class CheckpointResult:
    """What ``save_state``/``load_state`` did, for the caller to take back into its own state."""

    path: Path
    """The checkpoint directory written or read."""
    save_iteration: int | None = None
    """The number of the next automatic checkpoint when this save or load set it; None leaves it as it is."""
    step: int | None = None
    """The loop's micro-step count read back (Accelerate's checkpoints hold it); None leaves it as it is."""
