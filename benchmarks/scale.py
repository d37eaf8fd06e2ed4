"""The planner's collectives and pipeline schedules at 10^3-10^4 GPUs, beside what published measurements show
(docs/planner-accuracy.md section 11).

    python benchmarks/scale.py

No GPU is needed: each line is NCCL's tuning model as ``convoy.plan.speed.collectives`` prices it, or the
schedule's idle time and critical-path sends as ``convoy.plan.schedules`` counts them, at the sizes the sources
measured. The last table splits a Llama 3 405B step as the Llama 3 paper lays the run out (TP 8 x PP 16 x DP 64 or
128, seq 8192, 16M tokens per step) into the parts the planner charges, and sets the planned per-GPU rate at 16K
GPUs over that at 8K beside the paper's (its table 4: 400 / 430 TFLOP/s), the change it puts down to fewer
micro-batches per step: a check of the bubble at p = 16, nothing fitted to it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from convoy.plan.dims import ParallelDims  # noqa: E402
from convoy.plan.hardware import Hardware, lookup_gpu  # noqa: E402
from convoy.plan.memory import Layout  # noqa: E402
from convoy.plan.model import from_hf_config  # noqa: E402
from convoy.plan.run import RunSpec  # noqa: E402
from convoy.plan.schedules import critical_transfers, pipeline_bubble  # noqa: E402
from convoy.plan.speed.collectives import Group, _seconds, choice  # noqa: E402
from convoy.plan.timing import NCCL_LINK_FRACTION, step_time  # noqa: E402

#: a rail-optimized node's GPU: one 400 Gbit/s NIC of its own (Llama 3's RoCE and InfiniBand clusters), at NCCL's
#: 0.96 of it; a Summit node: 2 x EDR (25 GB/s) for 6 GPUs; Selene: one 200 Gbit/s HDR NIC per A100
RAIL_400 = 50e9 * NCCL_LINK_FRACTION["net"]
SUMMIT = 25e9 / 6 * NCCL_LINK_FRACTION["net"]
HDR_200 = 25e9 * NCCL_LINK_FRACTION["net"]

LLAMA3_405B = from_hf_config({"model_type": "llama", "num_hidden_layers": 126, "hidden_size": 16384,
                              "num_attention_heads": 128, "num_key_value_heads": 8, "intermediate_size": 53248,
                              "vocab_size": 128256, "_name_or_path": "Llama 3 405B"})


def _ring(op: str, nbytes: float, group: Group) -> float:
    return min(_seconds(op, "ring", p, nbytes, group) for p in range(3))


def collectives() -> str:
    """One line per published point: the model's algorithm, protocol, time and bus bandwidth."""
    block = 3.19e9 / 8  # one Llama 3 405B block's parameters on one of 8 tp ranks
    cases = (
        ("NCCL 2.4 blog: 8 B all-reduce, 24,576 GPUs (Summit: 4,096 nodes x 6)", "all_reduce", 8,
         Group(ranks=24_576, nodes=4_096, bus_bytes_per_s=SUMMIT)),
        ("same, 1 GB", "all_reduce", 1e9, Group(ranks=24_576, nodes=4_096, bus_bytes_per_s=SUMMIT)),
        ("Llama 3 DP group (128 ranks, 1 per node, 400G rail): fp32 grads of a block, reduce-scatter",
         "reduce_scatter", 4 * block, Group(ranks=128, nodes=128, bus_bytes_per_s=RAIL_400)),
        ("same: bf16 weights of a block, all-gather", "all_gather", 2 * block,
         Group(ranks=128, nodes=128, bus_bytes_per_s=RAIL_400)),
        ("same: a norm's weights (16 KB), all-gather", "all_gather", 2 * 16384,
         Group(ranks=128, nodes=128, bus_bytes_per_s=RAIL_400)),
        ("same: DDP bucket (25 MiB), all-reduce", "all_reduce", 25 * 2**20,
         Group(ranks=128, nodes=128, bus_bytes_per_s=RAIL_400)),
        ("Megatron 2021, 3,072 A100s (TP 8 x PP 64 x DP 6): DDP bucket over 6 nodes", "all_reduce", 25 * 2**20,
         Group(ranks=6, nodes=6, bus_bytes_per_s=HDR_200)),
        ("ZeRO-3, 1,536 A100s on 192 nodes: a 24 KB gather", "all_gather", 24_576,
         Group(ranks=1_536, nodes=192, bus_bytes_per_s=HDR_200 * 8)),
    )
    lines = ["| collective | model picks | seconds | ring alone | bus bandwidth (of the link's) |",
             "|---|---|---|---|---|"]
    for name, op, nbytes, group in cases:
        algo, proto, seconds = choice(op, nbytes, group)
        factor = 2 * (group.ranks - 1) / group.ranks if op == "all_reduce" else (group.ranks - 1) / group.ranks
        bus = nbytes * factor / seconds
        lines.append(f"| {name} | {algo} {proto} | {seconds * 1e3:.3g} ms | {_ring(op, nbytes, group) * 1e3:.3g} ms"
                     f" | {bus / 1e9:.3g} GB/s ({bus / group.bus_bytes_per_s:.0%}) |")
    return "\n".join(lines)


def schedules() -> str:
    """The bubble and the critical-path sends of 1F1B and interleaved 1F1B at p = 16."""
    lines = ["| p = 16 | m = 8 | m = 16 | m = 32 |", "|---|---|---|---|"]
    for name, v in (("1f1b", 1), ("interleaved_1f1b", 2), ("interleaved_1f1b", 4), ("interleaved_1f1b", 8)):
        cells = [f"{pipeline_bubble(16, m, schedule=name, stages_per_rank=v):.3f} idle, "
                 f"{critical_transfers(16, m, schedule=name, stages_per_rank=v):.0f} sends waited"
                 for m in (8, 16, 32)]
        lines.append(f"| {name}{f', v {v}' if v > 1 else ''} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def llama3_405b() -> str:
    """A Llama 3 405B step split into what the planner charges, per schedule, and the efficiency at 16K GPUs over
    that at 8K: the paper's table 4 gives 400 / 430 TFLOP/s per GPU (0.93), which it puts down to the smaller batch
    per DP group (m 32 -> 16 at p = 16), so the bubble's growth."""
    lines = ["| GPUs (DP) | schedule | compute (of which bubble) | exposed DP | TP | PP sends | step | "
             "16K / 8K per-GPU rate |", "|---|---|---|---|---|---|---|---|"]
    # the paper's FSDP: optimizer state and gradients sharded, weights not resharded after the forward (ZeRO-2),
    # gradients reduce-scattered in fp32 (bf16-fsdp)
    run = RunSpec(seq_len=8192, micro_batch=1, precision="bf16-fsdp", recompute="none")
    for v in (1, 2, 4, 8):
        steps = {}
        for dp in (64, 128):
            hw = Hardware(gpu=lookup_gpu("H100-80GB"), gpus_per_node=8, nodes=16 * dp, inter_gbps=3200)
            layout = Layout(dims=ParallelDims(dp_shard=dp, tp=8, pp=16), zero_stage=2, microbatches=2048 // dp,
                            pp_schedule="interleaved_1f1b" if v > 1 else "1f1b", pp_stages_per_rank=v)
            steps[dp] = step_time(LLAMA3_405B, run, layout, hw, global_batch=2048)
        ratio = steps[64].seconds / 2 / steps[128].seconds
        for dp, t in steps.items():
            lines.append(f"| {128 * dp:,} ({dp}) | {'1F1B' if v == 1 else f'interleaved, v {v}'}, "
                         f"m {2048 // dp} | {t.compute:.2f} s ({t.bubble:.2f} s) | {t.exposed_dp:.2f} s | "
                         f"{t.tp_comm:.2f} s | {t.pp_comm:.3f} s | {t.seconds:.2f} s | "
                         f"{f'{ratio:.3f} (published 0.930)' if dp == 128 else ''} |")
    return "\n".join(lines)


def main() -> int:
    print(collectives())
    print("\n" + schedules())
    print("\n" + llama3_405b())
    return 0


if __name__ == "__main__":
    sys.exit(main())
