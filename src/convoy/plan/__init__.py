"""convoy.plan: memory and time per parallelism layout, and which to use.

    import convoy
    p = convoy.plan("config.json", hardware="8xH100-80GB")       # == convoy.plan.api.plan(...)
    print(p.recommendation.candidate.name, p.recommendation.reasons)

Nothing here imports torch unless a model is built from a factory or an ``nn.Module`` is given, or a device is
measured (``speed.measure``, ``speed.measure_cpu``). The modules, from the entry points down:

Entry points
    ``api``            ``plan(...)``, ``plan_for(...)``, ``recommend_for_module(...)``: the planner as one call.
    ``commands``       the ``convoy launch`` arguments and ``Accelerator(...)`` call that run a planned layout.
    ``plot``           ``convoy plan --plot``: memory beside step time per candidate (matplotlib).
Decision
    ``candidates``     the layouts the trainer runs (DDP, ZeRO 1/2/3, HSDP, TP, PP, products, offload).
    ``recommend``      the Hugging Face guide's cases as an algorithm: the fastest layout that fits, and why.
    ``knobs``          when nothing fits as asked: recompute, then CPU offload.
Memory
    ``memory``         bytes per GPU of a layout: model states, activations, buffers, reserve.
    ``activations``    what one block saves for backward, tensor by tensor, per precision recipe and family.
Time
    ``timing``         seconds per step of a layout: passes, bubble, data/tensor/pipeline traffic, offload.
    ``schedules``      pipeline schedules: idle time, activations held, transfers, the schedules a layout can run.
    ``speed/``         how fast a device runs each kind of work, measured or modeled (its own guide).
Inputs
    ``model``          ``ModelSpec`` from a config, a factory or numbers.
    ``run``            ``RunSpec``: sequence, batch, precision recipe, optimizer, recomputation.
    ``shapes``         every GEMM of one micro-batch at its shape, and the attention's.
    ``dims``           ``ParallelDims``: dp_replicate x dp_shard x tp x pp.
    ``hardware``       the GPU table (one source per row) and the machine shape (``Hardware``).
    ``architectures``  what each accelerator architecture attains: the GPU table's and the rates' facts.
    ``units``          bytes and seconds as the planner prints them.
"""

from __future__ import annotations

import sys
import types

TYPE_CHECKING = False  # typing is not imported at run time: a plan starts without it
if TYPE_CHECKING:
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
