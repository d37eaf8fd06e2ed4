"""The strategy interface: how a model, its optimizer and its checkpoints are spread over processes.

    from convoy.train.strategies.base import Strategy, register_strategy, create_strategy

    @register_strategy("tp")
    class TensorParallelStrategy(Strategy):
        def setup_module(self, module): ...          # wrap / parallelize, return the module to train
        ...

    strategy = create_strategy("tp", settings)       # what the Accelerator does with strategy="tp"

The ``Accelerator`` is a thin facade: every distributed decision (wrapping, gradient sync, clipping,
state dicts, sharded checkpoints, which ranks form a data-parallel group) is a method here, and the facade
never looks at a concrete strategy type. Optional abilities are separate small interfaces
(``SupportsNoSync``); the facade tests ``isinstance(strategy, SupportsNoSync)``, never a name.

Built-in strategies are listed in ``_BUILTIN`` as ``"module:Class"`` and imported on first use; another
package registers more names with ``@register_strategy(name)``.
"""

from __future__ import annotations

import abc
import contextlib
import importlib
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch

from convoy.errors import StrategyError, shown
from convoy.train.parallel.float8 import float8_for
from convoy.train.precision import Precision, precision_for
from convoy.train.settings import TrainSettings
from convoy.train.strategies.options import StrategyOptions

__all__ = [
    "Strategy",
    "SupportsNoSync",
    "ParameterOrigins",
    "register_strategy",
    "strategy_class",
    "create_strategy",
    "available_strategies",
    "check_strategy_options",
]


class Strategy(abc.ABC):
    """How one process holds and trains its part of the model. One instance per Accelerator.

    Call order used by the Accelerator: ``setup_environment()`` once; ``setup_module()`` for each model;
    ``setup_optimizer()`` for each optimizer (after its model); then per step ``backward()``,
    ``clip_grad_norm_()``; and ``teardown()`` at the end.
    """

    #: the registry name (``"ddp"``); set by ``register_strategy``.
    name: ClassVar[str] = ""
    #: ``distributed_type`` reported by ``Accelerator.distributed_type`` (Accelerate's names: "NO",
    #: "MULTI_CPU", "MULTI_GPU", "FSDP", ...); "MULTI_" + device is used when empty.
    distributed_type: ClassVar[str] = ""
    #: True when the engine needs a process group even for a one-process job (DDP, FSDP); the
    #: Accelerator then starts a one-rank group before ``setup_environment``.
    needs_process_group: ClassVar[bool] = False
    #: the ``strategy_options`` keys this strategy reads; ``None`` (a strategy that does not say) takes any.
    #: ``Accelerator(...)`` refuses other keys at construction (``check_strategy_options``).
    options: ClassVar[tuple[str, ...] | None] = None
    #: the typed record those options are parsed into (``convoy.train.strategies.options``), read as ``self.config``
    options_type: ClassVar[type[StrategyOptions]] = StrategyOptions

    def __init__(self, context: TrainSettings, precision: Precision | None = None) -> None:
        self.context = context  # the job's settings: rank, world size, device, degrees, the user's options dict
        self.config = self.options_type.parse(context.options)  # those options, parsed once (options_type)
        # mixed precision (convoy.train.precision): the Accelerator's, else one for the settings' mode
        self.precision = precision if precision is not None else precision_for(
            context.mixed_precision, device_type=context.device_type,
            float8=float8_for(context, check_board=False))

    # --- environment -------------------------------------------------------------------------------
    @property
    def root_device(self) -> torch.device:
        """The device this process computes on."""

        if self.context.device_type == "cpu":
            return torch.device("cpu")
        return torch.device(self.context.device_type, self.context.local_rank)

    def setup_environment(self) -> None:
        """Build what the strategy needs beyond the default process group (a device mesh). Idempotent.

        The Accelerator has already started the default process group (``torch.distributed``) when the
        job has several processes, or when ``needs_process_group`` is set.
        """

    @property
    def data_parallel_rank(self) -> int:
        """Which data shard this process reads (ranks of one tp/pp group read the same data)."""
        return self.context.rank

    @property
    def data_parallel_size(self) -> int:
        """How many different data shards are read in one step."""
        return self.context.world_size

    # --- module and optimizer ----------------------------------------------------------------------
    @abc.abstractmethod
    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Move ``module`` to the device and wrap/shard it; return the module to call in the loop."""

    def setup_optimizer(self, optimizer: torch.optim.Optimizer, module: torch.nn.Module | None = None
                        ) -> torch.optim.Optimizer:
        """Return the optimizer to step. ``module`` is the prepared model the optimizer belongs to, if known.

        The default re-points the optimizer's parameter lists at the prepared model's parameters when
        wrapping replaced them (an optimizer created before ``prepare`` keeps working).
        """
        return optimizer

    def unwrap(self, module: torch.nn.Module) -> torch.nn.Module:
        """The user's module inside whatever wrapper ``setup_module`` added."""
        return module

    # --- a training step ---------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        loss.backward(**kwargs)

    def clip_grad_norm_(self, module: torch.nn.Module | None, parameters: Any, max_norm: float,
                        norm_type: float = 2.0) -> torch.Tensor:
        """Clip the global gradient norm (over every rank's shard); return the norm before clipping."""

        return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    # --- state -------------------------------------------------------------------------------------
    def full_model_state_dict(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        """Consolidated, unwrapped, CPU state dict (for ``save_model``). Collective: every rank calls it;
        rank 0 gets the full tensors, other ranks may get an empty dict."""
        return {k: v.detach().cpu() for k, v in self.unwrap(module).state_dict().items()}

    def checkpoint_state(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None
                         ) -> tuple[dict[str, Any], dict[str, Any]]:
        """(model, optimizer) state dicts keyed by parameter name, possibly sharded (DTensors), ready for
        ``torch.distributed.checkpoint``. Loadable by any strategy at any world size."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if optimizer is None:
            return get_model_state_dict(module), {}
        return get_state_dict(module, (optimizer,))

    def load_checkpoint_state(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                              model_state: dict[str, Any], optimizer_state: dict[str, Any]) -> None:
        """Apply state dicts produced by ``checkpoint_state`` (after ``torch.distributed.checkpoint.load``).
        An empty ``model_state`` or ``optimizer_state`` means: leave that part alone."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

        # either part may be empty: the Accelerator loads each model once, then each optimizer
        if model_state:
            set_model_state_dict(module, model_state)
        if optimizer is not None and optimizer_state:
            set_optimizer_state_dict(module, (optimizer,), optimizer_state)

    def after_build(self, module: Any, callback: Callable[[], None]) -> None:
        """Run ``callback`` once ``module`` holds its final parameters: at once, unless the strategy builds the
        module later (a pipeline is split on its first call); ``load_state`` waits for that."""
        callback()

    def teardown(self) -> None:
        """Release what ``setup_environment`` started (the Accelerator calls it once, at the end)."""


class ParameterOrigins:
    """Where each parameter a user saw before ``prepare()`` lives afterwards.

    Engines such as FSDP2 and tensor parallel replace a module's parameters with new (sharded) ones, so an
    optimizer created before ``prepare()`` would step tensors the model no longer uses. A strategy records
    the module and name of every original parameter, then re-points the optimizer at what is there now.
    """

    def __init__(self) -> None:
        self._where: dict[int, tuple[Any, str]] = {}

    def record(self, module: Any, names: dict[int, str]) -> None:
        """``names`` maps ``id(original parameter)`` to its name in ``module``."""
        for pid, name in names.items():
            self._where[pid] = (module, name)

    def knows(self, param: Any) -> bool:
        return id(param) in self._where

    def current(self, param: Any) -> Any:
        """The parameter that now stands where ``param`` stood (``param`` itself if it was not recorded)."""
        found = self._where.get(id(param))
        if found is None:
            return param
        module, name = found
        return module.get_parameter(name)

    def repoint(self, optimizer: Any) -> None:
        """Make ``optimizer``'s parameter groups hold the current parameters."""
        for group in optimizer.param_groups:
            group["params"] = [self.current(p) for p in group["params"]]


class SupportsNoSync(abc.ABC):
    """Optional ability: skip the gradient all-reduce for a backward (gradient accumulation)."""

    @abc.abstractmethod
    def no_sync(self, module: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """Inside, backward accumulates local gradients without communicating."""

    def trigger_sync(self, module: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        """Inside, the next backward synchronises gradients even after forwards run under ``no_sync``.
        The default suits engines that decide at backward time (FSDP2's ``set_requires_gradient_sync``)."""
        return contextlib.nullcontext()


# --- registry --------------------------------------------------------------------------------------

# name -> "module:Class" for the built-in strategies; imported only when asked for.
_BUILTIN: dict[str, str] = {
    "single": "convoy.train.strategies.single:SingleStrategy",
    "dp": "convoy.train.strategies.dp:DataParallelStrategy",
    "ddp": "convoy.train.strategies.ddp:DDPStrategy",
    "zero1": "convoy.train.strategies.ddp:Zero1Strategy",
    "zero2": "convoy.train.strategies.fsdp:Zero2Strategy",
    "zero3": "convoy.train.strategies.fsdp:Zero3Strategy",
    "fsdp": "convoy.train.strategies.fsdp:FSDPStrategy",
    "parallel": "convoy.train.strategies.parallel:ParallelStrategy",
    "tp": "convoy.train.strategies.parallel:TensorParallelStrategy",
    "pp": "convoy.train.strategies.parallel:PipelineParallelStrategy",
    "hsdp": "convoy.train.strategies.parallel:HybridShardStrategy",
}
_REGISTERED: dict[str, type[Strategy]] = {}


def register_strategy(name: str, *, replace: bool = False) -> Callable[[type[Strategy]], type[Strategy]]:
    """Class decorator: make ``Accelerator(strategy=name)`` build this class."""

    def decorate(cls: type[Strategy]) -> type[Strategy]:
        if not (isinstance(cls, type) and issubclass(cls, Strategy)):
            raise TypeError(f"register_strategy({name!r}) needs a Strategy subclass, got {cls!r}")
        if not replace and name in _REGISTERED and _REGISTERED[name] is not cls:
            raise StrategyError(f"strategy {name!r} is already registered by {_REGISTERED[name].__qualname__}; "
                                f"pass replace=True to override it")
        cls.name = name
        _REGISTERED[name] = cls
        return cls

    return decorate


def available_strategies() -> tuple[str, ...]:
    """Every name ``strategy=`` accepts (built-ins, registered ones, and ``"auto"``)."""
    return tuple(sorted({"auto", *_BUILTIN, *_REGISTERED}))


def strategy_class(name: str) -> type[Strategy]:
    """The class registered under ``name``; ``StrategyError`` listing the valid names otherwise."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name in _BUILTIN:
        module_name, _, cls_name = _BUILTIN[name].partition(":")
        cls = getattr(importlib.import_module(module_name), cls_name)
        _REGISTERED.setdefault(name, cls)
        cls.name = name
        return _REGISTERED[name]
    raise StrategyError(f"strategy={name!r} is not a known strategy; choose one of "
                        f"{', '.join(available_strategies())}")


def check_strategy_options(name: str, options: Mapping[str, Any]) -> None:
    """``StrategyError`` naming the valid keys when ``options`` has a key strategy ``name`` does not read
    (for ``"auto"``: a key none of convoy's strategies reads, as auto hands them to the one it picks)."""
    if not options:
        if name != "auto":
            strategy_class(name)  # an unknown name fails here, at construction
        return
    if name == "auto":  # auto picks among convoy's own strategies only, never a registered one
        from convoy.config.schema import BUILTIN_STRATEGIES

        classes = [strategy_class(n) for n in BUILTIN_STRATEGIES if n != "auto"]
        valid = sorted({key for cls in classes for key in cls.options or ()})
    else:
        declared = strategy_class(name).options
        if declared is None:
            return
        valid = sorted(declared)
    unknown = sorted(str(k) for k in options if k not in valid)
    if unknown:
        raise StrategyError(f"strategy_options: {shown(unknown[0])} is not an option of strategy={name!r}; "
                            f"valid keys: {', '.join(valid) or 'none'}")


def create_strategy(name: str, context: TrainSettings, precision: Precision | None = None) -> Strategy:
    """Build the strategy registered under ``name`` for this job, holding ``precision`` (the Accelerator's; None:
    one for ``context.mixed_precision``)."""
    cls = strategy_class(name)
    return cls(context) if precision is None else cls(context, precision)
