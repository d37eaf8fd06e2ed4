"""What prepared dataloaders hand out, globally, on however many processes this was launched with.

    convoy launch --nproc-per-node 2 data_order.py --out result.json

Rank 0 writes, per case, the global sample order (each step's batches gathered with ``gather_for_metrics``,
in rank order) and the parameters of a model trained on shuffled data; ``tests/train/data/test_data_order.py``
compares them with plain one-process PyTorch.
"""

from __future__ import annotations

import argparse
import json

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from convoy import Accelerator
from convoy.train import DataLoaderConfiguration

N = 22  # not a multiple of any global batch below: the last step is padded and truncated again
B = 3


class Indices(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, index):  # an int, or a list of ints (a BatchSampler used as the sampler)
        return torch.tensor(index)


class Stream(IterableDataset):
    def __iter__(self):
        yield from (torch.tensor(i) for i in range(N))


class Uneven:  # a batch sampler with no .sampler and no .batch_size
    def __iter__(self):
        return iter([[0, 1, 2], [3], [4, 5, 6, 7], [8, 9], [10, 11, 12], [13]])

    def __len__(self) -> int:
        return 6


def global_order(acc: Accelerator, loader, epochs: int = 2, set_epoch: int | None = None) -> list[list[int]]:
    loader = acc.prepare(loader)
    assert isinstance(loader, DataLoader), type(loader)
    out = []
    for epoch in range(epochs):
        if set_epoch is not None:
            loader.set_epoch(set_epoch + epoch)
        seen = []
        for batch in loader:
            seen += acc.gather_for_metrics(batch.reshape(-1)).tolist()
        out.append(seen)
    return out


def train(acc: Accelerator) -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs = torch.linspace(-1, 1, 24).unsqueeze(1)
    data = torch.utils.data.TensorDataset(xs, 3 * xs + 1)
    loader = DataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(5))
    model, opt, loader = acc.prepare(model, opt, loader)
    for _ in range(2):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
    return [p.item() for p in acc.unwrap_model(model).parameters()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    acc = Accelerator()
    rank = acc.process_index
    result = {}
    result["generator"] = global_order(acc, DataLoader(Indices(), batch_size=B, shuffle=True,
                                                       generator=torch.Generator().manual_seed(7)))
    torch.manual_seed(5 + 1000 * rank)  # rank 0's seed decides, as in Accelerate
    result["global_seed"] = global_order(acc, DataLoader(Indices(), batch_size=B, shuffle=True))
    sampler = BatchSampler(RandomSampler(Indices(), generator=torch.Generator().manual_seed(9)), B, False)
    result["batch_sampler_as_sampler"] = global_order(acc, DataLoader(Indices(), sampler=sampler, batch_size=None))
    result["stream"] = global_order(acc, DataLoader(Stream(), batch_size=B))
    result["no_batch_size"] = global_order(acc, DataLoader(Indices(), batch_size=None), epochs=1)
    acc.even_batches = False  # a batch sampler without batch_size cannot be evened out
    uneven = acc.prepare(DataLoader(Indices(), batch_sampler=Uneven()))  # ranks' batches differ in size
    acc.even_batches = True
    result["uneven_batch_sampler"] = sorted({i for batch in uneven
                                             for i in acc.gather_for_metrics(batch.tolist(), use_gather_object=True)})
    acc.dataloader_config = DataLoaderConfiguration(use_seedable_sampler=True, data_seed=11)
    result["seedable"] = global_order(acc, DataLoader(Indices(), batch_size=B, shuffle=True), set_epoch=3)
    acc.dataloader_config = DataLoaderConfiguration(dispatch_batches=True)  # process 0 reads, sends the slices
    result["dispatch_stream"] = global_order(acc, DataLoader(Stream(), batch_size=B))
    torch.manual_seed(5 + 1000 * rank)
    result["dispatch_global_seed"] = global_order(acc, DataLoader(Indices(), batch_size=B, shuffle=True))
    acc.dataloader_config = DataLoaderConfiguration()
    result["trained"] = train(acc)
    if acc.is_main_process:
        with open(args.out, "w") as f:
            json.dump(result, f)
    acc.end_training()


if __name__ == "__main__":
    main()
