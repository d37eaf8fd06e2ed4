"""``convoy.prepare_data_loader``: Accelerate's free function that shards a DataLoader without an Accelerator.

    from convoy import PartialState, prepare_data_loader
    state = PartialState()
    loader = prepare_data_loader(loader, state.device, state.num_processes, state.process_index,
                                 put_on_device=True)

The same sharding as ``accelerator.prepare(loader)`` (``convoy.train.data.PreparedDataLoader``): every
process reads its own share of each global batch. ``dispatch_batches=True`` (Accelerate: process 0 reads
and sends) gives the same batches here, each read by the process that uses it. Shuffling is always seeded
and agreed by every process (``use_seedable_sampler``, ``rng_types`` need nothing more); a prepared loader
always has ``state_dict``/``load_state_dict`` (``use_stateful_dataloader``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from convoy.errors import NotSupportedYetError

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["prepare_data_loader"]


def prepare_data_loader(dataloader: Any, device: "torch.device | None" = None, num_processes: int | None = None,
                        process_index: int | None = None, split_batches: bool = False, put_on_device: bool = False,
                        rng_types: Any = None, dispatch_batches: bool | None = None, even_batches: bool = True,
                        slice_fn_for_dispatch: Callable[..., Any] | None = None, use_seedable_sampler: bool = False,
                        data_seed: int | None = None, non_blocking: bool = False,
                        use_stateful_dataloader: bool = False, torch_device_mesh: Any = None) -> Any:
    """``dataloader`` sharded for process ``process_index`` of ``num_processes`` (default: this job's)."""
    import torch

    from convoy.train import collectives
    from convoy.train.data import LoopState, PreparedDataLoader
    from convoy.train.process_state import PartialState

    if slice_fn_for_dispatch is not None or torch_device_mesh is not None:
        raise NotSupportedYetError("prepare_data_loader(slice_fn_for_dispatch=/torch_device_mesh=) is not supported; "
                                   "use Accelerator(parallelism={...}).prepare(loader), which shards over the mesh")
    state = PartialState()
    shards = state.num_processes if num_processes is None else num_processes
    shard = state.process_index if process_index is None else process_index
    if data_seed is not None:
        seed = data_seed
    else:  # every process shuffles with process 0's draw
        source = dataloader.generator
        draw = torch.randint(0, 2**31 - 1, (1,), generator=source) if source is not None \
            else torch.randint(0, 2**31 - 1, (1,))
        seed = int(collectives.broadcast_object(int(draw.item())))
    target = (device if device is not None else state.device) if put_on_device else None
    return PreparedDataLoader(dataloader, num_shards=shards, shard=shard, split_batches=split_batches,
                              even_batches=even_batches, seed=seed, device=target, state=LoopState())
