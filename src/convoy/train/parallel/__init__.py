"""Tensor, pipeline and combined parallelism (DTensor ``parallelize_module``, ``torch.distributed.pipelining``).

    from convoy.train.parallel import build_mesh, resolve_tp_plan, apply_tensor_parallel, PipelineModule
    accelerator = convoy.Accelerator(parallelism={"dp": 2, "tp": 2})   # strategy "parallel" uses these

The machinery only: the strategies that use it (``tp``, ``pp`` and ``parallel``, any dp x tp x pp layout)
are ``convoy.train.strategies.parallel``.
"""

from convoy.train.parallel.mesh import ParallelMesh, build_mesh
from convoy.train.parallel.pipeline import SCHEDULES, PipelineConfig, PipelineModule, stage_boundaries
from convoy.train.parallel.tensor import STYLES, TPPlan, apply_tensor_parallel, resolve_tp_plan

__all__ = [
    "ParallelMesh",
    "build_mesh",
    "SCHEDULES",
    "PipelineConfig",
    "PipelineModule",
    "stage_boundaries",
    "STYLES",
    "TPPlan",
    "apply_tensor_parallel",
    "resolve_tp_plan",
]
