"""convoy.train: the ``Accelerator`` and the strategies it delegates to.

    from convoy.train import Accelerator, ProjectConfiguration
    accelerator = Accelerator(strategy="ddp", project_dir="runs/a")

Importing this package imports torch.
"""

from convoy.train.accelerator import Accelerator, DataLoaderConfiguration, ProjectConfiguration
from convoy.train.strategies.base import Strategy, SupportsNoSync, register_strategy

__all__ = ["Accelerator", "DataLoaderConfiguration", "ProjectConfiguration", "Strategy", "SupportsNoSync",
           "register_strategy"]
