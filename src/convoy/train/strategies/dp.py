"""``strategy="dp"``: ``torch.nn.DataParallel``, one process driving every visible GPU.

    accelerator = Accelerator(strategy="dp")    # python train.py, no launcher

Known costs (as PyTorch's own guide says, prefer ``ddp``): the model is replicated to every GPU on every
forward, outputs are gathered on GPU 0 and one Python thread per GPU contends for the GIL, so it is usually
slower than DDP even on one machine. It exists for scripts that cannot be launched as several processes.
"""

from __future__ import annotations

import torch

from convoy.errors import NotSupportedYetError, StrategyError
from convoy.train.parallel.recompute import refuse_recompute
from convoy.train.strategies.base import Strategy
from convoy.train.strategies.options import StrategyOptions

__all__ = ["DataParallelStrategy"]


class DataParallelStrategy(Strategy):
    """``torch.nn.DataParallel`` over every visible GPU of this one process."""

    distributed_type = "MULTI_GPU"
    options = StrategyOptions.keys()

    def setup_environment(self) -> None:
        if self.context.world_size > 1:
            raise StrategyError(f"strategy='dp' runs in one process, but this job has {self.context.world_size}; "
                                "use strategy='ddp' with several processes")
        # DataParallel copies the module into one thread per GPU every step, and the checkpoint hooks keep one state
        # per block, which the threads would share
        refuse_recompute(self.context.recompute, "dp", "torch.nn.DataParallel's replicas would share each block's "
                                                       "checkpoint state; use strategy='ddp'")
        if self.precision.float8 is not None:
            # parallel_apply re-enters autocast in each replica's thread with ``enabled`` alone, and the autocast
            # dtype is per thread: the replicas would compute fp16, which float8 training has no loss scaling for
            raise NotSupportedYetError("strategy='dp' with mixed_precision='fp8' is not supported yet: "
                                       "torch.nn.DataParallel runs each GPU's replica in a thread where autocast "
                                       "computes in fp16, not bf16, and fp8 has no loss scaling; use strategy='ddp' "
                                       "(one process per GPU)")
        if self.context.compile != "none":
            raise NotSupportedYetError(f"compile={self.context.compile!r} with strategy='dp' is not supported yet "
                                       "(torch.nn.DataParallel copies the module into its threads every step); use "
                                       "strategy='ddp'")
        if self.context.device_type != "cuda":
            raise StrategyError("strategy='dp' (torch.nn.DataParallel) needs CUDA GPUs; on the CPU use "
                                "strategy='single', or several processes with strategy='ddp'")

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return torch.nn.DataParallel(module.to(self.root_device))

    def unwrap(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.module if isinstance(module, torch.nn.DataParallel) else module
