"""The settings of one training process: its place in the job and what the launcher and the script asked for.

    settings = resolve_settings(explicit={"mixed_precision": "bf16"}, env=os.environ)
    settings.mixed_precision, settings.strategy   # argument > CONVOY_* variable > settings file > default
    strategy = create_strategy(settings.strategy, settings)   # a strategy reads the same record (``self.context``)

One record, ``TrainSettings``, travels from the ``Accelerator`` to its strategy: the strategy builder only replaces
what ``strategy="auto"`` chose (the name, the degrees, the options). The launcher's variables are read by
``convoy.launch.rank_env`` (``RANK``, ``WORLD_SIZE``, ... and ``CONVOY_MIXED_PRECISION``, ``CONVOY_STRATEGY``,
``CONVOY_PARALLELISM``, ``CONVOY_GRADIENT_ACCUMULATION_STEPS``, ``CONVOY_COLLECTIVE_TIMEOUT``, ``CONVOY_RECOMPUTE``,
``CONVOY_FP8_RECIPE``, ``CONVOY_FP8_EMULATE``, ``CONVOY_COMPILE``; Accelerate's ``ACCELERATE_MIXED_PRECISION``,
``ACCELERATE_GRADIENT_ACCUMULATION_STEPS`` and ``ACCELERATE_DEBUG_MODE``), every value by its key in
``convoy.config.schema``, so a value the launcher refuses is refused here with the same line. When
``RANK``/``WORLD_SIZE`` say the job has several processes, a process group is started even on a CPU-only machine
(``convoy.train.process_group``): convoy never trains N independent copies that each believe they are alone.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from convoy.config.schema import (
    COMPILE_SCOPES,
    FP8_RECIPES,
    KEYS,
    MIXED_PRECISIONS,
    RECOMPUTE_MODES,
    MixedPrecision,
    check_offload,
    dp_engine_beside,
)
from convoy.errors import ConfigError, shown
from convoy.launch.rank_env import SETTING_NAMES, ConvoyEnv, RankEnv, read_convoy_env, read_debug_mode, read_rank_env
from convoy.plan.dims import ParallelDims

__all__ = ["TrainSettings", "resolve_settings", "overridden", "COMPILE_SETTINGS"]

#: the settings of ``torch.compile`` (``Accelerator(compile=..., compile_backend=...)``, ``CONVOY_COMPILE``, ...)
COMPILE_SETTINGS = ("compile", "compile_backend", "compile_mode", "compile_dynamic")


@dataclass(frozen=True, kw_only=True)
class TrainSettings(RankEnv):
    """Resolved settings of one training process: who it is in its job (the ``RankEnv`` fields: ``rank``,
    ``local_rank``, which picks the device, ``world_size``, ``local_world_size``, ``master_addr``, ...) and
    what it runs; also what a strategy reads as ``self.context``."""

    device_type: str = "cpu"
    """Where this process computes: ``"cpu"`` or an accelerator type (``"cuda"``)."""
    mixed_precision: MixedPrecision = MixedPrecision(KEYS["mixed_precision"].default)
    """``"no"``, ``"fp16"`` or ``"bf16"`` (a string is converted); strategies map it onto their engine's policy."""
    strategy: str = KEYS["strategy"].default
    """Strategy name (``"auto"``, ``"ddp"``, ``"zero3"``, ...); after building, the one ``"auto"`` chose."""
    gradient_accumulation_steps: int = KEYS["gradient_accumulation_steps"].default
    gradient_clipping: float | None = None
    """The launcher's global gradient norm clipped to before each optimizer step (``CONVOY_GRADIENT_CLIPPING``)."""
    """Backward passes per optimizer step; a strategy that runs backward itself (a pipeline) scales by it."""
    collective_timeout_s: float = KEYS["collective_timeout"].default
    """Timeout of every collective (convoy's default is 300 s, not torch's 30 min)."""
    recompute: str = KEYS["recompute"].default
    """Activation recomputation of the model's blocks: ``"none"``, ``"selective"`` or ``"full"``
    (``convoy.train.parallel.recompute``); each strategy applies it where it prepares the model."""
    fp8_recipe: str = "tensorwise"
    """How ``mixed_precision="fp8"`` scales: ``"tensorwise"``, ``"rowwise"`` or ``"rowwise_with_gw_hp"``
    (``convoy.train.parallel.float8``); read only under fp8."""
    fp8_emulate: bool = False
    """Run fp8 on a board without float8 tensor cores, in torchao's emulation (tests); refused there otherwise."""
    compile: str = KEYS["compile"].default
    """torch.compile: ``"none"``, ``"blocks"`` (each block in place) or ``"model"``
    (``convoy.train.parallel.compile``); each strategy applies it right after recomputation."""
    compile_backend: str = KEYS["compile_backend"].default
    """The torch.compile backend (``"inductor"``)."""
    compile_mode: str | None = KEYS["compile_mode"].default
    """torch.compile's ``mode`` (None: torch's default)."""
    compile_dynamic: bool | None = KEYS["compile_dynamic"].default
    """torch.compile's ``dynamic`` (None: torch's automatic dynamic shapes)."""
    parallel_dims: ParallelDims | None = None
    """Parallel degrees (``parallelism=``, ``CONVOY_PARALLELISM``); ``None`` = pure data parallel over the world."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """Strategy-specific options (``strategy_options``: ``find_unused_parameters``, ``cpu_offload``, ...)."""
    debug: bool = False
    """Check shapes across processes before collectives (``ACCELERATE_DEBUG_MODE=1``, ``PartialState().debug``)."""
    backend: str | None = None
    """Process-group backend asked for (``InitProcessGroupKwargs(backend=)``); ``None``: gloo on CPU, nccl on CUDA."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mixed_precision not in MIXED_PRECISIONS:
            raise ConfigError(f"mixed_precision={shown(self.mixed_precision)} is not supported; "
                              f"choose one of {', '.join(MIXED_PRECISIONS)}")
        object.__setattr__(self, "mixed_precision", MixedPrecision(self.mixed_precision))
        if isinstance(self.gradient_accumulation_steps, bool) or not isinstance(
                self.gradient_accumulation_steps, int) or self.gradient_accumulation_steps < 1:
            raise ConfigError(f"gradient_accumulation_steps={self.gradient_accumulation_steps} must be >= 1")
        if not 0 < self.collective_timeout_s < float("inf"):
            raise ConfigError(f"collective timeout {self.collective_timeout_s} s must be positive")
        if self.fp8_recipe not in FP8_RECIPES:
            raise ConfigError(f"fp8_recipe={shown(self.fp8_recipe)} is not supported; "
                              f"choose one of {', '.join(FP8_RECIPES)}")
        if self.compile not in COMPILE_SCOPES:
            raise ConfigError(f"compile={shown(self.compile)} is not supported; "
                              f"choose one of {', '.join(COMPILE_SCOPES)}")
        if self.recompute not in RECOMPUTE_MODES:
            raise ConfigError(f"recompute={shown(self.recompute)} is not supported; "
                              f"choose one of {', '.join(RECOMPUTE_MODES)}")

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def planned_fp8(self) -> str:
        """The float8 recipe a plan of this run prices (``RunSpec.fp8``): ``fp8_recipe`` under
        ``mixed_precision="fp8"``, ``"none"`` for 16-bit GEMMs and for torchao's emulation (``fp8_emulate``), which
        runs them in bf16."""
        return self.fp8_recipe if self.mixed_precision == "fp8" and not self.fp8_emulate else "none"


def _setting(name: str, given: Mapping[str, Any], launched: ConvoyEnv) -> Any:
    """The constructor argument ``name`` (checked by the schema key the launcher uses), else what the launcher
    set, else the schema's default."""
    if name in given:
        return KEYS[name].parse(given[name], where=f"Accelerator({name}={shown(given[name])})", typed=True)
    value = getattr(launched, name)
    return KEYS[name].default if value is None else value


def _parallel_dims(dims: Any, world_size: int) -> ParallelDims | None:
    if dims is None or isinstance(dims, ParallelDims):
        if dims is not None:
            dims.check_world_size(world_size)
        return dims
    if isinstance(dims, str):
        return ParallelDims.parse(dims, world_size=world_size)
    if isinstance(dims, Mapping):  # Accelerator(parallelism={"dp": 2, "tp": 2})
        return ParallelDims.from_mapping(dims, world_size=world_size)
    raise ConfigError(f"parallelism={shown(dims)}: give a mapping like {{'dp': 2, 'tp': 2}}, a string like "
                      f"'dp=2,tp=2' or a ParallelDims")


def resolve_settings(*, explicit: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
                     cpu: bool = False, options: Mapping[str, Any] | None = None,
                     defaults: Mapping[str, Any] | None = None, strategy_family: tuple[str, ...] = ()
                     ) -> TrainSettings:
    """Combine explicit constructor arguments (``None`` = not given) with the launcher's environment
    (``convoy.launch.rank_env``, read there). ``options``: the strategy options (their keys are checked by
    ``convoy.train.arguments.check_arguments``), over the launcher's (``CONVOY_STRATEGY_OPTIONS``, an Accelerate config
    file's), over ``defaults`` (a kwargs handler's). Reads the settings files and, unless ``cpu``,
    asks torch whether CUDA is there; nothing else. ``strategy_family``: the strategies an engine's plugin runs as
    (``convoy.train.plugins``): a strategy from the launcher outside them becomes the first."""
    if options is not None and not isinstance(options, Mapping):
        raise ConfigError(f"strategy_options={shown(options)}: give a dict such as "
                          f"{{'find_unused_parameters': True}}")
    from convoy.config.settings import file_settings_env

    env = os.environ if env is None else env
    given = {k: v for k, v in (explicit or {}).items() if v is not None}
    ranks = read_rank_env(env)
    from_env = read_convoy_env(env, skip=given)  # CONVOY_* and Accelerate's aliases, then settings files
    unset = [name for name in SETTING_NAMES if getattr(from_env, name) is None and name not in given]
    from_files = read_convoy_env(file_settings_env(env), skip=set(SETTING_NAMES) - set(unset))
    launched = replace(from_env, **{name: getattr(from_files, name) for name in unset})
    dims = _parallel_dims(given["parallelism"] if "parallelism" in given else launched.parallelism,
                          ranks.world_size)
    strategy = _setting("strategy", given, launched)
    if strategy_family and "strategy" not in given and strategy not in strategy_family:
        strategy = strategy_family[0]  # Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin()): FSDP, not ddp
    dp_engine_beside(strategy, dims)  # a strategy that cannot run beside these degrees: one line, as the launcher
    options = {**(defaults or {}), **(launched.strategy_options or {}),
               **_launched_options(strategy, dims, launched, env), **(options or {})}
    return TrainSettings(
        **{f.name: getattr(ranks, f.name) for f in fields(RankEnv)},
        device_type="cpu" if cpu else _device_type(),
        mixed_precision=_setting("mixed_precision", given, launched),
        strategy=strategy,
        gradient_accumulation_steps=_setting("gradient_accumulation_steps", given, launched),
        collective_timeout_s=_setting("collective_timeout", given, launched),
        gradient_clipping=_setting("gradient_clipping", given, launched),
        recompute=_setting("recompute", given, launched),
        fp8_recipe=_setting("fp8_recipe", given, launched) or FP8_RECIPES[0],
        fp8_emulate=bool(_setting("fp8_emulate", given, launched)),
        **{name: _setting(name, given, launched) for name in COMPILE_SETTINGS},
        parallel_dims=dims, options=options,
        backend=given.get("backend"), debug=read_debug_mode(env),
    )


#: the strategy options a launcher flag stands for (``--cpu-offload``, ``--pp-schedule``, ...): a script's
#: ``strategy_options`` of these names say the same thing
_LAUNCHED_AS_OPTIONS = ("cpu_offload", "pp_schedule", "pp_stages_per_rank", "pp_microbatches")


def overridden(*, explicit: Mapping[str, Any] | None, options: Mapping[str, Any] | None,
               env: Mapping[str, str]) -> str | None:
    """One line naming each setting the script's ``Accelerator(...)`` gives otherwise than the launcher's
    variables in ``env`` (``CONVOY_*``, Accelerate's ``ACCELERATE_*``), and that the script's win; None when they
    agree (or the launcher said nothing). Settings files are defaults, not the launcher: not compared.

    The rule is Accelerate's (``AcceleratorState`` reads ``ACCELERATE_MIXED_PRECISION`` only when the argument is
    None): an argument the script passes is what it asks for, so it wins; the line makes the difference seen."""
    given = {k: v for k, v in (explicit or {}).items() if v is not None and k in SETTING_NAMES}
    given |= {k: v for k, v in (options or {}).items() if k in _LAUNCHED_AS_OPTIONS and v is not None}
    if not given:
        return None
    launched = read_convoy_env(env)
    differ = []
    for name, value in given.items():
        said = getattr(launched, name)
        if said is None:
            continue
        if name == "parallelism":
            world = read_rank_env(env).world_size
            same = _parallel_dims(value, world) == _parallel_dims(said, world)
        elif name in _LAUNCHED_AS_OPTIONS:
            same = bool(value) == bool(said) if name == "cpu_offload" else value == said
        else:
            same = KEYS[name].parse(value, where=f"Accelerator({name}={shown(value)})", typed=True) == said
        if not same:
            flag = "--dp/--tp/--pp" if name == "parallelism" else KEYS[name].flag
            differ.append(f"{name}={shown(value)} (the launcher's {flag}: {shown(_plain(said))})")
    if not differ:
        return None
    return ("the script's Accelerator(...) arguments win over what convoy launch was told: " + ", ".join(differ) +
            "; leave them out of the script to run the launcher's")


def _plain(value: Any) -> Any:
    """A launched value as the user typed it (``MixedPrecision.BF16`` -> ``"bf16"``)."""
    return value.value if hasattr(value, "value") else value


def _launched_options(strategy: str, dims: ParallelDims | None, launched: ConvoyEnv,
                      env: Mapping[str, str]) -> dict[str, Any]:
    """The strategy options the launcher's settings stand for (``--cpu-offload``: ``cpu_offload``,
    ``--pp-schedule``/``--pp-stages-per-rank``/``--pp-microbatches``: the options of those names where there is a
    pipeline);
    ``strategy_options`` given to the Accelerator win over them. A strategy with nothing to offload is one line
    naming where ``cpu_offload`` came from."""
    out: dict[str, Any] = {}
    if launched.cpu_offload:
        variable = KEYS["cpu_offload"].env_var
        check_offload(strategy, dims, said=f"{variable}={env[variable]}" if variable in env else "cpu_offload = true")
        out["cpu_offload"] = True
    pipeline = strategy == "pp" or (dims is not None and dims.pp_enabled)
    for name in ("pp_schedule", "pp_stages_per_rank", "pp_microbatches"):
        if getattr(launched, name) is not None and pipeline:
            out[name] = getattr(launched, name)
    return out


def _device_type() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"
