"""``Accelerator(recompute=MODE)`` on one CUDA device, run by tests/gpu/test_recompute_gpu.py, a fresh process per mode.

    python tests/gpu/scripts/recompute_cuda.py selective single /tmp/params-selective.pt   # none | selective | full
    python tests/gpu/scripts/recompute_cuda.py full zero3 /tmp/params-full.pt              # single | zero3
    python tests/gpu/scripts/recompute_cuda.py full single /tmp/p.pt --smoke               # tiny, on the CPU too

Trains transformers' Llama (8 layers of 1024, GQA 16/4, sequence 1024 x batch 8, bf16) for 9 AdamW steps with the
mode asked for, saves the parameters (CPU tensors) to the path given, and prints ``REPORT <json>``: the plan
report's measured peak (``torch.cuda.max_memory_allocated`` over steps 3-7) and the plan's for that recomputation,
the case the plan names, and the blocks' forward calls per step (twice each with recomputation). ``--smoke`` runs
2 layers of 64 on whatever device there is, to check the script itself.
"""

import dataclasses
import json
import sys

import torch

from convoy import Accelerator

SEQ, BATCH = 1024, 8
SHAPE = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
             num_key_value_heads=4, vocab_size=8192)
if "--smoke" in sys.argv:
    SEQ, BATCH = 32, 2
    SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=128)


def llama() -> "torch.nn.Module":
    """A Llama the planner reads by its config (transformers' own model, SDPA attention)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(**SHAPE, attn_implementation="sdpa"))


def main(mode: str, strategy: str, out: str) -> None:
    acc = Accelerator(strategy=strategy, mixed_precision="bf16", recompute=mode)
    torch.manual_seed(0)
    model = llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, optimizer = acc.prepare(model, optimizer)
    calls = [0]
    for block in acc.unwrap_model(model).model.layers:
        block.mlp.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    generator = torch.Generator().manual_seed(1)
    for _ in range(9):
        ids = torch.randint(0, SHAPE["vocab_size"], (BATCH, SEQ), generator=generator).to(acc.device)
        acc.backward(model(ids, labels=ids).loss)
        optimizer.step()
        optimizer.zero_grad()
    report = acc.plan_report()
    full = acc.strategy.full_model_state_dict(model)
    torch.save({k: v.float().cpu() for k, v in full.items()}, out)
    calls_per_step = calls[0] / 9 / SHAPE["num_hidden_layers"]
    print("REPORT", json.dumps({**dataclasses.asdict(report), "memory_ratio": report.memory_ratio,
                                "calls_per_step": calls_per_step, "device": acc.device.type}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
