"""convoy.plan: memory and time per parallelism layout, and which to use.

    import convoy
    p = convoy.plan("config.json", hardware="8xH100-80GB")       # == convoy.plan.api.plan(...)
    print(p.recommendation.candidate.name, p.recommendation.reasons)

Submodules: ``dims`` (ParallelDims), ``hardware`` (GPU table), ``model`` (model descriptions), ``memory``,
``timing``, ``candidates``, ``recommend``, ``api``. Nothing here imports torch unless a model is built from
a factory or an ``nn.Module`` is given.
"""

from __future__ import annotations

import sys
import types
from typing import Any

__all__ = ["ParallelDims", "plan", "Plan", "recommend_for_module"]


class _CallablePackage(types.ModuleType):
    """``convoy.plan`` is both this package and the public function: importing any ``convoy.plan.*`` submodule
    binds the package to the name ``convoy.plan`` (Python sets the attribute on the parent), which would
    shadow the function ``convoy.plan(...)``. Making the package callable keeps both spellings working."""

    def __call__(self, *args: Any, **kwargs: Any):
        from convoy.plan.api import plan

        return plan(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage


def __getattr__(name: str) -> Any:
    if name == "ParallelDims":
        from convoy.plan.dims import ParallelDims

        return ParallelDims
    if name in ("plan", "Plan", "recommend_for_module"):
        from convoy.plan import api

        return getattr(api, name)
    raise AttributeError(f"module 'convoy.plan' has no attribute {name!r}")
