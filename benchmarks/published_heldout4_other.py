"""A fourth held-out set of published runs (issue 38, item 3), from sources other than NVIDIA's own tables: rows
collected while the model changes of issue 38 were being merged, and frozen ("fourth held-out set frozen
(published_heldout4_other)") before anything planned them. The development loop does not read this file; the lead
adds it to the held-out check (``benchmarks/published_results.py --held-out``) once, after those changes are merged.

Each row is a ``published_results.Published`` with what its source states: hardware, model shape, layout, micro and
global batch, sequence, recompute, precision, the stack (a name of ``convoy.plan.stacks.STACKS``) and the software
the source names, and the step time with its ``derivation`` from the numbers the source prints. ``PRINTED`` holds
those numbers as printed; ``tests/plan/test_published_heldout4_other.py`` recomputes each step time from them, checks
each source's second column (MFU, model TFLOP/s) against the row's shape under the source's own formula, the shapes
against the parameter counts the sources give, that each layout fills its GPUs, and that no row repeats one of the
other tables. Where a source leaves a planner input unstated, ``NOT_STATED`` says which and what the row takes.

Sources read (no number here comes from anything but the file named, at the commit named):

- foundation-model-stack/fms-fsdp README.md at 4ffb9bd (2024-03-21, "update hf converter doc"; the table as 5e522b4 of
  2024-03-13 left it, the day IBM and Meta's PyTorch blog post "Maximizing training throughput using PyTorch FSDP"
  printed the same numbers), keys O4I*: "Training throughput benchmarks", the eager (no torch.compile) runs of IBM's
  fms-fsdp before the compile update (ed74fd5, 2024-05-09, whose 7b row the first held-out set holds as HI1/HI2). The
  7b A100 column is the development table's I1 (same source): left out; the 7b H100 column and the 34b and 70b rows
  are taken. The table states per model the sharding strategy, activation checkpointing and batch size (2 per GPU),
  and tokens/s/GPU on 128 A100 80GB with 400 Gbit/s between nodes and on 96 H100 80GB with 800 Gbit/s; a second table
  prints MFU (nanoGPT/PaLM's 6N + 12·l·h·s per token over 312 and 989 TFLOP/s), which the test checks within 10 %
  against the row's shape (with the shape's own parameter count the 7b row prints 4 % above that formula, the 34b and
  70b rows 5-8 % below it). Taken: 7b on H100 (HSDP: sharded within a node of 8, replicated across nodes; no AC), 34b
  and 70b (FSDP FULL_SHARD, full AC: fms_fsdp/policies/ac_handler.py checkpoints every LLaMABlock when
  ``selective_checkpointing`` is 1, the default) on both clusters. The configuration at that commit:
  fms_fsdp/config/training.py (seq_length 4096, batch_size 2, mixed_precision True, use_torch_compile False),
  main_training.py (FSDP1 with ``limit_all_gathers=True``, bf16 MixedPrecision ``bfSixteen``), and the shapes of
  fms_fsdp/utils/config_utils.py's get_model_config over ibm-fms's LLaMAConfig (vocabulary 32,000, untied head): "7b"
  the default (32 layers, 4096 wide, 32 heads, FFN 11,008), "34b" (48 layers, 8192 wide, 64 heads, 8 KV heads, FFN
  22,016), "70b" (80 layers, 8192 wide, 64 heads, 8 KV heads, FFN 28,672). The blog names the software: PyTorch
  nightlies after the 2.2 release (Nov 2023 - Feb 2024), SDPA flash attention v2.
- togethercomputer/together-dgxc-benchmarking, Together AI's own runs of NVIDIA's Megatron-Bridge / NeMo recipes on
  its B200 cluster, keys O4T*:
  - tests/b200/pretrain/llama3.1/logs/benchmark_k8s_nemo2602.md at 337f1d3c (2026-03-27): Llama 3.1 8B on one node
    of 8 B200, NeMo 26.02.00 container, GBS 128, MBS 2, TP 1, PP 1, CP 1, "Avg Step Time (ms)" over iterations
    31-50 and MODEL_TFLOP/s/GPU, rows BF16 and FP8 (the NVFP4 row is left out: no planner recipe). The jobs'
    k8s/pretrain-b200-llama3.1-8b-{bf16,fp8}-gbs128.yaml give the command (Megatron-Bridge
    scripts/performance/run_script.py, ``-mr llama3_8b``, ``--compute_dtype bf16`` / ``fp8_cs``), and the BF16 run's
    log (logs/pretrain-b200-llama3.1-8b-bf16-gbs128.log) prints the resolved config: seq_length 8192, no recompute
    (recompute_granularity null), no CUDA graphs, no TP overlap, the distributed optimizer with overlapped grad
    reduce and param gather, 8,030,261,248 parameters, 8 micro-batches per step. FP8 ``fp8_cs`` is Transformer
    Engine's per-tensor current scaling. The TFLOP/s column agrees with the step time under Megatron-Bridge's Llama
    formula with causal (halved) attention, s·(12·l·h²·(1 + G/H + s/2h) + 18·l·f·h + 6·V·h) per sample (the test
    checks it within 0.5 %: it also pins the sequence).
  - tests/b200/scripts/nemotron4_15b/REPORT_BF16.md at d275be99 (2026-04-13): Nemotron-4 15B BF16 on 64 and 256
    B200, NeMo 26.02.00 container with Together's compat_runner.py over NVIDIA's dgxc-benchmarking nemotron4-15b
    recipe, TP 1, PP 1, CP 1, VP 1, MBS 2, GBS 256 / 1,024, sequence 4096, bf16-mixed, CUDA graphs on, distributed
    Adam, "Avg step time" and TFLOPS/GPU over steps 3-49. The shape is the third held-out set's NEMOTRON4_15B (32
    layers, 6144 wide, 48 heads, 8 query groups, squared-ReLU FFN 24,576, vocabulary 256,000); the TFLOPS column
    agrees with the step time under NeMo's Nemotron formula with causal attention, s·(12·l·h²·(1 + G/H + s/2h) +
    12·l·h·f + 6·V·h) = 3.652e14 FLOPs per sample (the test checks it within 0.5 %). tests/b200/slurm/nemotron4-15b/
    results.md at d275be99 prints the same two BF16 runs (jobs 81054, 81056) rounded (0.930 s, 1.015 s) and the FP8
    runs: 64 GPUs, GBS 256 (job 81053, 0.763 s, 1,916 TFLOP/s/GPU, CUDA graphs disabled), and the 256-GPU FP8
    "optimization experiments" (TP 1, MBS 2) of which the baseline GBS 512 (job 81057, 0.457 s, 1,594) and the
    submitted GBS 2048 (job 81072, 1.535 s, 1,904) are taken (the repeats, the GBS 1024 and 2560 runs, the TP 2 runs
    with TP overlap forced off, the NVLS and profiler runs are not). Their FP8 is "FP8 (hybrid, tensorwise recipe)"
    (tests/b200/scripts/nemotron4_15b/64gpus_fp8/CONTEXT.md): Transformer Engine's hybrid E4M3/E5M2 format with
    per-tensor scaling. The FP8 TFLOP/s columns agree with the step times under the same 3.652e14 FLOPs per sample
    within 0.3 %.
  The cluster: 8 B200 per node, "ConnectX-7 IB 400Gb/s" (results.md), 8 mlx5 HCAs per node
  (tests/b200/reports/Llama_70B_FP8_Scaling_Benchmark_Report.md at d275be99): 3,200 Gbit/s per node.

Tried and left out:
- AMD Instinct: AMD's "Performance results with AMD ROCm software" page (amd.com rocm-hub, training tabs for
  Megatron-LM, PyTorch/torchtitan and MaxText on MI300X/MI325X/MI355X) is where AMD's training dockers point for
  throughput (ROCm/ROCm docs/how-to/rocm-for-ai/training/benchmark-docker/megatron-lm.rst and pytorch-training.rst
  at e396b4898 hold the commands - e.g. Llama 3.1 8B MBS 2, GBS 128, TP 1, sequence 8192 on 8 MI300X - but no
  throughput in any version of their history); the stored copies of the page end inside its inference tables, so no
  training number of it could be read. The ROCm blogs (ROCm/rocm-blogs; the MI355X training-performance post is on a
  board convoy does not list), AMD's MLPerf Training posts (Llama 2 70B LoRA: fine-tuning; Llama 3.1 8B on
  MI325X/MI350X/MI355X: boards convoy does not list), AMD-AIG-AIMA/pytorch-training-benchmark (commands only) gave
  no row. MosaicML/Databricks' MI250 posts ran MI250 (not MI250X, convoy's board) and print their multi-node
  results as figures.
- Intel Gaudi: Intel's "Model Performance Data for Intel Gaudi 2" training table (SynapseAI 1.18/1.19: LLaMA 2
  7B/13B/70B and 3.1 8B/70B tokens/s) prints FP8 rows only and no layout; HabanaAI/Megatron-DeepSpeed and
  HabanaAI/Megatron-LM READMEs give layouts (e.g. LLaMA 3.1 8B on 8 HPUs DP 4 x TP 2, 70B on 64 HPUs DP 8 x TP 8)
  but no throughput, and which recipe the table ran is not said; FP8 on Gaudi is no planner input either (convoy's
  Gaudi boards have no float8 peak). Gaudi 3's table and the MLPerf GPT-3 rows (FP8, time-to-train) likewise.
  Databricks' Gaudi 2 post (MPT-7B on 8 and 160 Gaudi 2) prints its throughput as figures.
- PyTorch blog posts (pytorch/pytorch.github.io _posts): "Supercharging Training using float8 and FSDP2" (IBM/Meta,
  2024-11: Llama 3 1.8B-405B tokens/s/GPU on 128 and 512 H100s, bf16 and float8) states that batch size and AC were
  "explored" per run without giving them; "Accelerating Large Scale Training and Convergence with PyTorch Float8
  Rowwise on Crusoe 2K H200s" prints its throughput only as bar charts (its 1,600-GPU loss runs: deterministic
  mode, no batch size); "Maximizing Training Throughput Using PyTorch FSDP and Torch.compile" (2024-05) prints MFU
  only, with per-model selective AC unstated (its 7B row is the first set's HI1); its 13B rows and the 13b row of
  the table taken ("Selective AC": every n-th block, n not stated) are left out; the Crusoe B200 MXFP8 post is on
  MXFP8 (no planner recipe). "Scaling PyTorch FSDP for Training Foundation Models on IBM Cloud" (T5, figures only).
- Together's other B200 runs: Llama 3 70B FP8 at 64-592 GPUs (Megatron-FSDP with 5 layers' activations offloaded to
  the CPU: offloading is no planner input), Llama 3.1 405B and 70B NVFP4 (no planner recipe), Nemotron-4 15B FP8
  rows named above as not taken, the 2026-04-15 re-benchmark (TFLOP/s only, steps 3-9), Nemotron-4 340B (TFLOP/s
  only, NeMo 25.07 container whose FLOP convention is not pinned down), and the MoE and hybrid models (DeepSeek-V3,
  Grok-1, Qwen3, Nemotron-H).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from convoy.plan.dims import ParallelDims  # noqa: E402
from published_heldout3_nvidia import NEMOTRON4_15B  # noqa: E402
from published_results import LLAMA2_7B, LLAMA3_8B, Published, _llama  # noqa: E402

#: the numbers each source prints, as it prints them (the step times below follow from these)
PRINTED: dict[str, dict[str, float]] = {
    # fms-fsdp README.md (4ffb9bd): Training Throughput tokens/sec/GPU; MFU of the second table
    "O4I2": {"tokens_per_gpu": 7500, "mfu": 0.37},
    "O4I3": {"tokens_per_gpu": 700, "mfu": 0.47},
    "O4I4": {"tokens_per_gpu": 1550, "mfu": 0.32},
    "O4I5": {"tokens_per_gpu": 370, "mfu": 0.50},
    "O4I6": {"tokens_per_gpu": 800, "mfu": 0.34},
    # together-dgxc-benchmarking benchmark_k8s_nemo2602.md (337f1d3c): Avg Step Time (ms), MODEL_TFLOP/s/GPU
    "O4T1": {"step_ms": 5701, "tflops": 1183.5},
    "O4T2": {"step_ms": 4121, "tflops": 1637.0},
    # together-dgxc-benchmarking nemotron4_15b/REPORT_BF16.md (d275be99): Avg step time (s), Avg TFLOPS/GPU
    "O4T3": {"step_s": 0.9302, "tflops": 1570.4},
    "O4T4": {"step_s": 1.0149, "tflops": 1439.4},
    # together-dgxc-benchmarking slurm/nemotron4-15b/results.md (d275be99): Step Time (s), TFLOP/s/GPU (FP8 rows)
    "O4T5": {"step_s": 0.763, "tflops": 1916},
    "O4T6": {"step_s": 0.457, "tflops": 1594},
    "O4T7": {"step_s": 1.535, "tflops": 1904},
}

#: the parameter count each source gives its model, and where: the model's name where the source gives no count
SOURCE_PARAMS: dict[str, tuple[float, str]] = {
    "O4I2": (7e9, "the table's model size 7b"),
    **{key: (34e9, "the table's model size 34b") for key in ("O4I3", "O4I4")},
    **{key: (70e9, "the table's model size 70b") for key in ("O4I5", "O4I6")},
    **{key: (8_030_261_248, "the BF16 run's log: number of parameters on rank (0, 0)") for key in ("O4T1", "O4T2")},
    **{key: (15e9, "the report's model name Nemotron4 15B") for key in ("O4T3", "O4T4", "O4T5", "O4T6", "O4T7")},
}

#: rows whose source names a rounded size only, and how far the shape's count may be from it (the MFU or TFLOP/s
#: check of the test pins these shapes instead): ibm-fms's 7b has 6.74e9 parameters, Nemotron-4 15B 15.63e9
ROUNDED_NAMES: dict[str, float] = {"O4I2": 0.04, **{key: 0.05 for key in ("O4T3", "O4T4", "O4T5", "O4T6", "O4T7")}}

#: ibm-fms LLaMAConfig shapes of fms_fsdp/utils/config_utils.py (4ffb9bd); "7b" is Llama 2 7B's shape
FMS_34B = _llama(48, 8192, 64, 8, 22016, 32000, "Llama 2 34B (fms-fsdp 34b)")
FMS_70B = _llama(80, 8192, 64, 8, 28672, 32000, "Llama 2 70B (fms-fsdp 70b)")

_FMS = ("foundation-model-stack/fms-fsdp README.md (4ffb9bd, 2024-03-21), 'Training throughput benchmarks', "
        "row {size}, {board} column")
_FMS_SW = ("IBM fms-fsdp of 2024-03 on PyTorch nightlies after 2.2: FSDP1 {sharding} (limit_all_gathers), eager "
           "(use_torch_compile False), SDPA flash attention v2, bf16 MixedPrecision (bfSixteen){ac}")


def _fms(key: str, size: str, model, *, a100: bool, hsdp: bool, recompute: str) -> Published:
    gpus, seq, local = (128, 4096, 2) if a100 else (96, 4096, 2)
    board, gpu, inter = ("A100 80G", "A100-80GB", 400.0) if a100 else ("H100 80G", "H100-80GB", 800.0)
    tokens = PRINTED[key]["tokens_per_gpu"]
    dims = ParallelDims(dp_replicate=gpus // 8, dp_shard=8) if hsdp else ParallelDims(dp_shard=gpus)
    return Published(
        key=key, source=_FMS.format(size=size, board=board), model=model,
        hardware=f"{gpus} x {board}, {inter:,.0f} Gbit/s between nodes", gpu=gpu, gpus_per_node=8, nodes=gpus // 8,
        inter_gbps=inter, dims=dims, zero_stage=3, seq=seq, micro_batch=local, global_batch=local * gpus,
        recompute=recompute, precision="bf16-fsdp", stack="fsdp1",
        software=_FMS_SW.format(sharding="HYBRID_SHARD (sharded in the node)" if hsdp else "FULL_SHARD",
                                ac="; full AC (every block, non-reentrant checkpoint_wrapper)"
                                if recompute == "full" else ""),
        step_seconds=local * seq / tokens,
        derivation=f"{local * gpus} x {seq} tokens / ({tokens:,} tokens/s/GPU x {gpus})")


_TOGETHER_HW = "B200 (Together AI DGXC cluster, 8 per node, InfiniBand with 8 mlx5 HCAs per node)"
_LLAMA_SRC = ("togethercomputer/together-dgxc-benchmarking tests/b200/pretrain/llama3.1/logs/"
              "benchmark_k8s_nemo2602.md (337f1d3c), row pretrain-b200-llama3.1-8b-{dtype}-gbs128")
_LLAMA_SW = ("NeMo 26.02.00 container, Megatron-Bridge scripts/performance/run_script.py -mr llama3_8b "
             "(--compute_dtype {dtype}): Megatron-Core with Transformer Engine, distributed optimizer with overlapped "
             "grad reduce and param gather, no recompute, no CUDA graphs{fp8}")
_NEMOTRON_SRC = ("togethercomputer/together-dgxc-benchmarking tests/b200/scripts/nemotron4_15b/REPORT_BF16.md "
                 "(d275be99), {gpus} GPUs column")
_NEMOTRON_SW = ("NeMo 26.02.00 container with Together's compat_runner.py over NVIDIA dgxc-benchmarking's "
                "nemotron4-15b recipe (NeMo 2.0, Megatron-Core, Transformer Engine): {dtype}, distributed Adam, "
                "{graphs}")
_BF16 = _NEMOTRON_SW.format(dtype="bf16-mixed", graphs="CUDA graphs on (the report)")
_FP8 = _NEMOTRON_SW.format(dtype="FP8 through Transformer Engine (hybrid format, tensorwise recipe)",
                           graphs="CUDA graphs off (compat_runner.py disables them: an FP8 replay bug)")
_NEMOTRON_FP8_SRC = ("togethercomputer/together-dgxc-benchmarking tests/b200/slurm/nemotron4-15b/results.md "
                     "(d275be99), {table}")


def _together(key: str, source: str, model, *, gpus: int, batch: int, micro: int, seq: int, fp8: str,
              software: str) -> Published:
    p = PRINTED[key]
    step = p["step_ms"] / 1000 if "step_ms" in p else p["step_s"]
    printed = f"{p['step_ms']:,} ms" if "step_ms" in p else f"{p['step_s']} s"
    return Published(
        key=key, source=source, model=model, hardware=f"{gpus} x {_TOGETHER_HW}", gpu="B200", gpus_per_node=8,
        nodes=gpus // 8, inter_gbps=3200.0, dims=ParallelDims(dp_replicate=gpus), zero_stage=1, seq=seq,
        micro_batch=micro, global_batch=batch, recompute="none", precision="bf16", fp8=fp8,
        step_seconds=step, derivation=f"printed: step time {printed}", stack="megatron-core",
        software=software)


ROWS: tuple[Published, ...] = (
    _fms("O4I2", "7b", LLAMA2_7B, a100=False, hsdp=True, recompute="none"),
    _fms("O4I3", "34b", FMS_34B, a100=True, hsdp=False, recompute="full"),
    _fms("O4I4", "34b", FMS_34B, a100=False, hsdp=False, recompute="full"),
    _fms("O4I5", "70b", FMS_70B, a100=True, hsdp=False, recompute="full"),
    _fms("O4I6", "70b", FMS_70B, a100=False, hsdp=False, recompute="full"),
    _together("O4T1", _LLAMA_SRC.format(dtype="bf16"), LLAMA3_8B, gpus=8, batch=128, micro=2, seq=8192, fp8="none",
              software=_LLAMA_SW.format(dtype="bf16", fp8="")),
    _together("O4T2", _LLAMA_SRC.format(dtype="fp8"), LLAMA3_8B, gpus=8, batch=128, micro=2, seq=8192,
              fp8="tensorwise",
              software=_LLAMA_SW.format(dtype="fp8_cs", fp8="; FP8 through Transformer Engine with per-tensor "
                                                            "current scaling (fp8_cs)")),
    _together("O4T3", _NEMOTRON_SRC.format(gpus=64), NEMOTRON4_15B, gpus=64, batch=256, micro=2, seq=4096,
              fp8="none", software=_BF16),
    _together("O4T4", _NEMOTRON_SRC.format(gpus=256), NEMOTRON4_15B, gpus=256, batch=1024, micro=2, seq=4096,
              fp8="none", software=_BF16),
    _together("O4T5", _NEMOTRON_FP8_SRC.format(table="'FP8 Results - 64 GPUs', job 81053"), NEMOTRON4_15B, gpus=64,
              batch=256, micro=2, seq=4096, fp8="tensorwise", software=_FP8),
    _together("O4T6", _NEMOTRON_FP8_SRC.format(table="'FP8 Results - 256 GPUs', Baseline GBS 512, job 81057"),
              NEMOTRON4_15B, gpus=256, batch=512, micro=2, seq=4096, fp8="tensorwise", software=_FP8),
    _together("O4T7", _NEMOTRON_FP8_SRC.format(table="'FP8 Results - 256 GPUs', exp6 GBS 2048 rerun, job 81072"),
              NEMOTRON4_15B, gpus=256, batch=2048, micro=2, seq=4096, fp8="tensorwise", software=_FP8),
)


#: planner inputs a source leaves unstated, and what the row takes for them
NOT_STATED: dict[str, str] = {
    **{key: "sequence (4096 taken: fms_fsdp/config/training.py seq_length at 4ffb9bd; the blog: 'models of 4k "
            "sequence length'), the network figure's unit (read as per node, as the first held-out set does for "
            "the same README), the PyTorch nightly (after 2.2, Nov 2023 - Feb 2024)"
       for key in ("O4I2", "O4I3", "O4I4", "O4I5", "O4I6")},
    "O4T1": "inter-node network (one node; 3,200 Gbit/s per node recorded, unused)",
    "O4T2": "the FP8 run's resolved config (the BF16 run's log is the one read: same command but --compute_dtype "
            "fp8_cs; no recompute and no CUDA graphs taken from it), inter-node network (one node)",
    **{key: "recompute (none taken: the report names none, and NVIDIA's nemotron4-15b recipes set none), "
            "CUDA graphs (the BF16 report says on; the compat_runner.py fix list says off unconditionally: no "
            "planner input either way)" for key in ("O4T3", "O4T4")},
    **{key: "recompute (none taken, as for the BF16 rows), the FP8 scaling (per-tensor 'tensorwise' taken from "
            "CONTEXT.md's 'hybrid, tensorwise recipe'; Transformer Engine's delayed or current scaling not said)"
       + ("" if key == "O4T5" else "; the 256-GPU experiments' FP8 recipe and MBS 2 taken from the table's base "
          "config and the 64-GPU run") for key in ("O4T5", "O4T6", "O4T7")},
}


if __name__ == "__main__":
    for row in ROWS:
        print(f"{row.key:5} {row.stack:13} {row.gpus_per_node * row.nodes:4} GPUs {row.gpu:10} {row.layout_name:25} "
              f"{row.global_batch:5} x {row.seq:5}  {row.step_seconds:7.3f} s  {row.derivation}")
