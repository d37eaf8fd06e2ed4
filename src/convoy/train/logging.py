"""Rank-aware logging: messages from the main process only, unless asked otherwise.

    from convoy.train.logging import get_logger
    logger = get_logger(__name__)                        # like accelerate.logging.get_logger
    logger.info("epoch %d", epoch)                       # printed by rank 0 only
    logger.info("my shard has %d rows", n, main_process_only=False)   # every rank, prefixed "[rank N]"
    logger.warning("slow step", main_process_only=False, in_order=True)  # every rank, rank 0 first

The rank is the live process group's when one is initialised, else ``RANK`` from the environment (what
``convoy launch`` and torchrun set), else 0. torch is never imported here: a process group can only exist
if the caller already imported it. The level comes from ``log_level=`` or ``CONVOY_LOG_LEVEL``.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Mapping

from convoy.errors import ConfigError
from convoy.config.schema import KEYS
from convoy.launch.env import RankEnv, read_log_level, read_rank_env

__all__ = ["get_logger", "RankLoggerAdapter", "process_rank", "world_size", "is_main_process"]


def _group() -> Any | None:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


def process_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's global rank: the process group's, else ``RANK``, else 0."""
    dist = _group()
    if dist is not None:
        return dist.get_rank()
    return _rank_env(env).rank


def world_size(env: Mapping[str, str] | None = None) -> int:
    """Processes in the job: the process group's size, else ``WORLD_SIZE``, else 1."""
    dist = _group()
    if dist is not None:
        return dist.get_world_size()
    return _rank_env(env).world_size


def _rank_env(env: Mapping[str, str] | None) -> RankEnv:
    """The launcher's rank variables; a plain process's (rank 0 of 1) when they are malformed (a logger does not
    refuse to log: the Accelerator reports them)."""
    try:
        return read_rank_env(os.environ if env is None else env)
    except ConfigError:
        return RankEnv()


def is_main_process(env: Mapping[str, str] | None = None) -> bool:
    """True on global rank 0 (and in a plain, non-distributed process)."""
    return process_rank(env) == 0


class RankLoggerAdapter(logging.LoggerAdapter):
    """A logger whose calls take ``main_process_only=True`` and ``in_order=False`` keywords."""

    def log(self, level: int, msg: Any, *args: Any, main_process_only: bool = True, in_order: bool = False,
            **kwargs: Any) -> None:
        if not self.isEnabledFor(level):
            return
        rank = process_rank()
        if main_process_only:
            if rank == 0:
                self.logger.log(level, msg, *args, **kwargs)
            return
        prefixed = f"[rank {rank}] {msg}" if world_size() > 1 else msg
        dist = _group()
        if not in_order or dist is None:
            self.logger.log(level, prefixed, *args, **kwargs)
            return
        for turn in range(dist.get_world_size()):  # one rank at a time, separated by barriers
            if turn == rank:
                self.logger.log(level, prefixed, *args, **kwargs)
            dist.barrier()

    def debug(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        self.log(logging.DEBUG, msg, *args, **kwargs)

    def info(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        self.log(logging.INFO, msg, *args, **kwargs)

    def warning(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        self.log(logging.WARNING, msg, *args, **kwargs)

    def error(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        self.log(logging.ERROR, msg, *args, **kwargs)

    def critical(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        self.log(logging.CRITICAL, msg, *args, **kwargs)

    def exception(self, msg: Any, *args: Any, exc_info: Any = True, **kwargs: Any) -> None:
        self.log(logging.ERROR, msg, *args, exc_info=exc_info, **kwargs)


def get_logger(name: str, log_level: str | int | None = None) -> RankLoggerAdapter:
    """A logger for ``name`` that logs on the main process only unless a call says otherwise.

    ``log_level`` (or ``CONVOY_LOG_LEVEL``) sets the underlying logger's level; when neither is given the
    level is left as the application configured it.
    """
    logger = logging.getLogger(name)
    level: str | int | None = log_level
    if isinstance(level, str) and level.strip():  # the same names as CONVOY_LOG_LEVEL and convoy.toml take
        level = KEYS["log_level"].parse(level, where="get_logger(log_level=...)")
    elif level is None or isinstance(level, str):  # not given (or blank): the environment's, if any
        level = read_log_level(os.environ)
    if level is not None:
        logger.setLevel(logging.getLevelName(level.upper()) if isinstance(level, str) else level)
    return RankLoggerAdapter(logger, {})
