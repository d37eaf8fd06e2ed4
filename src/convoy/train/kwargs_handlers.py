"""Accelerate's ``kwargs_handlers`` and ``GradientAccumulationPlugin``, applied to convoy's engines.

    from convoy import Accelerator, DistributedDataParallelKwargs, InitProcessGroupKwargs
    accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True),
                                               InitProcessGroupKwargs(timeout=timedelta(seconds=60))])

Each handler checks its fields when it is made (one ``ConfigError`` line naming the field and what would be
right: ``InitProcessGroupKwargs(timeout=30)`` asks for a ``timedelta``); yes/no fields take True, False, numpy's
bools, 0 and 1, and keep a ``bool``, which torch's own checks require. As in Accelerate, only the fields a user
changed from their defaults are applied:
``DistributedDataParallelKwargs`` -> the DDP wrapper's options, ``InitProcessGroupKwargs`` -> the process
group's backend and timeout, ``GradScalerKwargs`` -> ``torch.amp.GradScaler(...)``, ``AutocastKwargs`` ->
``torch.autocast(enabled=, cache_enabled=)``, ``AORecipeKwargs`` -> ``mixed_precision="fp8"``'s torchao config and
layer filter (``convoy.train.parallel.float8``), ``ProfileKwargs`` -> ``Accelerator.profile()``'s
``torch.profiler.profile`` (``convoy.train.profiling``). Transformer Engine's and MS-AMP's fp8 recipes
(``TERecipeKwargs``, ``MSAMPRecipeKwargs``, ``FP8RecipeKwargs``) are refused in one line: convoy's fp8 is torchao's.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import math
import numbers
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NoReturn

from convoy.errors import ConfigError, shown
from convoy.train.arguments import is_flag

__all__ = ["KwargsHandler", "DDPCommunicationHookType", "DistributedDataParallelKwargs", "InitProcessGroupKwargs",
           "GradScalerKwargs", "AutocastKwargs", "AORecipeKwargs", "ProfileKwargs", "GradientAccumulationPlugin",
           "Handlers", "collect_handlers", "handler_of", "REFUSED_ARGUMENTS", "refuse_arguments", "refuse_other_fp8"]


class KwargsHandler:
    """Base of the handlers: ``to_kwargs()`` is the fields that differ from the class's defaults."""

    def to_kwargs(self) -> dict[str, Any]:
        default = type(self)()
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)  # type: ignore[arg-type]
                if getattr(self, f.name) != getattr(default, f.name)}


def _refuse(handler: Any, name: str, want: str) -> NoReturn:
    raise ConfigError(f"{type(handler).__name__}({name}={shown(getattr(handler, name))}): give {want}")


def _check_flags(handler: Any, *names: str, optional: bool = False) -> None:
    """Each field in ``names`` is a yes/no (``optional``: or None), kept as a ``bool``."""
    for name in names:
        value = getattr(handler, name)
        if value is None and optional:
            continue
        if not is_flag(value):
            _refuse(handler, name, "True or False" + (", or None" if optional else ""))
        object.__setattr__(handler, name, bool(value))  # frozen or not; numpy's bool and 1 become True


def _check_number(handler: Any, name: str, want: str, *, whole: bool = False, above: float | None = None,
                  below: float | None = None) -> None:
    """The field ``name`` is a finite number (``whole``: an int) ``> above`` and ``< below``; numpy's numbers are
    kept as Python's."""
    value = getattr(handler, name)
    if whole and isinstance(value, float) and value.is_integer():  # 4.0 (a computed count) is 4
        value = int(value)
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral if whole else numbers.Real)
            # numbers.Real declares no __gt__ in typeshed; real numbers do compare
            or not math.isfinite(value) or (above is not None and not value > above)  # type: ignore[operator]
            or (below is not None and not value < below)):
        _refuse(handler, name, want)
    object.__setattr__(handler, name, int(value) if isinstance(value, numbers.Integral) else float(value))


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

    def __post_init__(self) -> None:
        _check_number(self, "dim", "a whole number", whole=True)
        _check_flags(self, "broadcast_buffers", "find_unused_parameters", "check_reduction", "gradient_as_bucket_view",
                     "static_graph")
        if self.bucket_cap_mb is not None:  # None: DDP's own default (25)
            _check_number(self, "bucket_cap_mb", "the size of a gradient bucket in MB, a number > 0 (e.g. 25), or "
                                                 "None", above=0)
        if self.comm_state_option is not None and not isinstance(self.comm_state_option, dict):
            _refuse(self, "comm_state_option", "a dict of PowerSGDState's arguments, e.g. "
                                               "{'matrix_approximation_rank': 2}")
        from convoy.train.strategies.ddp import comm_hook  # the hook's names, as strategy_options= checks them
        from convoy.train.strategies.options import DDPOptions

        comm_hook(DDPOptions(comm_hook=self.comm_hook, comm_wrapper=self.comm_wrapper,
                             comm_state_option=self.comm_state_option))


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Options of ``torch.distributed.init_process_group``: backend and timeout."""

    backend: str | None = "nccl"
    init_method: str | None = None
    timeout: datetime.timedelta | None = None

    def __post_init__(self) -> None:
        if self.backend is not None:
            import torch.distributed as dist

            from convoy.devices.vendors import VENDORS

            # torch's and registered ones, and the vendors' (hccl is registered only once torch_npu or Habana's
            # module is imported, which may come after the Accelerator's arguments are made)
            known = [b for b in dist.Backend.backend_list if b not in ("undefined", "fake")]
            known += sorted({row.process_group_backend for row in VENDORS.values()} - set(known))
            # one backend, or one per device: "cpu:gloo,cuda:nccl"
            names = [part.split(":")[-1].strip().lower() for part in str(self.backend).split(",")] \
                if isinstance(self.backend, str) else [None]
            if not all(name in known for name in names):
                _refuse(self, "backend", f"a torch.distributed backend ({', '.join(known)}), or None for convoy's "
                                         "choice (gloo on CPU, the device's own on a GPU)")
        if self.timeout is not None and not (isinstance(self.timeout, datetime.timedelta)
                                             and self.timeout > datetime.timedelta(0)):
            example = self.timeout if isinstance(self.timeout, (int, float)) and self.timeout > 0 else 600
            _refuse(self, "timeout", f"a datetime.timedelta longer than zero, e.g. timedelta(seconds={example}), or "
                                     "None")


@dataclass
class GradScalerKwargs(KwargsHandler):
    """Options of ``torch.amp.GradScaler`` (used with ``mixed_precision="fp16"``)."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True

    def __post_init__(self) -> None:  # torch checks the factors only with asserts, and the rest not at all
        _check_flags(self, "enabled")
        if not self.enabled:  # torch checks nothing of a disabled scaler, which never scales
            return
        _check_number(self, "init_scale", "the first loss scale, a number > 0 (e.g. 65536.0)", above=0)
        _check_number(self, "growth_factor", "a number > 1 (the scale is multiplied by it)", above=1)
        _check_number(self, "backoff_factor", "a number between 0 and 1 (the scale is multiplied by it after an "
                                              "overflow)", above=0, below=1)
        _check_number(self, "growth_interval", "a whole number >= 1 of steps", whole=True, above=0)


@dataclass
class AutocastKwargs(KwargsHandler):
    """Options of ``torch.autocast`` under mixed precision."""

    enabled: bool = True
    cache_enabled: bool | None = None

    def __post_init__(self) -> None:
        _check_flags(self, "enabled")
        _check_flags(self, "cache_enabled", optional=True)


@dataclass
class AORecipeKwargs(KwargsHandler):
    """torchao's float8 recipe for ``mixed_precision="fp8"`` (Accelerate's fields): a whole
    ``torchao.float8.Float8LinearConfig`` (``config``; None: ``fp8_recipe``'s), and which linears convert
    (``module_filter_func(module, fqn) -> bool``, True: convert; convoy skips the output head and dims that are not
    multiples of 16 first). ``enable_fsdp_float8_all_gather`` / ``pad_inner_dim``: None keeps convoy's choice (float8
    all-gather under FSDP2 with tensorwise scaling; no padding)."""

    config: Any = None
    module_filter_func: Any = None
    pad_inner_dim: bool | None = None
    enable_fsdp_float8_all_gather: bool | None = None

    def __post_init__(self) -> None:
        _check_flags(self, "pad_inner_dim", "enable_fsdp_float8_all_gather", optional=True)
        if self.module_filter_func is not None and not callable(self.module_filter_func):
            _refuse(self, "module_filter_func", "a function (module, fqn) -> bool, True for the linears to convert")
        if self.config is not None and type(self.config).__name__ != "Float8LinearConfig":
            _refuse(self, "config", "a torchao.float8.Float8LinearConfig (e.g. Float8LinearConfig.from_recipe_name("
                                    "'rowwise')), or None")

    def to_kwargs(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


#: Accelerate's fp8 recipe handlers of other backends, refused by class name (a script imports them from accelerate)
_OTHER_FP8 = {"TERecipeKwargs": "Transformer Engine", "FP8RecipeKwargs": "Transformer Engine / MS-AMP",
              "MSAMPRecipeKwargs": "MS-AMP"}


def refuse_other_fp8(handler: Any) -> None:
    """``NotSupportedYetError`` for Accelerate's Transformer Engine / MS-AMP fp8 recipe handlers."""
    name = type(handler).__name__
    if name in _OTHER_FP8:
        from convoy.errors import NotSupportedYetError

        raise NotSupportedYetError(f"kwargs_handlers: {name} ({_OTHER_FP8[name]} fp8) is not supported by convoy; its "
                                   f"fp8 is torchao's: pass AORecipeKwargs(...) or fp8_recipe='tensorwise'")


def _ao_handler(handler: Any) -> AORecipeKwargs | None:
    """convoy's ``AORecipeKwargs`` for one of Accelerate's (same fields), else None."""
    if type(handler).__name__ != "AORecipeKwargs" or isinstance(handler, AORecipeKwargs):
        return None
    # Accelerate's fills config from its own defaults (pad_inner_dim and float8 all-gather on): taken as given
    return AORecipeKwargs(config=getattr(handler, "config", None),
                          module_filter_func=getattr(handler, "module_filter_func", None))
_SCHEDULE_KEYS = ("wait", "warmup", "active", "repeat", "skip_first")


@dataclass
class ProfileKwargs(KwargsHandler):
    """Options of ``torch.profiler.profile`` (Accelerate's fields and defaults)."""

    activities: list[str] | None = None
    """What to record: ``"cpu"``, ``"cuda"``, ``"xpu"``, ``"hpu"``, ``"mtia"``; None: torch's default (every
    available one)."""
    schedule_option: dict[str, int] | None = None
    """``torch.profiler.schedule``'s arguments (``wait``, ``warmup``, ``active``, ``repeat``, ``skip_first``)."""
    on_trace_ready: Callable[..., Any] | None = None
    """Called with the profiler each time the schedule finishes a recording."""
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | None = None
    """Where each process writes its Chrome trace (``profile_<process index>.json``); None: no file."""

    def __post_init__(self) -> None:
        if self.activities is not None and (isinstance(self.activities, str) or not all(
                isinstance(a, str) for a in self.activities)):
            raise ConfigError(f"ProfileKwargs(activities={shown(self.activities)}): give a list of names, e.g. "
                              "['cpu', 'cuda'], or None")
        if self.schedule_option is not None:
            unknown = sorted(set(self.schedule_option) - set(_SCHEDULE_KEYS))
            if not isinstance(self.schedule_option, dict) or unknown:
                raise ConfigError(f"ProfileKwargs(schedule_option={shown(self.schedule_option)}): give a dict with "
                                  f"keys among {', '.join(_SCHEDULE_KEYS)}")
        if self.output_trace_dir is not None and not isinstance(self.output_trace_dir, (str, os.PathLike)):
            raise ConfigError(f"ProfileKwargs(output_trace_dir={shown(self.output_trace_dir)}): give a directory "
                              "path, or None")

    def _activity(self, name: str) -> Any:
        import torch

        kinds = {"cpu": torch.profiler.ProfilerActivity.CPU, "cuda": torch.profiler.ProfilerActivity.CUDA}
        if hasattr(torch, "hpu") and torch.hpu.is_available():
            kinds["hpu"] = torch.profiler.ProfilerActivity.HPU
        if torch.xpu.is_available():
            kinds["xpu"] = torch.profiler.ProfilerActivity.XPU
        if torch.mtia.is_available():
            kinds["mtia"] = torch.profiler.ProfilerActivity.MTIA
        if name not in kinds:
            raise ConfigError(f"ProfileKwargs(activities=[{name!r}]): this machine can record {', '.join(kinds)}")
        return kinds[name]

    def build(self) -> Any:
        """The ``torch.profiler.profile`` these options describe (not started)."""
        import torch

        return torch.profiler.profile(
            activities=None if self.activities is None else [self._activity(a) for a in self.activities],
            schedule=None if self.schedule_option is None else torch.profiler.schedule(**self.schedule_option),
            on_trace_ready=self.on_trace_ready, record_shapes=self.record_shapes,
            profile_memory=self.profile_memory, with_stack=self.with_stack, with_flops=self.with_flops,
            with_modules=self.with_modules)


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
        _check_number(self, "num_steps", "micro-steps per optimizer step, a whole number >= 1", whole=True, above=0)
        _check_flags(self, "adjust_scheduler", "sync_with_dataloader", "sync_each_batch")


# Accelerate's constructor arguments convoy refuses, and what to use instead.
REFUSED_ARGUMENTS = {
    "deepspeed_plugins": "one deepspeed_plugin=DeepSpeedPlugin(...), or strategy='zero1'/'zero2'/'zero3'",
    "megatron_lm_plugin": "parallelism={'tp': ..., 'pp': ...}",
    "torch_tp_plugin": "parallelism={'tp': ...}",
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
    ao: AORecipeKwargs | None = None
    """The ``AORecipeKwargs`` given (``Accelerator.fp8_recipe_handler``), else None."""
    profile: Any = None
    """The ``ProfileKwargs`` given (``Accelerator.profile()``'s default), else None."""


def collect_handlers(handlers: Iterable[Any] | None) -> Handlers:
    """Sort ``kwargs_handlers`` by kind; one of each kind at most, as Accelerate allows."""
    seen: dict[type, Any] = {}
    for handler in handlers or ():
        refuse_other_fp8(handler)
        handler = _ao_handler(handler) or handler
        kind = next((k for k in (DistributedDataParallelKwargs, InitProcessGroupKwargs, GradScalerKwargs,
                                 AutocastKwargs, AORecipeKwargs, ProfileKwargs) if isinstance(handler, k)), None)
        if kind is None:
            raise ConfigError(f"kwargs_handlers: {handler!r} is not supported; pass DistributedDataParallelKwargs, "
                              "InitProcessGroupKwargs, GradScalerKwargs, AutocastKwargs, AORecipeKwargs or "
                              "ProfileKwargs (FSDP/DeepSpeed options go in Accelerator(strategy_options={...}))")
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
    from convoy.train.strategies.options import DDPOptions

    comm_hook(DDPOptions.parse(ddp))
    group = seen[InitProcessGroupKwargs].to_kwargs() if InitProcessGroupKwargs in seen else {}
    if group.get("init_method") is not None:
        raise ConfigError("InitProcessGroupKwargs(init_method=...) is not supported; convoy launch (or torchrun) "
                          "sets MASTER_ADDR/MASTER_PORT, which the process group reads")
    timeout = group.get("timeout")
    return Handlers(ddp=ddp, backend=group.get("backend"),
                    timeout_s=timeout.total_seconds() if timeout is not None else None,
                    scaler=seen[GradScalerKwargs].to_kwargs() if GradScalerKwargs in seen else {},
                    autocast=seen[AutocastKwargs].to_kwargs() if AutocastKwargs in seen else {},
                    ao=seen.get(AORecipeKwargs), profile=seen.get(ProfileKwargs))


def handler_of(handlers: Iterable[Any] | None, kind: type) -> Any:
    """The handler of ``kind`` in ``kwargs_handlers`` (Accelerate's ``ddp_handler``, ``init_handler``, ...), else
    None."""
    return next((h for h in handlers or () if isinstance(h, kind)), None)
