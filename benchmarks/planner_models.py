"""Small, faithful plain-PyTorch copies of three Hugging Face decoder families, built from a ``config.json`` dict.

    from planner_models import build, causal_lm_loss
    model = build({"model_type": "llama", "hidden_size": 256, ...}, attention="sdpa")
    loss = causal_lm_loss(model(ids), ids)

What matters here is memory, so each block performs the same tensor operations, in the same order and
dtypes, as ``transformers``' modeling code (GPT2Block, LlamaDecoderLayer, GPTNeoXLayer; transformers 4.5x and
5.x): Conv1D as ``addmm``, ``gelu_new`` written out (``pow``, ``tanh``, two ``mul``), ``LlamaRMSNorm`` with its
fp32 upcast, rotary embeddings from fp32 ``cos``/``sin``, SwiGLU, GPT-NeoX's partial rotary and parallel
residual, and the loss's ``logits.float()`` upcast. ``transformers`` is not needed (the benchmark uses it
instead when installed and ``--hf`` is given).

``cuda_rules=True`` makes CPU autocast behave as CUDA autocast for the ops whose lists differ: CUDA autocast
runs ``softmax``, ``pow``, ``layer_norm``, ``rsqrt`` and ``log_softmax`` in float32 (PyTorch's "Autocast Op
Reference", CUDA ops that can autocast to float32), CPU autocast does not. The explicit ``.float()`` casts it
inserts are exactly the casts CUDA autocast makes, so CPU MemTracker runs see what a GPU would keep.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["build", "causal_lm_loss", "GPT2", "Llama", "GPTNeoX", "CONFIGS"]


def _cuda_fp32(x: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """The float32 cast CUDA autocast makes for an op on its fp32 list (only when emulating it on the CPU)."""
    if getattr(module, "cuda_rules", False) and x.device.type == "cpu" and torch.is_autocast_enabled("cpu"):
        return x.float()
    return x


def _dropout(x: torch.Tensor, p: float, mod: nn.Module) -> torch.Tensor:
    """F.dropout; when emulating CUDA on the CPU, the fused ``native_dropout`` CUDA uses (a bool mask is saved;
    CPU's unfused dropout saves a noise tensor of the input's dtype instead)."""
    if getattr(mod, "cuda_rules", False) and mod.training and 0 < p < 1 and x.device.type == "cpu":
        return torch.native_dropout(x, p, True)[0]
    return F.dropout(x, p=p, training=mod.training)


def _attention(mod: nn.Module, q, k, v, *, impl: str, dropout: float, scale: float, softmax_dtype=None):
    """SDPA (fused) or HF's eager path; q (b, a, s, d), k/v (b, kv, s, d); returns (b, s, a, d)."""
    b, a, s, d = q.shape
    if impl == "sdpa":
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout if mod.training else 0.0, is_causal=True,
                                             scale=scale, enable_gqa=k.shape[1] != a)
        return out.transpose(1, 2)
    if k.shape[1] != a:  # HF repeat_kv
        rep = a // k.shape[1]
        k = k[:, :, None].expand(b, k.shape[1], rep, s, d).reshape(b, a, s, d)
        v = v[:, :, None].expand(b, v.shape[1], rep, s, d).reshape(b, a, s, d)
    w = torch.matmul(q, k.transpose(2, 3)) * scale
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    w = w.masked_fill(~mask, torch.finfo(w.dtype).min)
    if softmax_dtype is not None:  # Llama / NeoX: softmax(..., dtype=float32).to(query.dtype)
        w = F.softmax(w, dim=-1, dtype=softmax_dtype).to(q.dtype)
    else:  # GPT-2: softmax (fp32 under CUDA autocast), then .type(value.dtype)
        w = F.softmax(_cuda_fp32(w, mod), dim=-1).type(v.dtype)
    w = _dropout(w, dropout, mod)
    return torch.matmul(w, v).transpose(1, 2)


class Conv1D(nn.Module):
    """HF's GPT-2 Conv1D: ``addmm(bias, x, weight)`` with the weight stored (in, out)."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        out = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return out.view(x.size()[:-1] + (out.size(-1),))


class LayerNorm(nn.LayerNorm):
    def forward(self, x):
        x = _cuda_fp32(x, self)
        if x.dtype != self.weight.dtype:  # 16-bit weights (FSDP2's param_dtype): CUDA autocast casts them too
            return F.layer_norm(x, self.normalized_shape, _cuda_fp32(self.weight, self), _cuda_fp32(self.bias, self),
                                self.eps)
        return super().forward(x)


def gelu_new(x: torch.Tensor, mod: nn.Module) -> torch.Tensor:
    """transformers' NewGELUActivation, op for op (``pow`` is on CUDA autocast's fp32 list)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(_cuda_fp32(x, mod), 3.0))))


class GPT2Block(nn.Module):
    def __init__(self, c: Mapping[str, Any], impl: str) -> None:
        super().__init__()
        h, f = c["n_embd"], c.get("n_inner") or 4 * c["n_embd"]
        self.heads, self.impl = c["n_head"], impl
        self.p_attn, self.p_resid = c.get("attn_pdrop", 0.1), c.get("resid_pdrop", 0.1)
        self.act = c.get("activation_function", "gelu_new")
        self.ln_1, self.ln_2 = LayerNorm(h, eps=c.get("layer_norm_epsilon", 1e-5)), LayerNorm(h)
        self.c_attn, self.c_proj = Conv1D(3 * h, h), Conv1D(h, h)
        self.c_fc, self.mlp_proj = Conv1D(f, h), Conv1D(h, f)

    def forward(self, x):
        b, s, h = x.shape
        d = h // self.heads
        q, k, v = self.c_attn(self.ln_1(x)).split(h, dim=2)
        q, k, v = (t.view(b, s, self.heads, d).transpose(1, 2) for t in (q, k, v))
        out = _attention(self, q, k, v, impl=self.impl, dropout=self.p_attn, scale=d ** -0.5)
        out = _dropout(self.c_proj(out.reshape(b, s, h)), self.p_resid, self)
        x = x + out
        y = self.c_fc(self.ln_2(x))
        y = gelu_new(y, self) if self.act == "gelu_new" else F.gelu(y, approximate="tanh")
        return x + _dropout(self.mlp_proj(y), self.p_resid, self)


class GPT2(nn.Module):
    def __init__(self, c: Mapping[str, Any], impl: str = "sdpa") -> None:
        super().__init__()
        h = c["n_embd"]
        self.wte, self.wpe = nn.Embedding(c["vocab_size"], h), nn.Embedding(c.get("n_positions", 1024), h)
        self.p_embd = c.get("embd_pdrop", 0.1)
        self.h = nn.ModuleList(GPT2Block(c, impl) for _ in range(c["n_layer"]))
        self.ln_f = LayerNorm(h, eps=c.get("layer_norm_epsilon", 1e-5))

    def forward(self, ids):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = _dropout(self.wte(ids) + self.wpe(pos), self.p_embd, self)
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied head


class RMSNorm(nn.Module):
    """LlamaRMSNorm, op for op."""

    def __init__(self, h: int, eps: float) -> None:
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(h)), eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        var = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(var + self.eps)
        return self.weight * x.to(dtype)


def _rotary(x, cos, sin):
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin


def _cos_sin(dim: int, s: int, theta: float, like: torch.Tensor):
    """fp32 cos/sin (HF computes them with autocast off) cast to the hidden states' dtype, shape (1, 1, s, dim)."""
    with torch.autocast(like.device.type, enabled=False):
        inv = 1.0 / theta ** (torch.arange(0, dim, 2, device=like.device, dtype=torch.float32) / dim)
        freqs = torch.outer(torch.arange(s, device=like.device, dtype=torch.float32), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(like.dtype)[None, None], emb.sin().to(like.dtype)[None, None]


class LlamaLayer(nn.Module):
    def __init__(self, c: Mapping[str, Any], impl: str) -> None:
        super().__init__()
        h, f = c["hidden_size"], c["intermediate_size"]
        self.heads = c["num_attention_heads"]
        self.kv = c.get("num_key_value_heads") or self.heads
        self.d = c.get("head_dim") or h // self.heads
        self.impl, self.p_attn = impl, c.get("attention_dropout", 0.0)
        bias = bool(c.get("attention_bias", False)) or c.get("model_type") == "qwen2"
        self.q_proj = nn.Linear(h, self.heads * self.d, bias=bias)
        self.k_proj = nn.Linear(h, self.kv * self.d, bias=bias)
        self.v_proj = nn.Linear(h, self.kv * self.d, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.d, h, bias=False)
        self.gate_proj, self.up_proj = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False)
        self.down_proj = nn.Linear(f, h, bias=False)
        eps = c.get("rms_norm_eps", 1e-6)
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(h, eps), RMSNorm(h, eps)

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        y = self.input_layernorm(x)
        q = self.q_proj(y).view(b, s, -1, self.d).transpose(1, 2)
        k = self.k_proj(y).view(b, s, -1, self.d).transpose(1, 2)
        v = self.v_proj(y).view(b, s, -1, self.d).transpose(1, 2)
        q, k = _rotary(q, cos, sin), _rotary(k, cos, sin)
        out = _attention(self, q, k, v, impl=self.impl, dropout=self.p_attn, scale=self.d ** -0.5,
                         softmax_dtype=torch.float32)
        x = x + self.o_proj(out.reshape(b, s, -1))
        y = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))


class Llama(nn.Module):
    def __init__(self, c: Mapping[str, Any], impl: str = "sdpa") -> None:
        super().__init__()
        h = c["hidden_size"]
        self.embed_tokens = nn.Embedding(c["vocab_size"], h)
        self.layers = nn.ModuleList(LlamaLayer(c, impl) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(h, c.get("rms_norm_eps", 1e-6))
        self.tied = bool(c.get("tie_word_embeddings", False))
        self.lm_head = None if self.tied else nn.Linear(h, c["vocab_size"], bias=False)
        self.theta, self.d = c.get("rope_theta", 10000.0), self.layers[0].d

    def forward(self, ids):
        x = self.embed_tokens(ids)
        cos, sin = _cos_sin(self.d, ids.shape[1], self.theta, x)
        for layer in self.layers:
            x = layer(x, cos, sin)
        x = self.norm(x)
        return F.linear(x, self.embed_tokens.weight) if self.tied else self.lm_head(x)


class NeoXLayer(nn.Module):
    def __init__(self, c: Mapping[str, Any], impl: str) -> None:
        super().__init__()
        h, f = c["hidden_size"], c.get("intermediate_size") or 4 * c["hidden_size"]
        self.heads, self.d = c["num_attention_heads"], h // c["num_attention_heads"]
        self.rot = int(self.d * c.get("rotary_pct", 0.25))
        self.impl, self.p_attn = impl, c.get("attention_dropout", 0.0)
        self.p_hidden = c.get("hidden_dropout", 0.0)
        self.parallel = c.get("use_parallel_residual", True)
        eps = c.get("layer_norm_eps", 1e-5)
        self.input_layernorm, self.post_attention_layernorm = LayerNorm(h, eps=eps), LayerNorm(h, eps=eps)
        self.query_key_value, self.dense = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.dense_h_to_4h, self.dense_4h_to_h = nn.Linear(h, f), nn.Linear(f, h)

    def _attn(self, y, cos, sin):
        b, s, h = y.shape
        qkv = self.query_key_value(y).view(b, s, -1, 3 * self.d).transpose(1, 2)
        q, k, v = qkv.chunk(3, dim=-1)
        q = torch.cat((_rotary(q[..., :self.rot], cos, sin), q[..., self.rot:]), dim=-1)
        k = torch.cat((_rotary(k[..., :self.rot], cos, sin), k[..., self.rot:]), dim=-1)
        out = _attention(self, q, k, v, impl=self.impl, dropout=self.p_attn, scale=self.d ** -0.5,
                         softmax_dtype=torch.float32)
        return _dropout(self.dense(out.reshape(b, s, h)), self.p_hidden, self)

    def forward(self, x, cos, sin):
        a = self._attn(self.input_layernorm(x), cos, sin)
        if self.parallel:
            m = self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(self.post_attention_layernorm(x))))
            return _dropout(m, self.p_hidden, self) + a + x
        x = a + x
        m = self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(self.post_attention_layernorm(x))))
        return _dropout(m, self.p_hidden, self) + x


class GPTNeoX(nn.Module):
    def __init__(self, c: Mapping[str, Any], impl: str = "sdpa") -> None:
        super().__init__()
        h = c["hidden_size"]
        self.embed_in = nn.Embedding(c["vocab_size"], h)
        self.layers = nn.ModuleList(NeoXLayer(c, impl) for _ in range(c["num_hidden_layers"]))
        self.final_layer_norm = LayerNorm(h, eps=c.get("layer_norm_eps", 1e-5))
        self.embed_out = nn.Linear(h, c["vocab_size"], bias=False)
        self.rot, self.theta = self.layers[0].rot, c.get("rotary_emb_base", 10000.0)

    def forward(self, ids):
        x = self.embed_in(ids)
        cos, sin = _cos_sin(self.rot, ids.shape[1], self.theta, x)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.embed_out(self.final_layer_norm(x))


_FAMILIES = {"gpt2": GPT2, "llama": Llama, "mistral": Llama, "qwen2": Llama, "gpt_neox": GPTNeoX}


def build(config: Mapping[str, Any], *, attention: str = "sdpa", cuda_rules: bool = False) -> nn.Module:
    """The model for ``config`` (a config.json dict); ``attention`` is ``"sdpa"`` or ``"eager"``."""
    model = _FAMILIES[config["model_type"]](config, attention)
    for m in model.modules():
        m.cuda_rules = cuda_rules
    return model


def causal_lm_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """transformers' ForCausalLMLoss: fp32 upcast of the logits, labels shifted with -100 padding, mean CE."""
    logits = logits.float()
    labels = F.pad(ids, (0, 1), value=-100)[..., 1:]
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


#: the benchmark's models (config.json dicts, as on the Hub; the 1.1B one is TinyLlama-1.1B's shape)
CONFIGS: dict[str, dict[str, Any]] = {
    "gpt2-124m": {"model_type": "gpt2", "n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257,
                  "n_positions": 1024, "activation_function": "gelu_new"},
    "pythia-410m": {"model_type": "gpt_neox", "hidden_size": 1024, "num_hidden_layers": 24,
                    "num_attention_heads": 16, "intermediate_size": 4096, "vocab_size": 50304, "rotary_pct": 0.25,
                    "use_parallel_residual": True, "max_position_embeddings": 4096},
    "llama-1.1b-gqa": {"model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 22,
                       "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 5632,
                       "vocab_size": 32000, "max_position_embeddings": 4096},
    "qwen2-0.5b": {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14,
                   "num_key_value_heads": 2, "intermediate_size": 4864, "vocab_size": 151936,
                   "tie_word_embeddings": True, "max_position_embeddings": 32768},
}
