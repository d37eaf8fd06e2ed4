"""Compare the planner's per-category bytes with PyTorch's MemTracker on a real CPU training step.

    .venv/bin/python tests/plan/scripts/measure_accuracy.py            # prints a markdown table

A GPT-style model written the way the planner's formulas assume (LayerNorm, eager softmax attention, GELU
MLP of 4h, no dropout), fp32 AdamW, one step on the CPU with real tensors. MemTracker (torch.distributed.
_tools.mem_tracker) attributes every live tensor to parameters, gradients, optimizer state or activations;
the table shows its peak per category next to ``convoy.plan.memory.memory_per_gpu``.
"""

from __future__ import annotations

import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "src"))


class Block(nn.Module):
    def __init__(self, h: int, heads: int) -> None:
        super().__init__()
        self.n_head = heads
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.n_head, h // self.n_head).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(h // self.n_head), dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=2048, h=256, heads=8, layers=4) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, h)
        self.layers = nn.ModuleList(Block(h, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(h)
        self.head = nn.Linear(h, vocab, bias=False)

    def forward(self, ids):
        x = self.emb(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln_f(x))


def build() -> nn.Module:
    return GPT()


def measure(seq: int, batch: int) -> dict:
    from torch.distributed._tools.mem_tracker import MemTracker

    torch.manual_seed(0)
    model = build()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 2048, (batch, seq))
    mt = MemTracker()
    mt.track_external(model, opt, ids)
    with mt:
        for i in range(2):
            loss = F.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
            loss.backward()
            opt.step()
            opt.zero_grad()
            if i == 0:
                mt.reset_mod_stats()
    peak = next(iter(mt.get_tracker_snapshot("peak").values()))
    return {str(k).split(".")[-1].lower(): v for k, v in peak.items()}


def main() -> None:
    from convoy.plan.memory import Layout, memory_per_gpu
    from convoy.plan.model import from_factory
    from convoy.plan.run import RunSpec

    spec = from_factory(f"{__file__}:build")
    print(f"model: {spec.num_params:,} parameters, {spec.num_layers} blocks, h={spec.hidden}, a={spec.heads}")
    print("| s x b | category | MemTracker peak (MiB) | planner (MiB) | planner / measured |")
    print("|---|---|---:|---:|---:|")
    for seq, batch in ((128, 4), (256, 4), (512, 2)):
        run = RunSpec(seq_len=seq, micro_batch=batch, precision="fp32", attention="eager")
        est = memory_per_gpu(spec, run, Layout())
        t0 = time.perf_counter()
        got = measure(seq, batch)
        pairs = [("parameters", got.get("param", 0), est.params),
                 ("optimizer states", got.get("opt", 0), est.optimizer),
                 ("activations (incl. logits)", got.get("act", 0), est.activations),
                 ("temporaries (logits grad)", got.get("temp", 0), est.temporary),
                 ("peak allocated", got.get("total", 0), est.allocated)]
        for name, measured, estimate in pairs:
            ratio = f"{estimate / measured:.3f}" if measured else "n/a"
            print(f"| {seq} x {batch} | {name} | {measured / 2**20:.2f} | {estimate / 2**20:.2f} | {ratio} |")
        print(f"<!-- measured in {time.perf_counter() - t0:.1f} s; MemTracker categories at peak: {got} -->")


if __name__ == "__main__":
    main()
