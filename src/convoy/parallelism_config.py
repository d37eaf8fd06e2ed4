"""Accelerate's import path for ``ParallelismConfig`` (``from accelerate.parallelism_config import
ParallelismConfig``); the object lives in ``convoy.train.plugins``.

    from convoy.parallelism_config import ParallelismConfig
"""

from convoy.train.plugins import ParallelismConfig

__all__ = ["ParallelismConfig"]
