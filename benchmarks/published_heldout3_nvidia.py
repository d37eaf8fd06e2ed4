"""A third held-out set of published runs (issue 38, item 3), NVIDIA's own: rows collected while the model changes
of issue 38 were being merged, and frozen ("third held-out set frozen (published_heldout3_nvidia)") before anything
planned them. The development loop does not read this file; the held-out check plans these rows.

Each row is a ``published_results.Published`` with what its source states: hardware, model shape, layout (TP, PP,
CP, virtual pipeline stages), micro and global batch, sequence, recompute, precision, the stack (a name of
``convoy.plan.stacks.STACKS``) and the software the source names, and the step time with its ``derivation`` from the
numbers the source prints. ``PRINTED`` holds those numbers as printed; ``tests/plan/test_published_heldout3_nvidia.py``
checks each step time against the printed tokens/s and MFU (or TFLOP/s), the FLOPs per sample each source prints
against the row's shape under the source's own formula, the shapes against the parameter counts the sources name,
that each layout fills its GPUs, and that no row repeats one of the other held-out tables or the development table.
Where a source leaves a planner input unstated, ``NOT_STATED`` says which and what the row takes. All rows ran on
Megatron-Core through NeMo (stack ``megatron-core``) on DGX H100s.

Sources read (no number here comes from anything but the file named, at the commit named):

- NVIDIA/dgxc-benchmarking at 35a9aecc8d (v24.11.1, committed 2025-05-21, the first release in the repository's
  history; GSW_VERSION 24.11), keys N3L*, N3N*, N3G*: the training recipes' READMEs llama3.1/README_{8b,70b,405b}.md
  (NeMo 24.09 container), nemotron/README_{15b,340b}.md (NeMo 24.09 container, tables headed "24.11") and
  nemo_megatron/README_175b.md (NeMo 24.05 container, launch.sh FW_VERSION), each with a BF16 and an FP8
  weak-scaling table whose header states TP, PP, CP, VP, MBS and GA and whose columns state the GPUs and the global
  batch; each prints "Training step time (seconds per step)" (the last step's ``train_step_timing`` of a 50-step
  run), tokens/s (= GBS x sequence / step time) and MFU (= GBS x the README's model FLOPs per sample / step time /
  GPUs / 989 TFLOP/s for BF16 or 1979 TFLOP/s for FP8). The step time is the printed one; the test checks the other
  two columns against it. The recipes' configs at the same commit give what the headers do not:
  llama3.1/llama3.1_{8b,70b,405b}.yaml with configure.sh, nemotron/nemotron4-{15b,340b}-synth.yaml with
  configure.sh, and nemo_megatron/gpt3_175b_hydra.yaml: the shapes (layers, hidden, FFN, heads, query groups; the
  vocabulary from the README's FLOP note), no activation recompute except Nemotron-4 340B
  (``activations_checkpoint_granularity: selective``, Megatron's selective recompute of core attention), sequence
  parallelism, TP communication overlap (userbuffers), ``distributed_fused_adam`` (the distributed optimizer), FP8
  through Transformer Engine with the hybrid format, delayed scaling and FP8 parameters (``fp8_hybrid``,
  ``fp8_params``; launch.sh DTYPE=fp8, the configure.sh overrides), cuDNN fused attention for Llama 3.1 and
  Nemotron-4 15B (``NVTE_FUSED_ATTN=1``), flash attention for Nemotron-4 340B and GPT-3 175B. The hardware is the
  repository README's reference: NVIDIA's EOS, DGX H100 (8 x H100 80GB HBM3, 700 W, NVLink 4), 8 x 400 Gbit/s
  InfiniBand compute links per node.
- NVIDIA/dgxc-benchmarking at 85380ffe02 (v25.04.01, committed 2025-05-21; FW_VERSION 25.02.01, NeMo 2.0's
  scripts/performance recipes), keys N3R*: llama3.1/README.md (the Llama 3 70B FP8 layout TP 4 x PP 8 x VP 5
  without CP, new against 24.11's TP 4 x PP 4 x CP 2) and nemotron/README.md (Nemotron-4 15B at TP 2, MBS 2, new
  against 24.11's TP 4, MBS 4): the layout table at the top of each README, the same three printed rows per column,
  and the Notes' FLOP formula (Nemotron: 12·l·h²·(1 + G/H + s/h) + 12·l·h·f + 6·V·h per token, 3.85e14 per 15B
  sample; the 70B README prints no per-sample figure, the test takes 24.11's 3.94e15, which gives the printed MFU).
  The layouts agree with nemotron/launch.sh (TP 2, MBS 2, GBS = 4 per GPU) and with NVIDIA/NeMo
  scripts/performance/recommended_model_configs/model_configs_h100.csv at 4411158716 (2025-03, the 25.02 recipes'
  time); the recipes (nemo/collections/llm/recipes/llama3_70b.py, nemotron4_15b.py at that commit) set no recompute;
  FP8 is ``bf16_with_fp8_mixed`` (delayed scaling).
- NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md at c0b9a00031 (2026-02-26, "26.02 perf summary"), "26.02
  NeMo Container", DGX-H100 table, key N3B70: LLAMA3_70B on 64 GPUs, FP8, GBS 256, MBS 1, TP 4, PP 8, CP 1, VP 5,
  Tokens / sec / GPU and Model TFLOP / sec / GPU; the recipe is scripts/performance/configs/llama/
  llama3_workload_base_configs.py's LLAMA3_70B_PRETRAIN_CONFIG_H100_FP8_CS_V2 (the GBS-256 variant) over
  src/megatron/bridge/recipes/llama/llama3.py's llama3_70b_pretrain_config (no recompute, distributed optimizer,
  sequence parallel) at the same commit; FP8-CS is Transformer Engine's per-tensor current scaling. The TFLOP column
  agrees with the tokens/s column under the Llama formula above with causal (halved) attention: the test checks it.

Taken: for each model and layout the smallest full-model GPU count and the largest, BF16 and FP8, a few rows per
model. Left out, and why:
- FP8 columns of 24.11 that repeat a run of the first or second held-out set (NeMo 24.07's summary table ran the
  same layout and batch): Llama 3.1 8B on 8 GPUs (NM3), 70B on 64 (NM4), Nemotron 340B on 128 (NN3), GPT-3 175B on
  128 (NM1); and 25.04.01's 70B FP8 64-GPU column (GBS 128: the same batch as NM4, a different layout, left out to
  keep one row per batch and GPU count).
- The 24.11 BF16 70B table's 2048-GPU column: its tokens/s (2,248,957) and MFU (53.38 %) are the 1024-GPU column's
  doubled and repeated and disagree with its step time (14.98 s); the 1024-GPU column is taken instead.
- Llama 3.1 405B's 32-, 96- and 192-GPU columns (24.11) and its "405b-Proxy" rows (25.04.01): 7 to 62 of the 126
  layers, a truncated proxy model. 25.04.01's 405B rows and Megatron-Bridge's (TP 8 x PP 8 x VP 8 = 64 chunks for
  126 layers): the recipe splits the pipeline unevenly (``account_for_embedding_in_pipeline_split`` and
  ``account_for_loss_in_pipeline_split`` in llama31_405b_pretrain_config), which a row cannot state.
- 25.04.01's Nemotron-4 340B rows: its README's layout table says VP NA where launch.sh and NeMo's csv set VP 12;
  with VP 12 they are 24.11's layout and batch re-run (256 GPUs, GBS 64). Its Llama 3.1 8B and 70B BF16 rows: 24.11's
  layouts and batches re-run on a newer container. Later dgxc releases (68eaf7e, v25.05, on) print GB200/B200 tables
  only for these models ("For H100 support: see the previous release").
- Megatron-Bridge's other DGX-H100 rows: LLAMA3_8B (25.09, 25.11: the table says FSDP 8, the H100 FP8-CS config
  at 97ad8cc6f sets no FSDP and ``recompute_num_layers=5``: not pinned down), LLAMA3_70B at GBS 128 (25.09, 25.11:
  the same GPUs and batch as NM4), the same 70B run re-timed in 26.02.01-26.04.01, and the MoE rows.
- The Megatron-LM README of other commits: its 2022-24 text table (22B-1T) prints MFU and HFU only, no layout,
  measured "using a data parallel size of one"; its 2024-25 figures are images (images/model_table.png is the one
  the first held-out set read); its 2025-10 table lists layouts without throughput. Korthikanti et al. 2022
  (arXiv:2205.05198), whose single-layer timing was used to derive a GEMM factor of the development model: its
  end-to-end iteration-time table (22B, 175B, 530B, 1T) was not used here, since no text of the paper could be read
  (the pages and code indexes hold its abstract and the README's MFU table only), and Megatron-LM's examples hold no
  script for it. MT-NLG (Smith et al. 2022, arXiv:2201.11990): its throughput table could not be read either (the
  first held-out set found only a third party's transcription). NeMo's repository holds performance_summary.md for
  24.07 only (docs/source/performance/, 4c73f77670..d31653f792, then a link); of the docs pages of 24.09-25.07 the
  second held-out set found the DGX-H100 tables unreadable but for a GPT-3 175B row (the first set's NM2 layout);
  from 25.09 on they are the Megatron-Bridge summaries above.
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
_V2411 = "35a9aecc8d"
_V2504 = "85380ffe02"

#: the numbers each source prints, as it prints them. dgxc-benchmarking: "Training step time (seconds per step)",
#: "Throughput in tokens per second", "Model flops utilization" (%) of the column for the row's GPUs;
#: Megatron-Bridge: "Tokens / sec / GPU", "Model TFLOP / sec / GPU"
PRINTED: dict[str, dict[str, float]] = {
    # 35a9aecc8d llama3.1/README_8b.md, "Llama 3.1 8b 24.09 BF16 (TP=1, PP=1, CP=2, MBS=1, GA=32)" / FP8
    "N3L8a": {"step_s": 12.91, "tokens_per_s": 81222, "mfu_pct": 59.37},
    "N3L8c": {"step_s": 9.82, "tokens_per_s": 1708474, "mfu_pct": 39.02},
    # 35a9aecc8d llama3.1/README_70b.md, "Llama 3.1 70b 24.09 BF16 (TP=4, PP=4, CP=2, VP=5, MBS=1, GA=64)" / FP8
    "N3L70a": {"step_s": 14.72, "tokens_per_s": 71235, "mfu_pct": 54.10},
    "N3L70b": {"step_s": 14.92, "tokens_per_s": 1124478, "mfu_pct": 53.38},
    "N3L70c": {"step_s": 11.39, "tokens_per_s": 2945955, "mfu_pct": 34.96},
    # 35a9aecc8d llama3.1/README_405b.md, "Llama 3.1 405b 24.09 BF16 (TP=8, PP=9, CP=2, VP=7, MBS=1, GA=63)" / FP8
    "N3L405a": {"step_s": 17.20, "tokens_per_s": 120022, "mfu_pct": 55.78},
    "N3L405b": {"step_s": 17.62, "tokens_per_s": 468646, "mfu_pct": 54.45},
    "N3L405d": {"step_s": 12.35, "tokens_per_s": 668626, "mfu_pct": 38.87},
    # 35a9aecc8d nemotron/README_15b.md, "Nemotron4 15b 24.11 BF16 (TP=4, PP=1, MBS=4, GA=4)" / FP8
    "N3N15a": {"step_s": 2.83, "tokens_per_s": 92630, "mfu_pct": 62.10},
    "N3N15c": {"step_s": 2.08, "tokens_per_s": 126031, "mfu_pct": 42.22},
    # 35a9aecc8d nemotron/README_340b.md, "Nemotron4 340b 24.11 BF16 (TP=8, PP=8, MBS=1, GA=16, VP=12)" / FP8
    "N3N340a": {"step_s": 4.61, "tokens_per_s": 28432, "mfu_pct": 55.38},
    "N3N340b": {"step_s": 4.84, "tokens_per_s": 433296, "mfu_pct": 52.75},
    "N3N340c": {"step_s": 3.49, "tokens_per_s": 600903, "mfu_pct": 36.56},
    # 35a9aecc8d nemo_megatron/README_175b.md, "NeMo Megatron 24.11 BF16 (TP=4,PP=8, MBS=1, VP=12, SEQ=2048)" / FP8
    "N3G175a": {"step_s": 8.91, "tokens_per_s": 58843, "mfu_pct": 49.93},
    "N3G175b": {"step_s": 9.02, "tokens_per_s": 930001, "mfu_pct": 49.32},
    "N3G175c": {"step_s": 6.24, "tokens_per_s": 1344328, "mfu_pct": 35.63},
    # 85380ffe02 llama3.1/README.md, "Llama 3.1 70b FP8" table (layout table: TP 4, PP 8, CP 1, VP 5, MBS 1)
    "N3R70": {"step_s": 10.08, "tokens_per_s": 1664406, "mfu_pct": 39.50},
    # 85380ffe02 nemotron/README.md, "Nemotron4 15b BF16" / "FP8" tables (layout table: TP 2, PP 1, MBS 2, GA 4)
    "N3R15a": {"step_s": 2.66, "tokens_per_s": 98550, "mfu_pct": 58.54},
    "N3R15b": {"step_s": 2.09, "tokens_per_s": 16054752, "mfu_pct": 37.23},
    # Megatron-Bridge c0b9a00031 docs/performance-summary.md, 26.02, DGX-H100, LLAMA3_70B FP8 row
    "N3B70": {"tokens_per_gpu": 1621, "tflops": 728},
}

#: each source's model FLOPs, as printed ("The model flops for ... for GBS=1 is ..."; per token for Megatron-Bridge,
#: whose column is TFLOP/s), with its formula and the vocabulary its note uses:
#: ``llama``: s·(12·l·h²·(1 + G/H + s/h) + 18·l·f·h + 6·V·h) (llama3.1/README_*.md Notes);
#: ``llama-causal``: the same with s/2h (the per-token figure that gives Megatron-Bridge's TFLOP column);
#: ``gpt``: s·(24·l·h² + 12·l·h·s + 48·l·h² + 6·V·h) (24.11's nemotron/ and nemo_megatron/ Notes);
#: ``nemotron``: s·(12·l·h²·(1 + G/H + s/h) + 12·l·h·f + 6·V·h) (25.04.01's nemotron/README.md Notes)
MODEL_FLOPS: dict[str, tuple[float | None, str, int]] = {
    "llama3.1-8b": (4.74e14, "llama", 128256), "llama3.1-70b": (3.94e15, "llama", 128256),
    "llama3.1-405b": (2.17e16, "llama", 128256), "nemotron4-15b": (434.5e12, "gpt", 256000),
    "nemotron4-340b": (1.01e16, "gpt", 256000), "gpt3-175b": (2.20e15, "gpt", 51200),
    "nemotron4-15b-2504": (3.85e14, "nemotron", 256000), "llama3-70b-bridge": (None, "llama-causal", 128256),
}

#: which ``MODEL_FLOPS`` entry each row's source uses
FLOPS_OF: dict[str, str] = {}

#: the parameter count each source gives its model, and where (the sources name rounded sizes only)
SOURCE_PARAMS: dict[str, tuple[float, str]] = {}

#: rows whose source names a rounded size only, and how far the shape's count may be from it (the FLOP checks of the
#: test pin these shapes instead): Nemotron-4 15B is 15.6e9 under nemotron4-15b-synth.yaml's shape with the
#: 256,000-word vocabulary (3.1e9 of it in the two untied embeddings)
ROUNDED_NAMES: dict[str, float] = {}

_PEAK_TFLOPS = {"bf16": 989, "fp8": 1979}
"""The peaks the READMEs' MFU divides by ("The peak theoretical throughput for H100 FP8 is 1979 TFLOPS and for H100
BF16 is 989 TFLOPS")."""

_EOS = ("H100 80GB HBM3 SXM (700 W), NVLink 4; DGX H100 nodes of NVIDIA's EOS (the README's reference architecture), "
        "8 x 400 Gbit/s InfiniBand compute links per node")
_DGX_H100 = "H100 80GB SXM (DGX-H100, NVLink); network not stated"
_H100_GBPS = 3200.0

#: Llama 3.1 405B as the recipe's llama3.1_405b.yaml shapes it: 126 layers, hidden 16384, FFN 53248, 128 heads and
#: 16 query groups (Meta's model has 8), untied embeddings of the 128,256-word vocabulary
LLAMA31_405B_G16 = _llama(126, 16384, 128, 16, 53248, 128256, "Llama 3.1 405B (NeMo recipe, 16 query groups)")
#: Nemotron-4 15B as nemotron4-15b-synth.yaml (and NeMo 2.0's Nemotron4Config15B) shape it: 32 layers, hidden 6144,
#: 48 heads, 8 query groups, FFN 24576 (4h) squared-ReLU, no bias, rotary, untied embeddings; vocabulary 256,000 (the
#: READMEs' FLOP notes, the nemotron_2_256k tokenizer configure.sh passes)
NEMOTRON4_15B = _nemotron(32, 6144, 48, 8, "Nemotron-4 15B (NeMo)")


def _row(key: str, source: str, model: ModelSpec, flops: str, *, gpus: int, batch: int, seq: int, micro: int,
         tp: int, pp: int, cp: int, virtual: int, dtype: str, recompute: str, software: str, params: float,
         params_where: str, hardware: str = _EOS) -> Published:
    p = PRINTED[key]
    FLOPS_OF[key] = flops
    SOURCE_PARAMS[key] = (params, params_where)
    if "step_s" in p:
        step = p["step_s"]
        derivation = (f"printed: training step time {step} s (the table's {p['tokens_per_s']:,.0f} tokens/s = "
                      f"{batch:,} x {seq} / {step}; its MFU {p['mfu_pct']} % = {batch:,} x "
                      f"{MODEL_FLOPS[flops][0]:.3g} FLOPs / {step} s / {gpus} / {_PEAK_TFLOPS[dtype]} TFLOP/s)")
    else:
        step = batch * seq / (p["tokens_per_gpu"] * gpus)
        derivation = f"{batch:,} x {seq} tokens / ({p['tokens_per_gpu']:,.0f} tokens/s/GPU x {gpus})"
    return Published(
        key=key, source=source, model=model, hardware=f"{gpus} x {hardware}", gpu="H100-80GB", gpus_per_node=8,
        nodes=gpus // 8, inter_gbps=_H100_GBPS,
        dims=ParallelDims(dp_replicate=gpus // (tp * pp * cp), tp=tp, pp=pp, cp=cp), zero_stage=1, seq=seq,
        micro_batch=micro, global_batch=batch, recompute=recompute, precision="bf16", pp_stages_per_rank=virtual,
        fp8="tensorwise" if dtype == "fp8" else "none", step_seconds=step, derivation=derivation,
        stack="megatron-core", software=software)


def _dgxc(commit: str, readme: str, table: str, gpus: int, batch: int, configs: str) -> str:
    return (f"{_DGXC} {readme} at {commit}, table '{table}', column '{gpus}x H100 GPUs' (GBS {batch}); layout and "
            f"shape from {configs}")


_FP8_DELAYED = "FP8 (Transformer Engine, hybrid E4M3/E5M2, delayed scaling{params})"
_SW_2411 = ("NeMo {container} container (NeMo-Framework-Launcher, Megatron-Core, Transformer Engine), {dtype}; "
            "{attn}{tp}, distributed_fused_adam with overlapped grad reduce and param gather{extra}; "
            "dgxc-benchmarking 24.11")
_TP_2411 = ", sequence parallel, TP overlap (userbuffers)"
_SW_2504 = ("NeMo 25.02.01 container (NeMo 2.0 scripts/performance recipe, Megatron-Core, Transformer Engine), "
            "{dtype}; sequence parallel, TP overlap (userbuffers), distributed optimizer; dgxc-benchmarking 25.04.01")


def _dtype(dtype: str, params: str = "") -> str:
    return _FP8_DELAYED.format(params=params) if dtype == "fp8" else "BF16"


def _llama31(key: str, size: str, dtype: str, gpus: int, batch: int) -> Published:
    model, tp, pp, virtual = {"8b": (LLAMA3_8B, 1, 1, 1), "70b": (LLAMA3_70B, 4, 4, 5),
                              "405b": (LLAMA31_405B_G16, 8, 9, 7)}[size]
    header = {"8b": "TP=1, PP=1, CP=2, MBS=1, GA=32", "70b": "TP=4, PP=4, CP=2, VP=5, MBS=1, GA=64",
              "405b": "TP=8, PP=9, CP=2, VP=7, MBS=1, GA=63"}[size]
    return _row(key, _dgxc(_V2411, f"llama3.1/README_{size}.md", f"Llama 3.1 {size} 24.09 {dtype.upper()} ({header})",
                           gpus, batch, f"llama3.1/llama3.1_{size}.yaml and configure.sh"),
                model, f"llama3.1-{size}", gpus=gpus, batch=batch, seq=8192, micro=1, tp=tp, pp=pp, cp=2,
                virtual=virtual, dtype=dtype, recompute="none",
                software=_SW_2411.format(container="24.09", dtype=_dtype(dtype, ", fp8 params"),
                                         attn="cuDNN fused attention (NVTE_FUSED_ATTN=1)",
                                         tp=_TP_2411 if tp > 1 else "", extra=", overlapped P2P" if pp > 1 else ""),
                params=float(size[:-1]) * 1e9, params_where=f"the recipe's name Llama 3.1 {size}")


def _nemotron4(key: str, size: str, dtype: str, gpus: int, batch: int) -> Published:
    if size == "15b":
        model, tp, pp, virtual, micro, recompute = NEMOTRON4_15B, 4, 1, 1, 4, "none"
        header, attn, extra = "TP=4, PP=1, MBS=4, GA=4", "cuDNN fused attention (NVTE_FUSED_ATTN=1)", ""
    else:
        model, tp, pp, virtual, micro, recompute = NEMOTRON_340B, 8, 8, 12, 1, "selective"
        header, attn = "TP=8, PP=8, MBS=1, GA=16, VP=12", "flash attention (NVTE_FUSED_ATTN=0)"
        extra = ", overlapped P2P, Megatron's selective recompute (core attention)"
    return _row(key, _dgxc(_V2411, f"nemotron/README_{size}.md", f"Nemotron4 {size} 24.11 {dtype.upper()} ({header})",
                           gpus, batch, f"nemotron/nemotron4-{size}-synth.yaml and configure.sh"),
                model, f"nemotron4-{size}", gpus=gpus, batch=batch, seq=4096, micro=micro, tp=tp, pp=pp, cp=1,
                virtual=virtual, dtype=dtype, recompute=recompute,
                software=_SW_2411.format(container="24.09", dtype=_dtype(dtype, ", fp8 params"), attn=attn,
                                         tp=_TP_2411, extra=extra),
                params=float(size[:-1]) * 1e9, params_where=f"the recipe's name Nemotron4 {size}")


def _gpt3(key: str, dtype: str, gpus: int, batch: int) -> Published:
    return _row(key, _dgxc(_V2411, "nemo_megatron/README_175b.md",
                           f"NeMo Megatron 24.11 {dtype.upper()} (TP=4,PP=8, MBS=1, VP=12, SEQ=2048)", gpus, batch,
                           "nemo_megatron/gpt3_175b_hydra.yaml"),
                _NEMO_GPT3, "gpt3-175b", gpus=gpus, batch=batch, seq=2048, micro=1, tp=4, pp=8, cp=1, virtual=12,
                dtype=dtype, recompute="none",
                software=_SW_2411.format(container="24.05", dtype=_dtype(dtype, ", fp8 params"),
                                         attn="flash attention (NVTE_FUSED_ATTN=0; the yaml's attention and "
                                              "hidden dropout 0.1)", tp=_TP_2411, extra=", overlapped P2P"),
                params=175e9, params_where="the recipe's name GPT 3 175b")


ROWS: tuple[Published, ...] = (
    _llama31("N3L8a", "8b", "bf16", 8, 128),
    _llama31("N3L8c", "8b", "fp8", 128, 2048),
    _llama31("N3L70a", "70b", "bf16", 64, 128),
    _llama31("N3L70b", "70b", "bf16", 1024, 2048),
    _llama31("N3L70c", "70b", "fp8", 2048, 4096),
    _llama31("N3L405a", "405b", "bf16", 576, 252),
    _llama31("N3L405b", "405b", "bf16", 2304, 1008),
    _llama31("N3L405d", "405b", "fp8", 2304, 1008),
    _nemotron4("N3N15a", "15b", "bf16", 16, 64),
    _nemotron4("N3N15c", "15b", "fp8", 16, 64),
    _nemotron4("N3N340a", "340b", "bf16", 128, 32),
    _nemotron4("N3N340b", "340b", "bf16", 2048, 512),
    _nemotron4("N3N340c", "340b", "fp8", 2048, 512),
    _gpt3("N3G175a", "bf16", 128, 256),
    _gpt3("N3G175b", "bf16", 2048, 4096),
    _gpt3("N3G175c", "fp8", 2048, 4096),
    _row("N3R70", _dgxc(_V2504, "llama3.1/README.md", "Llama 3.1 70b FP8", 1024, 2048,
                        "the README's layout table (70b FP8: TP 4, PP 8, CP 1, VP 5, MBS 1, GBS 2048 at 1024 GPUs), "
                        "NeMo model_configs_h100.csv (4411158716), recipes/llama3_70b.py"),
         LLAMA3_70B, "llama3.1-70b", gpus=1024, batch=2048, seq=8192, micro=1, tp=4, pp=8, cp=1, virtual=5,
         dtype="fp8", recompute="none", software=_SW_2504.format(dtype=_dtype("fp8")),
         params=70e9, params_where="the README's name Llama 3.1 70b"),
    _row("N3R15a", _dgxc(_V2504, "nemotron/README.md", "Nemotron4 15b BF16", 16, 64,
                         "the README's layout table (15b: TP 2, PP 1, MBS 2, GA 4), launch.sh, NeMo "
                         "model_configs_h100.csv (4411158716), recipes/nemotron4_15b.py"),
         NEMOTRON4_15B, "nemotron4-15b-2504", gpus=16, batch=64, seq=4096, micro=2, tp=2, pp=1, cp=1, virtual=1,
         dtype="bf16", recompute="none", software=_SW_2504.format(dtype="BF16"),
         params=15e9, params_where="the README's name Nemotron4 15b"),
    _row("N3R15b", _dgxc(_V2504, "nemotron/README.md", "Nemotron4 15b FP8", 2048, 8192,
                         "the README's layout table (15b: TP 2, PP 1, MBS 2, GA 4), launch.sh, NeMo "
                         "model_configs_h100.csv (4411158716), recipes/nemotron4_15b.py"),
         NEMOTRON4_15B, "nemotron4-15b-2504", gpus=2048, batch=8192, seq=4096, micro=2, tp=2, pp=1, cp=1, virtual=1,
         dtype="fp8", recompute="none", software=_SW_2504.format(dtype=_dtype("fp8")),
         params=15e9, params_where="the README's name Nemotron4 15b"),
    _row("N3B70", "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md at c0b9a00031 (2026-02-26), '26.02 NeMo "
                  "Container', DGX-H100 table, row LLAMA3_70B FP8; recipe scripts/performance/configs/llama/"
                  "llama3_workload_base_configs.py LLAMA3_70B_PRETRAIN_CONFIG_H100_FP8_CS_V2 over "
                  "src/megatron/bridge/recipes/llama/llama3.py llama3_70b_pretrain_config",
         LLAMA3_70B, "llama3-70b-bridge", gpus=64, batch=256, seq=8192, micro=1, tp=4, pp=8, cp=1, virtual=5,
         dtype="fp8", recompute="none", hardware=_DGX_H100,
         software="NeMo 26.02 container, Megatron-Bridge performance recipe (Megatron-Core, Transformer Engine): "
                  "FP8 with per-tensor current scaling (FP8-CS), TP overlap (userbuffers_fp8_h100_h8192_tp4_mbs1_"
                  "seqlen8192), sequence parallel, distributed optimizer with overlapped grad reduce and param "
                  "gather, no recompute",
         params=70e9, params_where="the table's name LLAMA3_70B"),
)

ROUNDED_NAMES.update({key: 0.05 for key in ("N3N15a", "N3N15c", "N3R15a", "N3R15b")})

_NEMO_OPT = ("optimizer sharding (NeMo's distributed optimizer, which shards the optimizer state over data-parallel "
             "ranks: taken as ZeRO-1, as the earlier sets take it)")
_FP8_RECIPE = ("the FP8 recipe's scaling (Transformer Engine's delayed scaling; the planner's per-tensor "
               "'tensorwise' taken)")

#: planner inputs a source leaves unstated, and what the row takes for them
NOT_STATED: dict[str, str] = {
    row.key: _NEMO_OPT + ("; " + _FP8_RECIPE if row.fp8 != "none" and row.key != "N3B70" else "") for row in ROWS}
for _key in ("N3G175a", "N3G175b", "N3G175c"):
    NOT_STATED[_key] += ("; GPT-3 175B's vocabulary (gpt3_175b_hydra.yaml names a GPT-2 BPE vocab.json; the first "
                         "held-out set's shape, 50,257 words and learned positions of 2048, taken; the README's FLOP "
                         "note counts 51,200)")
NOT_STATED["N3B70"] += ("; the network (the table says DGX-H100 only: 8 x 400 Gbit/s per node taken, a DGX H100's); "
                        "the Megatron-Bridge version inside the 26.02 container (the recipe files at c0b9a00031, the "
                        "commit that wrote the 26.02 table, taken)")
for _key in ("N3R70", "N3R15a", "N3R15b"):
    NOT_STATED[_key] += ("; the NeMo 2.0 recipe inside the 25.02.01 container (NVIDIA/NeMo at 4411158716, 2025-03, "
                         "taken: its csv gives the README's layouts)")


if __name__ == "__main__":
    for row in ROWS:
        print(f"{row.key:8} {row.gpus_per_node * row.nodes:5} GPUs  {row.layout_name:45} {row.global_batch:5} x "
              f"{row.seq:5}  {row.step_seconds:7.2f} s  {row.how}")
