"""The launcher -> training environment contract: what every rank finds in its environment.

    from convoy.launch.rank_env import ConvoyEnv, convoy_env, rank_env, read_convoy_env, read_rank_env
    env = {**base, **selection_env, **convoy_env(ConvoyEnv(mixed_precision="bf16", parallelism="dp=2,tp=1")),
           **rank_env(rank=1, local_rank=1, world_size=2, local_world_size=2, master_addr="127.0.0.1",
                      master_port=41873, run_id="job")}
    read_rank_env(os.environ).rank              # inside a rank: who am I (1)
    read_convoy_env(os.environ).mixed_precision # inside a rank: what the launcher asked for ("bf16")

Two halves, each written and read here and nowhere else (the launcher writes, ``convoy.train`` and the
worker bootstrap read):

* torchrun's variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
  ``ROLE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``, ``TORCHELASTIC_*``), with the values torch's elastic agent
  gives them, so an unmodified torchrun script runs as it is;
* convoy's own (``CONVOY_MIXED_PRECISION``, ``CONVOY_STRATEGY``, ``CONVOY_PARALLELISM``,
  ``CONVOY_GRADIENT_ACCUMULATION_STEPS``, ``CONVOY_COLLECTIVE_TIMEOUT``, ``CONVOY_RECOMPUTE``, ``CONVOY_FP8_RECIPE``,
  ``CONVOY_COMPILE``,
  ...) set from launch
  flags and read by the ``Accelerator``; an explicit constructor argument always wins over them.
  ``CONVOY_STRATEGY_OPTIONS`` (JSON) carries the strategy options an Accelerate config file sets (``auto_wrap``:
  ``convoy launch --config_file``); a key of ``Accelerator(strategy_options=...)`` wins. Accelerate's launcher says
  the same with ``ACCELERATE_MIXED_PRECISION``, ``ACCELERATE_GRADIENT_ACCUMULATION_STEPS`` and
  ``ACCELERATE_DEBUG_MODE``, which are read here too.

Every value is parsed by its key in ``convoy.config.schema``, on both sides, so the parent refuses exactly
what a rank would refuse.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from convoy.config.schema import (
    BUILTIN_STRATEGIES,
    DEFAULT_COLLECTIVE_TIMEOUT,
    KEYS,
    MIXED_PRECISIONS,
    check_offload,
    dp_engine_beside,
    parse_whole,
)
from convoy.errors import ConfigError, shown

__all__ = [
    "DEFAULT_SIGNALS",
    "DEFAULT_COLLECTIVE_TIMEOUT",
    "MIXED_PRECISIONS",
    "RANK_VARIABLES",
    "CONVOY_VARIABLES",
    "STRATEGY_OPTIONS_VARIABLE",
    "DEEPSPEED_CONFIG_VARIABLE",
    "LAUNCHED_OPTIONS",
    "ConvoyEnv",
    "RankEnv",
    "rank_env",
    "convoy_env",
    "check_launch_settings",
    "check_rank",
    "read_convoy_env",
    "read_deepspeed_config",
    "read_rank_env",
    "read_collective_timeout",
    "read_debug_mode",
    "launched_options",
]


RANK_VARIABLES = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
    "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE",
)
#: the settings the launcher hands to every rank, each as its schema key's ``CONVOY_<KEY>`` variable
SETTING_NAMES = ("mixed_precision", "strategy", "parallelism", "cpu_offload", "pp_schedule", "pp_stages_per_rank",
                 "pp_microbatches", "gradient_accumulation_steps", "collective_timeout", "recompute", "fp8_recipe",
                 "fp8_emulate", "compile", "compile_backend", "compile_mode", "compile_dynamic", "gradient_clipping")
STRATEGY_OPTIONS_VARIABLE = "CONVOY_STRATEGY_OPTIONS"
#: an Accelerate file's DeepSpeed JSON (``deepspeed_config_file``), handed to the ranks whole, as a JSON object: its
#: ``optimizer`` / ``scheduler`` sections build ``DummyOptim`` / ``DummyScheduler``, and it is what
#: ``accelerator.state.deepspeed_plugin.deepspeed_config`` holds (Accelerate's ``ACCELERATE_DEEPSPEED_CONFIG_FILE``)
DEEPSPEED_CONFIG_VARIABLE = "CONVOY_DEEPSPEED_CONFIG"
CONVOY_VARIABLES = tuple(KEYS[name].env_var for name in SETTING_NAMES)
#: the strategy options a launcher hands to the ranks (an Accelerate config file's), and the strategies that read
#: each (``"parallel"`` with its FSDP2 dp engine): FSDP2's ``CPUOffloadPolicy``, the module classes sharded one by one
LAUNCHED_OPTIONS = {"auto_wrap": ("zero2", "zero3", "fsdp", "hsdp", "parallel"),
                    # with cp: how the ring passes K/V blocks (an Accelerate file's parallelism_config_cp_comm_strategy)
                    "cp_comm_strategy": ("zero2", "zero3", "fsdp", "hsdp", "parallel")}
#: Accelerate's launcher's variable for a setting, read when convoy's own is not set (Accelerate's
#: ``Accelerator.__init__`` reads both; there ACCELERATE_GRADIENT_ACCUMULATION_STEPS beats even the argument, here
#: an explicit argument wins, as for every variable)
_ACCELERATE_ALIASES = {"mixed_precision": ("ACCELERATE_MIXED_PRECISION",),
                       "gradient_accumulation_steps": ("ACCELERATE_GRADIENT_ACCUMULATION_STEPS",)}


DEFAULT_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT"
"""torchrun's ``--signals-to-handle`` default, exported to each rank as ``TORCHELASTIC_SIGNALS_TO_HANDLE``."""


def rank_env(
    *,
    rank: int,
    local_rank: int,
    world_size: int,
    local_world_size: int,
    master_addr: str,
    master_port: int,
    run_id: str,
    group_rank: int = 0,
    group_world_size: int = 1,
    restart_count: int = 0,
    max_restarts: int = 0,
    error_file: str | None = None,
    role: str = "default",
    nccl_async_error_handling: str = "1",
    signals_to_handle: str = DEFAULT_SIGNALS,
) -> dict[str, str]:
    """torchrun's per-worker variables, as ``LocalElasticAgent._start_workers`` sets them (torch 2.13).

    ``TORCHELASTIC_USE_AGENT_STORE`` is ``False``: no agent holds a store, so rank 0's process group creates
    the TCPStore on ``MASTER_PORT`` itself, exactly as under ``torchrun --rdzv-backend static``.
    """
    if not 0 <= local_rank < local_world_size or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank}/local rank {local_rank} outside world {world_size}/{local_world_size}")
    env = {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "GROUP_RANK": str(group_rank),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": role,
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "WORLD_SIZE": str(world_size),
        "GROUP_WORLD_SIZE": str(group_world_size),
        "ROLE_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(max_restarts),
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": nccl_async_error_handling,
        "TORCHELASTIC_SIGNALS_TO_HANDLE": signals_to_handle,  # torchrun exports it for its agent
    }
    if error_file:
        env["TORCHELASTIC_ERROR_FILE"] = error_file
    return env


@dataclass(frozen=True, kw_only=True)
class RankEnv:
    """Who this process is in its job, as torchrun's variables say (a plain process: rank 0 of 1)."""

    rank: int = 0
    """Global rank (``RANK``)."""
    local_rank: int = 0
    """Rank on this machine (``LOCAL_RANK``; defaults to ``RANK`` in a job without it, else 0)."""
    world_size: int = 1
    """Processes in the job (``WORLD_SIZE``)."""
    local_world_size: int = 1
    """Processes on this machine (``LOCAL_WORLD_SIZE``; defaults to ``WORLD_SIZE``)."""
    master_addr: str | None = None
    """Where rank 0's store listens (``MASTER_ADDR``); None when not set."""
    master_port: int | None = None
    """Its port (``MASTER_PORT``); None when not set."""
    restart_count: int = 0
    """How often the elastic agent has restarted the workers (``TORCHELASTIC_RESTART_COUNT``)."""

    def __post_init__(self) -> None:
        check_rank(self.rank, self.world_size)
        if not 0 <= self.local_rank < self.local_world_size:
            raise ConfigError(f"LOCAL_RANK={self.local_rank} is outside LOCAL_WORLD_SIZE={self.local_world_size}; "
                              f"a local rank must be in 0..{self.local_world_size - 1}")
        if self.local_world_size > self.world_size > 1:
            raise ConfigError(f"LOCAL_WORLD_SIZE={self.local_world_size} is above WORLD_SIZE={self.world_size}; a "
                              "machine cannot run more of the job's processes than the job has")
        if self.master_port is not None and not 0 < self.master_port <= 65535:
            raise ConfigError(f"MASTER_PORT={self.master_port} is not a TCP port; give one from 1 to 65535")


def check_rank(rank: int, world_size: int) -> None:
    """``ConfigError`` unless ``rank`` is one of the ``world_size`` ranks."""
    if not 0 <= rank < world_size:
        raise ConfigError(f"RANK={rank} is outside WORLD_SIZE={world_size}; a rank must be in 0..{world_size - 1}")


def _whole(env: Mapping[str, str], key: str) -> int | None:
    """``env[key]`` as a whole number >= 0 (the settings' own parser); None when unset."""
    raw = env.get(key)
    return None if raw is None or raw == "" else parse_whole(raw, key)


def read_rank_env(env: Mapping[str, str]) -> RankEnv:
    """This process's place in its job from ``env`` (a rank's ``os.environ``); ``ConfigError`` if malformed."""
    world_size = _whole(env, "WORLD_SIZE")
    world_size = 1 if world_size is None else world_size
    rank = _whole(env, "RANK") or 0
    local_rank = _whole(env, "LOCAL_RANK")
    local_world_size = _whole(env, "LOCAL_WORLD_SIZE")
    port = _whole(env, "MASTER_PORT")
    local_rank = (rank if world_size > 1 else 0) if local_rank is None else local_rank
    if local_world_size is None:  # not set: as many as the job has, or as LOCAL_RANK implies (a plain process)
        local_world_size = world_size if world_size > 1 else local_rank + 1
    return RankEnv(rank=rank, local_rank=local_rank, world_size=world_size,
                   local_world_size=local_world_size, master_addr=env.get("MASTER_ADDR") or None,
                   master_port=port if world_size > 1 else None,  # a process alone never reaches a store
                   restart_count=_whole(env, "TORCHELASTIC_RESTART_COUNT") or 0)


@dataclass(frozen=True, kw_only=True)
class ConvoyEnv:
    """What the launcher asked the training layer for; ``None`` = not set (the Accelerator's default)."""

    mixed_precision: str | None = None
    """One of ``convoy.config.schema.MIXED_PRECISIONS`` ("no", "fp16", "bf16", "fp8"), the trainer's list."""
    strategy: str | None = None
    """One of ``convoy.config.schema.BUILTIN_STRATEGIES`` ("auto", "ddp", "fsdp", ...)."""
    parallelism: str | None = None
    """Degrees as "dp=2,tp=2,pp=1"; parse with ``convoy.plan.dims.ParallelDims.parse``."""
    cpu_offload: bool | None = None
    """FSDP2's shards kept in host memory (``strategy_options["cpu_offload"]``)."""
    pp_schedule: str | None = None
    """The pipeline schedule when pp > 1 (``strategy_options["pp_schedule"]``)."""
    pp_stages_per_rank: int | None = None
    """Stages per process of an interleaved schedule (``strategy_options["pp_stages_per_rank"]``)."""
    pp_microbatches: int | None = None
    """Micro-batches a pipeline cuts each batch into (``strategy_options["pp_microbatches"]``)."""
    gradient_accumulation_steps: int | None = None
    """Micro-batches per optimizer step."""
    gradient_clipping: float | None = None
    """The global gradient norm clipped to before each optimizer step (an Accelerate file's DeepSpeed
    ``gradient_clipping``)."""
    collective_timeout: float | None = None
    """Seconds before a collective that not every rank reached fails (convoy's default: 300)."""
    recompute: str | None = None
    """Activation recomputation, one of ``convoy.config.schema.RECOMPUTE_MODES`` ("none", "selective", "full")."""
    fp8_recipe: str | None = None
    """fp8's scaling, one of ``convoy.config.schema.FP8_RECIPES`` ("tensorwise", "rowwise", "rowwise_with_gw_hp")."""
    fp8_emulate: bool | None = None
    """fp8 on a board without float8 tensor cores, in torchao's emulation (tests)."""
    compile: str | None = None
    """torch.compile, one of ``convoy.config.schema.COMPILE_SCOPES`` ("none", "blocks", "model")."""
    compile_backend: str | None = None
    """The torch.compile backend ("inductor", "aot_eager", ...)."""
    compile_mode: str | None = None
    """torch.compile's mode, one of ``convoy.config.schema.COMPILE_MODES``."""
    compile_dynamic: bool | None = None
    """torch.compile's ``dynamic``."""
    strategy_options: Mapping[str, Any] | None = None
    """Strategy options of ``LAUNCHED_OPTIONS`` (``{"auto_wrap": ("LlamaDecoderLayer",)}``)."""
    deepspeed_config: Mapping[str, Any] | None = None
    """An Accelerate file's DeepSpeed JSON object (``DEEPSPEED_CONFIG_VARIABLE``), read by the script's Accelerator
    as if it had passed ``DeepSpeedPlugin(hf_ds_config=...)``."""

    def __post_init__(self) -> None:
        # each value is checked by the schema key the trainer reads it with, so the parent refuses exactly
        # what every rank would refuse (before any rank starts)
        for name in SETTING_NAMES:
            value = getattr(self, name)
            where = "--dp/--tp/--pp (parallelism)" if name == "parallelism" else KEYS[name].flag
            if value is not None:  # stored as parsed: "300" -> 300.0, "BF16" -> "bf16"
                object.__setattr__(self, name, KEYS[name].parse(value, where=where))
        if self.strategy_options is not None:
            object.__setattr__(self, "strategy_options", launched_options(self.strategy_options,
                                                                          where=STRATEGY_OPTIONS_VARIABLE))
        if self.deepspeed_config is not None and not isinstance(self.deepspeed_config, Mapping):
            raise ConfigError(f"{DEEPSPEED_CONFIG_VARIABLE}: {shown(self.deepspeed_config)} is not a DeepSpeed config "
                              f"object")


def launched_options(options: Any, *, where: str) -> dict[str, Any]:
    """``options`` checked as ``LAUNCHED_OPTIONS`` (``auto_wrap``: module class names), the names as a tuple;
    ``ConfigError`` naming ``where`` otherwise."""
    if not isinstance(options, Mapping) or any(key not in LAUNCHED_OPTIONS for key in options):
        raise ConfigError(f"{where}: {shown(options)} is not valid; expected an object with keys from "
                          f"{', '.join(LAUNCHED_OPTIONS)}")
    checked: dict[str, Any] = {}
    for key, value in options.items():
        if key == "auto_wrap":
            if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value or \
                    not all(isinstance(v, str) and v.strip() for v in value):
                raise ConfigError(f"{where}: auto_wrap={shown(value)}: give module class names like "
                                  f"['LlamaDecoderLayer']")
            value = tuple(v.strip() for v in value)
        if key == "cp_comm_strategy" and value not in ("allgather", "alltoall"):
            raise ConfigError(f"{where}: cp_comm_strategy={shown(value)}: give 'allgather' or 'alltoall'")
        checked[key] = value
    return checked


def check_launch_settings(settings: ConvoyEnv, *, said: Callable[[str, object], str] | None = None) -> None:
    """What the launcher refuses beyond each value's syntax: a strategy that is not convoy's own (a rank
    would look it up in a registry that only the training script fills, ``register_strategy``), and a strategy
    that cannot run beside the degrees asked for (``convoy.config.schema.dp_engine_beside``: ``--strategy ddp
    --tp 2``), as every rank would refuse them.

    ``said(name, value)``: how the message names the setting (``LaunchRequest.said``: the flag, the
    ``CONVOY_*`` variable or the settings file it came from); default: its flag."""
    if settings.strategy is not None and settings.strategy not in BUILTIN_STRATEGIES:
        from convoy.config.settings import said as as_flag

        named = (said or (lambda name, value: as_flag({}, name, value)))("strategy", repr(settings.strategy[:40]))
        raise ConfigError(f"{named} is not one of convoy's strategies "
                          f"({', '.join(BUILTIN_STRATEGIES)}); a strategy your script registers itself is "
                          f"chosen in the script, Accelerator(strategy=...)")
    if settings.strategy is not None and settings.parallelism is not None:
        from convoy.config.settings import said as as_flag
        from convoy.plan.dims import ParallelDims

        named = (said or (lambda name, value: as_flag({}, name, value)))("strategy", repr(settings.strategy))
        dp_engine_beside(settings.strategy, ParallelDims.parse(settings.parallelism), said=named)
    if settings.cpu_offload:
        from convoy.config.settings import said as as_flag
        from convoy.plan.dims import ParallelDims

        named = (said or (lambda name, value: as_flag({}, name, value)))("cpu_offload", True)
        dims = ParallelDims.parse(settings.parallelism) if settings.parallelism else None
        check_offload(settings.strategy or KEYS["strategy"].default, dims, said=named)
    for name in ("pp_schedule", "pp_stages_per_rank", "pp_microbatches"):
        value = getattr(settings, name)
        if value is None or settings.strategy in ("pp", "auto"):
            continue
        from convoy.config.settings import said as as_flag
        from convoy.plan.dims import ParallelDims

        dims = ParallelDims.parse(settings.parallelism) if settings.parallelism else None
        if dims is None or not dims.pp_enabled:
            named = (said or (lambda name, value: as_flag({}, name, value)))(name, value)
            raise ConfigError(f"{named} schedules a pipeline, and the job has none (pp=1); give --pp with it, or "
                              f"leave it out")
    for name in ("fp8_recipe", "fp8_emulate"):
        value = getattr(settings, name)
        if value and settings.mixed_precision not in (None, "fp8"):
            from convoy.config.settings import said as as_flag

            say_as = said or (lambda n, v: as_flag({}, n, v))
            if not say_as(name, value).startswith("--"):
                continue  # a standing preference (CONVOY_FP8_RECIPE, a settings file) for the fp8 jobs: kept
            raise ConfigError(f"{say_as(name, value)} configures fp8, but "
                              f"{say_as('mixed_precision', settings.mixed_precision)} is asked for; give "
                              f"--mixed-precision fp8 with it, or leave it out")
    for key, value in (settings.strategy_options or {}).items():
        if settings.strategy is not None and settings.strategy not in LAUNCHED_OPTIONS[key]:
            from convoy.config.settings import said as as_flag

            say_as = said or (lambda n, v: as_flag({}, n, v))
            raise ConfigError(f"{say_as(key, value)} is not read by {say_as('strategy', settings.strategy)}; it is an "
                              f"option of {', '.join(LAUNCHED_OPTIONS[key])}")


def convoy_env(settings: ConvoyEnv) -> dict[str, str]:
    """The ``CONVOY_*`` variables for ``settings``; unset fields are left out (the trainer's default holds)."""
    values = {KEYS[name].env_var: getattr(settings, name) for name in SETTING_NAMES}
    env = {key: _format(value) for key, value in values.items() if value is not None}
    if settings.strategy_options:
        env[STRATEGY_OPTIONS_VARIABLE] = json.dumps({k: list(v) if isinstance(v, tuple) else v
                                                    for k, v in sorted(settings.strategy_options.items())})
    if settings.deepspeed_config is not None:
        env[DEEPSPEED_CONFIG_VARIABLE] = json.dumps(settings.deepspeed_config)
    return env


def _format(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def read_convoy_env(env: Mapping[str, str], *, skip: Collection[str] = ()) -> ConvoyEnv:
    """Parse the ``CONVOY_*`` variables of ``env`` (a rank's ``os.environ``), and Accelerate's
    ``ACCELERATE_MIXED_PRECISION`` and ``ACCELERATE_GRADIENT_ACCUMULATION_STEPS`` where convoy's are unset;
    ``ConfigError`` naming the variable if malformed.

    ``skip``: settings not to read (the trainer was given them explicitly, and an explicit value wins).
    """
    values = {}
    for name in SETTING_NAMES:
        if name in skip:
            continue
        for variable in (KEYS[name].env_var, *_ACCELERATE_ALIASES.get(name, ())):
            raw = env.get(variable)
            if raw is not None and raw.strip():
                values[name] = KEYS[name].parse(raw, where=f"environment {variable}")
                break
    options = _json_variable(env, STRATEGY_OPTIONS_VARIABLE, 'a JSON object such as {"auto_wrap": ["Block"]}')
    if options is not _UNSET:
        values["strategy_options"] = launched_options(options, where=f"environment {STRATEGY_OPTIONS_VARIABLE}")
    values["deepspeed_config"] = read_deepspeed_config(env)
    return ConvoyEnv(**values)


_UNSET = object()


def _json_variable(env: Mapping[str, str], variable: str, what: str, *, mapping: bool = False) -> Any:
    """The JSON value of ``variable`` in ``env`` (``_UNSET`` when unset or blank; JSON's null is None);
    ``ConfigError`` saying it is not ``what`` when it does not parse (or, with ``mapping``, is not an object)."""
    raw = env.get(variable, "")
    if not raw.strip():
        return _UNSET
    try:
        value = json.loads(raw)
        parsed = True
    except ValueError:
        parsed = False
    if not parsed or (mapping and not isinstance(value, Mapping)):
        raise ConfigError(f"environment {variable}: {shown(raw)} is not {what}")
    return value


def read_deepspeed_config(env: Mapping[str, str]) -> Mapping[str, Any] | None:
    """The DeepSpeed JSON object the launcher handed over (``DEEPSPEED_CONFIG_VARIABLE``), None when unset;
    ``ConfigError`` naming the variable if it is not a JSON object."""
    parsed = _json_variable(env, DEEPSPEED_CONFIG_VARIABLE, "a DeepSpeed config JSON object", mapping=True)
    return None if parsed is _UNSET else parsed


def read_collective_timeout(env: Mapping[str, str]) -> float:
    """Seconds from ``CONVOY_COLLECTIVE_TIMEOUT``, else convoy's default (300); ``ConfigError`` if malformed."""
    key = KEYS["collective_timeout"]
    raw = env.get(key.env_var, "")
    return key.parse(raw, where=f"environment {key.env_var}") if raw.strip() else DEFAULT_COLLECTIVE_TIMEOUT


def read_log_level(env: Mapping[str, str]) -> str | None:
    """``CONVOY_LOG_LEVEL`` (``debug`` ... ``critical``), None when unset; ``ConfigError`` if malformed."""
    key = KEYS["log_level"]
    raw = env.get(key.env_var, "")
    return key.parse(raw, where=f"environment {key.env_var}") if raw.strip() else None


def read_debug_mode(env: Mapping[str, str]) -> bool:
    """Accelerate's ``ACCELERATE_DEBUG_MODE``: check shapes across processes before collectives."""
    return env.get("ACCELERATE_DEBUG_MODE", "").strip().lower() in ("1", "true", "yes")
