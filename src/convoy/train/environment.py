"""The training process's view of its job: rank, world, device, settings from ``convoy launch``.

    settings = resolve_settings(explicit={"mixed_precision": "bf16"}, env=os.environ)
    settings.mixed_precision, settings.strategy          # explicit argument > CONVOY_* variable > default
    start_process_group(settings)                        # gloo on CPU, nccl on CUDA; no-op for one process

Reads the launcher contract (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ... set by ``convoy launch`` or
torchrun, and ``CONVOY_MIXED_PRECISION``, ``CONVOY_STRATEGY``, ``CONVOY_PARALLELISM``,
``CONVOY_GRADIENT_ACCUMULATION_STEPS``, ``CONVOY_COLLECTIVE_TIMEOUT``; Accelerate's ``ACCELERATE_MIXED_PRECISION``
and ``ACCELERATE_DEBUG_MODE``). When ``RANK``/``WORLD_SIZE`` say
the job has several processes, a process group is started even on a CPU-only machine: convoy never trains
N independent copies that each believe they are alone.

Every setting is read by its key in ``convoy.config.schema`` (the launcher reads the same keys), so a value
the launcher refuses is refused here with the same line: ``mixed_precision`` one of ``MIXED_PRECISIONS``,
``gradient_accumulation_steps`` a whole number >= 1 (``2.5`` is refused, not rounded), ``collective_timeout``
finite seconds > 0, ``parallelism`` a ``ParallelDims``, a mapping or a string, and ASCII whole numbers in
``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE``.
"""

from __future__ import annotations

import atexit
import os
import re
import time
from dataclasses import dataclass
from typing import Any, Mapping

from convoy.config.schema import DEFAULT_COLLECTIVE_TIMEOUT, KEYS, MIXED_PRECISIONS, show
from convoy.errors import ConfigError
from convoy.plan.dims import ParallelDims

__all__ = ["TrainSettings", "resolve_settings", "check_arguments", "start_process_group", "stop_process_group"]

DEFAULT_COLLECTIVE_TIMEOUT_S = DEFAULT_COLLECTIVE_TIMEOUT


@dataclass(frozen=True, kw_only=True)
class TrainSettings:
    """Resolved settings of one training process."""

    rank: int = 0
    """Global rank."""
    local_rank: int = 0
    """Rank on this machine."""
    world_size: int = 1
    """Processes in the job."""
    local_world_size: int = 1
    """Processes on this machine."""
    device_type: str = "cpu"
    """Where this process computes: ``"cpu"`` or an accelerator type (``"cuda"``)."""
    mixed_precision: str = "no"
    """``"no"``, ``"fp16"`` or ``"bf16"``."""
    strategy: str = "auto"
    """Strategy name (``"auto"``, ``"ddp"``, ``"zero3"``, ...)."""
    gradient_accumulation_steps: int = 1
    """Micro-steps per optimizer step."""
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S
    """Timeout of every collective."""
    parallel_dims: ParallelDims | None = None
    """Parallel degrees from ``CONVOY_PARALLELISM``, if given."""
    debug: bool = False
    """Check shapes across processes before collectives (``ACCELERATE_DEBUG_MODE=1``, ``PartialState().debug``)."""
    backend: str | None = None
    """Process-group backend asked for (``InitProcessGroupKwargs(backend=)``); ``None``: gloo on CPU, nccl on CUDA."""

    def __post_init__(self) -> None:
        if self.mixed_precision not in MIXED_PRECISIONS:
            raise ConfigError(f"mixed_precision={self.mixed_precision!r} is not supported; "
                              f"choose one of {', '.join(MIXED_PRECISIONS)}")
        if isinstance(self.gradient_accumulation_steps, bool) or not isinstance(
                self.gradient_accumulation_steps, int) or self.gradient_accumulation_steps < 1:
            raise ConfigError(f"gradient_accumulation_steps={self.gradient_accumulation_steps} must be >= 1")
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"RANK={self.rank} is outside WORLD_SIZE={self.world_size}; "
                              f"a rank must be in 0..{self.world_size - 1}")
        if not 0 < self.collective_timeout_s < float("inf"):
            raise ConfigError(f"collective timeout {self.collective_timeout_s} s must be positive")


def _int(env: Mapping[str, str], key: str, default: int) -> int:
    raw = env.get(key)
    if raw is None or raw == "":
        return default
    if not re.fullmatch(r"\s*[0-9]{1,9}\s*", raw):  # ASCII: int() would read '٣'
        raise ConfigError(f"{key}={show(raw)} is not a whole number >= 0")
    return int(raw)


def _setting(name: str, given: Mapping[str, Any], env: Mapping[str, str], *also: str) -> Any:
    """``name``'s value from the constructor argument, else ``CONVOY_<NAME>`` (then ``also``), checked by the
    schema key the launcher uses; ``None`` when neither sets it."""
    key = KEYS[name]
    if name in given:
        return key.parse(given[name], where=f"Accelerator({name}={show(given[name])})")
    for variable in (key.env_var, *also):
        raw = env.get(variable)
        if raw is not None and raw.strip() != "":
            return key.parse(raw, where=f"environment {variable}")
    return None


def _parallel_dims(given: Mapping[str, Any], env: Mapping[str, str], world_size: int) -> ParallelDims | None:
    dims = given.get("parallelism", env.get("CONVOY_PARALLELISM") or None)
    if dims is None or isinstance(dims, ParallelDims):
        if dims is not None:
            dims.check_world_size(world_size)
        return dims
    if isinstance(dims, str):
        return ParallelDims.parse(dims, world_size=world_size)
    if isinstance(dims, Mapping):  # Accelerator(parallelism={"dp": 2, "tp": 2})
        return ParallelDims.from_mapping(dims, world_size=world_size)
    raise ConfigError(f"parallelism={show(dims)}: give a mapping like {{'dp': 2, 'tp': 2}}, a string like "
                      f"'dp=2,tp=2' or a ParallelDims")


def resolve_settings(*, explicit: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
                     cpu: bool = False) -> TrainSettings:
    """Combine explicit constructor arguments (``None`` = not given) with the environment. Pure."""
    from convoy.config.settings import file_settings_env

    env = os.environ if env is None else env
    env = {**file_settings_env(env), **env}  # settings files (convoy config) below the environment
    given = {k: v for k, v in (explicit or {}).items() if v is not None}
    world_size = _int(env, "WORLD_SIZE", 1)
    rank = _int(env, "RANK", 0)
    local_rank = _int(env, "LOCAL_RANK", rank if world_size > 1 else 0)
    local_world_size = _int(env, "LOCAL_WORLD_SIZE", world_size)

    mixed = _setting("mixed_precision", given, env, "ACCELERATE_MIXED_PRECISION") or "no"
    strategy = _setting("strategy", given, env) or "auto"
    accum = _setting("gradient_accumulation_steps", given, env) or 1
    timeout = _setting("collective_timeout", given, env) or DEFAULT_COLLECTIVE_TIMEOUT
    dims = _parallel_dims(given, env, world_size)
    return TrainSettings(
        rank=rank, local_rank=local_rank, world_size=world_size, local_world_size=local_world_size,
        device_type="cpu" if cpu else _device_type(),
        mixed_precision=mixed, strategy=strategy, gradient_accumulation_steps=accum,
        collective_timeout_s=timeout, parallel_dims=dims, backend=given.get("backend"),
        debug=env.get("ACCELERATE_DEBUG_MODE", "").lower() in ("1", "true", "yes"),
    )


def check_arguments(*, strategy: str, strategy_options: Any, dataloader_config: Any,
                    project_config: Any = None) -> None:
    """The ``Accelerator`` arguments that are not settings, checked at construction with one ``ConfigError``
    (``StrategyError`` for a strategy or its options): ``strategy_options`` keys the strategy reads (the
    union over convoy's strategies for ``"auto"``), a ``dataloader_config`` with ``split_batches`` and
    ``even_batches``, a ``project_config`` with ``project_dir`` and ``iteration``."""
    from convoy.train.strategies.base import check_strategy_options

    if strategy_options is not None and not isinstance(strategy_options, Mapping):
        raise ConfigError(f"strategy_options={show(strategy_options)}: give a dict such as "
                          f"{{'find_unused_parameters': True}}")
    check_strategy_options(strategy, dict(strategy_options or {}))
    if dataloader_config is not None and not all(hasattr(dataloader_config, a)
                                                 for a in ("split_batches", "even_batches")):
        raise ConfigError(f"dataloader_config={show(dataloader_config)}: give a DataLoaderConfiguration("
                          f"split_batches=..., even_batches=...) (convoy.train.DataLoaderConfiguration)")
    if project_config is not None and not all(hasattr(project_config, a) for a in
                                              ("project_dir", "iteration", "total_limit",
                                               "automatic_checkpoint_naming")):
        raise ConfigError(f"project_config={show(project_config)}: give a ProjectConfiguration(project_dir=...) "
                          f"(convoy.train.ProjectConfiguration)")


def _device_type() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


_owned_group = False
_generation = 0  # process groups this process has started over a store (see start_process_group)


def start_process_group(settings: TrainSettings, *, always: bool = False) -> bool:
    """Start the default process group for this job if there is none; True when this call started it.

    ``always`` starts a one-process group (an in-memory store) even when the job has a single process,
    for strategies whose engine needs a group (DDP, FSDP).
    """
    global _owned_group, _generation
    import datetime

    import torch.distributed as dist

    if dist.is_initialized():
        return False
    if settings.world_size == 1 and not always:
        return False
    timeout = datetime.timedelta(seconds=settings.collective_timeout_s)
    backend = settings.backend or ("cpu:gloo,cuda:nccl" if settings.device_type == "cuda" else "gloo")
    if settings.world_size == 1 and "MASTER_ADDR" not in os.environ:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    elif _generation == 0:
        dist.init_process_group(backend, rank=settings.rank, world_size=settings.world_size, timeout=timeout)
    else:
        # A group started again in this process (end_training(), then a new Accelerator): torch keys the default
        # group's rendezvous "default_pg/0/..." every time, and the store (kept alive on loopback by rank 0) still
        # holds the previous group's addresses, so a rank could dial a dead one ("connectFullMesh failed"). Every
        # rank starts its groups in the same order, so a per-process count gives each generation its own keys.
        store, _, _ = next(dist.rendezvous("env://", settings.rank, settings.world_size, timeout=timeout))
        store.set_timeout(timeout)
        dist.init_process_group(backend, store=dist.PrefixStore(f"convoy_group_{_generation}", store),
                                rank=settings.rank, world_size=settings.world_size, timeout=timeout)
    _generation += 1
    _owned_group = True
    # A group still alive at interpreter shutdown leaves gloo's worker threads holding tensors, and the
    # process aborts (SIGABRT, "terminate called without an active exception") after all its work is done
    # (pytorch/pytorch#179291). Destroying it while the interpreter is alive avoids that; a no-op after
    # end_training().
    atexit.register(stop_process_group)
    return True


def stop_process_group() -> None:
    """Destroy the default process group if ``start_process_group`` started it. Idempotent."""
    global _owned_group
    import torch.distributed as dist

    if _owned_group and dist.is_initialized():
        # gloo's worker threads may still be dropping the last collective's Python tensors; if the
        # interpreter is already shutting down they abort the process (pytorch/pytorch#179291). A short
        # pause took an unmodified Accelerate script from 5 crashes in 25 runs to none.
        time.sleep(0.05)
        dist.destroy_process_group()
    _owned_group = False
