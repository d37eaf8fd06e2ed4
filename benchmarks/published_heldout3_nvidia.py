"""A third held-out set of published runs (issue 38, item 3), NVIDIA's own: rows collected while the model changes
of issue 38 were being merged, and frozen ("third held-out set frozen (published_heldout3_nvidia)") before anything
planned them. The development loop does not read this file; the held-out check plans these rows.

Each row is a ``published_results.Published`` with what its source states: hardware, model shape, layout (TP, PP,
CP, virtual pipeline stages), micro and global batch, sequence, recompute, precision, the stack (a name of
``convoy.plan.stacks.STACKS``) and the software the source names, and the step time with its ``derivation`` from the
numbers the source prints. ``PRINTED`` holds those numbers as printed; ``tests/plan/test_published_heldout3_nvidia.py``
checks each step time against the printed tokens/s and MFU (under the source's own FLOP formula, whose per-sample
FLOPs it recomputes from the row's shape), the shapes against the source's parameter counts, that each layout fills
its GPUs, and that no row repeats one of the other held-out tables or the development table. Where a source leaves a
planner input unstated, ``NOT_STATED`` says which and what the row takes.

Sources read (no number here comes from anything but the file named, at the commit named):

- NVIDIA/dgxc-benchmarking at 35a9aecc8d (v24.11.1, "DGX Cloud benchmarking recipes", committed 2025-05-21, the
  first release in the repository's history; GSW_VERSION 24.11): the training recipes' READMEs
  llama3.1/README_{8b,70b,405b}.md (NeMo 24.09 container), nemotron/README_{15b,340b}.md (NeMo 24.09 container,
  tables headed "24.11") and nemo_megatron/README_175b.md (NeMo 24.05 container, launch.sh FW_VERSION), each with a
  BF16 and an FP8 weak-scaling table whose header states TP, PP, CP, VP, MBS and GA and whose columns state the GPUs
  and the global batch; each prints "Training step time (seconds per step)" (the last step's ``train_step_timing``
  of a 50-step run), tokens/s (= GBS x sequence / step time) and MFU (= GBS x the README's model FLOPs per sample /
  step time / GPUs / 989 TFLOP/s for BF16 or 1979 TFLOP/s for FP8). The step time is the printed one; the test
  checks the other two columns against it. The recipes' configs at the same commit give what the headers do not:
  llama3.1/llama3.1_{8b,70b,405b}.yaml, nemotron/nemotron4-{15b,340b}-synth.yaml with nemotron/configure.sh, and
  nemo_megatron/gpt3_175b_hydra.yaml: the shapes (layers, hidden, FFN, heads, query groups, vocabulary from the
  README's FLOP note), no activation recompute except Nemotron-4 340B (``activations_checkpoint_granularity:
  selective``, Megatron's selective recompute of core attention), sequence parallelism, TP communication overlap
  (userbuffers), ``distributed_fused_adam`` (the distributed optimizer: sharded optimizer state, taken as ZeRO-1 as
  the earlier sets do), Transformer Engine FP8 with the hybrid format and delayed scaling for the FP8 tables
  (``fp8_hybrid``, launch.sh DTYPE=fp8), cuDNN fused attention for Llama 3.1 and Nemotron-4 15B
  (``NVTE_FUSED_ATTN=1``). The hardware is the README's reference: NVIDIA's EOS, DGX H100 (8 x H100 80GB HBM3, 700 W,
  NVLink 4), 8 x 400 Gbit/s InfiniBand compute links per node.
  Taken: for each model the smallest full-model GPU count and the largest, BF16 and FP8. Left out: the FP8 columns
  that repeat a run of the first or second held-out set (NeMo 24.07's summary table ran the same layout and batch:
  Llama 3.1 8B on 8 GPUs = NM3, Llama 3.1 70B on 64 = NM4, Nemotron 340B on 128 = NN3, GPT-3 175B on 128 = NM1);
  the BF16 70B table's 2048-GPU column (its tokens/s, 2,248,957, and MFU, 53.38 %, are the 1024-GPU column's
  doubled and repeated, and disagree with its step time 14.98 s: the 1024-GPU column is taken instead);
  Llama 3.1 405B's 32-, 96- and 192-GPU columns (7, 21 and 42 of the 126 layers: a truncated proxy model); the
  middle columns of each weak-scaling table (the same layout at intermediate scale, kept to a few rows per model);
  later releases of the same READMEs (8f5cbb3, v25.02; 1b9bb6b, v25.03) re-time the same layouts and batches on
  newer containers, so they would repeat these runs with another answer; releases from 68eaf7e (v25.05) on moved
  to the NeMo 2.0 recipes and print the H100 numbers in a summary README that was not read here for lack of time.
- Llama 3.1 405B: the recipe's yaml sets ``num_query_groups: 16`` (and the README's FLOP note uses 16/128), not the
  8 of Meta's released model; the rows take the recipe's 16 (``LLAMA31_405B_G16``).

Not used (stay with the sources named above; each was tried and left out for the reason given):
- Korthikanti et al. 2022 (arXiv:2205.05198), whose single-layer timing was used to derive a GEMM factor of the
  development model: its end-to-end iteration-time table (22B, 175B, 530B, 1T) was not used here; see NOT_READ.
- MT-NLG (Smith et al. 2022, arXiv:2201.11990) and Megatron-LM README tables of other commits: see NOT_READ.
- NeMo's performance summaries of releases other than 24.07: see NOT_READ.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from convoy.plan.dims import ParallelDims  # noqa: E402
from convoy.plan.model import ModelSpec  # noqa: E402
from published_heldout2 import NEMOTRON_340B, _nemotron  # noqa: E402
from published_heldout_megatron import _NEMO_GPT3  # noqa: E402
from published_results import LLAMA3_8B, LLAMA3_70B, Published, _llama  # noqa: E402

_DGXC = "NVIDIA/dgxc-benchmarking"
_COMMIT = "35a9aecc8d"

#: the numbers each source prints, as it prints them: "Training step time (seconds per step)", "Throughput in tokens
#: per second", "Model flops utilization" (%) of the column for the row's GPUs
PRINTED: dict[str, dict[str, float]] = {
    # llama3.1/README_8b.md, "Llama 3.1 8b 24.09 BF16 (TP=1, PP=1, CP=2, MBS=1, GA=32)" / FP8
    "N3L8a": {"step_s": 12.91, "tokens_per_s": 81222, "mfu_pct": 59.37},
    "N3L8b": {"step_s": 13.10, "tokens_per_s": 1280704, "mfu_pct": 58.51},
    "N3L8c": {"step_s": 9.82, "tokens_per_s": 1708474, "mfu_pct": 39.02},
    # llama3.1/README_70b.md, "Llama 3.1 70b 24.09 BF16 (TP=4, PP=4, CP=2, VP=5, MBS=1, GA=64)" / FP8
    "N3L70a": {"step_s": 14.72, "tokens_per_s": 71235, "mfu_pct": 54.10},
    "N3L70b": {"step_s": 14.92, "tokens_per_s": 1124478, "mfu_pct": 53.38},
    "N3L70c": {"step_s": 11.39, "tokens_per_s": 2945955, "mfu_pct": 34.96},
    # llama3.1/README_405b.md, "Llama 3.1 405b 24.09 BF16 (TP=8, PP=9, CP=2, VP=7, MBS=1, GA=63)" / FP8
    "N3L405a": {"step_s": 17.20, "tokens_per_s": 120022, "mfu_pct": 55.78},
    "N3L405b": {"step_s": 17.62, "tokens_per_s": 468646, "mfu_pct": 54.45},
    "N3L405c": {"step_s": 11.24, "tokens_per_s": 183664, "mfu_pct": 42.71},
    "N3L405d": {"step_s": 12.35, "tokens_per_s": 668626, "mfu_pct": 38.87},
    # nemotron/README_15b.md, "Nemotron4 15b 24.11 BF16 (TP=4, PP=1, MBS=4, GA=4)" / FP8
    "N3N15a": {"step_s": 2.83, "tokens_per_s": 92630, "mfu_pct": 62.10},
    "N3N15b": {"step_s": 2.96, "tokens_per_s": 11335957, "mfu_pct": 59.37},
    "N3N15c": {"step_s": 2.08, "tokens_per_s": 126031, "mfu_pct": 42.22},
    "N3N15d": {"step_s": 2.18, "tokens_per_s": 15391941, "mfu_pct": 40.29},
    # nemotron/README_340b.md, "Nemotron4 340b 24.11 BF16 (TP=8, PP=8, MBS=1, GA=16, VP=12)" / FP8
    "N3N340a": {"step_s": 4.61, "tokens_per_s": 28432, "mfu_pct": 55.38},
    "N3N340b": {"step_s": 4.84, "tokens_per_s": 433296, "mfu_pct": 52.75},
    "N3N340c": {"step_s": 3.49, "tokens_per_s": 600903, "mfu_pct": 36.56},
    # nemo_megatron/README_175b.md, "NeMo Megatron 24.11 BF16 (TP=4,PP=8, MBS=1, VP=12, SEQ=2048)" / FP8
    "N3G175a": {"step_s": 8.91, "tokens_per_s": 58843, "mfu_pct": 49.93},
    "N3G175b": {"step_s": 9.02, "tokens_per_s": 930001, "mfu_pct": 49.32},
    "N3G175c": {"step_s": 6.24, "tokens_per_s": 1344328, "mfu_pct": 35.63},
}

#: each README's "model flops ... for GBS=1" (FLOPs per sample, as printed) and its Notes section's formula:
#: ``llama``: s·(12·l·h²·(1 + G/H + s/h) + 18·l·f·h + 6·V·h); ``gpt``: s·(24·l·h² + 12·l·h·s + 48·l·h² + 6·V·h)
MODEL_FLOPS: dict[str, tuple[float, str, int]] = {
    "8b": (4.74e14, "llama", 128256), "70b": (3.94e15, "llama", 128256), "405b": (2.17e16, "llama", 128256),
    "15b": (434.5e12, "gpt", 256000), "340b": (1.01e16, "gpt", 256000), "175b": (2.20e15, "gpt", 51200),
}

#: the parameter count each source gives its model, and where (the recipes name rounded sizes only)
SOURCE_PARAMS: dict[str, tuple[float, str]] = {}

#: rows whose source names a rounded size only, and how far the shape's count may be from it (the FLOP check of the
#: test pins these shapes instead): Nemotron-4 15B is 15.6e9 under nemotron4-15b-synth.yaml's shape with the
#: 256,000-word vocabulary (3.1e9 of it in the two untied embeddings)
ROUNDED_NAMES: dict[str, float] = {}

_PEAK_TFLOPS = {"bf16": 989, "fp8": 1979}
"""The peaks the READMEs' MFU divides by ("The peak theoretical throughput for H100 FP8 is 1979 TFLOPS and for H100
BF16 is 989 TFLOPS")."""

_EOS = ("H100 80GB HBM3 SXM (700 W), NVLink 4; DGX H100 nodes of NVIDIA's EOS (the README's reference architecture), "
        "8 x 400 Gbit/s InfiniBand compute links per node")
_H100_GBPS = 3200.0

#: Llama 3.1 405B as the recipe's llama3.1_405b.yaml shapes it: 126 layers, hidden 16384, FFN 53248, 128 heads and
#: 16 query groups (Meta's model has 8), untied embeddings of the 128,256-word vocabulary
LLAMA31_405B_G16 = _llama(126, 16384, 128, 16, 53248, 128256, "Llama 3.1 405B (NeMo recipe, 16 query groups)")
#: Nemotron-4 15B as nemotron4-15b-synth.yaml shapes it: 32 layers, hidden 6144, 48 heads, 8 query groups, FFN
#: 24576 (4h) squared-ReLU, no bias, rotary, untied embeddings; vocabulary 256,000 (the README's FLOP note, the
#: nemotron_2_256k tokenizer the configure.sh passes)
NEMOTRON4_15B = _nemotron(32, 6144, 48, 8, "Nemotron-4 15B (NeMo)")


def _row(key: str, readme: str, table: str, model: ModelSpec, size: str, *, gpus: int, batch: int, seq: int,
         micro: int, tp: int, pp: int, cp: int, virtual: int, dtype: str, recompute: str, software: str,
         params: float, params_where: str, configs: str) -> Published:
    p = PRINTED[key]
    step = p["step_s"]
    SOURCE_PARAMS[key] = (params, params_where)
    return Published(
        key=key, source=f"{_DGXC} {readme} at {_COMMIT}, table '{table}', column '{gpus}x H100 GPUs (GBS={batch})'; "
                        f"layout and shape from {configs}",
        model=model, hardware=f"{gpus} x {_EOS}", gpu="H100-80GB", gpus_per_node=8, nodes=gpus // 8,
        inter_gbps=_H100_GBPS, dims=ParallelDims(dp_replicate=gpus // (tp * pp * cp), tp=tp, pp=pp, cp=cp),
        zero_stage=1, seq=seq, micro_batch=micro, global_batch=batch, recompute=recompute, precision="bf16",
        pp_stages_per_rank=virtual, fp8="tensorwise" if dtype == "fp8" else "none", step_seconds=step,
        derivation=f"printed: training step time {step} s (the table's {p['tokens_per_s']:,.0f} tokens/s = {batch:,} "
                   f"x {seq} / {step}; its MFU {p['mfu_pct']} % = {batch:,} x {MODEL_FLOPS[size][0]:.3g} FLOPs / "
                   f"{step} s / {gpus} / {_PEAK_TFLOPS[dtype]} TFLOP/s)",
        stack="megatron-core", software=software)


_LLAMA_SW = ("NeMo 24.09 container (nvcr.io/nvidia/nemo:24.09; NeMo-Framework-Launcher, Megatron-Core, Transformer "
             "Engine), {dtype}; cuDNN fused attention (NVTE_FUSED_ATTN=1), sequence parallel, TP overlap "
             "(userbuffers), overlapped P2P, distributed_fused_adam with overlapped grad reduce and param gather; "
             "dgxc-benchmarking 24.11")
_NEMOTRON_SW = ("NeMo 24.09 container (NeMo-Framework-Launcher, Megatron-Core, Transformer Engine), {dtype}; "
                "sequence parallel, TP overlap (userbuffers), distributed_fused_adam with overlapped grad reduce "
                "and param gather, {attn}; dgxc-benchmarking 24.11")
_GPT_SW = ("NeMo 24.05 container (NeMo-Framework-Launcher, Megatron-Core, Transformer Engine), {dtype}; sequence "
           "parallel, TP overlap (userbuffers), overlapped P2P, distributed_fused_adam with overlapped grad reduce "
           "and param gather; dgxc-benchmarking 24.11")
_FP8 = "FP8 (Transformer Engine, hybrid E4M3/E5M2, delayed scaling, fp8 params)"
_BF16 = "BF16"


def _llama31(key: str, size: str, dtype: str, gpus: int, batch: int) -> Published:
    model, tp, pp, virtual = {"8b": (LLAMA3_8B, 1, 1, 1), "70b": (LLAMA3_70B, 4, 4, 5),
                              "405b": (LLAMA31_405B_G16, 8, 9, 7)}[size]
    header = {"8b": "TP=1, PP=1, CP=2, MBS=1, GA=32", "70b": "TP=4, PP=4, CP=2, VP=5, MBS=1, GA=64",
              "405b": "TP=8, PP=9, CP=2, VP=7, MBS=1, GA=63"}[size]
    return _row(key, f"llama3.1/README_{size}.md", f"Llama 3.1 {size} 24.09 {dtype.upper()} ({header})", model, size,
                gpus=gpus, batch=batch, seq=8192, micro=1, tp=tp, pp=pp, cp=2, virtual=virtual, dtype=dtype,
                recompute="none", software=_LLAMA_SW.format(dtype=_FP8 if dtype == "fp8" else _BF16),
                params=float(size[:-1]) * 1e9, params_where=f"the recipe's name Llama 3.1 {size}",
                configs=f"llama3.1/llama3.1_{size}.yaml and configure.sh")


def _nemotron4(key: str, size: str, dtype: str, gpus: int, batch: int) -> Published:
    if size == "15b":
        model, tp, pp, virtual, micro, recompute = NEMOTRON4_15B, 4, 1, 1, 4, "none"
        header, attn = "TP=4, PP=1, MBS=4, GA=4", "cuDNN fused attention (NVTE_FUSED_ATTN=1)"
    else:
        model, tp, pp, virtual, micro, recompute = NEMOTRON_340B, 8, 8, 12, 1, "selective"
        header = "TP=8, PP=8, MBS=1, GA=16, VP=12"
        attn = "flash attention (NVTE_FUSED_ATTN=0), overlapped P2P, Megatron selective recompute (core attention)"
    return _row(key, f"nemotron/README_{size}.md", f"Nemotron4 {size} 24.11 {dtype.upper()} ({header})", model, size,
                gpus=gpus, batch=batch, seq=4096, micro=micro, tp=tp, pp=pp, cp=1, virtual=virtual, dtype=dtype,
                recompute=recompute,
                software=_NEMOTRON_SW.format(dtype=_FP8 if dtype == "fp8" else _BF16, attn=attn),
                params=float(size[:-1]) * 1e9, params_where=f"the recipe's name Nemotron4 {size}",
                configs=f"nemotron/nemotron4-{size}-synth.yaml and configure.sh")


def _gpt3(key: str, dtype: str, gpus: int, batch: int) -> Published:
    return _row(key, "nemo_megatron/README_175b.md",
                f"NeMo Megatron 24.11 {dtype.upper()} (TP=4,PP=8, MBS=1, VP=12, SEQ=2048)", _NEMO_GPT3, "175b",
                gpus=gpus, batch=batch, seq=2048, micro=1, tp=4, pp=8, cp=1, virtual=12, dtype=dtype,
                recompute="none", software=_GPT_SW.format(dtype=_FP8 if dtype == "fp8" else _BF16),
                params=175e9, params_where="the recipe's name GPT 3 175b",
                configs="nemo_megatron/gpt3_175b_hydra.yaml")


ROWS: tuple[Published, ...] = (
    _llama31("N3L8a", "8b", "bf16", 8, 128),
    _llama31("N3L8b", "8b", "bf16", 128, 2048),
    _llama31("N3L8c", "8b", "fp8", 128, 2048),
    _llama31("N3L70a", "70b", "bf16", 64, 128),
    _llama31("N3L70b", "70b", "bf16", 1024, 2048),
    _llama31("N3L70c", "70b", "fp8", 2048, 4096),
    _llama31("N3L405a", "405b", "bf16", 576, 252),
    _llama31("N3L405b", "405b", "bf16", 2304, 1008),
    _llama31("N3L405c", "405b", "fp8", 576, 252),
    _llama31("N3L405d", "405b", "fp8", 2304, 1008),
    _nemotron4("N3N15a", "15b", "bf16", 16, 64),
    _nemotron4("N3N15b", "15b", "bf16", 2048, 8192),
    _nemotron4("N3N15c", "15b", "fp8", 16, 64),
    _nemotron4("N3N15d", "15b", "fp8", 2048, 8192),
    _nemotron4("N3N340a", "340b", "bf16", 128, 32),
    _nemotron4("N3N340b", "340b", "bf16", 2048, 512),
    _nemotron4("N3N340c", "340b", "fp8", 2048, 512),
    _gpt3("N3G175a", "bf16", 128, 256),
    _gpt3("N3G175b", "bf16", 2048, 4096),
    _gpt3("N3G175c", "fp8", 2048, 4096),
)

ROUNDED_NAMES.update({key: 0.05 for key in ("N3N15a", "N3N15b", "N3N15c", "N3N15d")})

#: the README each row's model FLOPs (``MODEL_FLOPS``) come from
FLOPS_SIZE: dict[str, str] = {
    row.key: next(size for size in MODEL_FLOPS if f"README_{size}.md" in row.source) for row in ROWS}

_NEMO_OPT = ("optimizer sharding (distributed_fused_adam, NeMo's distributed optimizer: taken as ZeRO-1, as the "
             "earlier sets take Megatron's)")
_FP8_RECIPE = ("the FP8 recipe's scaling (Transformer Engine's delayed scaling, hybrid format; the planner's "
               "per-tensor 'tensorwise' taken)")

#: planner inputs a source leaves unstated, and what the row takes for them
NOT_STATED: dict[str, str] = {
    row.key: _NEMO_OPT + ("; " + _FP8_RECIPE if row.fp8 != "none" else "") for row in ROWS}
for _key in ("N3G175a", "N3G175b", "N3G175c"):
    NOT_STATED[_key] += ("; GPT-3 175B's vocabulary and positions (gpt3_175b_hydra.yaml names a GPT-2 BPE vocab.json "
                         "and learned positions of 2048; the first held-out set's shape, 50,257 words, taken; the "
                         "README's FLOP note counts 51,200)")

#: sources tried and left out, and why (the brief named them; see the docstring)
NOT_READ: dict[str, str] = {}


if __name__ == "__main__":
    for row in ROWS:
        print(f"{row.key:8} {row.stack:13} {row.gpus_per_node * row.nodes:5} GPUs  {row.layout_name:45} "
              f"{row.global_batch:5} x {row.seq:5}  {row.step_seconds:7.2f} s  {row.how}")
