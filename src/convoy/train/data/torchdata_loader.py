"""``DataLoaderConfiguration(use_stateful_dataloader=True)``: prepared loaders that are torchdata's
``StatefulDataLoader`` (as Accelerate makes them), for code that checks ``isinstance(loader, StatefulDataLoader)``.

The loader iterates through torchdata's stateful iterators; its ``state_dict()``/``load_state_dict()`` stay
convoy's (``PreparedDataLoader``'s): the epoch, the batches of it already consumed and the shuffling state, so
a position resumes mid-epoch in the same order, also with another number of processes. ``save_state`` stores
it and ``load_state`` restores it like any prepared loader's. torchdata is optional (``pip install torchdata``).
"""

from __future__ import annotations

import warnings
from typing import Any

from convoy.errors import NotSupportedYetError
from convoy.train.data.prepared import PreparedDataLoader

try:
    from torchdata.stateful_dataloader import StatefulDataLoader
except ImportError:  # optional dependency
    StatefulDataLoader = None

__all__ = ["require_torchdata", "stateful_loader_class"]

_NEEDS = ("DataLoaderConfiguration(use_stateful_dataloader=True) needs torchdata, which is not installed: "
          "pip install torchdata (or leave it False; save_state keeps the loader position without it)")


def require_torchdata() -> type:
    """torchdata's ``StatefulDataLoader`` class; NotSupportedYetError naming the install when it is missing."""
    if StatefulDataLoader is None:
        raise NotSupportedYetError(_NEEDS)
    return StatefulDataLoader


if StatefulDataLoader is not None:
    # PreparedDataLoader first: its state_dict/load_state_dict and __iter__ win, and its super() calls reach
    # StatefulDataLoader's __init__ and __iter__ (torchdata's iterators)
    class StatefulPreparedDataLoader(PreparedDataLoader, StatefulDataLoader):
        """A ``PreparedDataLoader`` that is also torchdata's ``StatefulDataLoader``; ``state_dict()`` holds
        convoy's position (epoch, batches consumed, shuffling state)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            with warnings.catch_warnings():  # torchdata 0.11 calls torch.set_vital, deprecated in newer torch
                warnings.filterwarnings("ignore", message="'set_vital' is deprecated")
                super().__init__(*args, **kwargs)

    __all__.append("StatefulPreparedDataLoader")


def stateful_loader_class() -> type[PreparedDataLoader]:
    """The prepared-loader class of ``use_stateful_dataloader=True``."""
    require_torchdata()
    return StatefulPreparedDataLoader
