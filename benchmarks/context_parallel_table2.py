"""torchtitan's context-parallel rows (benchmarks/llama3_h100_202412_torchtitan.md, table 2: Llama 3.1 8B on 8 H100s,
local batch 1, full activation checkpointing, FSDP + CP 1-8 at 32k-256k tokens, torch.compile + float8) as convoy's
planner costs them, run as torchtitan ran them.

    python benchmarks/context_parallel_table2.py

No GPU is needed. Each row is planned on the board torchtitan ran (H100 96GB HBM2e at 500 W: ``H100-96GB-500W``),
on torchtitan's stack (``convoy.plan.stacks``), with per-block torch.compile and torchao's tensorwise float8, as
benchmarks/published_results.py plans table 1's compiled float8 row (T1f). The second table splits each planned step:
the attention kernels (torch's ring: ``convoy.plan.ring``), the ring's fp32 merges and gradient accumulation, its
exposed transfers, and everything else (docs/planner-accuracy.md, section 10).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from convoy.plan.dims import ParallelDims  # noqa: E402
from convoy.plan.hardware import Hardware, lookup_gpu  # noqa: E402
from convoy.plan.memory import Layout, memory_per_gpu, reported_bytes  # noqa: E402
from convoy.plan.model import from_hf_config  # noqa: E402
from convoy.plan.ring import ring_kernels, ring_traffic_bytes  # noqa: E402
from convoy.plan.run import RunSpec  # noqa: E402
from convoy.plan.shapes import attention_shape  # noqa: E402
from convoy.plan.speed.rates import rates_for  # noqa: E402
from convoy.plan.timing import step_time  # noqa: E402

#: (sequence, cp, tokens/s per GPU, memory GiB) of table 2
PUBLISHED = ((32768, 1, 3890, 83.9), (65536, 2, 2540, 84.2), (131072, 4, 1071, 84.0), (262144, 8, 548, 84.5))
MODEL = from_hf_config({"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                        "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256,
                        "_name_or_path": "Llama 3.1 8B"})
HARDWARE = Hardware(gpu=lookup_gpu("H100-96GB-500W"), gpus_per_node=8, nodes=1, inter_gbps=3200)
STACK = "torchtitan"


def _run(seq: int) -> RunSpec:
    return RunSpec(seq_len=seq, micro_batch=1, precision="bf16-fsdp", recompute="full", compile="blocks",
                   fp8="tensorwise")


def _layout(cp: int) -> Layout:
    return Layout(dims=ParallelDims(dp_shard=8 // cp, cp=cp), zero_stage=3, microbatches=1)


def table() -> str:
    """Planned against published, per row."""
    lines = ["| FSDP x CP | sequence | published tok/s/GPU | planned tok/s/GPU (planned / published) | "
             "published / planned memory |", "|---|---|---|---|---|"]
    for seq, cp, published, gib in PUBLISHED:
        run, layout = _run(seq), _layout(cp)
        t = step_time(MODEL, run, layout, HARDWARE, global_batch=layout.dims.dp, stack=STACK)
        memory = reported_bytes(memory_per_gpu(MODEL, run, layout, stack=STACK), STACK) / 2**30
        lines.append(f"| {8 // cp} x {cp} | {seq} | {published:,} | {t.tokens_per_s_per_gpu:,.0f} "
                     f"({t.tokens_per_s_per_gpu / published:.2f}x) | {gib} / {memory:.1f} GiB |")
    return "\n".join(lines)


def breakdown() -> str:
    """Where each planned step goes: attention kernels, the ring's fp32 traffic, its exposed transfers, the rest."""
    rates = rates_for(HARDWARE.gpu)
    lines = ["| FSDP x CP | published step (seq / cp / tok/s) | planned step | attention kernels | "
             "ring merges (fp32) | ring exposed | the rest |", "|---|---|---|---|---|---|---|"]
    for seq, cp, published, _ in PUBLISHED:
        run, layout = _run(seq), _layout(cp)
        t = step_time(MODEL, run, layout, HARDWARE, global_batch=layout.dims.dp, stack=STACK)
        b, a, kv, s, d = attention_shape(MODEL, run)
        layers = MODEL.num_layers or 1
        if cp > 1:
            first, later = ring_kernels(rates, batch=b, heads=a, seq=s, head_dim=d, cp=cp, dtype="bf16")
            kernels = first + (cp - 1) * later
            merges, grads = ring_traffic_bytes(batch=b, heads=a, seq=s, head_dim=d, cp=cp)
            merge = layers * (2 * merges + grads) / rates.memory_bytes_per_s  # the forward twice: full recompute
        else:
            kernels, merge = rates.attention_seconds(b, a, kv, s, d, "bf16"), 0.0
        attention = layers * kernels * (1 + 1 / 3)  # full recompute: the forward (a third) again
        exposed = t.tp_comm
        rest = t.seconds - attention - merge - exposed
        lines.append(f"| {8 // cp} x {cp} | {seq / cp / published:.1f} s | {t.seconds:.1f} s | {attention:.1f} s | "
                     f"{merge:.2f} s | {exposed:.2f} s | {rest:.1f} s |")
    return "\n".join(lines)


def main() -> None:
    print(table())
    print()
    print(breakdown())


if __name__ == "__main__":
    main()
