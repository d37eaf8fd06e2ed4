"""``strategy="ddp"`` and ``strategy="zero1"``: replicas kept in step by all-reducing gradients.

    accelerator = Accelerator(strategy="ddp")      # DistributedDataParallel
    accelerator = Accelerator(strategy="zero1")    # DDP + ZeroRedundancyOptimizer (optimizer state sharded)

Options (``Accelerator(strategy_options={...})``, or Accelerate's ``DistributedDataParallelKwargs``):
``find_unused_parameters`` (bool), ``broadcast_buffers`` (bool), ``bucket_cap_mb`` (int), ``static_graph``
(bool), ``gradient_as_bucket_view`` (bool), and a gradient communication hook of PyTorch's:
``comm_hook`` ("fp16", "bf16", "power_sgd", "batched_power_sgd"), ``comm_wrapper`` ("fp16", "bf16": what the
hook sends, compressed), ``comm_state_option`` (``PowerSGDState``'s arguments). PyTorch runs the bf16 ones on
NCCL or XCCL only; elsewhere they are one ``ConfigError``.

The first ``DistributedDataParallel(...)`` of a process imports ``torch._dynamo`` (2-5 s, measured on
torch 2.13 CPU); convoy builds each DDP wrapper once per model, never twice.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import TYPE_CHECKING, Any, cast

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from convoy.errors import ConfigError, shown
from convoy.train.optimizer_names import named_optimizer_state, numbered_optimizer_state, param_names
from convoy.train.parallel.compile import apply_compile, compile_config
from convoy.train.parallel.recompute import apply_recompute
from convoy.train.strategies.base import Strategy, SupportsNoSync
from convoy.train.strategies.options import DDPOptions

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["DDPStrategy", "Zero1Strategy"]

_HOOKS = {"fp16": ("default_hooks", "fp16_compress_hook"), "bf16": ("default_hooks", "bf16_compress_hook"),
          "power_sgd": ("powerSGD_hook", "powerSGD_hook"),
          "batched_power_sgd": ("powerSGD_hook", "batched_powerSGD_hook")}
_WRAPPERS = {"fp16": "fp16_compress_wrapper", "bf16": "bf16_compress_wrapper"}


def _hook_name(value: Any, key: str, names: Any) -> str:
    name = "no" if value is None else str(getattr(value, "value", value)).lower()
    if name not in ("no", *names):
        raise ConfigError(f"{key}={shown(name)} is not a {key}; give one of no, {', '.join(names)}")
    return name


def comm_hook(options: DDPOptions) -> tuple[Any, Any] | None:
    """The hook ``options`` ask for (``comm_hook``, ``comm_wrapper``, ``comm_state_option``): (hook, a fresh
    state), or None. ``ConfigError`` for names PyTorch has no hook for, and for PowerSGD's arguments without a
    PowerSGD hook (Accelerate ignores them there)."""
    hook = _hook_name(options.comm_hook, "comm_hook", tuple(_HOOKS))
    wrapper = _hook_name(options.comm_wrapper, "comm_wrapper", tuple(_WRAPPERS))
    state_option = options.comm_state_option or {}
    powersgd = hook in ("power_sgd", "batched_power_sgd")
    if state_option and not powersgd:
        raise ConfigError("comm_state_option holds PowerSGDState's arguments; give comm_hook='power_sgd' or "
                          "'batched_power_sgd' with it")
    if hook == "no":
        return None
    import importlib

    hooks = importlib.import_module(f"torch.distributed.algorithms.ddp_comm_hooks.{_HOOKS[hook][0]}")
    function = getattr(hooks, _HOOKS[hook][1])
    state = None
    if powersgd:
        from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

        try:
            state = PowerSGDState(None, **dict(state_option))
        except TypeError as err:
            raise ConfigError(f"comm_state_option: {err}; give PowerSGDState's arguments, e.g. "
                              "{'matrix_approximation_rank': 2}") from None
    if wrapper != "no":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        function = getattr(default_hooks, _WRAPPERS[wrapper])(function)
    return function, state


class DDPStrategy(Strategy, SupportsNoSync):
    """``torch.nn.parallel.DistributedDataParallel`` around each model."""

    needs_process_group = True
    options = DDPOptions.keys()
    options_type = DDPOptions
    config: DDPOptions

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        module = module.to(self.root_device)
        if not any(p.requires_grad for p in module.parameters()):
            return module  # nothing to synchronise (a frozen teacher, an EMA copy): DDP would refuse it
        self.precision.convert_layers(module)  # fp8's Float8Linear swap first (torchtitan's order)
        apply_recompute(module, self.context.recompute)  # inside DDP's wrapper: its hooks see the whole backward
        apply_compile(module, compile_config(self.context))  # in place, inside DDP's wrapper too
        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        hook = comm_hook(self.config)  # before wrapping: a bad option stops nothing half-built
        ddp = DistributedDataParallel(module, device_ids=device_ids, **self.config.ddp_kwargs())
        if hook is not None:
            try:
                ddp.register_comm_hook(hook[1], hook[0])
            except TypeError as err:  # PyTorch runs the bf16 hooks on NCCL (CUDA 11+, NCCL 2.10+) or XCCL only
                why = str(err).splitlines()[0] if str(err) else type(err).__name__
                raise ConfigError(f"DDP refused the communication hook: {why}; on this backend use comm_hook='fp16'"
                                  ) from None
        return ddp

    def unwrap(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.module if isinstance(module, DistributedDataParallel) else module

    def no_sync(self, module: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        return module.no_sync() if isinstance(module, DistributedDataParallel) else contextlib.nullcontext()

    @contextlib.contextmanager
    def trigger_sync(self, module: torch.nn.Module) -> Any:
        """DDP decides at forward time whether the next backward all-reduces; a forward run under
        ``no_sync`` is made to all-reduce by re-arming the reducer (what DDP's own forward does)."""

        if not isinstance(module, DistributedDataParallel):
            yield
            return
        old = module.require_backward_grad_sync, module.require_forward_param_sync
        module.require_backward_grad_sync = module.require_forward_param_sync = True
        module.reducer.prepare_for_backward([])
        try:
            yield
        finally:
            module.require_backward_grad_sync, module.require_forward_param_sync = old


class Zero1Strategy(DDPStrategy):
    """DDP for gradients, ``ZeroRedundancyOptimizer`` so that each rank keeps 1/N of the optimizer state."""

    def setup_optimizer(self, optimizer: torch.optim.Optimizer, module: torch.nn.Module | None = None
                        ) -> torch.optim.Optimizer:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        if isinstance(optimizer, ZeroRedundancyOptimizer):
            return optimizer
        # param_groups carry every per-group setting (and a scheduler's initial_lr); defaults are exactly
        # the constructor's keyword arguments.
        groups = [dict(g) for g in optimizer.param_groups]
        accepted = inspect.signature(type(optimizer).__init__).parameters
        # defaults can hold keys the constructor does not take (AdamW's decoupled_weight_decay)
        defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
        return ZeroRedundancyOptimizer(groups, optimizer_class=type(optimizer), **defaults)

    # ZeroRedundancyOptimizer's state lives partitioned on its ranks; checkpoints store it consolidated,
    # keyed by parameter name like every other strategy's, so that any strategy at any size can load it.
    def checkpoint_state(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None
                         ) -> tuple[dict[str, Any], dict[str, Any]]:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict
        from torch.distributed.optim import ZeroRedundancyOptimizer

        msd = get_model_state_dict(module)
        if not isinstance(optimizer, ZeroRedundancyOptimizer):
            return super().checkpoint_state(module, optimizer)
        return msd, gathered_zero_state(optimizer, param_names(self.unwrap(module), optimizer))

    def load_checkpoint_state(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                              model_state: dict[str, Any], optimizer_state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_model_state_dict
        from torch.distributed.optim import ZeroRedundancyOptimizer

        if not isinstance(optimizer, ZeroRedundancyOptimizer):
            super().load_checkpoint_state(module, optimizer, model_state, optimizer_state)
            return
        if model_state:
            set_model_state_dict(module, model_state)
        if optimizer_state:
            load_zero_state(optimizer, optimizer_state, param_names(self.unwrap(module), optimizer))


def gathered_zero_state(optimizer: Any, names: list[str]) -> dict[str, Any]:
    """A ``ZeroRedundancyOptimizer``'s whole state, gathered from the ranks of its process group onto each of
    them, keyed by parameter name (``names``, from ``checkpoint.param_names``) like every other strategy's."""
    from torch.distributed.checkpoint.state_dict import _init_optim_state

    group = optimizer.process_group
    _init_optim_state(optimizer.optim)  # a fresh optimizer has no state yet: make its shapes exist
    optimizer.consolidate_state_dict(to=0)  # rank 0 of the group
    box = [optimizer.state_dict() if dist.get_rank(group) == 0 else None]
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
    return named_optimizer_state(cast(dict[str, Any], box[0]), names)  # every rank's now


def load_zero_state(optimizer: Any, state: dict[str, Any], names: list[str]) -> None:
    """Load a state from ``gathered_zero_state`` (every rank holds it; ZeRO keeps its own partition)."""
    optimizer.load_state_dict(numbered_optimizer_state(state, names))
