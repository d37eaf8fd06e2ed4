"""Where the training loop is: the loaders being iterated, whether this batch is their last, whether this step
synchronises gradients. One per Accelerator; its loaders, optimizer wrappers and ``GradientState`` read it.

    loop = LoopPosition()
    loop.enter(loader)                                              # a prepared loader reports its batches
    loop.at(loader, last=True, remainder=3)
    loop.end_of_dataloader, loop.remainder, loop.active_dataloader  # True, 3, loader
    loop.leave(loader)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["LoopPosition"]


@dataclass
class LoopPosition:
    """Where the training loop is, shared by the Accelerator, its optimizers and its dataloaders (one per
    Accelerator, never global)."""

    sync_gradients: bool = True
    """False on the micro-steps of ``accumulate`` that do not synchronise or step."""
    end_of_dataloader: bool = False
    """True while the last batch of the active dataloader is being processed."""
    remainder: int | None = None
    """Real (not padding) samples in the current step's global batch when it is the last, padded one."""
    dataloaders: list[Any] = field(default_factory=list)
    """The prepared loaders being iterated, innermost last (a loop inside a loop nests them)."""

    @property
    def active_dataloader(self) -> Any:
        return self.dataloaders[-1] if self.dataloaders else None

    @property
    def in_dataloader(self) -> bool:
        return bool(self.dataloaders)

    def enter(self, loader: Any) -> None:
        loader.end_of_dataloader, loader.remainder = False, None
        self.dataloaders.append(loader)
        self.end_of_dataloader, self.remainder = False, None

    def at(self, loader: Any, *, last: bool, remainder: int | None) -> None:
        loader.end_of_dataloader, loader.remainder = last, remainder
        self.end_of_dataloader, self.remainder = last, remainder

    def leave(self, loader: Any) -> None:
        """``loader`` stopped (ran out, or the loop broke out): the loader around it is active again."""
        loader.end_of_dataloader, loader.remainder = False, None
        self.dataloaders = [d for d in self.dataloaders if d is not loader]
        outer = self.active_dataloader
        self.end_of_dataloader = bool(outer.end_of_dataloader) if outer is not None else False
        self.remainder = outer.remainder if outer is not None else None
