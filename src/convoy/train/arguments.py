"""The ``Accelerator``'s arguments that are not settings, checked at construction with one ``ConfigError``.

    check_plain_arguments({"cpu": cpu, "split_batches": None}, project_dir="runs/a", rng_types=None)
    check_arguments(strategy="ddp", strategy_options={"find_unused_parameters": True}, dataloader_config=None)

Above ``settings.py`` and the strategies: ``check_arguments`` asks the strategy registry which
``strategy_options`` keys a strategy reads, so it cannot live in the settings record the strategies read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from convoy.errors import ConfigError, shown

__all__ = ["RNG_TYPES", "OPTIONAL_FLAGS", "is_flag", "check_plain_arguments", "check_arguments"]


#: what Accelerate's ``RNGType`` names (``rng_types``: accepted, and not needed: convoy's shuffling follows the
#: epoch's seed on every rank)
RNG_TYPES = ("torch", "cuda", "mps", "xla", "xpu", "npu", "hpu", "mlu", "musa", "sdaa", "generator")
#: the Accelerator's flags whose None means "the default" (from ``dataloader_config``)
OPTIONAL_FLAGS = ("split_batches", "even_batches")


def is_flag(value: Any) -> bool:
    """True for what a yes/no argument takes: True, False, numpy's bools, and the ints 0 and 1. A string is not
    one (``"no"`` would read as True), nor is None."""
    numpy_bool = type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")
    return isinstance(value, bool) or numpy_bool or (type(value) is int and value in (0, 1))


def check_plain_arguments(flags: Mapping[str, Any], *, project_dir: Any, rng_types: Any) -> None:
    """The ``Accelerator``'s plain arguments, before anything reads them, with one ``ConfigError``: ``flags``
    (name -> value) are True or False (None too where the name is in ``OPTIONAL_FLAGS``; 0, 1 and numpy's bools
    pass, a string does not: ``device_placement="no"`` would read as True), ``project_dir`` a path,
    ``rng_types`` names from ``RNG_TYPES``."""
    for name, value in flags.items():
        if value is None and name in OPTIONAL_FLAGS:
            continue
        if not is_flag(value):
            raise ConfigError(f"Accelerator({name}={shown(value)}): give True or False")
    if project_dir is not None and not isinstance(project_dir, (str, os.PathLike)):
        raise ConfigError(f"Accelerator(project_dir={shown(project_dir)}): give a directory path (a str or Path)")
    if rng_types is not None:
        names = [rng_types] if isinstance(rng_types, str) else rng_types
        try:
            bad = [n for n in names if str(getattr(n, "value", n)) not in RNG_TYPES]
        except TypeError:
            bad = [rng_types]
        if bad:
            raise ConfigError(f"Accelerator(rng_types=...): {shown(bad[0])} is not a random number generator; "
                              f"give names from {', '.join(RNG_TYPES)}")


def check_arguments(*, strategy: str, strategy_options: Any, dataloader_config: Any,
                    project_config: Any = None) -> None:
    """The ``Accelerator`` arguments that are not settings, checked at construction with one ``ConfigError``
    (``StrategyError`` for a strategy or its options): ``strategy_options`` keys the strategy reads (the
    union over convoy's strategies for ``"auto"``), a ``dataloader_config`` with ``split_batches`` and
    ``even_batches``, a ``project_config`` with ``project_dir`` and ``iteration``."""
    from convoy.train.strategies.base import check_strategy_options
    from convoy.train.strategies.options import DDPOptions

    check_strategy_options(strategy, dict(strategy_options or {}))
    ddp = DDPOptions.parse(strategy_options or {})
    if (ddp.comm_hook, ddp.comm_wrapper, ddp.comm_state_option) != (None, None, None):
        from convoy.train.strategies.ddp import comm_hook

        comm_hook(ddp)  # its values too, now rather than at prepare()
    if dataloader_config is not None and not all(hasattr(dataloader_config, a)
                                                 for a in ("split_batches", "even_batches")):
        raise ConfigError(f"dataloader_config={shown(dataloader_config)}: give a DataLoaderConfiguration("
                          f"split_batches=..., even_batches=...) (convoy.train.DataLoaderConfiguration)")
    if project_config is not None and not all(hasattr(project_config, a) for a in
                                              ("project_dir", "iteration", "total_limit",
                                               "automatic_checkpoint_naming")):
        raise ConfigError(f"project_config={shown(project_config)}: give a ProjectConfiguration(project_dir=...) "
                          f"(convoy.train.ProjectConfiguration)")
