"""The planner against published multi-GPU training results of other projects: step time (and memory where given).

    python benchmarks/published_results.py            # the markdown table of docs/planner-accuracy.md section 8
    python benchmarks/published_results.py --check    # exit 1 when a row without an explained deviation is
                                                      # more than 25 % off
    python benchmarks/published_results.py --held-out # the held-out runs (docs/planner-accuracy.md section 8b):
                                                      # benchmarks/published_heldout*.py, read only here

Each row is one published run, with its source, hardware, model, layout, batch and recompute as the source
states them (``Published``); the planner plans exactly that layout (``planned``: ``convoy.plan.memory`` and
``convoy.plan.timing`` on the shipped profile or the shape-aware model, no GPU needed). Published step times are
derived from what each source prints (tokens/s per GPU, or achieved FLOP/s with the source's own FLOP formula),
with the arithmetic in ``derivation``. Runs with torch.compile and float8 are planned with the planner's compile and
float8 pricing (``convoy.plan.speedups``): torchtitan's tables 1 and 3 give eager, compiled and compiled + float8
runs of one layout, and ``speedups()`` sets the planned gains beside the published ones.
``tests/plan/test_published_results.py`` keeps docs/planner-accuracy.md's table equal to this script's output.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from convoy.plan.dims import ParallelDims  # noqa: E402
from convoy.plan.hardware import Hardware, lookup_gpu  # noqa: E402
from convoy.plan.memory import Layout, memory_per_gpu, reported_bytes  # noqa: E402
from convoy.plan.model import ModelSpec, from_hf_config, from_numbers  # noqa: E402
from convoy.plan.run import RunSpec  # noqa: E402
from convoy.plan.timing import step_time  # noqa: E402

TARGET = 0.25


@dataclass(frozen=True, kw_only=True)
class Published:
    """One published training run and what the planner needs to plan it."""

    key: str
    source: str
    """Document or paper, and the table."""
    hardware: str
    """As the source states it (GPUs, memory, links)."""
    model: ModelSpec
    gpu: str
    """The planner's table row for the board."""
    gpus_per_node: int
    nodes: int
    inter_gbps: float
    """Network per node, Gbit/s (all NICs)."""
    dims: ParallelDims
    zero_stage: int
    seq: int
    micro_batch: int
    global_batch: int
    recompute: str
    precision: str
    """The planner's recipe for what the source ran (``bf16-fsdp``: FSDP with bf16 compute and fp32 shards)."""
    stack: str
    """The software it ran on, a name in ``convoy.plan.stacks.STACKS``: its GEMM library, attention, data-parallel
    schedule, save list and what it prints as memory."""
    software: str
    """The software as the source states it."""
    pp_stages_per_rank: int = 1
    """Virtual pipeline stages per GPU: above 1 the run used Megatron's interleaved 1F1B schedule."""
    compile: str = "none"
    """``torch.compile`` as the run applied it (``blocks``: torchtitan's per-block compile)."""
    fp8: str = "none"
    """The float8 recipe the run trained with (``tensorwise``: torchao's, with float8 FSDP all-gather)."""
    step_seconds: float
    derivation: str
    """How ``step_seconds`` follows from what the source prints."""
    memory_gib: float | None = None
    """Peak memory per GPU as published (GiB), where it is."""
    deviation: str = ""
    """What the plan does not model about this run (shown under the table); required where it is > 25 % off."""

    @property
    def how(self) -> str:
        """``bf16-fsdp``, ``bf16-fsdp + compile``, ``bf16-fsdp + compile + fp8 tensorwise``."""
        return self.precision + (" + compile" if self.compile != "none" else "") + (
            f" + fp8 {self.fp8}" if self.fp8 != "none" else "")

    @property
    def layout_name(self) -> str:
        d = self.dims
        parts = [f"{'FSDP' if self.zero_stage == 3 else 'ZeRO-1' if self.zero_stage == 1 else 'DP'} {d.dp}"]
        parts += [f"CP {d.cp}"] if d.cp > 1 else []
        parts += [f"TP {d.tp}"] if d.tp > 1 else []
        parts += [f"PP {d.pp}" + (f" (interleaved, v {self.pp_stages_per_rank})" if self.pp_stages_per_rank > 1
                                  else "")] if d.pp > 1 else []
        return " x ".join(parts)


def _llama(layers, hidden, heads, kv, ffn, vocab, name):
    return from_hf_config({"model_type": "llama", "num_hidden_layers": layers, "hidden_size": hidden,
                           "num_attention_heads": heads, "num_key_value_heads": kv, "intermediate_size": ffn,
                           "vocab_size": vocab, "_name_or_path": name})


def _gpt(params, layers, hidden, heads, vocab, name):
    """Megatron's and MPT's GPT: a GELU MLP of 4h, learned or ALiBi positions, multi-head attention."""
    return replace(from_numbers(params, layers=layers, hidden=hidden, heads=heads, vocab=vocab, ffn=4 * hidden),
                   name=name)


def _megatron_flops(batch, seq, layers, hidden, vocab=51200):
    """Narayanan et al. 2021, equation (3): 96·B·s·l·h²·(1 + s/6h + V/16lh), recomputation's forward included."""
    return 96 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def _megatron_params(layers, hidden, vocab=51200, seq=2048):
    """The same paper's equation (2): P = 12·l·h²·(1 + 13/12h + (V + s)/12lh)."""
    return 12 * layers * hidden**2 * (1 + 13 / (12 * hidden) + (vocab + seq) / (12 * layers * hidden))


def _table1(key, layers, hidden, heads, tp, pp, gpus, batch, micro, tflops, name, virtual=1):
    """One row of Narayanan et al. 2021's table 1 (micro-batch sizes from NVIDIA's examples/sc21/run_table_1.sh)."""
    flops = _megatron_flops(batch, 2048, layers, hidden)
    dp = gpus // (tp * pp)
    return Published(key=key, source=_MEGATRON, model=_gpt(_megatron_params(layers, hidden), layers, hidden, heads,
                                                           51200, name),
                     hardware=f"{gpus:,} x A100 80GB; {_SELENE}", gpu="A100-80GB", gpus_per_node=8, nodes=gpus // 8,
                     inter_gbps=1600, dims=ParallelDims(dp_replicate=dp, tp=tp, pp=pp), zero_stage=0, seq=2048,
                     micro_batch=micro, global_batch=batch, recompute="full", precision="bf16",
                     stack="megatron-2021", software=_MEGATRON_SOFTWARE, pp_stages_per_rank=virtual,
                     step_seconds=flops / (gpus * tflops * 1e12),
                     derivation=f"Megatron's 96·B·s·l·h²·(1 + s/6h + V/16lh) = {flops:.4g} FLOPs / ({gpus:,} x "
                                f"{tflops} TFLOP/s)")


LLAMA3_8B = _llama(32, 4096, 32, 8, 14336, 128256, "Llama 3.1 8B")
LLAMA3_70B = _llama(80, 8192, 64, 8, 28672, 128256, "Llama 3 70B")
LLAMA2_7B = _llama(32, 4096, 32, 32, 11008, 32000, "Llama 2 7B")
MPT_7B = _gpt(6_658_859_008, 32, 4096, 32, 50368, "MPT-7B")
MPT_70B = _gpt(64_862_437_376, 80, 8192, 64, 50368, "MPT-70B")
MPT_13B = _gpt(12_853_954_560, 40, 5120, 40, 50368, "MPT-13B")
MPT_30B = _gpt(29_975_214_080, 48, 7168, 56, 50368, "MPT-30B")

_TORCHTITAN_H100 = ("pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (Dec 2024)")
_FOUNDRY = "mosaicml/llm-foundry scripts/train/benchmarking/README.md"
_MEGATRON = "Narayanan et al. 2021 (arXiv:2104.04473), table 1"
_SELENE = "DGX A100 80GB, NVSwitch, 8 x 200 Gbit/s HDR InfiniBand per node"
_MEGATRON_SOFTWARE = "Megatron-LM (2021; its README: NGC PyTorch 20.12, PyTorch 1.8, CUDA 11.1, NCCL 2.8.3)"
_TORCHTITAN_SOFTWARE = "torchtitan (Dec 2024), torch main of 2024-12-23 (1963fc8), FSDP2, per-op selective AC"
_FOUNDRY_SOFTWARE = ("llm-foundry / Composer, PyTorch FSDP1 (FULL_SHARD, limit_all_gathers in its yamls), flash "
                     "attention")

_T1 = Published(key="T1", source=f"{_TORCHTITAN_H100}, table 1", model=LLAMA3_8B,
               hardware="8 x H100 96GB HBM2e (500 W), NVLink", gpu="H100-96GB-500W", gpus_per_node=8, nodes=1,
               inter_gbps=3200, dims=ParallelDims(dp_shard=8), zero_stage=3, seq=8192, micro_batch=2,
               global_batch=16, recompute="selective", precision="bf16-fsdp", stack="torchtitan",
               software=_TORCHTITAN_SOFTWARE, step_seconds=16 * 8192 / (5762 * 8),
               derivation="16 x 8192 tokens / (5,762 tokens/s/GPU x 8)", memory_gib=82.4)
_T2 = Published(key="T2", source=f"{_TORCHTITAN_H100}, table 3", model=LLAMA3_8B,
               hardware="128 x H100 96GB HBM2e (500 W), NVLink, 400 Gbit/s RDMA per GPU", gpu="H100-96GB-500W",
               gpus_per_node=8, nodes=16, inter_gbps=3200, dims=ParallelDims(dp_shard=128), zero_stage=3, seq=8192,
               micro_batch=2, global_batch=256, recompute="selective", precision="bf16-fsdp", stack="torchtitan",
               software=_TORCHTITAN_SOFTWARE, step_seconds=2 * 8192 / 5605,
               derivation="2 x 8192 tokens per GPU / 5,605 tokens/s/GPU",
               memory_gib=67.0)

_ROWS: tuple[Published, ...] = (
    _T1,
    *(replace(_T1, key=f"T1{suffix}", compile="blocks", fp8=fp8, step_seconds=16 * 8192 / (tps * 8),
              derivation=f"16 x 8192 tokens / ({tps:,} tokens/s/GPU x 8)", memory_gib=gib)
      for suffix, fp8, tps, gib in (("c", "none", 6667, 77.0), ("f", "tensorwise", 8532, 76.8))),
    Published(key="T3", source="pytorch/torchtitan docs/performance.md (Llama 3, 64 A100)", model=LLAMA3_8B,
              hardware="64 x A100 80GB (links not stated)", gpu="A100-80GB", gpus_per_node=8, nodes=8,
              inter_gbps=1600, dims=ParallelDims(dp_shard=64), zero_stage=3, seq=8192, micro_batch=1,
              global_batch=64, recompute="selective", precision="bf16-fsdp", stack="torchtitan",
              software="torchtitan (2024), PyTorch 2.x, FSDP2, per-op selective AC", step_seconds=8192 / 2973,
              derivation="64 x 8192 tokens / (2,973 tokens/s/GPU x 64)"),
    Published(key="T3b", source="pytorch/torchtitan docs/performance.md (Llama 3, 64 A100)", model=LLAMA3_70B,
              hardware="64 x A100 80GB (links not stated)", gpu="A100-80GB", gpus_per_node=8, nodes=8,
              inter_gbps=1600, dims=ParallelDims(dp_shard=64), zero_stage=3, seq=8192, micro_batch=1,
              global_batch=64, recompute="full", precision="bf16-fsdp", stack="torchtitan",
              software="torchtitan (2024), PyTorch 2.x, FSDP2, full AC", step_seconds=8192 / 331,
              derivation="64 x 8192 tokens / (331 tokens/s/GPU x 64)"),
    Published(key="F1", source=f"{_FOUNDRY}, A100 80GB table", model=MPT_7B,
              hardware="8 x A100 80GB (links not stated)", gpu="A100-80GB", gpus_per_node=8, nodes=1,
              inter_gbps=1600, dims=ParallelDims(dp_shard=8), zero_stage=3, seq=2048, micro_batch=6,
              global_batch=96, recompute="none", precision="bf16-fsdp", stack="fsdp1",
              software=_FOUNDRY_SOFTWARE, step_seconds=96 * 2048 / 37130,
              derivation="96 x 2048 tokens / 37,130 tokens/s"),
    Published(key="F2", source=f"{_FOUNDRY}, H100 80GB table", model=MPT_7B,
              hardware="8 x H100 80GB (links not stated)", gpu="H100-80GB", gpus_per_node=8, nodes=1,
              inter_gbps=3200, dims=ParallelDims(dp_shard=8), zero_stage=3, seq=2048, micro_batch=6,
              global_batch=48, recompute="none", precision="bf16-fsdp", stack="fsdp1",
              software=_FOUNDRY_SOFTWARE, step_seconds=48 * 2048 / 85144,
              derivation="48 x 2048 tokens / 85,144 tokens/s"),
    Published(key="F3", source=f"{_FOUNDRY}, A100 80GB table", model=MPT_70B,
              hardware="64 x A100 80GB, 1,600 Gbit/s RoCE between nodes", gpu="A100-80GB", gpus_per_node=8,
              nodes=8, inter_gbps=1600, dims=ParallelDims(dp_shard=64), zero_stage=3, seq=2048, micro_batch=8,
              global_batch=2048, recompute="full", precision="bf16", stack="fsdp1",
              software=_FOUNDRY_SOFTWARE, step_seconds=2048 * 2048 / 26274,
              derivation="2,048 x 2048 tokens / 26,274 tokens/s (pure bf16)"),
    Published(key="I1", source="IBM fms-fsdp README and PyTorch blog 'Maximizing training throughput using PyTorch "
              "FSDP' (2024)", model=LLAMA2_7B, hardware="128 x A100 80GB, 400 Gbit/s between nodes",
              gpu="A100-80GB", gpus_per_node=8, nodes=16, inter_gbps=400,
              dims=ParallelDims(dp_replicate=16, dp_shard=8), zero_stage=3, seq=4096, micro_batch=2,
              global_batch=256, recompute="none", precision="bf16-fsdp", stack="fsdp1",
              software="IBM fms-fsdp, PyTorch 2.x FSDP1 (HYBRID_SHARD), SDPA flash", step_seconds=8192 / 3700,
              derivation="2 x 4096 tokens per GPU / 3,700 tokens/s/GPU"),
    Published(key="M1", source=_MEGATRON, model=_gpt(1.7e9, 24, 2304, 24, 51200, "GPT 1.7B"),
              hardware=f"32 x A100 80GB; {_SELENE}", gpu="A100-80GB", gpus_per_node=8, nodes=4, inter_gbps=1600,
              dims=ParallelDims(dp_replicate=32), zero_stage=0, seq=2048, micro_batch=16, global_batch=512,
              recompute="full", precision="bf16", stack="megatron-2021",
              software=_MEGATRON_SOFTWARE, step_seconds=1.5467e16 / (32 * 137e12),
              derivation="Megatron's 96·B·s·l·h²·(1 + s/6h + V/16lh) = 1.547e16 FLOPs / (32 x 137 TFLOP/s)"),
    Published(key="M2", source=_MEGATRON, model=_gpt(18.4e9, 40, 6144, 48, 51200, "GPT 18.4B"),
              hardware=f"256 x A100 80GB; {_SELENE}", gpu="A100-80GB", gpus_per_node=8, nodes=32,
              inter_gbps=1600, dims=ParallelDims(dp_replicate=32, tp=8), zero_stage=0, seq=2048, micro_batch=8,
              global_batch=1024, recompute="full", precision="bf16", stack="megatron-2021",
              software=_MEGATRON_SOFTWARE,
              step_seconds=3.2484e17 / (256 * 135e12),
              derivation="3.248e17 FLOPs (the same formula) / (256 x 135 TFLOP/s)"),
    Published(key="M3", source=_MEGATRON, model=_gpt(39.1e9, 48, 8192, 64, 51200, "GPT 39.1B"),
              hardware=f"512 x A100 80GB; {_SELENE}", gpu="A100-80GB", gpus_per_node=8, nodes=64,
              inter_gbps=1600, dims=ParallelDims(dp_replicate=32, tp=8, pp=2), zero_stage=0, seq=2048,
              micro_batch=4, global_batch=1536, recompute="full", precision="bf16", stack="megatron-2021",
              software=_MEGATRON_SOFTWARE,
              step_seconds=1.0212e18 / (512 * 138e12),
              derivation="1.021e18 FLOPs / (512 x 138 TFLOP/s)"),
    Published(key="M4", source=_MEGATRON, model=_gpt(145.6e9, 80, 12288, 96, 51200, "GPT 145.6B"),
              hardware=f"1,536 x A100 80GB; {_SELENE}", gpu="A100-80GB", gpus_per_node=8, nodes=192,
              inter_gbps=1600, dims=ParallelDims(dp_replicate=24, tp=8, pp=8), zero_stage=0, seq=2048,
              micro_batch=2, global_batch=2304, recompute="full", precision="bf16", stack="megatron-2021",
              software=_MEGATRON_SOFTWARE,
              pp_stages_per_rank=2, step_seconds=5.6417e18 / (1536 * 148e12),
              derivation="5.642e18 FLOPs / (1,536 x 148 TFLOP/s)"),
    Published(key="Z1", source=f"{_MEGATRON[:-9]}, table 2 (ZeRO-3 without model parallelism)",
              model=_gpt(174.6e9, 96, 12288, 96, 51200, "GPT-3 175B"), hardware=f"384 x A100 80GB; {_SELENE}",
              gpu="A100-80GB", gpus_per_node=8, nodes=48, inter_gbps=1600, dims=ParallelDims(dp_shard=384),
              zero_stage=3, seq=2048, micro_batch=4, global_batch=1536, recompute="full",
              precision="bf16", stack="deepspeed-zero3-2021",
              software="DeepSpeed ZeRO-3 (2021) on Megatron\'s GPT", step_seconds=4.5110e18 / (384 * 144e12),
              derivation="4.511e18 FLOPs / (384 x 144 TFLOP/s)"),
    Published(key="Z1b", source=f"{_MEGATRON[:-9]}, table 2 (ZeRO-3 without model parallelism)",
              model=_gpt(174.6e9, 96, 12288, 96, 51200, "GPT-3 175B"), hardware=f"1,536 x A100 80GB; {_SELENE}",
              gpu="A100-80GB", gpus_per_node=8, nodes=192, inter_gbps=1600, dims=ParallelDims(dp_shard=1536),
              zero_stage=3, seq=2048, micro_batch=1, global_batch=1536, recompute="full",
              precision="bf16", stack="deepspeed-zero3-2021",
              software="DeepSpeed ZeRO-3 (2021) on Megatron\'s GPT", step_seconds=4.5110e18 / (1536 * 44e12),
              derivation="4.511e18 FLOPs / (1,536 x 44 TFLOP/s)"),
    Published(key="S1", source="bigscience-workshop/bigscience train/tr11-176B-ml/README.md (BLOOM, 2022), log "
              "line at iteration 85376", model=_gpt(176e9, 70, 14336, 112, 250880, "BLOOM 176B"),
              hardware="384 x A100 80GB, NVLink, 4 Omni-Path links (100 Gbit/s each) per node", gpu="A100-80GB",
              gpus_per_node=8, nodes=48, inter_gbps=400, dims=ParallelDims(dp_replicate=8, tp=4, pp=12),
              zero_stage=1, seq=2048, micro_batch=2, global_batch=2048, recompute="full",
              precision="bf16", stack="megatron-deepspeed",
              software="Megatron-DeepSpeed (2022), PyTorch 1.11, CUDA 11.5, DeepSpeed ZeRO-1 + pipeline engine",
              step_seconds=104.70,
              derivation="logged: elapsed time per iteration 104.70 s"),
    _T2,
    *(replace(_T2, key=f"T2{suffix}", compile="blocks", fp8=fp8, step_seconds=2 * 8192 / tps,
              derivation=f"2 x 8192 tokens per GPU / {tps:,} tokens/s/GPU", memory_gib=gib)
      for suffix, fp8, tps, gib in (("c", "none", 6514, 62.0), ("f", "tensorwise", 8380, 61.8))),
    Published(key="F4", source=f"{_FOUNDRY}, A100 80GB table", model=MPT_13B,
              hardware="8 x A100 80GB (links not stated)", gpu="A100-80GB", gpus_per_node=8, nodes=1,
              inter_gbps=1600, dims=ParallelDims(dp_shard=8), zero_stage=3, seq=2048, micro_batch=2,
              global_batch=48, recompute="none", precision="bf16-fsdp", stack="fsdp1",
              software=_FOUNDRY_SOFTWARE, step_seconds=48 * 2048 / 18097,
              derivation="48 x 2048 tokens / 18,097 tokens/s"),
    Published(key="F5", source=f"{_FOUNDRY}, A100 80GB table", model=MPT_30B,
              hardware="8 x A100 80GB (links not stated)", gpu="A100-80GB", gpus_per_node=8, nodes=1,
              inter_gbps=1600, dims=ParallelDims(dp_shard=8), zero_stage=3, seq=2048, micro_batch=3,
              global_batch=504, recompute="full", precision="bf16-fsdp", stack="fsdp1",
              software=_FOUNDRY_SOFTWARE, step_seconds=504 * 2048 / 7330,
              derivation="504 x 2048 tokens / 7,330 tokens/s"),
    Published(key="F6", source=f"{_FOUNDRY}, H100 80GB table", model=MPT_13B,
              hardware="64 x H100 80GB (links not stated)", gpu="H100-80GB", gpus_per_node=8, nodes=8,
              inter_gbps=3200, dims=ParallelDims(dp_shard=64), zero_stage=3, seq=2048, micro_batch=2,
              global_batch=128, recompute="none", precision="bf16-fsdp", stack="fsdp1",
              software=_FOUNDRY_SOFTWARE, step_seconds=128 * 2048 / 307209,
              derivation="128 x 2048 tokens / 307,209 tokens/s"),
    Published(key="F7", source=f"{_FOUNDRY}, H100 80GB table", model=MPT_30B,
              hardware="32 x H100 80GB (links not stated)", gpu="H100-80GB", gpus_per_node=8, nodes=4,
              inter_gbps=3200, dims=ParallelDims(dp_shard=32), zero_stage=3, seq=2048, micro_batch=14,
              global_batch=1344, recompute="full", precision="bf16-fsdp", stack="fsdp1",
              software=_FOUNDRY_SOFTWARE, step_seconds=1344 * 2048 / 73860,
              derivation="1,344 x 2048 tokens / 73,860 tokens/s"),
    Published(key="F8", source=f"{_FOUNDRY}, H100 80GB table", model=MPT_70B,
              hardware="64 x H100 80GB (links not stated)", gpu="H100-80GB", gpus_per_node=8, nodes=8,
              inter_gbps=3200, dims=ParallelDims(dp_shard=64), zero_stage=3, seq=2048, micro_batch=8,
              global_batch=2048, recompute="full", precision="bf16-fsdp", stack="fsdp1",
              software=_FOUNDRY_SOFTWARE, step_seconds=2048 * 2048 / 66523,
              derivation="2,048 x 2048 tokens / 66,523 tokens/s"),
    Published(key="F9", source=f"{_FOUNDRY}, A100 40GB table", model=MPT_7B,
              hardware="128 x A100 40GB, 1,600 Gbit/s RoCE between nodes", gpu="A100-40GB", gpus_per_node=8,
              nodes=16, inter_gbps=1600, dims=ParallelDims(dp_shard=128), zero_stage=3, seq=2048, micro_batch=18,
              global_batch=2304, recompute="full", precision="bf16", stack="fsdp1",
              software=_FOUNDRY_SOFTWARE, step_seconds=2304 * 2048 / 463749,
              derivation="2,304 x 2048 tokens / 463,749 tokens/s (pure bf16)"),
    _table1("M1b", 30, 3072, 32, 2, 1, 64, 512, 16, 138, "GPT 3.6B"),
    _table1("M1c", 36, 4096, 32, 4, 1, 128, 512, 16, 142, "GPT 7.5B"),
    _table1("M3b", 60, 10240, 80, 8, 4, 1024, 1792, 2, 140, "GPT 76.1B", virtual=3),
    _table1("M5", 96, 16384, 128, 8, 16, 1920, 2160, 1, 155, "GPT 310.1B", virtual=2),
    _table1("M6", 105, 20480, 128, 8, 35, 2520, 2520, 1, 163, "GPT 529.6B", virtual=3),
    _table1("M7", 128, 25600, 160, 8, 64, 3072, 3072, 1, 163, "GPT 1T"),
    Published(key="P1", source=f"{_MEGATRON[:-9]}, table 2 (PTD parallelism)",
              model=_gpt(174.6e9, 96, 12288, 96, 51200, "GPT-3 175B"), hardware=f"1,536 x A100 80GB; {_SELENE}",
              gpu="A100-80GB", gpus_per_node=8, nodes=192, inter_gbps=1600,
              dims=ParallelDims(dp_replicate=16, tp=8, pp=12), zero_stage=0, seq=2048, micro_batch=1,
              global_batch=1536, recompute="full", precision="bf16", stack="megatron-2021",
              software=_MEGATRON_SOFTWARE,
              step_seconds=_megatron_flops(1536, 2048, 96, 12288) / (1536 * 141e12),
              derivation="Megatron's formula: 4.511e18 FLOPs / (1,536 x 141 TFLOP/s)"),
    Published(key="P1b", source=f"{_MEGATRON[:-9]}, table 2 (PTD parallelism)",
              model=_gpt(174.6e9, 96, 12288, 96, 51200, "GPT-3 175B"), hardware=f"384 x A100 80GB; {_SELENE}",
              gpu="A100-80GB", gpus_per_node=8, nodes=48, inter_gbps=1600,
              dims=ParallelDims(dp_replicate=4, tp=8, pp=12), zero_stage=0, seq=2048, micro_batch=1,
              global_batch=1536, recompute="full", precision="bf16", stack="megatron-2021",
              software=_MEGATRON_SOFTWARE,
              step_seconds=_megatron_flops(1536, 2048, 96, 12288) / (384 * 153e12),
              derivation="Megatron's formula: 4.511e18 FLOPs / (384 x 153 TFLOP/s)"),
)


_MEGATRON_FAST = ("as the Megatron rows with tensor parallelism 8 are (0.84-0.92x; TP 4 0.98x, TP 2 1.00x, DP alone "
                  "1.05x), on the megatron-2021 stack (convoy.plan.stacks: fused softmax, the DDP all-reduce after the "
                  "backward). Not its GEMM library: one Megatron-LM layer of hidden 6144 at TP 8 on one DGX A100, "
                  "timed by its authors (Korthikanti et al. 2022, table 4: 19.6 ms, 27.2 ms with full recompute), is "
                  "planned within 2 % with convoy's GEMM model, and cuBLAS 11.0's own A100 GEMMs reach 1.08-1.10x "
                  "that model (benchmarks/stack_gemm_factors.py), so the stack's GEMM factor is 1.0, measured. What "
                  "is missing lies outside that layer: layers 8,192-25,600 wide (the same paper times them in its "
                  "figure 8, as a chart only), the pipeline across nodes, and the 2021 software (PyTorch 1.8, NCCL "
                  "2.8) where the layer was timed on 2022's; the tensor-parallel all-reduces (1.5-5.0 s of these "
                  "steps) are NCCL 2.19's model, not the paper's NCCL")

#: what the planner does not model about a row (shown under the table); required where it is > 25 % off, given
#: for every row more than 10 % off
DEVIATIONS = {
    "T1": "planned on torchtitan's stack (convoy.plan.stacks): its per-op save list (every other matmul's output "
          "kept: Llama's k, o and up projections run again) and its logged memory, max_memory_reserved (read as "
          "allocated x the reserved/allocated ratio measured on convoy's H100 runs). The board is planned as the "
          "500 W HBM2e H100 it is (1,636 MHz by the f^3 law, 2.4 TB/s), not the SXM5 profile (0.76x before)",
    **{key: f"as {key[:2]}. Compiled, the plan keeps the per-op save list as it is (convoy.plan.speedups: "
            "compile_saved_selective = 1), so the 5.4 GiB (5.0 at 128 GPUs) the published run saved by compiling, "
            "outside the blocks' saved tensors, is not in the plan: the eager row is planned 0.93x (0.98x at 128 "
            "GPUs) and the compiled ones 1.00-1.06x; the float8 row keeps the high-precision activations torchao's "
            "Float8Linear saves, as published (77.0 -> 76.8 GiB)"
       for key in ("T1c", "T1f", "T2c", "T2f")},
    "I1": "HSDP over 16 nodes of 400 Gbit/s on FSDP1's schedule (stack fsdp1): the plan hides all but 0.05 s of "
          "1.27 s of collectives (NCCL's model) behind 1.84 s of compute; what that overlap costs the compute "
          "(NCCL's kernels hold SMs and memory bandwidth while they run) is not modeled",
    "F6": "MPT-13B at one micro-batch of 2 per step on 64 H100s, on FSDP1's schedule (stack fsdp1: the root unit's "
          "all-gather and reduce-scatter exposed, each block's traffic overlapping only that block's compute): NCCL's "
          "model prices 0.30 s of collectives over 8 nodes against 0.63 s of compute and leaves 0.01 s exposed. What "
          "slows the published run by a further fifth (the compute the overlapped collectives take from the GEMMs, or "
          "a slower network than the 3,200 Gbit/s assumed: the source does not state its links) is not modeled",
    "M3b": f"planned 15 % fast, {_MEGATRON_FAST}. Planned with its interleaved schedule (3 virtual stages per GPU, "
           "bubble (p-1)/(v m) = 4 %)",
    "M4": f"planned 13 % fast, {_MEGATRON_FAST}. Planned with its interleaved schedule (2 virtual stages per GPU)",
    "M5": f"planned 14 % fast, {_MEGATRON_FAST}. Planned with its interleaved schedule (2 virtual stages per GPU)",
    "M6": f"planned 16 % fast, {_MEGATRON_FAST}. Planned with its interleaved schedule (3 virtual stages per GPU)",
    "M7": f"planned 13 % fast, {_MEGATRON_FAST}",
    "Z1": "planned 0.65x: at micro-batch 4 the plan runs at 71 % of the A100's peak by the source's own FLOP count "
          "(recomputation included; the 175B model's unsplit GEMMs at MAMF's 2025 86.9 %) where the source's ZeRO-3 "
          "ran at 46 % and the same paper's best PTD-P run at 52 %. The deepspeed-zero3-2021 stack prices "
          "DeepSpeed's one collective per parameter tensor (8.0 s by NCCL's model, taken as hidden behind the "
          "compute); its GEMMs at convoy's model, at which a Megatron layer timed by its authors is planned within "
          "2 % (stack factor 1.0, measured: benchmarks/stack_gemm_factors.py)",
    "Z1b": "planned 0.23x: DeepSpeed's one collective per parameter tensor over rings of 1,536 ranks is priced by "
           "NCCL's model (14.1 s per step, about 1.9 ms per small tensor's gather) and mostly hidden behind 13.2 s "
           "of compute. The source measured 66.7 s here and 66.7 s on 768 GPUs, where each GPU did twice the work: "
           "a fixed cost of about 60 s per step that neither the bytes (5.3 s at the nodes' 1,600 Gbit/s) nor "
           "NCCL's latency model reach; some cost per rank and collective of DeepSpeed's 2021 ZeRO-3 (its gather "
           "into a list of per-rank tensors is one candidate, not measured here) is missing. The same model at the "
           "same scale with DP x TP x PP (row P1) is planned within 10 %",
}
_ORDER = ("T1", "T1c", "T1f", "T2", "T2c", "T2f",
          "T3", "T3b", "F1", "F2", "F3", "F4", "F5", "F6", "F7", "F8", "F9", "I1", "M1", "M1b", "M1c",
          "M2", "M3", "M3b", "M4", "M5", "M6", "M7", "P1b", "P1", "S1", "Z1", "Z1b")
RESULTS: tuple[Published, ...] = tuple(
    replace(row, deviation=DEVIATIONS.get(row.key, row.deviation))
    for row in sorted(_ROWS, key=lambda r: _ORDER.index(r.key)))

def hardware(row: Published) -> Hardware:
    return Hardware(gpu=lookup_gpu(row.gpu), gpus_per_node=row.gpus_per_node, nodes=row.nodes,
                    inter_gbps=row.inter_gbps)


def planned(row: Published) -> tuple[float, float]:
    """(step seconds, peak GiB per GPU) the planner gives for ``row``'s layout on its hardware."""
    run = RunSpec(seq_len=row.seq, micro_batch=row.micro_batch, precision=row.precision, recompute=row.recompute,
                  compile=row.compile, fp8=row.fp8)
    m = row.global_batch // (row.micro_batch * row.dims.dp)
    schedule = "interleaved_1f1b" if row.pp_stages_per_rank > 1 else "1f1b"
    layout = Layout(dims=row.dims, zero_stage=row.zero_stage, microbatches=m, pp_schedule=schedule,
                    pp_stages_per_rank=row.pp_stages_per_rank)
    t = step_time(row.model, run, layout, hardware(row), global_batch=row.global_batch, stack=row.stack)
    memory = memory_per_gpu(row.model, run, layout, stack=row.stack)
    return t.seconds, reported_bytes(memory, row.stack) / 2**30


def within(row: Published) -> bool:
    seconds, _ = planned(row)
    return abs(seconds / row.step_seconds - 1) <= TARGET


def memory_within(row: Published) -> bool:
    """True when no memory is published, or the plan's is within 25 % of it."""
    return row.memory_gib is None or abs(planned(row)[1] / row.memory_gib - 1) <= TARGET


def table() -> str:
    """The markdown table of docs/planner-accuracy.md section 8."""
    lines = ["| | source | hardware | stack | model | layout | batch x seq, recompute, precision | published step | "
             "planned step (ratio) | published / planned memory |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in RESULTS:
        seconds, gib = planned(row)
        memory = f"{row.memory_gib:.1f} / {gib:.1f} GiB ({gib / row.memory_gib:.2f}x)" if row.memory_gib else \
            f"not published / {gib:.1f} GiB"
        lines.append(f"| {row.key} | {row.source} | {row.hardware} | {row.stack}: {row.software} | "
                     f"{row.model.name} | {row.layout_name} | "
                     f"{row.global_batch} x {row.seq} (micro-batch {row.micro_batch}), {row.recompute}, "
                     f"{row.how} | {row.step_seconds:.2f} s | {seconds:.2f} s "
                     f"({seconds / row.step_seconds:.2f}x) | {memory} |")
    return "\n".join(lines)


def deviations() -> str:
    """The list under the table: what the planner does not model, row by row."""
    return "\n".join(f"- {row.key}: {row.deviation}." for row in RESULTS if row.deviation)


def summary() -> str:
    """One sentence: how many rows are within 10 % and 25 % of their published step time."""
    ratios = [planned(row)[0] / row.step_seconds for row in RESULTS]
    ten = sum(abs(r - 1) <= 0.10 for r in ratios)
    quarter = sum(abs(r - 1) <= TARGET for r in ratios)
    return (f"Of the {len(RESULTS)} runs, {quarter} are planned within 25 % of their published step time and "
            f"{ten} within 10 % (ratios {min(ratios):.2f}-{max(ratios):.2f}x, median "
            f"{sorted(ratios)[len(ratios) // 2]:.2f}x).")


#: the runs of one layout eager, compiled, compiled + float8: (eager, compiled, float8) keys
SPEEDUP_SERIES = (("T1", "T1c", "T1f"), ("T2", "T2c", "T2f"))


def speedup_pairs() -> list[tuple[str, str, str, float, float]]:
    """(before, after, what, published gain, planned gain): tokens/s of each run over the one before it, for
    ``SPEEDUP_SERIES`` (compile over eager, float8 over compile)."""
    by_key = {row.key: row for row in RESULTS}
    out = []
    for keys in SPEEDUP_SERIES:
        rows = [by_key[k] for k in keys]
        for (before, after), what in zip(zip(rows, rows[1:]), ("+ torch.compile", "+ float8 tensorwise")):
            out.append((before.key, after.key, what, before.step_seconds / after.step_seconds,
                        planned(before)[0] / planned(after)[0]))
    return out


def speedups() -> str:
    """The markdown table of the published and planned gains of compile and float8 (docs/planner-accuracy.md)."""
    lines = ["| runs | step | published gain | planned gain | planned / published |", "|---|---|---|---|---|"]
    for before, key, what, published, plan in speedup_pairs():
        lines.append(f"| {before} -> {key} | {what} | {published - 1:+.1%} | {plan - 1:+.1%} | "
                     f"{plan / published:.3f} |")
    return "\n".join(lines)


#: the held-out tables: read only under ``--held-out`` (the development loop and ``--check`` never import them)
HELD_OUT_MODULES = ("published_heldout", "published_heldout_megatron", "published_heldout2",
                    "published_heldout3_nvidia", "published_heldout3_open", "published_heldout4_nvidia",
                    "published_heldout4_other")


def held_out_modules() -> list[Any]:
    """The held-out modules (benchmarks/published_heldout*.py), in their order."""
    import importlib.util

    sys.modules.setdefault("published_results", sys.modules[__name__])  # they import Published from here
    modules = []
    for name in HELD_OUT_MODULES:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules.setdefault(name, module)
        spec.loader.exec_module(module)
        modules.append(module)
    return modules


#: which held-out set each module belongs to: the first was collected before issue 38's model changes and its
#: baseline printed while they were under way; the second after, and planned only once they were all merged
HELD_OUT_SET = {"published_heldout": "first", "published_heldout_megatron": "first", "published_heldout2": "second",
                "published_heldout3_nvidia": "third", "published_heldout3_open": "third",
                "published_heldout4_nvidia": "fourth", "published_heldout4_other": "fourth"}


def held_out_sets() -> dict[str, str]:
    """Row key -> the held-out set it belongs to (``HELD_OUT_SET``)."""
    return {row.key: HELD_OUT_SET[module.__name__] for module in held_out_modules() for row in module.ROWS}


def held_out_seen() -> dict[str, str]:
    """Held-out rows the planner was compared with elsewhere before their set was collected (``SEEN_BEFORE``)."""
    return {key: why for module in held_out_modules() for key, why in getattr(module, "SEEN_BEFORE", {}).items()}


def held_out_rows() -> tuple[Published, ...]:
    """The ``ROWS`` of the held-out modules, in their order."""
    return tuple(row for module in held_out_modules() for row in module.ROWS)


def held_out_unstated() -> dict[str, str]:
    """Per held-out row, the planner inputs its source does not state and what the row takes (``NOT_STATED``)."""
    return {key: what for module in held_out_modules() for key, what in getattr(module, "NOT_STATED", {}).items()}


def _count(ratios: list[float]) -> str:
    values = sorted(ratios)
    return (f"{sum(abs(r - 1) <= TARGET for r in values)} of {len(values)} within 25 %, "
            f"{sum(abs(r - 1) <= 0.10 for r in values)} within 10 % (ratios {values[0]:.2f}-{values[-1]:.2f}x, "
            f"median {statistics.median(values):.2f}x)" if values else "no rows")


def held_out_report(rows: tuple[Published, ...], unstated: dict[str, str] | None = None,
                    sets: dict[str, str] | None = None, seen: dict[str, str] | None = None) -> str:
    """docs/planner-accuracy.md section 8b: the held-out table, the rows more than 10 % off, and the count (all rows,
    and apart the rows whose source states every input the planner takes, ``unstated`` naming the others; per
    held-out set where ``sets`` names them)."""
    unstated = unstated or {}
    sets = sets or {}
    seen = seen or {}
    lines = ["| | source | hardware | model | layout | batch x seq, recompute, precision | stack | published step | "
             "planned step (ratio) | published / planned memory |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    ratios: dict[str, float] = {}
    for row in rows:
        seconds, gib = planned(row)
        ratios[row.key] = seconds / row.step_seconds
        memory = f"{row.memory_gib:.1f} / {gib:.1f} GiB ({gib / row.memory_gib:.2f}x)" if row.memory_gib else \
            f"not published / {gib:.1f} GiB"
        layout = row.layout_name + (" (HSDP)" if row.dims.dp_replicate > 1 and row.dims.dp_shard > 1 else "")
        lines.append(f"| {row.key} | {row.source} | {row.hardware} | {row.model.name} | {layout} | "
                     f"{row.global_batch} x {row.seq} (micro-batch {row.micro_batch}), {row.recompute}, {row.how} | "
                     f"{row.stack} | {row.step_seconds:.2f} s | {seconds:.2f} s ({ratios[row.key]:.2f}x) | "
                     f"{memory} |")
    off = [f"{key} ({r:.2f}x)" for key, r in ratios.items() if abs(r - 1) > 0.10]
    software = "\n".join(f"- {row.key}: {row.software}." for row in rows if row.software)
    taken = "\n".join(f"- {key}: {what}." for key, what in unstated.items() if key in ratios)
    stated = [r for key, r in ratios.items() if key not in unstated]
    count = (f"All rows: {_count(list(ratios.values()))}.\n\nRows whose source states every input the planner takes: "
             f"{_count(stated)}; rows with an input taken (listed above): "
             f"{_count([r for key, r in ratios.items() if key in unstated])}.")
    for name in dict.fromkeys(sets.values()):
        members = {key: r for key, r in ratios.items() if sets.get(key) == name}
        count += (f"\n\nThe {name} set: {_count(list(members.values()))}; with every input stated: "
                  f"{_count([r for key, r in members.items() if key not in unstated])}.")
        before = [key for key in members if key in seen]
        if before:
            count += (f" Without the rows compared before ({', '.join(before)}: {seen[before[0]]}): "
                      f"{_count([r for key, r in members.items() if key not in seen])}.")
    return ("\n".join(lines) + "\n\nWhat each source states the run used:\n\n" + software
            + "\n\nInputs the source does not state, and what the plan takes:\n\n" + (taken or "none")
            + "\n\nMore than 10 % off (no explanation required): " + (", ".join(off) or "none") + ".\n\n" + count)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when an unexplained row is off by > 25 %")
    parser.add_argument("--held-out", action="store_true",
                        help="plan the held-out rows (benchmarks/published_heldout*.py) instead: docs section 8b")
    args = parser.parse_args(argv)
    if args.held_out:
        print(held_out_report(held_out_rows(), held_out_unstated(), held_out_sets(), held_out_seen()))
        return 0
    print(table())
    print("\nWhat the planner does not model, row by row:\n" + deviations() + "\n\n" + summary())
    print("\nCompile and float8, tokens/s of each run over the one before it:\n\n" + speedups())
    if args.check:
        off = [row.key for row in RESULTS if not (within(row) and memory_within(row)) and not row.deviation]
        if off:
            print(f"more than {TARGET:.0%} off without an explanation: {', '.join(off)}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
