"""Rank-aware logging: messages from the main process only, unless asked otherwise.

    from convoy.train.logging import get_logger
    logger = get_logger(__name__)                        # like accelerate.logging.get_logger
    logger.info("epoch %d", epoch)                       # printed by rank 0 only
    logger.info("my shard has %d rows", n, main_process_only=False)   # every rank, prefixed "[rankN]: "
    logger.warning("slow step", main_process_only=False, in_order=True)  # every rank, rank 0 first

The rank is the live process group's when one is initialised, else ``RANK`` from the environment (what
``convoy launch`` and torchrun set), else 0. torch is never imported here: a process group can only exist
if the caller already imported it.

The level is ``log_level=``, else ``CONVOY_LOG_LEVEL``, else ``log_level`` in a settings file (``convoy.toml``,
the user's config), else the application's own when it configured logging, else ``info`` (the setting's default).
A program that configured no logging handler (no ``logging.basicConfig``) still sees its messages at that level
on stderr: Python would hand them to ``logging.lastResort``, which prints warnings and above only, so that
``logger.info`` printed nothing under ``convoy launch``. The stand-in handler steps aside as soon as the
application installs a handler of its own.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from convoy.config.schema import KEYS
from convoy.errors import ConfigError
from convoy.launch.rank_env import RankEnv, read_log_level, read_rank_env

__all__ = ["get_logger", "RankLoggerAdapter", "MultiProcessAdapter", "process_rank", "local_process_rank", "world_size",
           "is_main_process"]


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


def local_process_rank(env: Mapping[str, str] | None = None) -> int:
    """This process's rank on its machine (``LOCAL_RANK``, what the launcher sets), else 0."""
    return _rank_env(env).local_rank


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

    # typeshed's log takes any **kwargs as object; these two are bools (Accelerate's MultiProcessAdapter)
    def log(self, level: int, msg: Any, *args: Any, main_process_only: bool = True,  # type: ignore[override]
            in_order: bool = False, **kwargs: Any) -> None:
        if not self.isEnabledFor(level):
            return
        rank = process_rank()
        if main_process_only:
            if rank == 0:
                self.logger.log(level, msg, *args, **kwargs)
            return
        # torch's own form (its tracebacks, its C++ warnings): convoy launch, which prefixes every rank's line
        # with it, then shows it once
        prefixed = f"[rank{rank}]: {msg}" if world_size() > 1 else msg
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

    def warning_once(self, msg: Any, *args: Any, **kwargs: Any) -> None:
        """``warning``, once per distinct message and arguments of this logger (Accelerate's, whose cache is per
        adapter too)."""
        key = (msg, args, tuple(sorted(kwargs.items())))
        if key not in self._warned:
            self._warned.add(key)
            self.warning(msg, *args, **kwargs)

    @property
    def _warned(self) -> set[Any]:
        return self.__dict__.setdefault("_warned_once", set())


MultiProcessAdapter = RankLoggerAdapter
"""Accelerate's name of the adapter ``get_logger`` returns."""


def get_logger(name: str, log_level: str | int | None = None) -> RankLoggerAdapter:
    """A logger for ``name`` that logs on the main process only unless a call says otherwise.

    Its level: ``log_level``, else ``CONVOY_LOG_LEVEL``, else a settings file's ``log_level``; when none is given,
    the level the application configured, or ``info`` when it configured no logging (see the module docstring).
    """
    logger = logging.getLogger(name)
    level: str | int | None = log_level
    if isinstance(level, str) and level.strip():  # the same names as CONVOY_LOG_LEVEL and convoy.toml take
        level = KEYS["log_level"].parse(level, where="get_logger(log_level=...)")
    elif level is None or isinstance(level, str):  # not given (or blank): the environment's, else the files'
        level = read_log_level(os.environ)
        if level is None:
            from convoy.config.settings import file_settings_env

            level = read_log_level(file_settings_env())
    configured = _has_own_handlers(logger)
    if level is None and not configured:
        level = KEYS["log_level"].default
    if level is not None:
        logger.setLevel(logging.getLevelName(level.upper()) if isinstance(level, str) else level)
    if not configured and not any(isinstance(h, _UntilConfigured) for h in logger.handlers):
        logger.addHandler(_UntilConfigured())
    return RankLoggerAdapter(logger, {})


class _UntilConfigured(logging.Handler):
    """stderr, ``%(message)s``, as Python's ``logging.lastResort`` but at the logger's own level, while no other
    handler would receive the record (once the application configures logging, its handlers print it)."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)

    def emit(self, record: logging.LogRecord) -> None:
        if _has_own_handlers(logging.getLogger(record.name)):
            return
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:  # as logging.StreamHandler: a closed stderr does not break the program
            self.handleError(record)


def _has_own_handlers(logger: logging.Logger) -> bool:
    """Whether a record of ``logger`` reaches a handler other than convoy's stand-in (``Logger.hasHandlers``
    without it)."""
    current: logging.Logger | None = logger
    while current is not None:
        if any(not isinstance(h, _UntilConfigured) for h in current.handlers):
            return True
        current = current.parent if current.propagate else None
    return False
