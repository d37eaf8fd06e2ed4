"""The launcher -> training environment contract: what every rank finds in its environment.

    from convoy.launch.env import rank_env, convoy_env, read_convoy_env
    env = {**base, **selection_env, **convoy_env(mixed_precision="bf16", parallelism="dp=2,tp=1"),
           **rank_env(rank=1, local_rank=1, world_size=2, local_world_size=2, master_addr="127.0.0.1",
                      master_port=41873, run_id="job")}
    settings = read_convoy_env(os.environ)      # inside a rank: what the launcher asked for

Two halves, each defined here and nowhere else:

* torchrun's variables (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``,
  ``ROLE_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``, ``TORCHELASTIC_*``), with the values torch's elastic agent
  gives them, so an unmodified torchrun script runs as it is;
* convoy's own (``CONVOY_MIXED_PRECISION``, ``CONVOY_STRATEGY``, ``CONVOY_PARALLELISM``,
  ``CONVOY_GRADIENT_ACCUMULATION_STEPS``, ``CONVOY_COLLECTIVE_TIMEOUT``) set from launch flags and read by the
  ``Accelerator``; an explicit constructor argument always wins over them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from convoy.errors import ConfigError

__all__ = [
    "DEFAULT_COLLECTIVE_TIMEOUT",
    "MIXED_PRECISIONS",
    "RANK_VARIABLES",
    "CONVOY_VARIABLES",
    "ConvoyEnv",
    "rank_env",
    "convoy_env",
    "read_convoy_env",
]

#: seconds a collective may wait before it fails; torch's own default is 30 minutes.
DEFAULT_COLLECTIVE_TIMEOUT = 300.0
MIXED_PRECISIONS = ("no", "fp16", "bf16", "fp8")

RANK_VARIABLES = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
    "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE",
)
CONVOY_VARIABLES = (
    "CONVOY_MIXED_PRECISION", "CONVOY_STRATEGY", "CONVOY_PARALLELISM", "CONVOY_GRADIENT_ACCUMULATION_STEPS",
    "CONVOY_COLLECTIVE_TIMEOUT",
)


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
    signals_to_handle: str = "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
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
class ConvoyEnv:
    """What the launcher asked the training layer for; ``None`` = not set (the Accelerator's default)."""

    mixed_precision: str | None = None
    """"no", "fp16", "bf16" or "fp8"."""
    strategy: str | None = None
    """Strategy name ("auto", "ddp", "fsdp", ...), checked by the training layer's registry."""
    parallelism: str | None = None
    """Degrees as "dp=2,tp=2,pp=1"; parse with ``convoy.plan.dims.ParallelDims.parse``."""
    gradient_accumulation_steps: int | None = None
    """Micro-batches per optimizer step."""
    collective_timeout: float | None = None
    """Seconds before a collective that not every rank reached fails (convoy's default: 300)."""

    def __post_init__(self) -> None:
        if self.mixed_precision is not None and self.mixed_precision not in MIXED_PRECISIONS:
            raise ConfigError(f"mixed precision {self.mixed_precision!r} is not one of {', '.join(MIXED_PRECISIONS)}")
        steps = self.gradient_accumulation_steps
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
            raise ConfigError(f"gradient accumulation steps {steps!r}: give a whole number >= 1")
        timeout = self.collective_timeout
        if timeout is not None and not timeout > 0:
            raise ConfigError(f"collective timeout {timeout!r}: give a number of seconds > 0")
        if self.strategy is not None and not self.strategy.strip():
            raise ConfigError("strategy '': give a strategy name such as 'auto', 'ddp' or 'fsdp'")
        if self.parallelism is not None:
            from convoy.plan.dims import ParallelDims

            ParallelDims.parse(self.parallelism)  # raises StrategyError naming the bad degree


def convoy_env(settings: ConvoyEnv) -> dict[str, str]:
    """The ``CONVOY_*`` variables for ``settings``; unset fields are left out (the trainer's default holds)."""
    values = {
        "CONVOY_MIXED_PRECISION": settings.mixed_precision,
        "CONVOY_STRATEGY": settings.strategy,
        "CONVOY_PARALLELISM": settings.parallelism,
        "CONVOY_GRADIENT_ACCUMULATION_STEPS": settings.gradient_accumulation_steps,
        "CONVOY_COLLECTIVE_TIMEOUT": settings.collective_timeout,
    }
    return {key: _format(value) for key, value in values.items() if value is not None}


def _format(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def read_convoy_env(env: Mapping[str, str]) -> ConvoyEnv:
    """Parse the ``CONVOY_*`` variables of ``env`` (a rank's ``os.environ``); ``ConfigError`` if malformed."""

    def number(key: str, kind):
        raw = env.get(key)
        if raw in (None, ""):
            return None
        try:
            return kind(raw)
        except ValueError:
            raise ConfigError(f"{key}={raw!r} is not a {kind.__name__}; set it to a number such as 4") from None

    return ConvoyEnv(
        mixed_precision=env.get("CONVOY_MIXED_PRECISION") or None,
        strategy=env.get("CONVOY_STRATEGY") or None,
        parallelism=env.get("CONVOY_PARALLELISM") or None,
        gradient_accumulation_steps=number("CONVOY_GRADIENT_ACCUMULATION_STEPS", int),
        collective_timeout=number("CONVOY_COLLECTIVE_TIMEOUT", float),
    )
