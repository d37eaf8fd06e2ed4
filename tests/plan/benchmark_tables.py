"""The published-run tables of ``benchmarks/`` as modules, for the tests that check them (``benchmarks/`` is not a
package): ``load("published_heldout2")``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def load(name: str) -> ModuleType:
    """``benchmarks/<name>.py``, loaded once per process (the held-out tables import ``published_results``)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module
