"""Training strategies: one class per way of spreading a model over processes (see ``base.py``)."""

from convoy.train.strategies.base import (
    Strategy,
    SupportsNoSync,
    available_strategies,
    create_strategy,
    register_strategy,
    strategy_class,
)

__all__ = [
    "Strategy",
    "SupportsNoSync",
    "available_strategies",
    "create_strategy",
    "register_strategy",
    "strategy_class",
]
