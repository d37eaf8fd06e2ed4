"""Held-out published runs (PyTorch-native families): rows the planner's developers do not read while building.

    python benchmarks/published_results.py --held-out    # plans these rows (and published_heldout_megatron.py's)

Each row is one published multi-GPU training run of llm-foundry (MosaicML Composer's FSDP), torchtitan or IBM's
fms-fsdp that benchmarks/published_results.py's development table does not hold, written down as its source states
it: hardware, model shape, layout, batch, recompute, precision, attention kernel, the software it ran (``software``,
``stack``: a name of convoy.plan.stacks.STACKS) and the published step time derived from the numbers the source
prints (``derivation``). ``PRINTED`` keeps those numbers (throughput, and the parameter count or MFU the source gives)
so that tests/plan/test_published_results.py checks each row's arithmetic and model size against its source, never
its planned ratio. The rows were collected and committed ("held-out rows frozen") before the planner was run on them;
a row is changed afterwards only to fix a transcription error shown against its source, and docs/planner-accuracy.md
section 8b says so when it happens.

Sources (read at the commits named, in the repositories' own git history):

- llm-foundry: mosaicml/llm-foundry scripts/train/benchmarking/README.md at 4952183 (2024-04-22). Its A100 tables
  date from 2023-05 (submit_benchmarks.py's default image then: mosaicml/pytorch 1.13.1_cu117, ``attn_impl``
  'triton', the triton flash-attention kernel), its "H100 80GB BF16" table from b2a43a1 (2023-10-19) and its
  "H100 80GB BF16 (Large Scale, >= 128 GPUs)" table from 5e85bd6 (2024-01-06; sweep.sh: image mosaicml/pytorch
  2.1.0_cu121, llm-foundry v0.0.4, ``attn_impl`` 'triton'). Composer's FSDP is FSDP1 (``limit_all_gathers``);
  ``amp_bf16``/DEFAULT is bf16 compute over fp32 shards, ``bf16``/PURE is pure bf16. The MPT models' parameter
  counts are the tables' NumParams column (they grow with the sequence length: learned position embeddings).
- torchtitan, 2024 A100 rows: pytorch/torchtitan docs/performance.md as of 6e2a9e0 (2024-12-03, the last commit
  before the Llama 2 rows were removed; the Llama 2 table was added by 559a526, 2024-04-16), "Llama 2 performance
  numbers": FSDP2 (1D) on 64 A100 80GB, eager; the models are torchtitan's llama2_configs (vocab 32,000 from the
  Llama 2 tokenizer; FFN sizes from its FeedForward rounding); sequence 4096 from train_configs/llama2_*.toml.
- torchtitan, Dec 2024 H100 rows: pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (added 820504e,
  2025-06-13; runs of torch 1963fc8 / torchao eab345c / torchtitan 9dec370, 2024-12-23..26), tables 4 and 5, on
  Grand Teton: H100 SXM 96GB HBM2e at 500 W, NVLink, 400 Gbit/s RDMA per GPU; memory is max_memory_reserved.
  Sequence 8192 from train_configs/llama3_{70b,405b}.toml at 9dec370; the pipeline rows use that commit's defaults
  (torchtitan/parallelisms/pipelining_utils.py: microbatches = the PP degree, 8; interleaved 1F1B with no split
  points given = 2 stages per rank), which the table does not restate.
- torchtitan, June 2025 H100 rows: benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md (added 2887250,
  2025-06-16; torch 38410cf9, torchtitan 820504e), vanilla-TP column of its bf16 rows; sequence 8192 from
  torchtitan/models/llama3/train_configs/llama3_{8b,70b}.toml at 820504e.
- torchtitan, June 2025 H200 rows: benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md (added a0e5b6c,
  2025-07-11; torch 2.8.0a0 of NGC 25.05, torchao 0afa4c1, torchtitan e7c0cae); its command line gives local batch
  2, compile, float8 with float8 FSDP all-gather; sequence 8192 and per-op selective AC from llama3_8b.toml at
  e7c0cae.
- fms-fsdp: foundation-model-stack/fms-fsdp README.md at ed74fd5 (2024-05-09, "update numbers with compile"),
  "Training throughput benchmarks" table: 7b with HSDP (FSDP1 HYBRID_SHARD: sharded in the node, replicated across),
  torch.compile of the whole model, no AC, batch 2 per GPU, sequence 4096 (fms_fsdp/config/training.py); the model
  is ibm-fms's LLaMAConfig() default (vocab 32,000, emb 4096, 32 layers, 32 heads, FFN 8/3 x 4096 rounded to 256 =
  11,008). Its 13b/34b/70b rows ran "Selective AC", fms-fsdp's fraction ``selective_checkpointing`` of blocks
  checkpointed, whose value per model the README does not state: left out.
"""

from __future__ import annotations

from dataclasses import dataclass

from convoy.plan.dims import ParallelDims
from published_results import LLAMA2_7B, LLAMA3_8B, LLAMA3_70B, MPT_13B, MPT_30B, MPT_70B, Published, _gpt, _llama


@dataclass(frozen=True, kw_only=True)
class Printed:
    """The numbers a source prints for one row, to check the row against (not the planner)."""

    tokens_per_s: float
    """All GPUs together, as the source prints it or its per-GPU figure times the GPUs."""
    params: float | None = None
    """The parameter count the source prints (llm-foundry's NumParams) or names (``Llama 3.1 70B``)."""
    params_where: str = ""
    mfu: float | None = None
    """MFU as the source prints it (a fraction)."""
    peak_tflops: float | None = None
    """The peak the source's MFU divides by."""
    mfu_formula: str = ""
    """``llm-foundry`` (3 x (2 N s + 4 l h s^2) FLOPs per sequence) or ``6N+12lhs`` (per token: torchtitan 2024,
    and the PaLM/nanoGPT formula fms-fsdp names)."""


_FOUNDRY = "mosaicml/llm-foundry scripts/train/benchmarking/README.md (4952183, 2024-04-22)"
_FOUNDRY_A100_SW = ("MosaicML Composer FSDP1 (FULL_SHARD, limit_all_gathers), PyTorch 1.13.1 + CUDA 11.7 "
                    "(submit_benchmarks.py default image, 2023), triton flash attention (attn_impl 'triton')")
_FOUNDRY_H100_SW = ("MosaicML Composer FSDP1 (FULL_SHARD, limit_all_gathers), llm-foundry v0.0.4 on image "
                    "mosaicml/pytorch 2.1.0_cu121 (sweep.sh, {date}), triton flash attention (attn_impl 'triton')")
_TT_2024 = "pytorch/torchtitan docs/performance.md at 6e2a9e0 (2024-12-03), 'Llama 2 performance numbers'"
_TT_2024_SW = ("torchtitan of April 2024 (table added 559a526, 2024-04-16): FSDP2, eager (no torch.compile), "
               "SDPA flash attention")
_TT_DEC = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md (820504e)"
_TT_DEC_SW = ("torchtitan 9dec370 on torch 1963fc8 and torchao eab345c (2024-12): FSDP2, per-block torch.compile, "
              "torchao float8 (tensorwise), AsyncTP {asynctp}, SDPA flash attention")
_TT_ASYNC = "pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md (2887250)"
_TT_ASYNC_SW = ("torchtitan 820504e on torch 38410cf9 (2025-06): FSDP2 + DTensor TP (vanilla TP column), per-block "
                "torch.compile, bf16, SDPA flash attention")
_GRAND_TETON = "H100 SXM 96GB HBM2e (500 W), NVLink, 400 Gbit/s RDMA per GPU"
_A100_NODES = "A100 80GB (links not stated)"


def _foundry(key: str, table: str, model, *, gpu: str, board: str, gpus: int, seq: int, micro: int, batch: int,
             tps: int, recompute: str, precision: str, software: str, params: int, mfu: float, peak: float,
             inter_gbps: float, links: str) -> tuple[Published, Printed]:
    row = Published(key=key, source=f"{_FOUNDRY}, {table} table", model=model, hardware=f"{gpus} x {board}, {links}",
                    gpu=gpu, gpus_per_node=8, nodes=gpus // 8, inter_gbps=inter_gbps,
                    dims=ParallelDims(dp_shard=gpus), zero_stage=3, seq=seq, micro_batch=micro, global_batch=batch,
                    recompute=recompute, precision=precision, stack="fsdp1", software=software,
                    step_seconds=batch * seq / tps, derivation=f"{batch:,} x {seq} tokens / {tps:,} tokens/s")
    return row, Printed(tokens_per_s=tps, params=params, params_where="the table's NumParams", mfu=mfu,
                        peak_tflops=peak, mfu_formula="llm-foundry")


_MPT_30B_8K = _gpt(30_019_254_272, 48, 7168, 56, 50368, "MPT-30B (8k positions)")
_MPT_13B_16K = _gpt(12_927_354_880, 40, 5120, 40, 50368, "MPT-13B (16k positions)")
_MPT_13B_8K = _gpt(12_885_411_840, 40, 5120, 40, 50368, "MPT-13B (8k positions)")

_H100_LS = "H100 80GB BF16 (Large Scale, >= 128 GPUs)"
_H100_T = "H100 80GB BF16"
_H100_BOARD = "H100 80GB"
_NO_LINKS = "(links not stated)"
_ROCE = "1,600 Gbit/s RoCE between nodes"

_PAIRS: list[tuple[Published, Printed]] = [
    _foundry("HF1", _H100_LS, MPT_70B, gpu="H100-80GB", board=_H100_BOARD, gpus=512, seq=2048, micro=8, batch=4096,
             tps=515636, recompute="full", precision="bf16-fsdp", software=_FOUNDRY_H100_SW.format(date="2024-01"),
             params=64862437376, mfu=0.4125, peak=989, inter_gbps=3200, links=_NO_LINKS),
    _foundry("HF2", _H100_LS, MPT_13B, gpu="H100-80GB", board=_H100_BOARD, gpus=256, seq=2048, micro=16, batch=4096,
             tps=1277214, recompute="full", precision="bf16-fsdp",
             software=_FOUNDRY_H100_SW.format(date="2024-01"), params=12853954560, mfu=0.4142, peak=989,
             inter_gbps=3200, links=_NO_LINKS),
    _foundry("HF3", _H100_LS, _gpt(6_658_859_008, 32, 4096, 32, 50368, "MPT-7B"), gpu="H100-80GB",
             board=_H100_BOARD, gpus=128, seq=2048, micro=6, batch=768, tps=1340830, recompute="none",
             precision="bf16-fsdp", software=_FOUNDRY_H100_SW.format(date="2024-01"), params=6658859008,
             mfu=0.4571, peak=989, inter_gbps=3200, links=_NO_LINKS),
    _foundry("HF4", _H100_T, _MPT_30B_8K, gpu="H100-80GB", board=_H100_BOARD, gpus=8, seq=8192, micro=1, batch=168,
             tps=11072, recompute="full", precision="bf16-fsdp", software=_FOUNDRY_H100_SW.format(date="2023-10"),
             params=30019254272, mfu=0.2992, peak=989, inter_gbps=3200, links="one node"),
    _foundry("HF5", _H100_T, _MPT_13B_16K, gpu="H100-80GB", board=_H100_BOARD, gpus=8, seq=16384, micro=3,
             batch=72, tps=23881, recompute="full", precision="bf16-fsdp",
             software=_FOUNDRY_H100_SW.format(date="2023-10"), params=12927354880, mfu=0.3555, peak=989,
             inter_gbps=3200, links="one node"),
    _foundry("HF6", "A100 80GB with 1600 Gbps node-node interconnect (RoCE)", _MPT_13B_8K, gpu="A100-80GB",
             board="A100 80GB", gpus=8, seq=8192, micro=5, batch=120, tps=14362, recompute="full",
             precision="bf16-fsdp", software=_FOUNDRY_A100_SW, params=12885411840, mfu=0.5607, peak=312,
             inter_gbps=1600, links="one node"),
    _foundry("HF7", "A100 80GB with 1600 Gbps node-node interconnect (RoCE)", MPT_70B, gpu="A100-80GB",
             board="A100 80GB", gpus=32, seq=2048, micro=2, batch=1024, tps=11962, recompute="full",
             precision="bf16", software=_FOUNDRY_A100_SW + "; pure bf16 (PURE)", params=64862437376, mfu=0.4856,
             peak=312, inter_gbps=1600, links=_ROCE),
    _foundry("HF8", "A100 40GB with 1600 Gbps node-node interconnect (RoCE)", MPT_30B, gpu="A100-40GB",
             board="A100 40GB", gpus=128, seq=2048, micro=6, batch=768, tps=110803, recompute="full",
             precision="bf16", software=_FOUNDRY_A100_SW + "; pure bf16 (PURE)", params=29975214080, mfu=0.5225,
             peak=312, inter_gbps=1600, links=_ROCE),
]

LLAMA2_13B_TT = _llama(40, 5120, 40, 40, 13824, 32000, "Llama 2 13B")
LLAMA2_70B_TT = _llama(80, 8192, 64, 8, 28672, 32000, "Llama 2 70B")
LLAMA3_405B = _llama(126, 16384, 128, 8, 53248, 128256, "Llama 3.1 405B")


def _tt_a100(key: str, model, *, local: int, recompute: str, what: str, wps: int, mfu: float) -> tuple[Published,
                                                                                                         Printed]:
    gpus, seq = 64, 4096
    row = Published(key=key, source=f"{_TT_2024}, {model.name[-3:].strip()} {what}, batch {local}", model=model,
                    hardware=f"{gpus} x {_A100_NODES}", gpu="A100-80GB", gpus_per_node=8, nodes=8, inter_gbps=1600,
                    dims=ParallelDims(dp_shard=gpus), zero_stage=3, seq=seq, micro_batch=local,
                    global_batch=local * gpus, recompute=recompute, precision="bf16-fsdp", stack="torchtitan",
                    software=_TT_2024_SW + (
                        "; AC 'selective op' is torchtitan's per-op policy (_save_list)" if what == "selective op"
                        else ""),
                    step_seconds=local * seq / wps,
                    derivation=f"{local * gpus} x {seq} tokens / ({wps:,} tokens/s/GPU x {gpus})")
    return row, Printed(tokens_per_s=wps * gpus, params=13e9 if "13B" in model.name else 70e9,
                        params_where="the model's name", mfu=mfu, peak_tflops=312, mfu_formula="6N+12lhs")


_PAIRS += [
    _tt_a100("HT1", LLAMA2_13B_TT, local=2, recompute="none", what="no AC", wps=2162, mfu=0.611),
    _tt_a100("HT2", LLAMA2_13B_TT, local=2, recompute="selective", what="selective op", wps=1904, mfu=0.538),
    _tt_a100("HT3", LLAMA2_70B_TT, local=1, recompute="selective", what="selective op", wps=355, mfu=0.508),
    _tt_a100("HT4", LLAMA2_70B_TT, local=2, recompute="full", what="full AC", wps=353, mfu=0.505),
]


def _tt_h100(key: str, source: str, model, *, gpus: int, dims: ParallelDims, local: int, micro: int, tps: float,
             recompute: str, software: str, fp8: str, memory: float | None = None, virtual: int = 1,
             gpu: str = "H100-96GB-500W", hardware: str = _GRAND_TETON) -> tuple[Published, Printed]:
    seq = 8192
    batch = local * dims.dp
    row = Published(key=key, source=source, model=model, hardware=f"{gpus} x {hardware}", gpu=gpu, gpus_per_node=8,
                    nodes=gpus // 8, inter_gbps=3200, dims=dims, zero_stage=3, seq=seq, micro_batch=micro,
                    global_batch=batch, recompute=recompute, precision="bf16-fsdp", pp_stages_per_rank=virtual,
                    compile="blocks", fp8=fp8, stack="torchtitan", software=software,
                    step_seconds=batch * seq / (tps * gpus), memory_gib=memory,
                    derivation=f"{batch} x {seq} tokens / ({tps:,} tokens/s/GPU x {gpus})")
    size = model.name.split()[-1]
    return row, Printed(tokens_per_s=tps * gpus, params=float(size[:-1]) * 1e9, params_where="the model's name")


_PAIRS += [
    _tt_h100("HT5", f"{_TT_DEC}, table 4, row '2D'", LLAMA3_70B, gpus=256, dims=ParallelDims(dp_shard=32, tp=8),
             local=16, micro=16, tps=829, recompute="full", fp8="tensorwise", memory=71.9,
             software=_TT_DEC_SW.format(asynctp="off")),
    _tt_h100("HT6", f"{_TT_DEC}, table 5, row '1F1B'", LLAMA3_405B, gpus=512,
             dims=ParallelDims(dp_shard=8, tp=8, pp=8), local=32, micro=4, tps=100, recompute="full",
             fp8="tensorwise", memory=82.5, software=_TT_DEC_SW.format(asynctp="on") + "; 1F1B, 8 microbatches "
             "(torchtitan's default: the PP degree)"),
    _tt_h100("HT7", f"{_TT_DEC}, table 5, row 'Interleaved 1F1B'", LLAMA3_405B, gpus=512,
             dims=ParallelDims(dp_shard=8, tp=8, pp=8), local=32, micro=4, tps=128, recompute="full",
             fp8="tensorwise", memory=72.7, virtual=2,
             software=_TT_DEC_SW.format(asynctp="on") + "; interleaved 1F1B, 2 stages per rank and 8 microbatches "
             "(torchtitan's defaults without split points: 126 layers over 16 stages of 7-8)"),
    _tt_h100("HT8", f"{_TT_ASYNC}, Llama3 70b table, row 'None (bfloat16)', vanilla TP", LLAMA3_70B, gpus=256,
             dims=ParallelDims(dp_shard=32, tp=8), local=16, micro=16, tps=597.3, recompute="full", fp8="none",
             software=_TT_ASYNC_SW),
    _tt_h100("HT9", f"{_TT_ASYNC}, Llama3 8b table, row 'None (bfloat16)', vanilla TP", LLAMA3_8B, gpus=64,
             dims=ParallelDims(dp_shard=8, tp=8), local=12, micro=12, tps=4378, recompute="selective", fp8="none",
             software=_TT_ASYNC_SW + "; per-op SAC (torchtitan's _save_list)"),
    _tt_h100("HT10", "pytorch/torchtitan benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md (a0e5b6c), "
             "row NUM_NODES 4", LLAMA3_8B, gpus=32, dims=ParallelDims(dp_shard=32), local=2, micro=2, tps=10938,
             recompute="selective", fp8="tensorwise", memory=47.96, gpu="H200-141GB",
             hardware="H200 (141 GB), NVLink, 400 Gbit/s RDMA (ConnectX-7) per GPU",
             software="torchtitan e7c0cae on torch 2.8.0a0 (NGC 25.05) and torchao 0afa4c1 (2025-06), Trainy on "
                      "WhiteFiber: FSDP2, per-block torch.compile, torchao float8 (tensorwise) with float8 FSDP "
                      "all-gather, per-op SAC (llama3_8b.toml), SDPA flash attention"),
]

_FMS = ("foundation-model-stack/fms-fsdp README.md (ed74fd5, 2024-05-09), 'Training throughput benchmarks', "
        "row 7b")
_FMS_SW = ("IBM fms-fsdp of 2024-05: FSDP1 HYBRID_SHARD (sharded in the node), torch.compile of the whole model, "
           "SDPA flash attention v2, bf16 mixed precision")


def _fms(key: str, *, gpus: int, gpu: str, board: str, inter: float, tps: int, mfu: float,
         peak: float) -> tuple[Published, Printed]:
    seq, local = 4096, 2
    row = Published(key=key, source=f"{_FMS}, {board} column", model=LLAMA2_7B,
                    hardware=f"{gpus} x {board}, {inter:,.0f} Gbit/s between nodes", gpu=gpu, gpus_per_node=8,
                    nodes=gpus // 8, inter_gbps=inter, dims=ParallelDims(dp_replicate=gpus // 8, dp_shard=8),
                    zero_stage=3, seq=seq, micro_batch=local, global_batch=local * gpus, recompute="none",
                    precision="bf16-fsdp", compile="model", stack="fsdp1", software=_FMS_SW,
                    step_seconds=local * seq / tps,
                    derivation=f"{local * gpus} x {seq} tokens / ({tps:,} tokens/s/GPU x {gpus})")
    # the README names the size only ("7b", 3.7 % above ibm-fms LLaMAConfig()'s 6.74e9): its MFU checks the model
    return row, Printed(tokens_per_s=tps * gpus, mfu=mfu, peak_tflops=peak, mfu_formula="6N+12lhs")


_PAIRS += [
    _fms("HI1", gpus=128, gpu="A100-80GB", board="A100 80GB", inter=400, tps=4550, mfu=0.68, peak=312),
    _fms("HI2", gpus=96, gpu="H100-80GB", board="H100 80GB", inter=800, tps=9600, mfu=0.46, peak=989),
]

ROWS: tuple[Published, ...] = tuple(row for row, _ in _PAIRS)
PRINTED: dict[str, Printed] = {row.key: printed for row, printed in _PAIRS}


#: per row, the planner inputs its source does not state and what the row takes (added by the lead after the
#: baseline was seen, from the rows' own hardware and software texts: no row's inputs changed)
NOT_STATED: dict[str, str] = {
    **{key: "inter-node network (3,200 Gbit/s per node taken, as section 8 does for H100s)"
       for key in ("HF1", "HF2", "HF3")},
    **{key: "inter-node network (1,600 Gbit/s per node taken, as section 8 does for A100s)"
       for key in ("HT1", "HT2", "HT3", "HT4")},
    **{key: "pipeline micro-batches and stages per rank (torchtitan 9dec370's defaults taken: 8 micro-batches, "
            "2 stages per rank when interleaved)" for key in ("HT6", "HT7")},
}
