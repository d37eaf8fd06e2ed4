"""``strategy="single"``: one process, one device (or the CPU); no wrapping, no communication.

    accelerator = Accelerator(strategy="single")
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from convoy.train.parallel.compile import apply_compile, compile_config
from convoy.train.parallel.recompute import apply_recompute
from convoy.train.strategies.base import Strategy
from convoy.train.strategies.options import StrategyOptions

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["SingleStrategy"]


class SingleStrategy(Strategy):
    """The model on ``root_device``; every method is the plain PyTorch one."""

    distributed_type = "NO"
    options = StrategyOptions.keys()

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        # Module.to moves parameters in place (same Parameter objects), so an optimizer built earlier
        # still points at them; recomputation hooks the blocks in place too
        module = module.to(self.root_device)
        self.precision.convert_layers(module)  # fp8's Float8Linear swap first (torchtitan's order)
        apply_recompute(module, self.context.recompute)
        apply_compile(module, compile_config(self.context))
        return module
