"""Accelerate's names on 2 CPU processes: one job, not two copies; sync_each_batch; the free operations.

    convoy launch --nproc-per-node 2 tests/train/scripts/accelerate_names.py
"""

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

import convoy
from convoy import Accelerator, DistributedType, GradientAccumulationPlugin


def main() -> None:
    # Accelerator() with no argument: a gloo group over both processes (Accelerate without cpu=True trains
    # two independent copies here), and each process reads its own half of the data.
    accelerator = Accelerator(gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=2,
                                                                                      sync_each_batch=True))
    rank = accelerator.process_index
    assert dist.is_initialized() and dist.get_world_size() == 2
    assert accelerator.distributed_type == DistributedType.MULTI_CPU == accelerator.state.distributed_type
    loader = accelerator.prepare(DataLoader(list(range(8)), batch_size=2))
    seen = [int(x) for batch in loader for x in batch]
    every = convoy.gather_object(seen)
    assert sorted(every) == list(range(8)) and len(set(seen)) == 4, (seen, every)

    # sync_each_batch: gradients are all-reduced on a micro-step that does not step the optimizer
    model = accelerator.prepare(torch.nn.Linear(1, 1, bias=False))
    with accelerator.accumulate(model):
        accelerator.backward(model(torch.tensor([[float(rank + 1)]])).sum())
        assert not accelerator.sync_gradients
    grads = convoy.gather(model.module.weight.grad.reshape(1))
    assert grads[0] == grads[1], grads

    # gather_for_metrics of a dict through gather_object: every process's keys, as in Accelerate
    assert accelerator.gather_for_metrics({"loss": rank}, use_gather_object=True) == ["loss", "loss"]

    # free operations with Accelerate's signatures
    mine = torch.tensor([float(rank + 1)])
    assert convoy.reduce(mine).item() == 1.5  # default "mean"
    assert convoy.reduce(mine, "max").item() == 2.0 and convoy.reduce(mine, "min").item() == 1.0
    assert accelerator.reduce(mine).item() == 3.0  # the method's default is "sum", as in Accelerate
    assert convoy.broadcast(mine.clone(), from_process=1).item() == 2.0
    assert convoy.broadcast_object_list([rank], from_process=1) == [1]
    copied = convoy.copy_tensor_to_devices(torch.tensor([7, 8]) if rank == 0 else None)
    assert copied.tolist() == [7, 8]
    generator = torch.Generator().manual_seed(rank)
    convoy.synchronize_rng_states(["generator"], generator=generator)
    assert convoy.gather(torch.rand(1, generator=generator)).unique().numel() == 1
    try:
        convoy.pad_across_processes(torch.zeros(2) if rank == 0 else torch.zeros(1, 2))
    except convoy.DistributedOperationError as exc:
        assert "different numbers of dimensions" in str(exc)
    else:
        raise AssertionError("pad_across_processes padded tensors of different ndim")
    print("ACCELERATE NAMES OK", flush=True)
    accelerator.end_training()


if __name__ == "__main__":
    main()
