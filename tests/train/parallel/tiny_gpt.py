"""A tiny GPT for the parallelism tests: Llama-style module names, so default TP plans apply to it.

    model = TinyGPT(TinyConfig(vocab=32, dim=16, heads=4, layers=4))
    tied = TinyGPT(TinyConfig(tied=True))              # lm_head.weight is embed_tokens.weight
    logits = model(torch.randint(0, 32, (2, 8)))       # [2, 8, 32]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TinyConfig:
    vocab: int = 32
    dim: int = 16
    heads: int = 4
    layers: int = 4
    seq: int = 8
    hidden: int = 32
    tied: bool = False  # lm_head.weight is embed_tokens.weight (GPT-2, Gemma, tied Llama 3.2 / Qwen2)

    @property
    def num_attention_heads(self) -> int:  # Hugging Face's name, read by convoy's head check
        return self.heads

    @property
    def num_hidden_layers(self) -> int:
        return self.layers


class Attention(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.num_heads = cfg.heads
        self.head_dim = cfg.dim // cfg.heads
        self.q_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.k_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.v_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.o_proj = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # num_heads is the local head count under TP (convoy divides it); head_dim stays whole
        q, k, v = (p(x).view(b, s, self.num_heads, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.hidden, bias=False)
        self.down_proj = nn.Linear(cfg.hidden, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.input_layernorm = nn.LayerNorm(cfg.dim)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = nn.LayerNorm(cfg.dim)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class TinyGPT(nn.Module):
    def __init__(self, cfg: TinyConfig = TinyConfig()) -> None:
        super().__init__()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.dim)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        if cfg.tied:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def batch(cfg: TinyConfig, *, size: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same deterministic batch on every rank for a given step."""
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, cfg.vocab, (size, cfg.seq + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def reference_run(start: nn.Module, cfg: TinyConfig, *, steps: int, size: int, clip: float
                  ) -> tuple[nn.Module, list[float], list[float]]:
    """One process, AdamW with gradient-norm clipping: the model, losses and pre-clip norms to match."""
    import copy

    model = copy.deepcopy(start)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses, norms = [], []
    for step in range(steps):
        x, y = batch(cfg, size=size, step=step)
        loss = lm_loss(model(x), y)
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item())
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return model, losses, norms


def assert_matches_reference(name: str, full: dict, ref: nn.Module, losses: list[float], ref_losses: list[float],
                             norms: list[float], ref_norms: list[float], *, clip: float) -> str:
    """Assert a parallel run equals ``reference_run`` (fp32 tolerances); returns the diffs as a line to print."""
    ref_sd = ref.state_dict()
    assert set(full) == set(ref_sd), sorted(set(full) ^ set(ref_sd))
    pdiff = max((full[k] - ref_sd[k]).abs().max().item() for k in ref_sd)
    ldiff = max(abs(a - b) for a, b in zip(losses, ref_losses))
    ndiff = max(abs(a - b) for a, b in zip(norms, ref_norms))
    assert ldiff < 1e-5 and ndiff < 1e-4 and pdiff < 2e-5, (name, losses, ref_losses, norms, ref_norms, pdiff)
    assert min(norms) > clip, norms  # clipping was active in every step
    return f"loss diff {ldiff:.1e} norm diff {ndiff:.1e} (norms {norms[0]:.4f}..) param diff {pdiff:.1e}"
