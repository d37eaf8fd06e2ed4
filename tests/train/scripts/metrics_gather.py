"""What ``gather_for_metrics`` returns at each step of a prepared loader, as JSON, under Accelerate or convoy.

    python metrics_gather.py accelerate|convoy      # one process: both libraries run it
    convoy launch --nproc-per-node N metrics_gather.py convoy

For every case (dataset length, split_batches, even_batches; batch size 6) and every kind of input (the batch
itself, a tensor that is not batch-sized, a nested structure, a Python object through ``use_gather_object``),
rank 0 prints one JSON line: the case and what was gathered at each step (its length, or the values). On
several processes only ``even_batches=True``: without it the ranks' last steps differ, and a script pads.
"""
import itertools
import json
import sys

import torch
from torch.utils.data import DataLoader

if sys.argv[1] == "accelerate":
    from accelerate import Accelerator, DataLoaderConfiguration
else:
    from convoy import Accelerator, DataLoaderConfiguration


def gathered(accelerator, batch, kind):
    if kind == "batch":
        return accelerator.gather_for_metrics(batch).tolist()
    if kind == "not_batch_sized":
        return len(accelerator.gather_for_metrics(torch.ones(4)))
    if kind == "nested":
        out = accelerator.gather_for_metrics({"ids": batch, "pair": (batch * 2, torch.ones(3))})
        return [out["ids"].tolist(), out["pair"][0].tolist(), len(out["pair"][1])]
    return accelerator.gather_for_metrics([int(x) for x in batch], use_gather_object=True)


def main() -> None:
    kinds = ["batch", "not_batch_sized", "nested", "object"]
    for length, split, even, kind in itertools.product([10, 12, 13], [False, True], [True, False], kinds):
        if not even and int(torch.distributed.is_initialized() and torch.distributed.get_world_size()) > 1:
            continue
        accelerator = Accelerator(dataloader_config=DataLoaderConfiguration(split_batches=split, even_batches=even))
        loader = accelerator.prepare(DataLoader(torch.arange(length), batch_size=6))
        steps = [gathered(accelerator, batch, kind) for batch in loader]
        if accelerator.is_main_process:
            print(json.dumps({"case": [length, split, even, kind], "steps": steps}), flush=True)


if __name__ == "__main__":
    main()
