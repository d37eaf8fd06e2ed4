"""A third held-out set of published runs (issue 38, item 3), from open training projects: rows collected after the
model changes of issue 38 were under way and frozen ("third held-out set frozen (published_heldout3_open)") before
anything planned them. The development loop does not read this file; the lead adds it to the held-out check
(``benchmarks/published_results.py --held-out``) once, after the model changes in progress are merged.

Each row is a ``published_results.Published`` with what its source states: hardware, model shape, layout, micro and
global batch, sequence, recompute, precision, the stack (a name of ``convoy.plan.stacks.STACKS``) and the software
the source names, and the step time with its ``derivation`` from the numbers the source prints. ``PRINTED`` holds
those numbers as printed; ``tests/plan/test_published_heldout3_open.py`` recomputes each step time from them, checks
each source's second column (MFU, GPU hours, a logged TFLOP/s and tokens/s pair) against the row's shape, the shapes
against the source's parameter counts, and that no row repeats one of the other tables. Where a source leaves a
planner input unstated, ``NOT_STATED`` says which and what the row takes.

Sources read (no number here comes from anything but the file named, at the commit named):

- pytorch/torchtitan docs/performance.md at 3faaa1a0d (2024-08-23, "Fix the performance number for 405B"; the table
  was added by 9515a140b the day before with 118 WPS / 37.1 % for the bf16 row, which the fix replaced: the fixed
  numbers are taken), "Llama 3.1 performance numbers": Llama 3.1 405B, 2D (FSDP 16 x TP 8) on 128 H100s with 95 GB
  HBM2e ("lower TDP SXM H100(95GB)", footnote 1: the Grand Teton boards of torchtitan's later files), local batch 2,
  global batch 32, full AC; the rows "None" and "Float8". The config is train_configs/llama3_405b.toml at that commit
  ("a preset for 128 H100 GPUs": seq_len 8192, tensor_parallel_degree 8, compile true, float8 with float8 FSDP
  all-gather). train.py there logs wps = local tokens / (seconds x model-parallel size), a per-GPU figure, and
  MFU = 100 x (6·N_non-embedding + 12·l·h·q·t) x wps / 989e12; the Float8 row's MFU is over 2 x 989e12 (the test
  checks both). The "Float8 + Async TP" row is left out (async TP is no planner input, as the second set decided).
  Left out also: the same file's Llama 3 8B "selective layer" row on 64 A100s (torchtitan's every-other-block AC;
  ``Published`` has no recompute_every field) and every other row of it (the development table's T3/T3b and the first
  held-out set's HT1-HT4 hold them).
- jzhang38/TinyLlama README.md at bf12224 (2024-02-04): "24k tokens per second per A100-40G GPU ... without
  activation checkpointing", "per-gpu batch size of 16k tokens", the "Training Details" table (22 layers, 32 heads,
  4 query groups, 2048 wide, SwiGLU 5632, sequence 2048, batch 2048 x 1024, 16 A100-40G GPUs) and the GPU-hours table
  (3,456 A100 hours for 300B tokens: 24.1k tokens/s/GPU, the test's second check). pretrain/tinyllama.py at that
  commit: micro_batch_size 8, 8 devices per node, Lightning Fabric FSDPStrategy (FULL_SHARD by default, block
  auto-wrap, no activation checkpointing, limit_all_gathers), precision "bf16-mixed" on A100
  (lit_gpt/utils.py); PRETRAIN.md runs it on two nodes of 8. lit_gpt/config.py's tiny_LLaMA_1b: vocabulary 32,000.
- microsoft/Megatron-DeepSpeed examples_deepspeed/rebase/README.md at d4a1532c (2023-08-08, the July 2023 sync with
  Megatron-LM): "After sync, GPT-3 13B, 3D parallelism | 55.6" TFLOPs per GPU, on "128 V100 GPUs (8 DGX-2 nodes, 16
  GPU per node, inter-node network is InfiniBand with around 660 Gbps measured bandwidth)", DeepSpeed v0.9.5. The
  layout is the row's training script, examples_deepspeed/rebase/ds_pretrain_gpt_13B.sh at that commit: 40 layers,
  5120 wide, 40 heads, sequence 2048, global batch 1024, micro-batch 2, TP 4, PP 8 (so DP 4), ZeRO-1, fp16,
  --checkpoint-activations with DeepSpeed's activation checkpointing, no flash attention, GPT-2 BPE vocabulary. The
  TFLOPs are megatron/utils.py's throughput_calculator (Narayanan et al.'s equation 3 with the factor 4 of
  checkpointing, the padded vocabulary). The "Before sync" row (50 TFLOPs) ran a script of the backup branch, not
  read: left out; so are the README's flash-attention figures (2.7B on 8 A100s "using the same script": model, batch
  and board memory would all be inferred) and the DeepSpeed4Science long-sequence table (its model is not named).
- huggingface/nanotron README.md "Benchmarks" and docs/benchmark_summary.svg (added c2528430, 2025-03-10; the plot of
  2025-02-13), "MFU and Memory Usage for Best Configurations" and "Best Configuration by Model Size and Number of
  Nodes": for each model (1.34B, 3.57B, 8.86B, 80.0B parameters) and node count (1-64 nodes of 8 H100s) the best
  layout's MFU and memory and its DP, TP, PP, gradient-accumulation steps (GAS), micro-batch (MBS) and ZeRO stage (the
  SVG keeps the printed labels as text comments; the two panels list their cells in the same order, and the GPU
  counts DP x TP x PP of the second match the node rows of the first). The shapes are scripts/scaling_benchmarks.py's
  model_configs at e24d2483 (2025-02-19, "Generates configs and SLURM scripts for scaling benchmarks used in
  https://huggingface.co/spaces/nanotron/ultrascale-playbook"): (layers, hidden, heads, intermediate) (16, 2048, 32,
  8192), (28, 3072, 32, 8192), (32, 4096, 32, 14336), (80, 8192, 64, 28672), key/value heads = heads
  (NUM_KEY_VALUE_HEADS None), vocabulary 131,072, embeddings tied below an intermediate size of 10,000, sequence 4096;
  its estimate_num_params gives exactly the plot's 1.34, 3.57, 8.86 and 80.0 B, and its commented TP sweep (3B: 363.66
  TFLOPs at 14,167.25 tok/s/gpu) gives the FLOPs per token of nanotron's get_flops (src/nanotron/models/llama.py at
  c2528430) for the 3.57B shape at 4096 tokens (the test checks both). The step time is get_flops of the global batch
  over (GPUs x MFU x 989 TFLOP/s). The base config (examples/config_tiny_llama_bench.yaml, last at 67c5ebb6): bf16,
  accumulate_grad_in_fp32, pp_engine 1f1b, tp_mode REDUCE_SCATTER (sequence-parallel TP) with async TP
  communication, no recompute_layer (nanotron's default False). Every layout's global batch is 256 sequences (1M
  tokens). Rows taken: the 1, 4, 16 and 64 node rows of the plot (15 of its 26 cells), so that one source does not
  outweigh the set; the 2, 8 and 32 node rows are left out for that reason only.

Tried and left out (no primary text of a step time, or no layout): GPT-NeoX-20B (arXiv:2204.06745; the stored pages
hold only summaries of the paper, as the first held-out set found), Pythia (its GPU hours are in the paper only;
TinyLlama's README quotes one figure second hand), OPT-175B (arXiv:2205.01068; no primary text stored, and its
992 GPUs with TP 8 leave 124 data-parallel ranks for a 1,024-sequence batch: the layout cannot be pinned down),
Falcon (arXiv:2311.16867; only abstracts and third-party summaries stored), LLM360 (LLM360/amber-train and k2-train
READMEs state no throughput), Colossal-AI's Llama example (the stored README has no benchmark table; its published
figures are for A800/H800 boards convoy does not list), litgpt (tutorials/pretrain_tinyllama.md at 0495ecb gives
"~ 4 weeks with 64 A100 GPUs" and 52 % MFU for TinyLlama: no batch, layout or throughput figure to derive a step
from), EleutherAI/pythia and gpt-neox READMEs (no throughput in any version), DeepSpeed's ZeRO++ and Ulysses
blogs (their throughput is in figures) and MosaicML/Databricks blogs (not read in the time).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from convoy.plan.dims import ParallelDims  # noqa: E402
from convoy.plan.model import ModelSpec, from_hf_config  # noqa: E402
from published_heldout import LLAMA3_405B  # noqa: E402
from published_heldout_megatron import _gpt_params  # noqa: E402
from published_results import Published, _gpt, _megatron_flops  # noqa: E402

#: the numbers each source prints, as it prints them (the step times below follow from these)
PRINTED: dict[str, dict[str, float]] = {
    # torchtitan docs/performance.md (3faaa1a0d), Llama 3.1 performance numbers: Batch size, WPS, MFU (%)
    "O3T1": {"local_batch": 2, "wps": 109, "mfu_pct": 29.0},
    "O3T2": {"local_batch": 2, "wps": 177, "mfu_pct": 23.46},
    # TinyLlama README.md (bf12224): tokens/s per A100-40G, MFU (%), per-GPU batch tokens, A100 GPU hours on 300B
    # tokens
    "O3L1": {"tokens_per_gpu": 24000, "mfu_pct": 56, "per_gpu_batch_tokens": 16384, "gpu_hours_300b": 3456},
    # Megatron-DeepSpeed examples_deepspeed/rebase/README.md (d4a1532c): "After sync, GPT-3 13B, 3D parallelism | 55.6"
    # TFLOPs (per GPU); 128 V100 GPUs, 8 DGX-2 nodes of 16, "around 660 Gbps measured bandwidth" between nodes
    "O3D1": {"tflops": 55.6, "gpus": 128, "gpus_per_node": 16, "inter_gbps": 660},
    # nanotron docs/benchmark_summary.svg: MFU (%), memory (GB), DP, TP, PP, GAS, MBS, ZeRO, by (model B, nodes)
    "O3N1x1": {"mfu_pct": 44.32, "memory_gb": 41.76, "dp": 4, "tp": 1, "pp": 2, "gas": 16, "mbs": 4, "zero": 1},
    "O3N3x1": {"mfu_pct": 46.68, "memory_gb": 56.87, "dp": 4, "tp": 1, "pp": 2, "gas": 32, "mbs": 2, "zero": 1},
    "O3N8x1": {"mfu_pct": 45.22, "memory_gb": 63.07, "dp": 2, "tp": 1, "pp": 4, "gas": 128, "mbs": 1, "zero": 1},
    "O3N1x4": {"mfu_pct": 38.38, "memory_gb": 16.39, "dp": 16, "tp": 1, "pp": 2, "gas": 16, "mbs": 1, "zero": 1},
    "O3N3x4": {"mfu_pct": 40.39, "memory_gb": 53.33, "dp": 16, "tp": 1, "pp": 2, "gas": 8, "mbs": 2, "zero": 1},
    "O3N8x4": {"mfu_pct": 43.31, "memory_gb": 61.10, "dp": 16, "tp": 1, "pp": 2, "gas": 16, "mbs": 1, "zero": 1},
    "O3N80x4": {"mfu_pct": 14.76, "memory_gb": 65.97, "dp": 1, "tp": 8, "pp": 4, "gas": 256, "mbs": 1, "zero": 0},
    "O3N1x16": {"mfu_pct": 29.46, "memory_gb": 38.84, "dp": 64, "tp": 2, "pp": 1, "gas": 1, "mbs": 4, "zero": 0},
    "O3N3x16": {"mfu_pct": 34.59, "memory_gb": 66.20, "dp": 32, "tp": 4, "pp": 1, "gas": 1, "mbs": 8, "zero": 0},
    "O3N8x16": {"mfu_pct": 36.33, "memory_gb": 66.88, "dp": 16, "tp": 8, "pp": 1, "gas": 2, "mbs": 8, "zero": 0},
    "O3N80x16": {"mfu_pct": 34.29, "memory_gb": 61.18, "dp": 1, "tp": 4, "pp": 32, "gas": 256, "mbs": 1, "zero": 0},
    "O3N1x64": {"mfu_pct": 5.25, "memory_gb": 8.40, "dp": 128, "tp": 2, "pp": 2, "gas": 1, "mbs": 2, "zero": 1},
    "O3N3x64": {"mfu_pct": 10.49, "memory_gb": 16.42, "dp": 128, "tp": 4, "pp": 1, "gas": 1, "mbs": 2, "zero": 1},
    "O3N8x64": {"mfu_pct": 18.69, "memory_gb": 57.76, "dp": 128, "tp": 4, "pp": 1, "gas": 1, "mbs": 2, "zero": 0},
    "O3N80x64": {"mfu_pct": 17.79, "memory_gb": 53.46, "dp": 32, "tp": 16, "pp": 1, "gas": 4, "mbs": 2, "zero": 1},
}

#: the parameter count each source gives its model, and where
SOURCE_PARAMS: dict[str, tuple[float, str]] = {
    "O3T1": (405e9, "the table's model size 405B"), "O3T2": (405e9, "the table's model size 405B"),
    "O3L1": (1.1e9, "the Training Details table's 1.1B"),
    "O3D1": (13e9, "the README's and script's name GPT-3 13B (model_size=13)"),
}

#: rows whose source names a rounded size only, and how far the shape's count may be from it
ROUNDED_NAMES: dict[str, float] = {}

_H100_GBPS = 3200.0
"""Network per H100 node: 8 x 400 Gbit/s (torchtitan's later files state 400 Gbit/s per GPU for these boards;
nanotron's plot does not state it, and its rows take a DGX H100's, named in ``NOT_STATED``)."""

# --- torchtitan, Llama 3.1 405B on 128 H100s (August 2024) ---------------------------------------------------------

_TT_AUG = ("pytorch/torchtitan docs/performance.md at 3faaa1a0d (2024-08-23), 'Llama 3.1 performance numbers', row "
           "'{what}'")
_TT_AUG_SW = ("torchtitan of August 2024 (3faaa1a0d) on PyTorch nightly: FSDP2 + DTensor TP 8 (no async TP), "
              "per-block torch.compile (train_configs/llama3_405b.toml), full AC, SDPA flash attention{fp8}")
_GRAND_TETON = "H100 SXM 95GB HBM2e at a lower TDP (the file's footnote 1), NVLink in the node; network not stated"


def _tt405(key: str, what: str, fp8: str) -> Published:
    p = PRINTED[key]
    gpus, fsdp, seq = 128, 16, 8192
    local, wps = int(p["local_batch"]), p["wps"]
    batch = local * fsdp
    return Published(
        key=key, source=_TT_AUG.format(what=what), model=LLAMA3_405B, hardware=f"{gpus} x {_GRAND_TETON}",
        gpu="H100-96GB-500W", gpus_per_node=8, nodes=gpus // 8, inter_gbps=_H100_GBPS,
        dims=ParallelDims(dp_shard=fsdp, tp=8), zero_stage=3, seq=seq, micro_batch=local, global_batch=batch,
        recompute="full", precision="bf16-fsdp", compile="blocks", fp8=fp8,
        step_seconds=batch * seq / (wps * gpus),
        derivation=f"{batch} x {seq} tokens / ({wps:g} tokens/s/GPU x {gpus})",
        stack="torchtitan",
        software=_TT_AUG_SW.format(fp8="; torchao float8 (dynamic tensorwise) with float8 FSDP all-gather"
                                   if fp8 != "none" else ""))


# --- TinyLlama 1.1B on 16 A100-40GB (2023-24) -----------------------------------------------------------------------

TINYLLAMA = from_hf_config({"model_type": "llama", "num_hidden_layers": 22, "hidden_size": 2048,
                            "num_attention_heads": 32, "num_key_value_heads": 4, "intermediate_size": 5632,
                            "vocab_size": 32000, "_name_or_path": "TinyLlama 1.1B"})


def _tinyllama() -> Published:
    p = PRINTED["O3L1"]
    gpus, seq, micro, batch = 16, 2048, 8, 1024
    tokens = p["tokens_per_gpu"]
    return Published(
        key="O3L1", source="jzhang38/TinyLlama README.md at bf12224 ('Blazingly Fast', 'Training Details'); "
                           "layout from pretrain/tinyllama.py and PRETRAIN.md at that commit",
        model=TINYLLAMA, hardware="16 x A100-SXM 40GB (2 nodes of 8); network not stated", gpu="A100-40GB",
        gpus_per_node=8, nodes=2, inter_gbps=1600, dims=ParallelDims(dp_shard=gpus), zero_stage=3, seq=seq,
        micro_batch=micro, global_batch=batch, recompute="none", precision="bf16-fsdp",
        step_seconds=batch * seq / (tokens * gpus),
        derivation=f"{batch:,} x {seq} tokens / ({tokens:,.0f} tokens/s/GPU x {gpus})",
        stack="fsdp1",
        software="TinyLlama (lit-gpt fork) on Lightning Fabric: PyTorch FSDP1 (FULL_SHARD, block auto-wrap, "
                 "limit_all_gathers), bf16-mixed, FlashAttention-2, fused RMSNorm, xformers fused SwiGLU, fused "
                 "rotary and cross entropy; 2023-09")


# --- Megatron-DeepSpeed after its July 2023 rebase: GPT-3 13B on 128 V100s ----------------------------------------

#: Megatron pads the GPT-2 BPE's 50,257 words to a multiple of 128 x TP (4): the vocabulary its TFLOPs line counts
_DS13B_PADDED_VOCAB = 50688


def _megatron_deepspeed_13b() -> Published:
    p = PRINTED["O3D1"]
    layers, hidden, heads, seq, batch, micro, tp, pp = 40, 5120, 40, 2048, 1024, 2, 4, 8
    gpus, per_node = int(p["gpus"]), int(p["gpus_per_node"])
    flops = _megatron_flops(batch, seq, layers, hidden, _DS13B_PADDED_VOCAB)
    return Published(
        key="O3D1", source="microsoft/Megatron-DeepSpeed examples_deepspeed/rebase/README.md at d4a1532c (2023-08-08), "
                           "row 'After sync, GPT-3 13B, 3D parallelism'; layout from its ds_pretrain_gpt_13B.sh",
        model=_gpt(_gpt_params(layers, hidden, 50257, seq), layers, hidden, heads, 50257, "GPT-3 13B (Megatron-DS)"),
        hardware=f"{gpus} x V100 (8 DGX-2 nodes of 16, NVSwitch), InfiniBand 'around 660 Gbps measured' between "
                 "nodes", gpu="V100-32GB", gpus_per_node=per_node, nodes=gpus // per_node, inter_gbps=p["inter_gbps"],
        dims=ParallelDims(dp_replicate=gpus // (tp * pp), tp=tp, pp=pp), zero_stage=1, seq=seq, micro_batch=micro,
        global_batch=batch, recompute="full", precision="fp16",
        step_seconds=flops / (gpus * p["tflops"] * 1e12),
        derivation=f"Megatron-DeepSpeed's throughput_calculator, 24·4·B·s·l·h²·(1 + s/6h + V/16lh) with V = 50,688 "
                   f"(padded) = {flops:.4g} FLOPs / ({gpus} x {p['tflops']} TFLOP/s)",
        stack="megatron-deepspeed",
        software="Megatron-DeepSpeed after the July 2023 sync with Megatron-LM, DeepSpeed v0.9.5: ZeRO-1, Megatron "
                 "TP 4, DeepSpeed pipeline engine PP 8, fp16, DeepSpeed activation checkpointing, fused softmax "
                 "(no --use-flash-attn), learned positions")


# --- nanotron, the Ultra-Scale Playbook's best layouts (2025-02) ----------------------------------------------------

_NANOTRON_VOCAB = 131072
_NANOTRON_SEQ = 4096
_NANOTRON_PEAK = 989e12
_NANOTRON_SOURCE = ("huggingface/nanotron README.md 'Benchmarks', docs/benchmark_summary.svg (c2528430), cell "
                    "{model} on {nodes} node{s}; shapes from scripts/scaling_benchmarks.py (e24d2483)")
_NANOTRON_SW = ("nanotron v0.5 (2025-02, Ultra-Scale Playbook sweep): its own DP (torch DDP, ZeRO-{zero}), Megatron-"
                "style TP with sequence parallelism (tp_mode REDUCE_SCATTER, async TP communication), 1F1B pipeline "
                "engine, bf16 with fp32 gradient accumulation, flash-attn 2, no recompute; no STACKS entry is "
                "nanotron's, so convoy's (PyTorch 2.x, flash attention, cuBLAS of 2024-25, DDP/ZeRO-1) is taken")


def _nanotron_model(layers: int, hidden: int, heads: int, ffn: int, name: str) -> ModelSpec:
    """scaling_benchmarks.py's Llama: multi-head attention (key/value heads = heads), SwiGLU of ``ffn``, the
    131,072-word vocabulary, embeddings tied when ``ffn`` < 10,000."""
    return from_hf_config({"model_type": "llama", "num_hidden_layers": layers, "hidden_size": hidden,
                           "num_attention_heads": heads, "num_key_value_heads": heads, "intermediate_size": ffn,
                           "vocab_size": _NANOTRON_VOCAB, "tie_word_embeddings": ffn < 10_000,
                           "_name_or_path": name})


NANOTRON_MODELS: dict[str, ModelSpec] = {
    "1": _nanotron_model(16, 2048, 32, 8192, "nanotron 1.34B"),
    "3": _nanotron_model(28, 3072, 32, 8192, "nanotron 3.57B"),
    "8": _nanotron_model(32, 4096, 32, 14336, "nanotron 8.86B"),
    "80": _nanotron_model(80, 8192, 64, 28672, "nanotron 80B"),
}
NANOTRON_SIZES = {"1": "1.34B", "3": "3.57B", "8": "8.86B", "80": "80.0B"}


def nanotron_flops(model: ModelSpec, batch: int, seq: int) -> float:
    """nanotron's ``get_flops`` (src/nanotron/models/llama.py at c2528430), the model FLOPs of one step: 3 x the
    forward's q/k/v, logits, attention-output, two-layer SwiGLU (4·s·h·f + 2·s·f·h) and LM-head matmuls, attention
    counted in full (not causal-halved)."""
    layers, h, heads = model.num_layers, model.hidden, model.heads
    kv = model.kv_heads or heads
    d = h // heads
    qkv = 2 * layers * batch * seq * h * heads * d + 2 * layers * batch * seq * h * 2 * kv * d
    logits = 2 * (2 * layers * batch * heads * seq * d * seq)
    out = 2 * layers * batch * heads * seq * d * h
    ffn = 4 * layers * batch * seq * h * model.ffn + 2 * layers * batch * seq * model.ffn * h
    head = 2 * batch * seq * h * model.vocab
    return 3 * (qkv + logits + out + ffn + head)


def _nanotron(key: str) -> Published:
    p = PRINTED[key]
    size, nodes = key[3:].split("x")
    model, nodes_n = NANOTRON_MODELS[size], int(nodes)
    dp, tp, pp, gas, mbs = (int(p[k]) for k in ("dp", "tp", "pp", "gas", "mbs"))
    gpus, seq, batch = dp * tp * pp, _NANOTRON_SEQ, dp * gas * mbs
    mfu = p["mfu_pct"] / 100
    flops = nanotron_flops(model, batch, seq)
    return Published(
        key=key, source=_NANOTRON_SOURCE.format(model=NANOTRON_SIZES[size], nodes=nodes_n,
                                                s="s" if nodes_n > 1 else ""),
        model=model, hardware=f"{gpus} x H100 ({nodes_n} node{'s' if nodes_n > 1 else ''} of 8; board memory and "
                              "network not stated)",
        gpu="H100-80GB", gpus_per_node=8, nodes=nodes_n, inter_gbps=_H100_GBPS,
        dims=ParallelDims(dp_replicate=dp, tp=tp, pp=pp), zero_stage=int(p["zero"]), seq=seq, micro_batch=mbs,
        global_batch=batch, recompute="none", precision="bf16-fp32-accum",
        step_seconds=flops / (gpus * mfu * _NANOTRON_PEAK),
        derivation=f"nanotron's get_flops = {flops:.4g} FLOPs / ({gpus} x {p['mfu_pct']} % x 989 TFLOP/s)",
        stack="convoy", software=_NANOTRON_SW.format(zero=int(p["zero"])))


_NANOTRON_KEYS = ("O3N1x1", "O3N3x1", "O3N8x1", "O3N1x4", "O3N3x4", "O3N8x4", "O3N80x4", "O3N1x16", "O3N3x16",
                  "O3N8x16", "O3N80x16", "O3N1x64", "O3N3x64", "O3N8x64", "O3N80x64")

ROWS: tuple[Published, ...] = (
    _tt405("O3T1", "None", "none"),
    _tt405("O3T2", "Float8", "tensorwise"),
    _tinyllama(),
    _megatron_deepspeed_13b(),
    *(_nanotron(key) for key in _NANOTRON_KEYS),
)

SOURCE_PARAMS.update({key: (float(NANOTRON_SIZES[key[3:].split("x")[0]][:-1]) * 1e9,
                            "the plot's model size (scaling_benchmarks.py's estimate_num_params)")
                      for key in _NANOTRON_KEYS})


#: planner inputs a source leaves unstated, and what the row takes for them
NOT_STATED: dict[str, str] = {
    **{key: "torch.compile (the table's 'Optimizations' column names none besides Float8; the preset toml of the "
            "commit, train_configs/llama3_405b.toml, sets compile = true: per-block compile taken), sequence (8192, "
            "the same toml), network (3,200 Gbit/s per node taken, the 400 Gbit/s per GPU torchtitan's later files "
            "state for these boards), board (H100-96GB-500W: the '95GB' lower-TDP SXM of the footnote)"
       for key in ("O3T1", "O3T2")},
    "O3L1": "the GPU count behind the 24k tokens/s/GPU (the README's training hardware, 16 A100-40G in 2 nodes of 8, "
            "taken; the GPU-hours table agrees at 24.1k), network (1,600 Gbit/s per node taken, a DGX A100's), the "
            "FSDP sharding strategy (Lightning's default FULL_SHARD over all 16 GPUs taken)",
    "O3D1": "board memory (DGX-2's V100 32GB taken; the README says V100 only), the vocabulary "
            "(ds_pretrain_gpt_13B.sh's GPT-2 BPE files: 50,257 words, padded to 50,688 as Megatron does at TP 4), "
            "sequence parallelism (not passed: off)",
    **{key: "sequence (4096, scaling_benchmarks.py's SEQUENCE_LENGTHS), board and network (H100 80GB SXM, 3,200 "
            "Gbit/s per node taken: the Hugging Face cluster's, not stated in the source), the peak the MFU divides "
            "by (989 TFLOP/s, the H100 SXM's dense bf16, taken), what the memory column measures (allocated or "
            "reserved: kept in PRINTED only), the pipeline schedule (the base config's 1f1b taken; nanotron's "
            "default is all-forward-all-backward)"
       for key in _NANOTRON_KEYS},
}


if __name__ == "__main__":
    for row in ROWS:
        print(f"{row.key:9} {row.stack:11} {row.gpus_per_node * row.nodes:4} GPUs  {row.layout_name:36} "
              f"{row.global_batch:5} x {row.seq}  {row.step_seconds:8.3f} s  {row.derivation}")
