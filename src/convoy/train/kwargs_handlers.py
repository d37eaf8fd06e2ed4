"""Accelerate's ``kwargs_handlers`` and ``GradientAccumulationPlugin``, applied to convoy's engines.

    from convoy import Accelerator, DistributedDataParallelKwargs, InitProcessGroupKwargs
    accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True),
                                               InitProcessGroupKwargs(timeout=timedelta(seconds=60))])

As in Accelerate, only the fields a user changed from their defaults are applied:
``DistributedDataParallelKwargs`` -> the DDP wrapper's options, ``InitProcessGroupKwargs`` -> the process
group's backend and timeout, ``GradScalerKwargs`` -> ``torch.amp.GradScaler(...)``, ``AutocastKwargs`` ->
``torch.autocast(enabled=, cache_enabled=)``.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from dataclasses import dataclass
from typing import Any, Iterable

from convoy.errors import ConfigError

__all__ = ["KwargsHandler", "DDPCommunicationHookType", "DistributedDataParallelKwargs", "InitProcessGroupKwargs",
           "GradScalerKwargs",
           "AutocastKwargs", "GradientAccumulationPlugin", "Handlers", "collect_handlers", "REFUSED_ARGUMENTS",
           "refuse_arguments"]


class KwargsHandler:
    """Base of the handlers: ``to_kwargs()`` is the fields that differ from the class's defaults."""

    def to_kwargs(self) -> dict[str, Any]:
        default = type(self)()
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)  # type: ignore[arg-type]
                if getattr(self, f.name) != getattr(default, f.name)}


class _Names(enum.EnumMeta):
    def __contains__(cls, item: Any) -> bool:  # "fp16" in DDPCommunicationHookType, as Accelerate's enums allow
        try:
            cls(item)
        except ValueError:
            return False
        return True


class DDPCommunicationHookType(str, enum.Enum, metaclass=_Names):
    """Accelerate's names for DDP's gradient communication hooks, PyTorch's own
    (``torch.distributed.algorithms.ddp_comm_hooks``): compress to fp16/bf16, or PowerSGD's low-rank
    approximation (``comm_state_option`` are ``PowerSGDState``'s arguments, e.g. ``matrix_approximation_rank``).
    Prints as its value (``fp16``), as Accelerate's."""

    def __str__(self) -> str:
        return self.value

    @classmethod
    def list(cls) -> list[str]:
        return [member.value for member in cls]

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Options of ``torch.nn.parallel.DistributedDataParallel`` (Accelerate's names and defaults), and the
    gradient communication hook to register on it (``comm_hook``; ``comm_wrapper`` compresses what a PowerSGD
    hook sends to fp16/bf16)."""

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: int = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_state_option: dict = dataclasses.field(default_factory=dict)


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Options of ``torch.distributed.init_process_group``: backend and timeout."""

    backend: str | None = "nccl"
    init_method: str | None = None
    timeout: datetime.timedelta | None = None


@dataclass
class GradScalerKwargs(KwargsHandler):
    """Options of ``torch.amp.GradScaler`` (used with ``mixed_precision="fp16"``)."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclass
class AutocastKwargs(KwargsHandler):
    """Options of ``torch.autocast`` under mixed precision."""

    enabled: bool = True
    cache_enabled: bool | None = None


@dataclass(frozen=True)
class GradientAccumulationPlugin:
    """How ``accumulate`` works (Accelerate's names)."""

    num_steps: int | None = None
    """Micro-steps per optimizer step."""
    adjust_scheduler: bool = True
    """Step the scheduler once per optimizer step, not once per micro-step."""
    sync_with_dataloader: bool = True
    """Synchronise (and step) at the end of each dataloader, also mid-accumulation."""
    sync_each_batch: bool = False
    """All-reduce gradients on every micro-step (saves memory; the optimizer still steps every num_steps)."""

    def __post_init__(self) -> None:
        if self.num_steps is None or self.num_steps < 1:
            raise ConfigError(f"GradientAccumulationPlugin(num_steps={self.num_steps!r}): num_steps must be a "
                              "whole number >= 1")


# Accelerate's constructor arguments convoy refuses, and what to use instead.
REFUSED_ARGUMENTS = {
    "deepspeed_plugin": "strategy='zero1'/'zero2'/'zero3' (ZeRO on PyTorch's engines) with strategy_options={...}",
    "deepspeed_plugins": "strategy='zero1'/'zero2'/'zero3' with strategy_options={...}",
    "fsdp_plugin": "strategy='fsdp' (FSDP2) with strategy_options={...}",
    "megatron_lm_plugin": "parallelism={'tp': ..., 'pp': ...}",
    "torch_tp_plugin": "parallelism={'tp': ...}",
    "parallelism_config": "parallelism={'dp': ..., 'tp': ..., 'pp': ...}",
    "dynamo_backend": "torch.compile(model) before prepare()",
    "dynamo_plugin": "torch.compile(model) before prepare()",
    "dispatch_batches": "DataLoaderConfiguration(...) (convoy shards on every process)",
}

def refuse_arguments(unsupported: dict[str, Any]) -> None:
    """``NotSupportedYetError`` for the first constructor argument convoy does not take, saying what to use."""
    if not unsupported:
        return
    from convoy.errors import NotSupportedYetError

    name = sorted(unsupported)[0]
    instead = f"use {REFUSED_ARGUMENTS[name]}" if name in REFUSED_ARGUMENTS else \
        "remove it (docs/migrating.md lists what convoy takes instead of Accelerate's other arguments)"
    raise NotSupportedYetError(f"Accelerator({name}=...) is not supported by convoy; {instead}")




@dataclass(frozen=True)
class Handlers:
    """What the handlers given to ``Accelerator(kwargs_handlers=[...])`` ask for, sorted by engine."""

    ddp: dict[str, Any] = dataclasses.field(default_factory=dict)
    backend: str | None = None
    timeout_s: float | None = None
    scaler: dict[str, Any] = dataclasses.field(default_factory=dict)
    autocast: dict[str, Any] = dataclasses.field(default_factory=dict)


def collect_handlers(handlers: Iterable[Any] | None) -> Handlers:
    """Sort ``kwargs_handlers`` by kind; one of each kind at most, as Accelerate allows."""
    seen: dict[type, Any] = {}
    for handler in handlers or ():
        kind = next((k for k in (DistributedDataParallelKwargs, InitProcessGroupKwargs, GradScalerKwargs,
                                 AutocastKwargs) if isinstance(handler, k)), None)
        if kind is None:
            raise ConfigError(f"kwargs_handlers: {handler!r} is not supported; pass DistributedDataParallelKwargs, "
                              "InitProcessGroupKwargs, GradScalerKwargs or AutocastKwargs (FSDP/DeepSpeed options "
                              "go in Accelerator(strategy_options={...}))")
        if kind in seen:
            raise ConfigError(f"kwargs_handlers: you can only pass one {kind.__name__}")
        seen[kind] = handler
    ddp = seen[DistributedDataParallelKwargs].to_kwargs() if DistributedDataParallelKwargs in seen else {}
    from convoy.train.strategies.ddp import DDPStrategy  # the DDP options convoy passes on: one list

    unknown = sorted(set(ddp) - set(DDPStrategy.options))
    if unknown:
        raise ConfigError(f"DistributedDataParallelKwargs({unknown[0]}=...) is not supported by convoy's DDP; "
                          f"set only {', '.join(sorted(DDPStrategy.options))}")
    from convoy.train.strategies.ddp import comm_hook  # checked here, at construction, not at prepare()

    comm_hook(ddp)
    group = seen[InitProcessGroupKwargs].to_kwargs() if InitProcessGroupKwargs in seen else {}
    if group.get("init_method") is not None:
        raise ConfigError("InitProcessGroupKwargs(init_method=...) is not supported; convoy launch (or torchrun) "
                          "sets MASTER_ADDR/MASTER_PORT, which the process group reads")
    timeout = group.get("timeout")
    return Handlers(ddp=ddp, backend=group.get("backend"),
                    timeout_s=timeout.total_seconds() if timeout is not None else None,
                    scaler=seen[GradScalerKwargs].to_kwargs() if GradScalerKwargs in seen else {},
                    autocast=seen[AutocastKwargs].to_kwargs() if AutocastKwargs in seen else {})
