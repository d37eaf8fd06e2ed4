"""torchtitan's context-parallel rows (benchmarks/llama3_h100_202412_torchtitan.md, table 2: Llama 3 8B on 8 H100s,
local batch 1, full activation checkpointing, CP 1-8 at 32k-256k tokens) as convoy's planner costs them.

    python benchmarks/context_parallel_table2.py

No GPU is needed. torchtitan's rows ran with torch.compile and fp8; the planner plans 16-bit eager PyTorch, so it
should be slower than them, not faster: the ratio printed is how far it is from them (docs/planner-accuracy.md, 10).
"""

from convoy.plan.dims import ParallelDims
from convoy.plan.hardware import parse_hardware
from convoy.plan.memory import Layout, memory_per_gpu
from convoy.plan.model import from_numbers
from convoy.plan.run import RunSpec
from convoy.plan.timing import step_time

#: (sequence, cp, tokens/s per GPU) of table 2
PUBLISHED = ((32768, 1, 3890), (65536, 2, 2540), (131072, 4, 1071), (262144, 8, 548))


def main() -> None:
    model = from_numbers(8.03e9, layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256)
    hw = parse_hardware("8xH100-80GB")
    print("| sequence | cp | published tok/s/GPU | planned tok/s/GPU (planned / published) | planned memory/GPU |")
    print("|---|---|---|---|---|")
    for seq, cp, published in PUBLISHED:
        dims = ParallelDims(dp_shard=8 // cp, cp=cp)
        layout = Layout(dims=dims, zero_stage=3, microbatches=1)
        run = RunSpec(seq_len=seq, recompute="full")
        t = step_time(model, run, layout, hw, global_batch=dims.dp)
        mem = memory_per_gpu(model, run, layout)
        print(f"| {seq} | {cp} | {published:,} | {t.tokens_per_s_per_gpu:,.0f} "
              f"({t.tokens_per_s_per_gpu / published:.2f}x) | {mem.total / 2**30:.1f} GiB |")


if __name__ == "__main__":
    main()
