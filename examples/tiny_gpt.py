"""A tiny GPT trained with the strategy the launcher names, e.g. zero3 (FSDP2: parameters, gradients and optimizer
state sharded).

    convoy launch --nproc-per-node 2 --strategy zero3 examples/tiny_gpt.py --steps 30
    python examples/tiny_gpt.py --steps 30 --strategy zero3    # one process: a one-rank mesh, same code

The script passes no setting of its own to ``Accelerator()``: the launcher's ``--strategy``,
``--mixed-precision``, ``--gradient-accumulation-steps`` (what ``convoy plan`` prints) are what it runs; its
``--strategy`` overrides the launcher's, and the Accelerator says so.

It learns a synthetic language (each token predicts the next: t -> (3 t + 1) mod vocab), so the loss visibly
falls within a few dozen steps on a CPU.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from convoy import Accelerator


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq = x.shape[1]
        mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=x.device), diagonal=1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 64, heads: int = 4, layers: int = 2, seq: int = 32) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))  # each block sharded on its own
        # no bias in the output layer, as GPT-2's and Llama's: a biased nn.Linear over (batch, seq, dim) returns a
        # view (torch's addmm over the flattened input, reshaped), which FSDP2 warns about on every rank
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def corpus(n: int, seq: int, vocab: int) -> TensorDataset:
    start = torch.randint(0, vocab, (n, 1), generator=torch.Generator().manual_seed(0))
    ids = [start]
    for _ in range(seq):
        ids.append((3 * ids[-1] + 1) % vocab)
    ids = torch.cat(ids, dim=1)
    return TensorDataset(ids[:, :-1], ids[:, 1:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--strategy", default=None, help="default: the launcher's --strategy, else auto")
    args = parser.parse_args()

    accelerator = Accelerator(strategy=args.strategy)
    torch.manual_seed(0)
    model = TinyGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = DataLoader(corpus(2048, 32, 64), batch_size=args.batch_size, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accelerator.print(f"tiny GPT, {sum(p.numel() for p in TinyGPT().parameters())} parameters, "
                      f"strategy={accelerator.strategy.name} on {accelerator.num_processes} process(es)")
    step = 0
    while step < args.steps:
        for x, y in loader:
            with accelerator.accumulate(model):  # --gradient-accumulation-steps batches per optimizer step
                logits = model(x)
                loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()
            if step % 10 == 0 or step == args.steps - 1:
                mean = accelerator.reduce(loss.detach(), "mean")
                accelerator.print(f"step {step:3d} loss {mean.item():.3f}")
            step += 1
            if step == args.steps:
                break
    accelerator.end_training()


if __name__ == "__main__":
    main()
