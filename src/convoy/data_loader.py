"""Accelerate's ``accelerate.data_loader`` import path (the sharding lives in ``convoy.train.data``).

    from convoy.data_loader import skip_first_batches, prepare_data_loader   # was: from accelerate.data_loader
"""

from convoy.train.data import (
    DataLoaderConfiguration,
    IterableDatasetShard,
    SeedableRandomSampler,
    SkipFirstBatches,
    prepare_data_loader,
    skip_first_batches,
)

__all__ = ["skip_first_batches", "prepare_data_loader", "SeedableRandomSampler", "IterableDatasetShard",
           "SkipFirstBatches", "DataLoaderConfiguration"]
