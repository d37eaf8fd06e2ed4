"""A small classifier on synthetic data, trained with convoy.Accelerator.

    convoy launch examples/classifier.py --epochs 2    # one process per device (2 on a CPU box: --nproc-per-node 2)
    python examples/classifier.py --epochs 2                 # one process

The code is Accelerate's quick-tour loop; only the import line names convoy.
"""

from __future__ import annotations

import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset

from convoy import Accelerator


def make_data(n: int, seed: int) -> TensorDataset:
    centers = torch.randn(4, 16, generator=torch.Generator().manual_seed(0)) * 2.0  # the same classes everywhere
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (n,), generator=g)
    return TensorDataset(centers[labels] + torch.randn(n, 16, generator=g), labels)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--strategy", default=None)
    args = parser.parse_args()

    accelerator = Accelerator(strategy=args.strategy)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    train = DataLoader(make_data(4096, 1), batch_size=args.batch_size, shuffle=True)
    test = DataLoader(make_data(1000, 2), batch_size=args.batch_size)
    model, optimizer, train, test = accelerator.prepare(model, optimizer, train, test)
    accelerator.print(f"training on {accelerator.num_processes} process(es), {accelerator.distributed_type}")

    for epoch in range(args.epochs):
        model.train()
        for step, (x, y) in enumerate(train):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if step % 20 == 0:
                accelerator.print(f"epoch {epoch} step {step:3d}/{len(train)} loss {loss.item():.4f}")
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for x, y in test:
                pred, y = accelerator.gather_for_metrics((model(x).argmax(-1), y))
                correct += (pred == y).sum().item()
                total += y.numel()
        accelerator.print(f"epoch {epoch} accuracy {correct / total:.3f} on {total} samples")
    accelerator.end_training()


if __name__ == "__main__":
    main()
