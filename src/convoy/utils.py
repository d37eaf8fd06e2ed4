"""Accelerate's import path for its plugin objects, so that ``from accelerate.utils import ...`` needs only its
package name changed (the objects live in ``convoy.train.plugins``; this module holds nothing of its own).

    from convoy.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin, ParallelismConfig
    from convoy.utils import TorchContextParallelConfig      # ParallelismConfig(cp_size=2, cp_handler=...)
"""

from convoy.train.plugins import (
    DeepSpeedPlugin,
    FullyShardedDataParallelPlugin,
    ParallelismConfig,
    TorchContextParallelConfig,
)

__all__ = ["DeepSpeedPlugin", "FullyShardedDataParallelPlugin", "ParallelismConfig", "TorchContextParallelConfig"]
