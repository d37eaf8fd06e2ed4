"""Tiny transformers models with random weights (no download), for the layout tests.

    model = tiny("llama")                       # LlamaForCausalLM, 2 layers, hidden 32, vocab 64, no dropout
    ids = token_batch(step=0)                   # [4, 8] ids, the same on every rank for a step
    loss = model(input_ids=ids, labels=ids).loss

Families: llama, qwen2, gpt2 (Conv1D projections, fused c_attn, tied embedding; convoy's built-in tp plan), phi3
(fused qkv_proj and gate_up_proj; its plan gathers and splits them: colwise_gather_output, rowwise_split_input),
qwen3 (per-head q/k norms: replicated_with_grad_allreduce), granite_swa (per-head attention sinks: a plan entry
naming a parameter, its attention module local_params; untied here, as its own plan splits embedding and head apart,
which a tied pair is the ties work's).
"""

from __future__ import annotations

import torch

VOCAB, HIDDEN, LAYERS, HEADS, SEQ, BATCH = 64, 32, 2, 4, 8, 4
FAMILIES = ("llama", "qwen2", "gpt2", "phi3", "qwen3", "granite_swa")


def tiny(family: str, *, seed: int = 0) -> torch.nn.Module:
    """A freshly initialised causal LM of ``family`` (same weights for the same seed on every rank)."""
    import transformers as T

    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, use_cache=False, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    configs = {
        "llama": lambda: (T.LlamaForCausalLM, T.LlamaConfig(**common, num_key_value_heads=2)),
        "qwen2": lambda: (T.Qwen2ForCausalLM, T.Qwen2Config(**common, num_key_value_heads=2)),
        "qwen3": lambda: (T.Qwen3ForCausalLM, T.Qwen3Config(**common, num_key_value_heads=2, head_dim=8)),
        "phi3": lambda: (T.Phi3ForCausalLM, T.Phi3Config(**common, num_key_value_heads=2)),
        "granite_swa": lambda: (T.GraniteSWAForCausalLM,
                                T.GraniteSWAConfig(**common, num_key_value_heads=2, tie_word_embeddings=False)),
        "gpt2": lambda: (T.GPT2LMHeadModel, T.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                                                        n_positions=SEQ * 2, resid_pdrop=0.0, embd_pdrop=0.0,
                                                        attn_pdrop=0.0, use_cache=False, bos_token_id=0,
                                                        eos_token_id=0)),
    }
    cls, config = configs[family]()
    torch.manual_seed(seed)
    model = cls(config)
    for name, param in model.named_parameters():
        if name.endswith(".sinks"):  # initialised to zeros: make each head's differ, so a misplaced one shows
            torch.nn.init.normal_(param)
    return model


def token_batch(*, step: int, size: int = BATCH) -> torch.Tensor:
    """The same ids on every rank for a given step (inputs and labels: the model shifts them)."""
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, VOCAB, (size, SEQ), generator=g)
