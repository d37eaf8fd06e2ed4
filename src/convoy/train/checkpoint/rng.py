"""Each rank's random state in a checkpoint: Python's, numpy's, torch's and, once CUDA is in use, CUDA's.

    save_file(rng_state(), staging / f"random_states_{rank}.pkl", "the random state")
    set_rng_state(load_file(path / f"random_states_{rank}.pkl"))

numpy's state is stored as plain ints, so that ``torch.load(weights_only=True)`` reads it without numpy's
globals. ``restore_rng`` also restores Accelerate's ``random_states_<rank>.pkl`` (``accelerate.py``).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

__all__ = ["rng_state", "set_rng_state", "restore_rng"]


def rng_state() -> dict[str, Any]:
    """This process's RNG states, as ``random_states_<rank>.pkl`` holds them."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    out: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state(),
                           "numpy": (str(name), [int(k) for k in keys], int(pos), int(has_gauss), float(cached))}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` returned."""
    name, keys, *rest = state["numpy"]
    restore_rng(python=state["python"], numpy_state=(name, np.asarray(keys, dtype=np.uint32), *rest),
                torch_state=state["torch"], cuda_states=state.get("cuda"))


def restore_rng(*, python: Any, numpy_state: Any, torch_state: Any, cuda_states: Any = None) -> None:
    """Set Python's, numpy's and torch's RNG, and CUDA's when given and available."""
    random.setstate(python)
    np.random.set_state(numpy_state)
    torch.set_rng_state(torch_state)
    if cuda_states is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda_states)
