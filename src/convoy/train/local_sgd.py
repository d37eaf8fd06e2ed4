"""Local SGD (Accelerate's ``LocalSGD``): each process takes ``local_sgd_steps`` optimizer steps on its own,
without synchronising gradients, then the processes average their parameters (one all-reduce per parameter).

    from convoy.local_sgd import LocalSGD               # was: from accelerate.local_sgd import LocalSGD
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=8) as local_sgd:
        for batch in loader:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                optimizer.step(); optimizer.zero_grad()
                local_sgd.step()                        # every 8th call: average the parameters

It means something where every process holds the whole model (DDP, ZeRO-1, which report ``MULTI_CPU``/``MULTI_GPU``)
and is a no-op on one process, as in Accelerate; a sharded or split model (FSDP, tensor or pipeline parallel) is
refused with one line. Leaving the block averages once more. Lin et al., "Don't Use Large Mini-Batches, Use Local
SGD", ICLR 2020.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

from convoy.errors import ConfigError, NotSupportedYetError, shown
from convoy.train.process_view import DistributedType

__all__ = ["LocalSGD"]

_REPLICATED = {DistributedType.NO, *(t for t in DistributedType if t.name.startswith("MULTI_"))}


class LocalSGD:
    """See the module docstring. ``enabled=False`` (or one process) makes every call a no-op."""

    def __init__(self, accelerator: Any, model: Any, local_sgd_steps: int, enabled: bool = True) -> None:
        kind = accelerator.distributed_type
        layout = accelerator.strategy.distributed_type
        if kind not in _REPLICATED or layout.split("+")[0] != layout:  # e.g. "DDP+TP": parameters are split
            raise NotSupportedYetError(
                f"LocalSGD averages whole replicas of the model; this job runs {layout} ({kind.value}), where "
                "processes hold different parts of it: use strategy='ddp' (or 'zero1'), or drop LocalSGD")
        if isinstance(local_sgd_steps, bool) or not isinstance(local_sgd_steps, int) or local_sgd_steps < 1:
            raise ConfigError(f"LocalSGD(local_sgd_steps={shown(local_sgd_steps)}): give the optimizer steps "
                              "between two averagings, a whole number >= 1")
        self.enabled = bool(enabled) and kind != DistributedType.NO
        self.num_steps = 0
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self._no_sync: Any = None

    def __enter__(self) -> LocalSGD:
        if self.enabled:
            self._no_sync = self.accelerator.no_sync(self.model)
            self._no_sync.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self.enabled:
            if kind is None:  # an exception on one process: the others would wait in the all-reduce
                self._sync_and_avg_model_params()
            self._no_sync.__exit__(kind, value, traceback)

    def step(self) -> None:
        """Count an optimizer step; every ``local_sgd_steps``-th one averages the parameters."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._sync_and_avg_model_params()

    def _sync_and_avg_model_params(self) -> None:
        import torch

        from convoy.train.operations import reduce

        self.accelerator.wait_for_everyone()  # watched: a missing process is named, not waited for
        with torch.no_grad():  # the free reduce: one all-reduce per parameter, no watch each
            for param in self.model.parameters():
                param.copy_(reduce(param.detach(), reduction="mean"))
