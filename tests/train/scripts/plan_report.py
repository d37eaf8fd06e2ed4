"""A few optimizer steps of a tiny GPT, then ``accelerator.plan_report()`` on every rank.

    convoy launch --nproc-per-node 2 tests/train/scripts/plan_report.py --strategy zero3 --mixed-precision bf16

Logging is configured at INFO, so the Accelerator's one line (logger ``convoy.train.plan_report``, main process)
appears on stderr. Each rank prints ``EARLY <json>`` (the report after step 3, still measuring) and ``REPORT <rank>
<json>`` (the report after the last step) with the report's fields, its ratios and the model's shape as
``describe_module`` reads it.
"""

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repo root, for tests.*

import torch
from tests.distributed import exit_without_teardown
from torch import nn

from convoy.train.accelerator import Accelerator


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.num_heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.num_heads, d // self.num_heads).transpose(1, 3).unbind(2)
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 32, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def as_json(report) -> str:
    return json.dumps({**dataclasses.asdict(report), "time_ratio": report.time_ratio,
                       "memory_ratio": report.memory_ratio})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="zero3")
    parser.add_argument("--mixed-precision", default="no")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="LOG %(name)s: %(message)s")
    acc = Accelerator(strategy=args.strategy, mixed_precision=args.mixed_precision, collective_timeout=60)
    torch.manual_seed(0)
    model = TinyGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = acc.prepare(model, optimizer)
    for step in range(1, args.steps + 1):
        ids = torch.randint(0, 64, (4, 16))
        logits = model(ids)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
        acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if step == 3 and acc.is_main_process:
            print("EARLY", as_json(acc.plan_report()), flush=True)
    print("REPORT", acc.process_index, as_json(acc.plan_report()), flush=True)
    acc.wait_for_everyone()


if __name__ == "__main__":
    main()
    exit_without_teardown()
