"""Accelerate's ``patch_environment`` and ``clear_environment``: change ``os.environ`` for a block only.

    from convoy.utils import patch_environment
    with patch_environment(omp_num_threads=1):      # OMP_NUM_THREADS=1 inside (names upper-cased, values str)
        ...

For a script's own use, as in Accelerate; convoy itself hands children an ``env`` dict instead.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

__all__ = ["patch_environment", "clear_environment"]


@contextlib.contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Set each ``NAME=str(value)`` (the keyword upper-cased) inside the block; restore what was there after."""
    before = {key.upper(): os.environ.get(key.upper()) for key in kwargs}
    for key, value in kwargs.items():
        os.environ[key.upper()] = str(value)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def clear_environment() -> Iterator[None]:
    """An empty ``os.environ`` inside the block; the whole previous environment back after."""
    saved = os.environ.copy()
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
