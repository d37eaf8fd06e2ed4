"""A fourth held-out set of published runs (issue 38, item 3), NVIDIA's own: rows collected while the model changes
of issue 38 were being merged, and frozen ("fourth held-out set frozen (published_heldout4_nvidia)") before anything
planned them. The development loop does not read this file; the held-out check plans these rows.

Each row is a ``published_results.Published`` with what its source states: hardware, model shape, layout (TP, PP,
CP, virtual pipeline stages, FSDP), micro and global batch, sequence, recompute, precision, the stack (a name of
``convoy.plan.stacks.STACKS``) and the software the source names, and the step time with its ``derivation`` from the
numbers the source prints. ``PRINTED`` holds those numbers as printed; ``tests/plan/test_published_heldout4_nvidia.py``
checks each step time against them, each printed TFLOP/s column or MFU against the row's shape under the source's own
FLOP formula, the shapes against the parameter counts the sources name, that each layout fills its GPUs, and that no
row repeats one of the other held-out tables or the development table. Where a source leaves a planner input
unstated, ``NOT_STATED`` says which and what the row takes. All rows ran on Megatron-Core through NeMo or
Megatron-Bridge (stack ``megatron-core``); five of them on DGX B200s, the first B200 rows of any table here.

Sources read (no number here comes from anything but the page or file named, at the commit named):

- NVIDIA NeMo Framework user guide, "Performance" page of the 25.02 release
  (docs.nvidia.com/nemo-framework/user-guide/latest/performance/performance_summary.html as stored: "Pretraining ...
  FP8 precision (using NeMo 2.0)", "Container: NeMo 25.02", "System: DGX-B200"), keys N4B*: the DGX-B200 table's
  dense rows GPT3-175B, LLAMA3-8B, LLAMA3-70B, Nemotron-15B and Nemotron-340B, each with #-GPUs, GBS, MBS, sequence
  length, TP, PP, CP, VP, EP, GA, "Tokens / sec / GPU" and "Model TFLOP / sec / GPU". The step time is GBS x
  sequence / (tokens/s/GPU x GPUs); the test checks the TFLOP column against the tokens column under NeMo's own
  formulas (nemo/utils/flops_formulas.py gpt3, llama3, nemotron, with the vocabularies of
  nemo/collections/common/parts/perf_metrics_utils.py LLM_VOCAB_SIZE_MAP: gpt3 51,200, llama3 128,256, nemotron
  256,000; full, not causal-halved, attention), which agree within 0.1 %. The page does not name the recipe's
  commit: NVIDIA/NeMo at d3f25b1210 (2025-03-08, "updated model configs"; its
  scripts/performance/recommended_model_configs/model_configs_b200.csv gives these rows the layouts of the version of
  2025-02-26, a0ea8f16a2, and adds the CUDA-graph column) is taken. Its csv rows agree with the page's layouts
  (GPT-3 175B's 512-GPU row, labelled h100 there, with TP 4, PP 4, VP 6; its dp_size column for Nemotron-4 15B, 32,
  is a leftover the page's GA of 2 contradicts: 256 / (2 x 64 GPUs)), set CUDA graphs for Llama 3 8B, 70B and the
  Nemotrons, and no recompute; scripts/performance/llm/pretrain_*.py at the same commit train FP8 with
  ``bf16_with_fp8_mixed`` (Transformer Engine, delayed scaling) and set B200 userbuffers configs for TP > 1, and the
  recipes (nemo/collections/llm/recipes/{gpt3_175b,llama3_8b,llama3_70b,nemotron4_15b,nemotron4_340b}.py) set
  sequence parallelism and TP communication overlap where TP > 1, the distributed optimizer, no recompute.
  Shapes: nemo/collections/llm/gpt/model/base.py GPTConfig175B (96 x 12288, 96 heads, FFN 4h, learned positions;
  the script's tokenizer is megatron-gpt2-345m, the GPT-2 BPE) and nemotron.py Nemotron4Config15B/340B (32 x 6144,
  48 heads, 8 groups; 96 x 18432, 96 heads, 8 groups; squared-ReLU FFN 4h), Llama 3 as Meta's.
- NVIDIA/dgxc-benchmarking at 68eaf7e117 (v25.05, 2025-06-10; nemotron/metadata.yaml: gsw_version 25.05, container
  nvcr.io/nvidia/nemo:25.04.00; nemotron/setup.sh: NeMo at b4148d2169), keys N4D*: nemotron/README.md's "H100
  Performance" tables "Nemotron4 340b BF16 H100" / "FP8 H100" (256x H100 GPUs) and "Nemotron4 15b FP8 H100" (16x
  H100 GPUs), each printing "Training step time (seconds per step)" (the mean of iterations 11-44,
  parse_train_timing.sh), tokens/s (= GBS x sequence / step time) and MFU (= GBS x the Notes' model FLOPs per sample
  / step time / GPUs / 989 TFLOP/s BF16 or 1979 FP8; Notes: 3.85e14 for 15B, 8.62124e15 for 340B, per token
  12·l·h²·(1 + G/H + s/h) + 12·l·h·f + 6·V·h). The layout is the README's table (15b: 16 GPUs, TP 2, PP 1, CP 1, DP 8,
  MBS 2, GBS 64, GA 4; 340b: 256 GPUs, TP 8, PP 8, CP 1, DP 4, VP 12, MBS 1, GBS 64, GA 16), which launch.sh (TP, PP,
  MBS, VP, GBS = 4 x GPUs for 15B and GPUs / 4 for 340B) and NeMo b4148d2169's model_configs_h100.csv (recompute 0,
  no CUDA graphs, no FSDP) agree with; its scripts/performance/argument_parser.py defaults ``--fp8_recipe`` to "ds"
  (delayed scaling) and launch.sh passes none. These runs are new against the third set: it holds 24.11's 340B at
  128 and 2048 GPUs (NeMo 1, selective recompute) and 25.04.01's 15B at 16 GPUs in BF16 (N3R15a) and 2048 in FP8.
- NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md at 3b9c7c701 (2025-10-10, "update 25.09 performance
  summary"), "25.09 NeMo Container", DGX-H100 table, keys N4M*: LLAMA3_8B (8 GPUs, GBS 128, MBS 1, FSDP 1, TP 1, PP
  1, CP 1, GA 16) and LLAMA3_70B (64 GPUs, GBS 128, MBS 1, FSDP 0, TP 4, PP 8, CP 1, VP 5, GA 64), Tokens / sec /
  GPU and Model TFLOP / sec / GPU. The 25.09 table names no precision: FP8 with current scaling is taken (its note
  speaks of quantization granularities; 725 and 727 model TFLOP/s/GPU are 73 % of H100's dense BF16 peak; the 25.11
  table, 97ad8cc6f, labels the same layouts FP8-CS; NOT_STATED says so). The recipe is the same commit's
  scripts/performance/configs/llama3/llama3_{8b,70b}_llm_pretrain.yaml, perf_matrix h100, fp8_cs: 8B with
  ``use_megatron_fsdp: true`` (Megatron-FSDP over the 8 GPUs), CP 1, no CUDA graphs, no recompute; 70B with TP 4,
  PP 8, CP 1, VP 5, no FSDP, no recompute (``recompute_num_layers`` is set for B200's FSDP layout only);
  ``grad_reduce_in_fp32: false``; the recipes (src/megatron/bridge/recipes/llama/llama3_{8b,70b}.py) set the
  distributed optimizer with overlapped grad reduce and param gather, and run_script.py the H100 TP-overlap config
  (userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192) for 70B. The TFLOP column agrees with the tokens column under the
  Llama formula with causal (halved) attention: the test checks it.

Taken: every dense row of those tables whose layout can be pinned down and that no other table holds. A run here is
its model, board, GPUs, batch, micro-batch, sequence, layout and precision (the test's key): N4M8 and N4M70 ran the
GPUs and batch of the first set's NM3 and NM4 (NeMo 24.07: CP 2 and ZeRO-1; TP 4 x PP 4 x CP 2) in other layouts
(Megatron-FSDP over 8; TP 4 x PP 8 without CP), and N4D15 the 16 GPUs and batch of the third set's N3N15c (TP 4,
micro-batch 4) and N3R15a (BF16) at TP 2 with micro-batch 2 in FP8: taken, since the layout is what the planner
chooses (the third set kept one row per batch and GPU count instead). Left out, and why:
- NeMo 25.02's LLAMA3-405B row on 128 B200s (TP 4 x PP 8 x CP 2 x VP 8: 64 pipeline chunks for 126 layers, which
  the recipe splits unevenly; the third set left Megatron-Bridge's 405B rows out for the same reason), its MoE rows
  (Mixtral) and its DGX-H100 table (only the first row, GPT3-175B on 512 GPUs, is readable in the stored page: the
  first held-out set's NM2 layout). NeMo 24.09, 24.12, 25.04 and 25.07: no stored page of 24.09 or 24.12 was
  found; the stored 25.04 and 25.07 pages show their DGX-GB200 tables only (the DGX-B200 and DGX-H100 tables follow
  and are cut off); no B200 row of theirs could be read, and GB200 rows are taken only beside a B200 row of the same
  table. NVIDIA/NeMo's docs/source/performance/performance_summary.md holds 24.07 only (the first and second sets'
  source); its performance_long_sequence.md gained a DGX-B200 Llama 3 8B table (a2c4cc8ee6, 2025-05-08, NeMo
  25.04.rc2) whose rows state TFLOP/s only, no micro-batch, recompute or FLOP formula, and layouts that do not fill
  their GPUs (8K: 8 GPUs with TP 1, PP 1, CP 1 and DP 2).
- Megatron-Bridge's DGX-B200 LLAMA3_8B rows (25.09: 29994 tokens/s/GPU FP8-CS, 25.11: 30624): the same run (8
  GPUs, GBS 128, MBS 2, TP 1, CUDA graphs) as NeMo 25.02's B200 row N4B8, re-timed on newer containers; one row per
  run is kept, the older. Their FP8-MX figures (in parentheses): MXFP8 (32-element block scaling) is no planner
  float8 recipe. Its LLAMA3.1_405B rows on B200 (TP 4 x PP 8 x VP 8) and H100 (TP 8 x PP 8 x VP 8): the uneven
  split above. 25.11's DGX-H100 rows: the 25.09 layouts re-timed (and its 8B row not pinned down, as the third set
  found: the table says FSDP 1 or 8 where the config of 97ad8cc6f sets no FSDP and ``recompute_num_layers: 5``).
  26.02 on: the DGX-H100 LLAMA3_70B GBS-256 run is the third set's N3B70 (re-timed in 26.02.01-26.04.01); 26.06's
  LLAMA3_70B rows on 8 and 32 H100s are its SFT and LoRA tables; Nemotron_3 and Nemotron-H rows are MoE or hybrid
  Mamba; the B200 rows of 26.02-26.08 are MoE or hybrid.
- dgxc-benchmarking v25.05's Nemotron4 15b BF16 H100 row (16 GPUs, TP 2, MBS 2, GBS 64): the run of the third set's
  N3R15a (25.04.01) re-timed; v25.04 (741c886) prints 25.04.01's step times with other MFU notes; v25.05.01 on add
  Llama 3.1 405B on 512 H100s (TP 8 x PP 8 x CP 2 x VP 8: the uneven split); from v25.07 (856bfc4) on the READMEs
  state layouts for B200 and H100 but print no throughput; the GB200 tables of v25.05 have no B200 row beside them;
  grok1, llama4, deepseek_v3 and nemotronh are MoE or hybrid models.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from convoy.plan.dims import ParallelDims  # noqa: E402
from convoy.plan.model import ModelSpec  # noqa: E402
from published_heldout2 import NEMOTRON_340B  # noqa: E402
from published_heldout3_nvidia import NEMOTRON4_15B  # noqa: E402
from published_heldout_megatron import _NEMO_GPT3  # noqa: E402
from published_results import LLAMA3_8B, LLAMA3_70B, Published  # noqa: E402

_NEMO_PAGE = ("NVIDIA NeMo Framework user guide, Performance summary (docs.nvidia.com/nemo-framework/user-guide/latest/"
              "performance/performance_summary.html as stored), 'Container: NeMo 25.02', 'System: DGX-B200' "
              "pre-training table (FP8), row {row}; layout as printed, recipe NVIDIA/NeMo d3f25b1210 "
              "scripts/performance/recommended_model_configs/model_configs_b200.csv and scripts/performance/llm/"
              "pretrain_{script}.py")
_DGXC = ("NVIDIA/dgxc-benchmarking nemotron/README.md at 68eaf7e117 (v25.05), table '{table}', column '{gpus}x H100 "
         "GPUs'; layout from the README's H100 specifications table and launch.sh, recipe NVIDIA/NeMo b4148d2169 "
         "(nemotron/setup.sh) scripts/performance/llm/pretrain_nemotron4_{size}.py")
_BRIDGE = ("NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md at 3b9c7c701 (2025-10-10), '25.09 NeMo Container', "
           "DGX-H100 table, row {row}; recipe scripts/performance/configs/llama3/llama3_{size}_llm_pretrain.yaml "
           "perf_matrix h100 fp8_cs at the same commit")

#: the numbers each source prints, as it prints them. NeMo's page and Megatron-Bridge: "Tokens / sec / GPU" and
#: "Model TFLOP / sec / GPU"; dgxc-benchmarking: "Training step time (seconds per step)", "Throughput in tokens per
#: second", "Model flops utilization" (%, printed to 0.1 or to 1)
PRINTED: dict[str, dict[str, float]] = {
    # NeMo 25.02 page, DGX-B200: #-GPUs | GBS | MBS | Seq | TP | PP | CP | VP | EP | GA | tokens/s/GPU | TFLOP/s/GPU
    "N4B175": {"tokens_per_gpu": 1600, "tflops": 1722},  # GPT3-175B | 512 | 2048 | 2 | 2048 | 4 | 4 | 1 | 6 | 1 | 32
    "N4B8": {"tokens_per_gpu": 26006, "tflops": 1506},  # LLAMA3-8B | 8 | 128 | 2 | 8192 | 1 | 1 | 1 | 1 | 1 | 8
    "N4B70": {"tokens_per_gpu": 3062, "tflops": 1474},  # LLAMA3-70B | 64 | 128 | 1 | 8192 | 2 | 4 | 2 | 5 | 1 | 32
    "N4B15": {"tokens_per_gpu": 14760, "tflops": 1387},  # Nemotron-15B | 64 | 256 | 2 | 4096 | 1 | 1 | 1 | 1 | 1 | 2
    "N4B340": {"tokens_per_gpu": 602, "tflops": 1268},  # Nemotron-340B | 128 | 32 | 1 | 4096 | 8 | 4 | 1 | 12 | 1 | 8
    # dgxc-benchmarking 68eaf7e117 nemotron/README.md, "H100 Performance"
    "N4D340a": {"step_s": 4.606, "tokens_per_s": 56913, "mfu_pct": 47.3},  # Nemotron4 340b BF16 H100, 256x
    "N4D340b": {"step_s": 3.107, "tokens_per_s": 84372, "mfu_pct": 35},  # Nemotron4 340b FP8 H100, 256x ("35%")
    "N4D15": {"step_s": 1.988, "tokens_per_s": 131863, "mfu_pct": 39.1},  # Nemotron4 15b FP8 H100, 16x
    # Megatron-Bridge 3b9c7c701, 25.09, DGX-H100:
    # #-GPUs | GBS | MBS | Seq | FSDP | TP | PP | CP | VP | EP | GA | tokens/s/GPU | TFLOP/s/GPU
    "N4M8": {"tokens_per_gpu": 14079, "tflops": 725},  # LLAMA3_8B | 8 | 128 | 1 | 8192 | 1 | 1 | 1 | 1 | n/a | 1 | 16
    "N4M70": {"tokens_per_gpu": 1619, "tflops": 727},  # LLAMA3_70B | 64 | 128 | 1 | 8192 | 0 | 4 | 8 | 1 | 5 | 1 | 64
}

#: each source's FLOP formula, by name (``FLOPS_OF``), and the vocabulary it counts:
#: ``gpt`` (NeMo flops_formulas.gpt3): s·(72·l·h² + 12·l·h·s + 6·V·h) per sample;
#: ``llama`` (NeMo flops_formulas.llama3): s·l·h²·(12 + 12·G/H + 18·f/h + 12·s/h + 6·V/(l·h));
#: ``llama-causal`` the same with 6·s/h (the per-token figure that gives Megatron-Bridge's TFLOP column);
#: ``nemotron`` (NeMo flops_formulas.nemotron, dgxc's Notes): s·l·h²·(12 + 12·G/H + 12·f/h + 12·s/h + 6·V/(l·h))
FORMULA_VOCAB: dict[str, int] = {"gpt": 51200, "llama": 128256, "llama-causal": 128256, "nemotron": 256000}

#: the model FLOPs per sample dgxc's README prints ("The model flops for Nemotron4 15b for GBS=1 is 3.85e14"; the
#: Notes' 340b calculation "= 8.62124e15")
MODEL_FLOPS: dict[str, float] = {"nemotron4-15b": 3.85e14, "nemotron4-340b": 8.62124e15}

#: which formula each row's source uses, and (dgxc rows) which printed FLOPs per sample
FLOPS_OF: dict[str, str] = {}
DGXC_FLOPS_OF: dict[str, str] = {}

#: the parameter count each source gives its model, and where (the sources name rounded sizes only)
SOURCE_PARAMS: dict[str, tuple[float, str]] = {}

#: rows whose source names a rounded size only, and how far the shape's count may be from it (the FLOP checks of the
#: test pin these shapes instead): Nemotron-4 15B is 15.6e9 under NeMo's Nemotron4Config15B with the 256,000-word
#: vocabulary (3.1e9 of it in the two untied embeddings)
ROUNDED_NAMES: dict[str, float] = {}

_PEAK_TFLOPS = {"bf16": 989, "fp8": 1979}
"""The H100 peaks dgxc's MFU divides by ("The peak theoretical throughput for H100 FP8 is 1979 TFLOPS and for H100
BF16 is 989 TFLOPS")."""

_DGX_B200 = "B200 (DGX-B200: 8 x B200, NVLink 5); network not stated"
_DGX_H100 = "H100 80GB SXM (DGX-H100, NVLink); network not stated"
_EOS = ("H100 80GB HBM3 (700 W), NVLink 4; DGX H100 nodes (the repository README's H100 reference architecture), "
        "8 x 400 Gbit/s InfiniBand compute links per node")
_GBPS = 3200.0


def _published(key: str, source: str, model: ModelSpec, *, gpu: str, hardware: str, gpus: int, dims: ParallelDims,
               zero: int, seq: int, micro: int, batch: int, virtual: int, fp8: bool, software: str, formula: str,
               params: float, params_where: str) -> Published:
    p = PRINTED[key]
    FLOPS_OF[key] = formula
    SOURCE_PARAMS[key] = (params, params_where)
    if "step_s" in p:
        step = p["step_s"]
        dtype = "fp8" if fp8 else "bf16"
        flops = MODEL_FLOPS[DGXC_FLOPS_OF[key]]
        derivation = (f"printed: training step time {step} s (the table's {p['tokens_per_s']:,.0f} tokens/s = "
                      f"{batch:,} x {seq} / {step}; its MFU {p['mfu_pct']} % = {batch:,} x {flops:.6g} FLOPs / "
                      f"{step} s / {gpus} / {_PEAK_TFLOPS[dtype]} TFLOP/s)")
    else:
        step = batch * seq / (p["tokens_per_gpu"] * gpus)
        derivation = (f"{batch:,} x {seq} tokens / ({p['tokens_per_gpu']:,.0f} tokens/s/GPU x {gpus}) "
                      f"(the table's {p['tflops']:,.0f} TFLOP/s/GPU agrees under the source's {formula} formula)")
    return Published(
        key=key, source=source, model=model, hardware=f"{gpus} x {hardware}", gpu=gpu, gpus_per_node=8,
        nodes=gpus // 8, inter_gbps=_GBPS, dims=dims, zero_stage=zero, seq=seq, micro_batch=micro,
        global_batch=batch, recompute="none", precision="bf16", pp_stages_per_rank=virtual,
        fp8="tensorwise" if fp8 else "none", step_seconds=step, derivation=derivation, stack="megatron-core",
        software=software)


_SW_NEMO = ("NeMo 25.02 container, NeMo 2.0 scripts/performance recipe (Megatron-Core, Transformer Engine): FP8 "
            "(bf16_with_fp8_mixed: hybrid E4M3/E5M2, delayed scaling){tp}, distributed optimizer{extra}, no recompute")
_TP = ", sequence parallel, TP communication overlap (userbuffers)"


def _nemo(key: str, row: str, script: str, model: ModelSpec, *, gpus: int, batch: int, micro: int, seq: int, tp: int,
          pp: int, cp: int, virtual: int, formula: str, params: float, extra: str = "") -> Published:
    dp = gpus // (tp * pp * cp)
    return _published(
        key, _NEMO_PAGE.format(row=row, script=script), model, gpu="B200", hardware=_DGX_B200, gpus=gpus,
        dims=ParallelDims(dp_replicate=dp, tp=tp, pp=pp, cp=cp), zero=1, seq=seq, micro=micro, batch=batch,
        virtual=virtual, fp8=True, software=_SW_NEMO.format(tp=_TP if tp > 1 else "", extra=extra), formula=formula,
        params=params, params_where=f"the table's name {row}")


_SW_DGXC = ("NeMo 25.04.00 container, NeMo 2.0 scripts/performance recipe at b4148d2169 (Megatron-Core, Transformer "
            "Engine), {dtype}; sequence parallel, TP communication overlap (the recipe's tp_comm_overlap), "
            "distributed optimizer{extra}, no recompute, no CUDA graphs; dgxc-benchmarking 25.05")


def _dgxc(key: str, size: str, dtype: str, gpus: int) -> Published:
    if size == "340b":
        model, tp, pp, virtual, micro, batch = NEMOTRON_340B, 8, 8, 12, 1, gpus // 4
        extra = ", deferred embedding wgrad"
    else:
        model, tp, pp, virtual, micro, batch = NEMOTRON4_15B, 2, 1, 1, 2, 4 * gpus
        extra = ""
    DGXC_FLOPS_OF[key] = f"nemotron4-{size}"
    fp8 = dtype == "fp8"
    return _published(
        key, _DGXC.format(table=f"Nemotron4 {size} {dtype.upper()} H100", gpus=gpus, size=size), model,
        gpu="H100-80GB", hardware=_EOS, gpus=gpus, dims=ParallelDims(dp_replicate=gpus // (tp * pp), tp=tp, pp=pp),
        zero=1, seq=4096, micro=micro, batch=batch, virtual=virtual, fp8=fp8,
        software=_SW_DGXC.format(dtype="FP8 (Transformer Engine, hybrid E4M3/E5M2, delayed scaling: --fp8_recipe ds)"
                                 if fp8 else "BF16", extra=extra),
        formula="nemotron", params=float(size[:-1]) * 1e9, params_where=f"the README's name Nemotron4 {size}")


ROWS: tuple[Published, ...] = (
    _nemo("N4B175", "GPT3-175B", "gpt3_175b", _NEMO_GPT3, gpus=512, batch=2048, micro=2, seq=2048, tp=4, pp=4, cp=1,
          virtual=6, formula="gpt", params=175e9, extra=", no dropout (GPTConfig175B)"),
    _nemo("N4B8", "LLAMA3-8B", "llama3_8b", LLAMA3_8B, gpus=8, batch=128, micro=2, seq=8192, tp=1, pp=1, cp=1,
          virtual=1, formula="llama", params=8e9, extra=", CUDA graphs"),
    _nemo("N4B70", "LLAMA3-70B", "llama3_70b", LLAMA3_70B, gpus=64, batch=128, micro=1, seq=8192, tp=2, pp=4, cp=2,
          virtual=5, formula="llama", params=70e9, extra=", CUDA graphs"),
    _nemo("N4B15", "Nemotron-15B", "nemotron4_15b", NEMOTRON4_15B, gpus=64, batch=256, micro=2, seq=4096, tp=1, pp=1,
          cp=1, virtual=1, formula="nemotron", params=15e9, extra=", CUDA graphs"),
    _nemo("N4B340", "Nemotron-340B", "nemotron4_340b", NEMOTRON_340B, gpus=128, batch=32, micro=1, seq=4096, tp=8,
          pp=4, cp=1, virtual=12, formula="nemotron", params=340e9,
          extra=", CUDA graphs"),
    _dgxc("N4D340a", "340b", "bf16", 256),
    _dgxc("N4D340b", "340b", "fp8", 256),
    _dgxc("N4D15", "15b", "fp8", 16),
    _published("N4M8", _BRIDGE.format(row="LLAMA3_8B", size="8b"), LLAMA3_8B, gpu="H100-80GB", hardware=_DGX_H100,
               gpus=8, dims=ParallelDims(dp_shard=8), zero=3, seq=8192, micro=1, batch=128, virtual=1, fp8=True,
               software="NeMo 25.09 container, Megatron-Bridge performance recipe (Megatron-Core, Transformer "
                        "Engine): FP8 (taken as FP8-CS, per-tensor current scaling), Megatron-FSDP over the 8 GPUs "
                        "(use_megatron_fsdp, keep_fp8_transpose_cache_when_using_custom_fsdp, NCCL user buffers), "
                        "bf16 gradient reduction, no CUDA graphs, no recompute",
               formula="llama-causal", params=8e9, params_where="the table's name LLAMA3_8B"),
    _published("N4M70", _BRIDGE.format(row="LLAMA3_70B", size="70b"), LLAMA3_70B, gpu="H100-80GB",
               hardware=_DGX_H100, gpus=64, dims=ParallelDims(dp_replicate=2, tp=4, pp=8), zero=1, seq=8192, micro=1,
               batch=128, virtual=5, fp8=True,
               software="NeMo 25.09 container, Megatron-Bridge performance recipe (Megatron-Core, Transformer "
                        "Engine): FP8 (taken as FP8-CS, per-tensor current scaling), TP communication overlap, "
                        "sequence parallel, distributed optimizer with overlapped grad reduce and param gather, "
                        "bf16 gradient reduction, no CUDA graphs, no recompute",
               formula="llama-causal", params=70e9, params_where="the table's name LLAMA3_70B"),
)

ROUNDED_NAMES.update({key: 0.05 for key in ("N4B15", "N4D15")})

_NEMO_OPT = ("optimizer sharding (NeMo's distributed optimizer, which shards the optimizer state over data-parallel "
             "ranks: taken as ZeRO-1, as the earlier sets take it)")
_FP8_RECIPE = ("the FP8 recipe's scaling (Transformer Engine's {scaling} scaling; the planner's per-tensor "
               "'tensorwise' taken)")
_B200_NET = ("the network (the page says DGX-B200 only: a DGX B200's 8 x 400 Gbit/s compute links per node taken, "
             "3,200 Gbit/s)")

#: planner inputs a source leaves unstated, and what the row takes for them
NOT_STATED: dict[str, str] = {}
for _row in ROWS:
    _parts = [] if _row.zero_stage == 3 else [_NEMO_OPT]
    if _row.key.startswith("N4M"):
        _parts.append("the precision (the 25.09 table names none: FP8 with Transformer Engine's per-tensor current "
                      "scaling taken, the 25.11 table's FP8-CS for the same layouts and the recipe's fp8_cs entry; "
                      "the planner's per-tensor 'tensorwise' taken)")
    elif _row.fp8 != "none":
        _parts.append(_FP8_RECIPE.format(scaling="delayed"))
    if _row.gpu == "B200":
        _parts.append(_B200_NET)
        _parts.append("the NeMo commit inside the 25.02 container (the page names none: NVIDIA/NeMo d3f25b1210, "
                      "2025-03-08, taken; its csv gives the page's layouts)")
    NOT_STATED[_row.key] = "; ".join(_parts)
NOT_STATED["N4B175"] += ("; GPT-3 175B's vocabulary (the script's megatron-gpt2-345m tokenizer, the GPT-2 BPE: the "
                         "first held-out set's shape, 50,257 words and learned positions of 2048, taken; NeMo's FLOP "
                         "formula counts 51,200)")
NOT_STATED["N4M8"] += ("; the data-parallel schedule of Megatron-FSDP (parameters, gradients and optimizer state "
                       "sharded over the 8 GPUs: taken as ZeRO-3 over dp_shard 8 with Megatron's bf16 weights and "
                       "gradients and fp32 main weights, precision 'bf16'); the network (the table says DGX-H100 "
                       "only: one node, no inter-node traffic)")
NOT_STATED["N4M70"] += ("; the network (the table says DGX-H100 only: 8 x 400 Gbit/s per node taken, a DGX H100's); "
                        "the Megatron-Bridge version inside the 25.09 container (the recipe files at 3b9c7c701, the "
                        "commit that wrote the 25.09 table, taken)")


if __name__ == "__main__":
    for row in ROWS:
        print(f"{row.key:8} {row.gpu:10} {row.gpus_per_node * row.nodes:5} GPUs  {row.layout_name:45} "
              f"{row.global_batch:5} x {row.seq:5}  {row.step_seconds:7.3f} s  {row.how}")
