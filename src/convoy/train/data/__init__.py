"""Prepared dataloaders: each process reads its part of every epoch, in the order one process would read it.

    from convoy.train.data import DataLoaderConfiguration
    accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(even_batches=False))
    loader = accelerator.prepare(DataLoader(dataset, batch_size=8, shuffle=True))   # a PreparedDataLoader

    sharding.py          DataLoaderConfiguration, Accelerate's rules, and the loader ``prepare`` makes of one
                         (``shard_data_loader``, ``prepare_data_loader``, ``skip_first_batches``)
    prepared.py          PreparedDataLoader: this process's batches in one process's order; SeedableRandomSampler
    streams.py           IterableDataset shards (IterableDatasetShard)
    dispatch.py          dispatch_batches=True: process 0 reads, every process gets its slice
    torchdata_loader.py  use_stateful_dataloader=True: the prepared loader as torchdata's StatefulDataLoader
    loop.py              LoopPosition: where the loop is (active loaders, last batch, gradient sync)
"""

from convoy.train.data.prepared import PreparedDataLoader, SeedableRandomSampler
from convoy.train.data.sharding import (
                                        DataLoaderConfiguration,
                                        SkipFirstBatches,
                                        is_prepared,
                                        prepare_data_loader,
                                        shard_data_loader,
                                        skip_first_batches,
)
from convoy.train.data.streams import IterableDatasetShard, shard_iterable

__all__ = ["DataLoaderConfiguration", "SeedableRandomSampler", "IterableDatasetShard", "shard_iterable",
           "PreparedDataLoader", "SkipFirstBatches", "shard_data_loader", "is_prepared", "prepare_data_loader",
           "skip_first_batches"]
