"""A tiny GPT trained with tensor parallelism (DTensor ``parallelize_module``) through ``convoy.Accelerator``.

    convoy launch --nproc-per-node 2 examples/tiny_gpt_tp.py            # tp=2 on 2 CPU processes (gloo)
    convoy launch --nproc-per-node 4 --dp 2 --tp 2 examples/tiny_gpt_tp.py   # 2D: zero3+tp2 (FSDP2 over dp)
    convoy launch --nproc-per-node 2 examples/tiny_gpt_tp.py --sequence-parallel --save runs/tp

The model uses Hugging Face / Llama module names (q_proj, o_proj, gate_proj, ...), so convoy's default
plan splits it with no ``tp_plan`` given. The task is learnable (each token is the previous one plus one,
mod the vocabulary), so the loss falls to near zero within the run.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

from convoy import Accelerator
from convoy.train.plan_report import trainer_layout

VOCAB, DIM, HEADS, LAYERS, SEQ = 64, 64, 4, 4, 16


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.num_heads, self.head_dim = HEADS, DIM // HEADS  # convoy makes num_heads the local count
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(DIM, DIM, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (p(x).view(b, s, self.num_heads, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        return self.o_proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.self_attn = Attention()
        self.mlp = nn.ModuleDict({"gate_proj": nn.Linear(DIM, 4 * DIM, bias=False),
                                  "up_proj": nn.Linear(DIM, 4 * DIM, bias=False),
                                  "down_proj": nn.Linear(4 * DIM, DIM, bias=False)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        h = self.post_attention_layernorm(x)
        return x + self.mlp["down_proj"](F.silu(self.mlp["gate_proj"](h)) * self.mlp["up_proj"](h))


class TinyGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Parameter(torch.zeros(SEQ, DIM))
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids) + self.pos[: ids.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def make_batch(step: int, size: int, shard: int = 0, shards: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """The same global batch on every rank for a step; each data-parallel rank takes its slice."""
    g = torch.Generator().manual_seed(step)
    start = torch.randint(0, VOCAB, (size, 1), generator=g)
    seq = (start + torch.arange(SEQ + 1)) % VOCAB
    seq = seq.chunk(shards)[shard]
    return seq[:, :-1], seq[:, 1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--sequence-parallel", action="store_true")
    parser.add_argument("--save", default=None, help="directory for a torch.distributed.checkpoint at the end")
    args = parser.parse_args()

    torch.manual_seed(0)  # the same initial weights on every rank before they are split
    accelerator = Accelerator(strategy="tp", strategy_options={"sequence_parallel": args.sequence_parallel})
    model = TinyGPT()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    strategy = accelerator.strategy
    layout, _ = trainer_layout(strategy, accumulation=accelerator.gradient_accumulation_steps)  # convoy plan's name
    accelerator.print(f"layout {layout.name} ({strategy.dims.describe()})")
    for step in range(args.steps):
        x, y = make_batch(step, args.batch_size, strategy.data_parallel_rank, strategy.data_parallel_size)
        loss = lm_loss(model(x), y)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if step % 10 == 0 or step == args.steps - 1:
            accelerator.print(f"step {step:3d}  loss {loss.item():.4f}")
    if args.save:
        accelerator.save_state(args.save)
        with torch.no_grad():  # the loss the next step would see, to compare after loading elsewhere
            x, y = make_batch(args.steps, args.batch_size, strategy.data_parallel_rank, strategy.data_parallel_size)
            next_loss = lm_loss(model(x), y).item()
            accelerator.print(f"saved {args.save} (loadable at any tp degree); next loss {next_loss:.6f}")
    accelerator.end_training()


if __name__ == "__main__":
    main()
