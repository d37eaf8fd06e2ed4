"""Held-out published runs of the Megatron lineage (BigScience's Megatron-DeepSpeed, Megatron-Core, NeMo): rows the
planner's model was not built against (issue 38, item 3). The development loop does not read this file; the
held-out check (``benchmarks/published_results.py --held-out``) plans these rows after they were frozen.

Each row is a ``published_results.Published`` with what its source states: hardware, model shape, layout, micro and
global batch, sequence, recompute, precision, attention, the stack (a name of ``convoy.plan.stacks.STACKS``) and the
software the source names, and the step time with its ``derivation`` from what the source prints (a logged
iteration time, tokens/s per GPU, or TFLOP/s per GPU with the source's own FLOP formula). ``PRINTED`` holds the
numbers as the source prints them; ``tests/plan/test_published_heldout_megatron.py`` recomputes each step time from
them with the source's formula. Where a source leaves a planner input unstated, ``NOT_STATED`` says which and what
the row takes, so a miss on such a row can be read against it.

Sources read, and what was left out (no number here comes from anything but the file named in its row):
- bigscience-workshop/bigscience (tr1-13B on V100s, the tr8-104B tune-up table, BLOOM's batch ramp-up phases).
- NVIDIA/Megatron-LM README.md's H100 weak-scaling table (images/model_table.png, Megatron-Core r0.8.0): the four
  rows without pipeline parallelism. The five pipelined rows are left out: their micro-batch size and interleaving
  (which set the bubble) are not stated.
- NVIDIA/NeMo docs/source/performance/performance_summary.md (NeMo 24.07, DGX-H100, FP8): the dense GPT-3 and
  Llama 3 rows whose shapes a source gives (Llama 2's and Nemotron's rows are left out: no shape read here).
No Meta run is included: see below.
Not included, because no primary text of the numbers could be read here: GPT-NeoX-20B's and Pythia's throughput
(arXiv:2204.06745, 2304.01373; the layout is in EleutherAI/gpt-neox configs/20B.yml, the step time only in the
paper), MT-NLG 530B's iteration times (arXiv:2201.11990 section 2.4; only a third party's transcription, which
disagrees with Microsoft's blog on the boards' memory, and no micro-batch size), Llama 3's table 4 (arXiv:2407.21783;
only a transcription of a talk's slide without micro-batch, interleaving or FLOP formula), Korthikanti et al.'s
table (arXiv:2205.05198; Megatron-LM's old README keeps only its MFU, not its layouts), and OPT-175B (metaseq's
logbook PDF is not in the snapshot; the chronicles give TP 8 and a 2M-token batch but no micro-batch or step time).
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from convoy.plan.dims import ParallelDims  # noqa: E402
from published_results import _ROWS as _DEVELOPMENT  # noqa: E402
from published_results import LLAMA3_8B, LLAMA3_70B, Published, _gpt, _megatron_flops  # noqa: E402

#: the numbers each source prints, as it prints them (the step times below follow from these)
PRINTED: dict[str, dict[str, float]] = {
    # train/tr1-13B-base/chronicles.md, "Round3 ... NNODES=64": "iteration 29020/ 311541 | ... elapsed time per
    # iteration (ms): 22306.6 | ... global batch size: 1024"
    "BS13a": {"iteration_ms": 22306.6, "global_batch": 1024, "nodes": 64},
    # train/tr1-13B-base/README.md, the final checkpoint's log: "iteration 168000/ 311541 | ... elapsed time per
    # iteration (ms): 13248.2 | ... global batch size: 1024"; 128 nodes for the last 3 weeks (same README; the
    # slurm script's NNODES=128)
    "BS13b": {"iteration_ms": 13248.2, "global_batch": 1024, "nodes": 128},
    # experiments/tr8-104B.md, "The baseline of 104B experiment w/o --use-bnb-optimizer ... using the main branch":
    # | 32 | 4 | 32 | 1 | 1 | 696 | 39.17 | 30GB (same conf as normal 104B) |, at the BS=2048 of the perl line above
    "BS104": {"seconds": 696, "tflops": 39.17, "model_b": 104, "global_batch": 2048, "memory_gb": 30},
    # train/tr11-176B-ml/README.md, "Global batch size": "iteration 3707/ 128728 | ... elapsed time per iteration
    # (s): 15.23 | ... global batch size: 16 | ... TFLOPs: 8.04"
    "S1a": {"seconds": 15.23, "tflops": 8.04, "global_batch": 16},
    # the same section: "the current setup starts with GBS=192/MBS=1 @ 73 TFLOPs"
    "S1b": {"tflops": 73, "global_batch": 192},
    # NVIDIA/Megatron-LM images/model_table.png: per-GPU teraFLOP/s, MFU, aggregate petaFLOP/s
    "MC1": {"tflops": 408.8, "mfu": 0.41, "pflops": 19.6},
    "MC2": {"tflops": 465.9, "mfu": 0.47, "pflops": 44.7},
    "MC3": {"tflops": 489.1, "mfu": 0.49, "pflops": 93.9},
    "MC4": {"tflops": 459.6, "mfu": 0.46, "pflops": 176.5},
    # NVIDIA/NeMo performance_summary.md, pre-training table: Tokens / sec / GPU (and Model TFLOP / sec / GPU)
    "NM1": {"tokens_per_gpu": 726, "tflops": 782},
    "NM2": {"tokens_per_gpu": 782, "tflops": 842},
    "NM3": {"tokens_per_gpu": 12036, "tflops": 697},
    "NM4": {"tokens_per_gpu": 1533, "tflops": 738},
    "NM5": {"tokens_per_gpu": 22521, "tflops": 736},
    "NM6": {"tokens_per_gpu": 5851, "tflops": 750},
}

#: the parameter count each source gives its model (the test checks the row's shape against it within 3 %)
SOURCE_PARAMS: dict[str, float] = {
    "BS13a": 13e9, "BS13b": 13e9, "BS104": 104e9, "S1a": 176e9, "S1b": 176e9,
    "MC1": 1.7e9, "MC2": 7.1e9, "MC3": 16e9, "MC4": 32e9,
    "NM1": 175e9, "NM2": 175e9, "NM3": 8e9, "NM4": 70e9, "NM5": 5e9, "NM6": 20e9,
}

_JZ_V100_GBPS = 400.0
"""Jean Zay's V100 nodes: the bigscience repository does not state their network (jz/hpc-specs.md gives 4
Omni-Path links per node for the A100 partition only); 4 x 100 Gbit/s is taken, and named in ``NOT_STATED``."""

_H100_GBPS = 3200.0
"""Network per H100 node where the source does not state it: 8 x 400 Gbit/s, a DGX H100's; named in
``NOT_STATED``."""

#: planner inputs a source leaves unstated, and what the row takes for them
NOT_STATED: dict[str, str] = {
    **{key: "inter-node network (400 Gbit/s per node taken)" for key in ("BS13a", "BS13b", "BS104")},
    **{key: "micro-batch size (1 taken), recompute (none taken), precision (bf16 taken: the MFU column is the "
            "TFLOP/s over the H100's 989 TFLOP/s bf16 peak), board memory and network (H100 80GB SXM, 3,200 "
            "Gbit/s per node taken)" for key in ("MC1", "MC2", "MC3", "MC4")},
    **{key: "recompute (none taken), optimizer sharding (Megatron's distributed optimizer, as ZeRO-1, taken), the "
            "FP8 recipe's scaling (Transformer Engine's; the planner's per-tensor 'tensorwise' taken), network "
            "(3,200 Gbit/s per node taken)" for key in ("NM1", "NM2", "NM3", "NM4", "NM5", "NM6")},
}
for _key in ("NM1", "NM2"):
    NOT_STATED[_key] += ("; GPT3-175B's shape (Megatron-LM's examples/gpt3/train_gpt3_175b_distributed.sh: 96 "
                         "layers, hidden 12288, 96 heads, GPT-2 BPE's 50,257 words taken)")
for _key, _size in (("NM5", "5b"), ("NM6", "20b")):
    NOT_STATED[_key] += (f"; GPT3-{_size.upper()}'s shape (NVIDIA/NeMo-Framework-Launcher launcher_scripts/conf/"
                         f"training/gpt3/{_size}_fp8_performance.yaml taken; the table's tokens/s and TFLOP/s "
                         "columns agree under it)")

_BIGSCIENCE = "bigscience-workshop/bigscience"
_TR1 = "Megatron-DeepSpeed (tr1-13B branch), DeepSpeed (big-science branch), PyTorch 1.8.1, CUDA 10.2; 2021"
_TR11 = ("Megatron-DeepSpeed (ds_ckpt_reshape branch), DeepSpeed (olruwase/elastic-ckpt-refresh), PyTorch 1.11, "
         "CUDA 11.5, apex; 2022")


def _gpt_params(layers: int, hidden: int, vocab: int, seq: int) -> int:
    """Megatron's GPT with learned positions and tied embeddings, as the bigscience READMEs count it
    (train/tr8-104B-wide/README.md): l(12h² + 13h) + vh + sh + 2h."""
    return layers * (12 * hidden**2 + 13 * hidden) + vocab * hidden + seq * hidden + 2 * hidden


def _mcore_params(layers: int, hidden: int, vocab: int) -> int:
    """Megatron-Core's GPT with rotary positions and untied input and output embeddings: l(12h² + 13h) + 2vh + 2h."""
    return layers * (12 * hidden**2 + 13 * hidden) + 2 * vocab * hidden + 2 * hidden


def _mcore_flops(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Megatron-Core r0.8.0's ``num_floating_point_operations`` (megatron/training/training.py) for multi-head
    attention and a GELU MLP of 4h: 12·B·s·l·h²·((2 + s/h) + 4 + V/(2lh)) = 72·B·s·l·h²·(1 + s/6h + V/12lh)."""
    return 72 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (12 * layers * hidden))


def _tr1(key: str, dp: int) -> Published:
    p = PRINTED[key]
    nodes = int(p["nodes"])
    where = ("train/tr1-13B-base/chronicles.md, 'Round3 ... NNODES=64', log line at iteration 29020"
             if key == "BS13a" else "train/tr1-13B-base/README.md, the final checkpoint's log line (iteration 168000)")
    return Published(
        key=key, source=f"{_BIGSCIENCE} {where}; layout from train/tr1-13B-base/tr1-13B-round1.slurm",
        model=_gpt(_gpt_params(40, 5120, 50257, 2048), 40, 5120, 32, 50257, "GPT 13B (BigScience tr1-13B)"),
        hardware=f"{4 * nodes} x V100 32GB (Jean Zay, {nodes} nodes of 4); network not stated", gpu="V100-32GB",
        gpus_per_node=4, nodes=nodes, inter_gbps=_JZ_V100_GBPS, dims=ParallelDims(dp_replicate=dp, tp=2, pp=4),
        zero_stage=1, seq=2048, micro_batch=1, global_batch=int(p["global_batch"]),
        recompute="full", precision="fp16", step_seconds=p["iteration_ms"] / 1000,
        derivation=f"logged: elapsed time per iteration (ms): {p['iteration_ms']}", stack="megatron-deepspeed",
        software=_TR1)


_S1 = next(row for row in _DEVELOPMENT if row.key == "S1")
_S1_FLOPS_VOCAB = 250880
"""BLOOM's 250,680-word vocabulary padded for TP 4 (the log's TFLOPs 8.04 at 15.23 s and 149.77 at 104.70 s follow
from Megatron's formula with it)."""

_MCORE_SOURCE = ("NVIDIA/Megatron-LM README.md 'Performance Benchmarking', images/model_table.png (commit "
                 "f2e5db402c, July 2024)")
_MCORE_SOFTWARE = ("Megatron-Core r0.8.0 (the weak-scaling figure's legend), --overlap-grad-reduce "
                   "--overlap-param-gather (the distributed optimizer) --tp-comm-overlap; 2024")


def _mcore(key: str, layers: int, hidden: int, heads: int, tp: int, name: str) -> Published:
    gpus, batch, vocab, seq = 48 * tp, 192, 131072, 4096
    tflops = PRINTED[key]["tflops"]
    flops = _mcore_flops(batch, seq, layers, hidden, vocab)
    return Published(
        key=key, source=_MCORE_SOURCE, model=_gpt(_mcore_params(layers, hidden, vocab), layers, hidden, heads, vocab,
                                                  name),
        hardware=f"{gpus} x H100 (memory and network not stated)", gpu="H100-80GB", gpus_per_node=8,
        nodes=gpus // 8, inter_gbps=_H100_GBPS, dims=ParallelDims(dp_replicate=48, tp=tp), zero_stage=1, seq=seq,
        micro_batch=1, global_batch=batch, recompute="none", precision="bf16",
        step_seconds=flops / (gpus * tflops * 1e12),
        derivation=f"Megatron-Core's 72·B·s·l·h²·(1 + s/6h + V/12lh) = {flops:.4g} FLOPs / ({gpus} x {tflops} "
                   "TFLOP/s)",
        stack="megatron-core", software=_MCORE_SOFTWARE)


_NEMO_SOURCE = "NVIDIA/NeMo docs/source/performance/performance_summary.md, pre-training table (NeMo 24.07, DGX-H100)"
_NEMO_SOFTWARE = "NeMo 24.07 container (Megatron-Core, Transformer Engine), FP8; 2024"
#: GPT-3 175B as Megatron-LM's examples/gpt3/train_gpt3_175b_distributed.sh shapes it (96 layers, 12288, 96 heads,
#: sequence 2048, the GPT-2 BPE vocabulary file)
_NEMO_GPT3 = _gpt(_gpt_params(96, 12288, 50257, 2048), 96, 12288, 96, 50257, "GPT-3 175B (NeMo)")
#: GPT3-5B and GPT3-20B as NVIDIA/NeMo-Framework-Launcher's launcher_scripts/conf/training/gpt3/5b_fp8_performance.yaml
#: and 20b_fp8_performance.yaml shape them (24 x 4096, 32 heads; 44 x 6144, 48 heads; FFN 4h, GPT-2 BPE)
_NEMO_GPT3_5B = _gpt(_gpt_params(24, 4096, 50257, 2048), 24, 4096, 32, 50257, "GPT-3 5B (NeMo)")
_NEMO_GPT3_20B = _gpt(_gpt_params(44, 6144, 50257, 2048), 44, 6144, 48, 50257, "GPT-3 20B (NeMo)")


def _nemo(key: str, model, gpus: int, batch: int, micro: int, seq: int, tp: int, pp: int, cp: int,
          virtual: int) -> Published:
    tokens = PRINTED[key]["tokens_per_gpu"]
    dp = gpus // (tp * pp * cp)
    return Published(
        key=key, source=_NEMO_SOURCE, model=model,
        hardware=f"{gpus} x H100 80GB SXM (DGX-H100, NVLink); network not stated", gpu="H100-80GB",
        gpus_per_node=8, nodes=gpus // 8, inter_gbps=_H100_GBPS, dims=ParallelDims(dp_replicate=dp, tp=tp, pp=pp,
                                                                                     cp=cp),
        zero_stage=1, seq=seq, micro_batch=micro, global_batch=batch, recompute="none", precision="bf16",
        pp_stages_per_rank=virtual, fp8="tensorwise",
        step_seconds=batch * seq / (tokens * gpus),
        derivation=f"{batch:,} x {seq} tokens / ({tokens:,} tokens/s/GPU x {gpus})",
        stack="megatron-core", software=_NEMO_SOFTWARE)


ROWS: tuple[Published, ...] = (
    _tr1("BS13a", dp=32),
    _tr1("BS13b", dp=64),
    Published(
        key="BS104", source=f"{_BIGSCIENCE} experiments/tr8-104B.md, the baseline row 'using the main branch' (the "
                            "tune-up after the FFN size was fixed); shape from train/tr8-104B-wide/README.md",
        model=_gpt(_gpt_params(32, 16384, 50257, 2048), 32, 16384, 32, 50257, "GPT 104B (BigScience tr8)"),
        hardware="128 x V100 32GB (Jean Zay, 32 nodes of 4); network not stated", gpu="V100-32GB",
        gpus_per_node=4, nodes=32, inter_gbps=_JZ_V100_GBPS, dims=ParallelDims(tp=4, pp=32), zero_stage=1, seq=2048,
        micro_batch=1, global_batch=2048, recompute="full", precision="fp16",
        step_seconds=PRINTED["BS104"]["seconds"],
        derivation="tabled: 696 s per iteration at GBS 2048 (the table's 39.17 TFLOPs = 104·4·2·2048·2048 / (696 "
                   "s x 128 GPUs x 1e3))",
        memory_gib=PRINTED["BS104"]["memory_gb"], stack="megatron-deepspeed",
        software="Megatron-DeepSpeed main branch, DeepSpeed; the tr1-13B setup (train/tr8-104B-wide/README.md); "
                 "2021"),
    replace(_S1, key="S1a",
            source=f"{_BIGSCIENCE} train/tr11-176B-ml/README.md, 'Global batch size' (the ramp-up's first batch "
                   "size), log line at iteration 3707",
            micro_batch=2, global_batch=16, step_seconds=PRINTED["S1a"]["seconds"],
            derivation="logged: elapsed time per iteration (s): 15.23 (TFLOPs: 8.04)", stack="megatron-deepspeed",
            software=_TR11),
    replace(_S1, key="S1b",
            source=f"{_BIGSCIENCE} train/tr11-176B-ml/README.md, 'Global batch size', the update: 'starts with "
                   "GBS=192/MBS=1 @ 73 TFLOPs'",
            micro_batch=1, global_batch=192,
            step_seconds=_megatron_flops(192, 2048, 70, 14336, _S1_FLOPS_VOCAB) / (384 * 73e12),
            derivation=f"the log's formula (math/README.md: Narayanan et al. equation 3, which gives the logged 8.04 "
                       f"TFLOPs at GBS 16): {_megatron_flops(192, 2048, 70, 14336, _S1_FLOPS_VOCAB):.4g} FLOPs / "
                       "(384 x 73 TFLOP/s)",
            stack="megatron-deepspeed", software=_TR11),
    _mcore("MC1", 24, 2048, 16, 1, "GPT 1.7B (Megatron-Core)"),
    _mcore("MC2", 30, 4096, 32, 2, "GPT 7.1B (Megatron-Core)"),
    _mcore("MC3", 32, 6144, 48, 4, "GPT 16B (Megatron-Core)"),
    _mcore("MC4", 48, 7168, 56, 8, "GPT 32B (Megatron-Core)"),
    _nemo("NM1", _NEMO_GPT3, gpus=128, batch=256, micro=1, seq=2048, tp=4, pp=8, cp=1, virtual=6),
    _nemo("NM2", _NEMO_GPT3, gpus=512, batch=2048, micro=2, seq=2048, tp=4, pp=8, cp=1, virtual=6),
    _nemo("NM3", LLAMA3_8B, gpus=8, batch=128, micro=1, seq=8192, tp=1, pp=1, cp=2, virtual=1),
    _nemo("NM4", LLAMA3_70B, gpus=64, batch=128, micro=1, seq=8192, tp=4, pp=4, cp=2, virtual=5),
    _nemo("NM5", _NEMO_GPT3_5B, gpus=64, batch=2048, micro=4, seq=2048, tp=1, pp=1, cp=1, virtual=1),
    _nemo("NM6", _NEMO_GPT3_20B, gpus=64, batch=256, micro=2, seq=2048, tp=2, pp=1, cp=1, virtual=1),
)


if __name__ == "__main__":
    for row in ROWS:
        print(f"{row.key:6} {row.stack:19} {row.gpus_per_node * row.nodes:5} GPUs  {row.layout_name:40} "
              f"{row.global_batch:5} x {row.seq}  {row.step_seconds:8.2f} s  {row.derivation}")
