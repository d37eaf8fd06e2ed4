"""The process's view of its job, in Accelerate's names: ``PartialState``, ``AcceleratorState``,
``GradientState`` and the ``DistributedType`` enum, on convoy's process group.

    from convoy import PartialState, DistributedType
    state = PartialState()                       # starts the process group under convoy launch / torchrun
    state.process_index, state.num_processes, state.device
    if state.distributed_type == DistributedType.MULTI_CPU: ...
    with state.split_between_processes(prompts) as mine: ...

As in Accelerate, every ``PartialState`` (and every ``AcceleratorState``) of a process shares one
dictionary of attributes: the process-wide view of the job. ``PartialState._reset_state()`` (and
``AcceleratorState._reset_state()``) is its documented reset. Its mixed precision is set once, also as in
Accelerate: a later ``Accelerator()`` without ``mixed_precision`` takes it, and one asking for another is a
``ConfigError`` (a ``ValueError``, as Accelerate's) until the reset. ``GradientState`` is a view of one
Accelerator's loop position (``accelerator.gradient_state``); ``GradientState()`` views the newest Accelerator's.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from convoy.devices.vendors import process_group_backend
from convoy.errors import ConfigError, shown

if TYPE_CHECKING:  # pragma: no cover
    from convoy.train.settings import TrainSettings

__all__ = ["DistributedType", "PartialState", "AcceleratorState", "GradientState", "distributed_type_for"]


class DistributedType(str, enum.Enum):
    """Accelerate's names of a set-up. A ``str`` enum: ``DistributedType.MULTI_CPU == "MULTI_CPU"``."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"

    # str() and format() give "DistributedType.MULTI_CPU", as Accelerate's (Python's own for a str enum), so
    # logs and printed comparisons match; == "MULTI_CPU" and .value still give the bare name.
    def __str__(self) -> str:
        return f"DistributedType.{self.name}"

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)


def process_device(*, device_type: str, local_rank: int, world_size: int) -> torch.device:
    """This process's device as Accelerate names it: ``cuda:<local rank>`` (or another vendor's); on the CPU
    ``cpu`` for one process and ``cpu:0`` for several (Accelerate indexes the CPU device of a distributed job)."""
    if device_type == "cpu":
        return torch.device("cpu", 0) if world_size > 1 else torch.device("cpu")
    return torch.device(device_type, local_rank)


def distributed_type_for(*, world_size: int, device_type: str, strategy_kind: str = "") -> DistributedType:
    """Accelerate's name for convoy's set-up: the strategy's own name (``"FSDP"`` for zero3/fsdp, ``"NO"``
    for single); a parallel layout (``"FSDP+TP+PP"``, ``"DDP+PP"``) is ``FSDP`` when FSDP shards it, else named
    by its processes; otherwise ``NO`` for one process and ``MULTI_<DEVICE>`` for several (``MULTI_GPU``: CUDA)."""
    if strategy_kind in DistributedType.__members__:
        return DistributedType(strategy_kind)
    if "FSDP" in strategy_kind.split("+") or "HSDP" in strategy_kind.split("+"):
        return DistributedType.FSDP
    if world_size == 1:
        return DistributedType.NO
    name = "MULTI_" + {"cuda": "GPU"}.get(device_type, device_type.upper())
    return DistributedType[name] if name in DistributedType.__members__ else DistributedType.MULTI_GPU


_RESET_HINT = ("This happens if `AcceleratorState._reset_state()` was called and an `Accelerator` or "
               "`PartialState` was not reinitialized.")


class PartialState:
    """The job as this process sees it: ranks, device, distributed type. Starts the process group."""

    _shared_state: dict[str, Any] = {}

    def __init__(self, cpu: bool = False, **kwargs: Any) -> None:
        """``kwargs``: ``backend`` and ``timeout`` (a ``timedelta``) of the process group, as in Accelerate."""
        self.__dict__ = self._shared_state
        if not self.initialized:
            from convoy.train.settings import resolve_settings
            from convoy.train.strategies.build import start_job

            timeout = kwargs.pop("timeout", None)
            seconds = timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout
            backend = kwargs.pop("backend", None)
            if kwargs:
                from convoy.errors import NotSupportedYetError

                raise NotSupportedYetError(f"PartialState({sorted(kwargs)[0]}=...) is not supported; pass only "
                                           "backend= and timeout= (convoy launch sets the rendezvous)")
            settings = resolve_settings(explicit={"collective_timeout": seconds, "backend": backend}, cpu=cpu)
            start_job(settings)
            self._fill(settings)

    def _fill(self, settings: TrainSettings, strategy_kind: str = "") -> None:
        self.num_processes = settings.world_size
        self.process_index = settings.rank
        self.local_process_index = settings.local_rank
        self.device = process_device(device_type=settings.device_type, local_rank=settings.local_rank,
                                     world_size=settings.world_size)
        self.distributed_type = distributed_type_for(world_size=settings.world_size,
                                                     device_type=settings.device_type, strategy_kind=strategy_kind)
        self.backend = settings.backend or process_group_backend(settings.device_type)  # as asked
        self.debug = settings.debug
        self.fork_launched = False

    @classmethod
    def _reset_state(cls, reset_partial_state: bool = False) -> None:
        """Forget the shared state (the process group stays up); the next ``PartialState()`` fills it again.
        ``reset_partial_state`` is Accelerate's ``AcceleratorState._reset_state`` argument: the two states are one
        dictionary here, so either call forgets both."""
        cls._shared_state.clear()

    @property
    def initialized(self) -> bool:
        return "num_processes" in self._shared_state

    def __getattr__(self, name: str) -> Any:  # only reached when the shared state lacks ``name``
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(f"`{type(self).__name__}` object has no attribute `{name}`. {_RESET_HINT}")

    def __repr__(self) -> str:
        backend = f"  Backend: {self.backend}" if self.num_processes > 1 and self.backend else ""  # as Accelerate
        return (f"Distributed environment: {self.distributed_type}{backend}\nNum processes: {self.num_processes}\n"
                f"Process index: {self.process_index}\nLocal process index: {self.local_process_index}\n"
                f"Device: {self.device}\n")

    def set_device(self) -> None:
        """Make ``self.device`` the current device of its kind (convoy's launch already did; kept for scripts that
        call it, as Accelerate's)."""
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)

    # --- who am I ------------------------------------------------------------------------------------
    @property
    def use_distributed(self) -> bool:
        return self.distributed_type != DistributedType.NO and self.num_processes > 1

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        return self.process_index == self.num_processes - 1

    @property
    def default_device(self) -> torch.device:
        return self.device

    # --- together ------------------------------------------------------------------------------------
    def wait_for_everyone(self) -> None:
        """A barrier over the job's processes (no-op for one process)."""
        from convoy.train import collectives

        if collectives.is_distributed():
            dist.barrier()

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """This process's contiguous share of a list, tuple, dict of lists or tensor."""
        from convoy.train import collectives

        yield collectives.split(inputs, self.num_processes, self.process_index, apply_padding)

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        with self._first(self.is_main_process):
            yield

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        with self._first(self.is_local_main_process):
            yield

    @contextlib.contextmanager
    def _first(self, leader: bool) -> Iterator[None]:
        if not leader:
            self.wait_for_everyone()
        yield
        if leader:
            self.wait_for_everyone()

    # --- decorators ------------------------------------------------------------------------------------
    def _only(self, condition: Callable[[], bool], function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return function(*args, **kwargs) if condition() else None
        return wrapper

    def on_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self._only(lambda: self.is_main_process, function)

    def on_local_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self._only(lambda: self.is_local_main_process, function)

    def on_last_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self._only(lambda: self.is_last_process, function)

    def on_process(self, function: Callable[..., Any] | None = None, process_index: int | None = None) -> Any:
        if function is None:
            return functools.partial(self.on_process, process_index=process_index)
        return self._only(lambda: self.process_index == process_index, function)

    def on_local_process(self, function: Callable[..., Any] | None = None,
                         local_process_index: int | None = None) -> Any:
        if function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        return self._only(lambda: self.local_process_index == local_process_index, function)

    def print(self, *args: Any, **kwargs: Any) -> None:
        if self.is_local_main_process:
            print(*args, **kwargs)

    def destroy_process_group(self, group: Any = None) -> None:
        """Destroy the process group convoy started (Accelerate's name for ``end_training``'s last step)."""
        from convoy.train.process_group import stop_process_group

        stop_process_group()


class AcceleratorState(PartialState):
    """``PartialState`` plus the Accelerator's settings (mixed precision). Shares ``PartialState``'s state."""

    _shared_state = PartialState._shared_state

    def __init__(self, mixed_precision: str | None = None, cpu: bool = False, **kwargs: Any) -> None:
        if mixed_precision is not None:
            from convoy.config.schema import KEYS

            where = f"AcceleratorState(mixed_precision={shown(mixed_precision)})"
            mixed_precision = KEYS["mixed_precision"].parse(mixed_precision, where=where)
            self._check_mixed_precision(mixed_precision, where=where)
        super().__init__(cpu=cpu, **kwargs)
        if "mixed_precision" not in self.__dict__:
            self.mixed_precision = mixed_precision or "no"

    @classmethod
    def _held_mixed_precision(cls) -> str | None:
        """The mixed precision this process's state was set up with; None before the first ``Accelerator`` (or
        ``AcceleratorState``) and after ``_reset_state()``."""
        return cls._shared_state.get("mixed_precision")

    @classmethod
    def _check_mixed_precision(cls, requested: str, *, where: str) -> None:
        """``ConfigError`` when the state holds another mixed precision than ``requested`` (Accelerate's
        ``_check_initialized`` raises its ``ValueError`` there): it is process-wide, and changing it would change
        what every earlier ``Accelerator``'s ``state`` says while that one computes as it was set up."""
        held = cls._held_mixed_precision()
        if held is not None and str(requested) != held:
            raise ConfigError(f"{where}: this process's AcceleratorState is already set up with "
                              f"mixed_precision={held!r} (by an earlier Accelerator); pass {held!r} or leave it out, "
                              f"or call AcceleratorState._reset_state() first")

    @classmethod
    def _from_settings(cls, settings: TrainSettings, strategy_kind: str = "") -> AcceleratorState:
        """The state of an Accelerator whose settings are resolved and whose process group is up."""
        state = cls.__new__(cls)
        state.__dict__ = cls._shared_state
        state._fill(settings, strategy_kind)
        state.mixed_precision = settings.mixed_precision.value  # a plain str, as Accelerate's
        return state

    def __repr__(self) -> str:
        return super().__repr__() + f"\nMixed precision type: {self.mixed_precision}\n"

    # Accelerate's plugin slots for engines convoy does not run (it runs ZeRO on PyTorch's own FSDP2/DDP, compiles
    # with the script's torch.compile): None, as Accelerate has them when that engine is off. deepspeed_plugin is
    # the DeepSpeed config in effect where one was given (convoy.train.deepspeed_view: the script's plugin or the
    # launcher's deepspeed_config_file), so a script's `"optimizer" in ...deepspeed_config` branch reads its sections
    deepspeed_plugin: Any = None
    deepspeed_plugins: Any = None
    dynamo_plugin: Any = None
    torch_tp_plugin: Any = None

    @property
    def is_fsdp2(self) -> bool:
        """True when FSDP shards the model: convoy's FSDP is always FSDP2 (``fully_shard``)."""
        return self.distributed_type == DistributedType.FSDP

    def get_deepspeed_plugin(self, name: str) -> Any:
        from convoy.errors import NotSupportedYetError

        raise NotSupportedYetError(f"get_deepspeed_plugin({name!r}): convoy runs no DeepSpeed engine, so there are no "
                                   "DeepSpeed plugins to pick from; one deepspeed_plugin= is read as a strategy")

    def select_deepspeed_plugin(self, name: str | None = None) -> None:
        self.get_deepspeed_plugin(str(name))


class GradientState:
    """Where the training loop is, as Accelerate names it: ``sync_gradients``, ``end_of_dataloader``,
    ``remainder``, ``active_dataloader``, ``num_steps`` and the accumulation plugin's flags."""

    _current: dict[str, Any] = {}

    def __init__(self, gradient_accumulation_plugin: Any = None, *, _accelerator: Any = None) -> None:
        newest = self._current.get("accelerator")
        accelerator = _accelerator if _accelerator is not None else (newest() if newest is not None else None)
        if accelerator is None:
            raise AttributeError("GradientState() has no Accelerator to describe; create an `Accelerator` first "
                                 "(or use `accelerator.gradient_state`)")
        object.__setattr__(self, "_accelerator", accelerator)

    @classmethod
    def _register(cls, accelerator: Any) -> None:
        cls._current["accelerator"] = weakref.ref(accelerator)  # never keeps a freed Accelerator alive

    @classmethod
    def _reset_state(cls) -> None:
        """Forget the newest Accelerator (it keeps its own loop position)."""
        cls._current.clear()

    @property
    def _loop(self) -> Any:
        return self._accelerator._loop

    @property
    def sync_gradients(self) -> bool:
        return self._loop.sync_gradients

    @property
    def end_of_dataloader(self) -> bool:
        return self._loop.end_of_dataloader

    @property
    def remainder(self) -> int:
        """Real samples in the last, padded global batch; -1 when the step is not such a batch."""
        value = self._loop.remainder
        return -1 if value is None else value

    @property
    def active_dataloader(self) -> Any:
        return self._loop.active_dataloader

    @property
    def in_dataloader(self) -> bool:
        return self.active_dataloader is not None

    @property
    def num_steps(self) -> int:
        return self._accelerator.gradient_accumulation_steps

    @property
    def plugin_kwargs(self) -> dict[str, Any]:
        plugin = self._accelerator.gradient_accumulation_plugin
        return {"num_steps": plugin.num_steps, "adjust_scheduler": plugin.adjust_scheduler,
                "sync_with_dataloader": plugin.sync_with_dataloader, "sync_each_batch": plugin.sync_each_batch}

    @property
    def adjust_scheduler(self) -> bool:
        return bool(self._accelerator.gradient_accumulation_plugin.adjust_scheduler)

    @property
    def sync_with_dataloader(self) -> bool:
        return bool(self._accelerator.gradient_accumulation_plugin.sync_with_dataloader)

    @property
    def dataloader_references(self) -> list[Any]:
        """Accelerate's stack of the loaders being iterated: ``[None]``, then each, innermost last."""
        return [None, *self._loop.dataloaders]

    @property
    def initialized(self) -> bool:
        return True  # a GradientState always describes a live Accelerator here

    @property
    def is_xla_gradients_synced(self) -> bool:
        return False  # convoy runs no XLA job

    def __getattr__(self, name: str) -> Any:
        if name in ("adjust_scheduler", "sync_with_dataloader", "sync_each_batch"):
            return getattr(self._accelerator.gradient_accumulation_plugin, name)
        raise AttributeError(f"`GradientState` object has no attribute `{name}`")

    def __repr__(self) -> str:
        return (f"Sync Gradients: {self.sync_gradients}\nAt end of current dataloader: {self.end_of_dataloader}\n"
                f"Extra samples added: {self.remainder}\nGradient accumulation plugin: {self.plugin_kwargs}\n")
