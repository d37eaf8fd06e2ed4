"""convoy.plan: memory and time per parallelism layout, and which to use.

    from convoy.plan import plan
    p = plan("config.json", hardware="8xH100-80GB")
    print(p.recommendation.candidate.name, p.recommendation.reasons)

Submodules: ``dims`` (ParallelDims), ``hardware`` (GPU table), ``model`` (model descriptions), ``memory``,
``timing``, ``candidates``, ``recommend``, ``api``. Nothing here imports torch unless a model is built from
a factory or an ``nn.Module`` is given.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ParallelDims", "plan", "Plan", "recommend_for_module"]


def __getattr__(name: str) -> Any:
    if name == "ParallelDims":
        from convoy.plan.dims import ParallelDims

        return ParallelDims
    if name in ("plan", "Plan", "recommend_for_module"):
        from convoy.plan import api

        return getattr(api, name)
    raise AttributeError(f"module 'convoy.plan' has no attribute {name!r}")
