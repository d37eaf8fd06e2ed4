"""Step-time model: FLOPs, ring collective costs, bubble, overlap, MFU."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from convoy.plan.activations import block_bytes
from convoy.plan.dims import ParallelDims
from convoy.plan.hardware import Hardware, lookup_gpu, parse_hardware
from convoy.plan.memory import Layout
from convoy.plan.model import ModelSpec, from_hf_config, from_numbers
from convoy.plan.run import RunSpec
from convoy.plan.speed.collectives import Group, collective_seconds
from convoy.plan.speed.rates import rates_for
from convoy.plan.timing import (
    DDP_BUCKET_BYTES,
    NCCL_LINK_FRACTION,
    compute_seconds,
    gemm_shapes,
    model_flops_per_token,
    parameter_tensors,
    ring_all_reduce_seconds,
    ring_gather_seconds,
    step_time,
)
from tests.conftest import REPO

MODEL = from_numbers(7e9, layers=32, hidden=4096, heads=32, vocab=32000)
RUN_AUTOCAST_1024x8 = RunSpec(seq_len=1024, micro_batch=8, precision="bf16-autocast")


def test_flops_per_token_is_6n_plus_attention():
    # a shape: N is the weights its GEMMs multiply (12h² per block with a 4h MLP, and the 32000 x 4096 head),
    # not the 7e9 given, whose embedding table is looked up at no FLOPs
    n = 32 * 12 * 4096**2 + 4096 * 32000
    assert model_flops_per_token(MODEL, 2048) == 6 * n + 12 * 32 * 4096 * 2048
    assert model_flops_per_token(MODEL, 2048, training=False) == 2 * n + 4 * 32 * 4096 * 2048
    assert model_flops_per_token(from_numbers(1e9), 4096) == 6e9  # no shape: no attention term


@pytest.mark.parametrize("config", ["llama2_7b", "gpt2", "pythia_160m", "qwen2_0_5b"])
def test_mfu_never_passes_the_efficiency(config):
    """MFU's numerator counts the FLOPs the time model charges: at efficiency 1 no layout beats 100 % (GPT-NeoX's
    untied 50k x 768 input embedding counted at 2 FLOPs per parameter put pythia-160m's single GPU at 124 %)."""
    from convoy.plan.api import plan

    p = plan(str(REPO / f"tests/plan/configs/{config}.json"), hardware="8xH100-80GB", efficiency=1.0,
             peak_tflops=1.0, recompute="none")
    assert max(r.time.mfu for r in p.rows) <= 1.0
    assert max(r.time.mfu for r in p.rows) > 0.99  # compute-bound at 1 TFLOPs: the bound is met, not missed by far


def test_tensor_parallel_gemms_round_up_and_cover_the_model():
    """GPT-2's vocabulary (50257) and a 3-way split of 4096 are not divisible: each rank's share rounds up, so the
    tp ranks together do at least the whole model's GEMMs (rounding down made them do less)."""
    gpt2 = from_numbers(124e6, layers=12, hidden=768, heads=12, vocab=50257)
    run = RunSpec(seq_len=1024)
    # 48 heads of 4096 (a config with head_dim 128 x 48 = 6144 projected back to 4096, as Gemma does):
    # 3 does not divide 4096
    odd = ModelSpec(name="48 heads", num_params=7 * 10**9, num_layers=32, hidden=4096, heads=48, vocab=32000, ffn=16384)
    for model, tp in ((gpt2, 2), (gpt2, 4), (odd, 3)):
        whole = sum(k * n * c for _, k, n, c in gemm_shapes(model, run))
        split = sum(k * n * c for _, k, n, c in gemm_shapes(model, run, tp=tp))
        assert whole <= tp * split < whole * 1.01, (model.name, tp)


def test_ring_costs():
    assert ring_all_reduce_seconds(8e9, 8, 1e9) == pytest.approx(2 * 7 / 8 * 8)
    assert ring_gather_seconds(8e9, 8, 1e9) == pytest.approx(7 / 8 * 8)
    assert ring_all_reduce_seconds(8e9, 1, 1e9) == 0


def test_a_bare_parameter_count_is_flops_over_peak_at_the_efficiency():
    hw = parse_hardware("1xH100-80GB")
    bare = from_numbers(7e9)
    run = RunSpec(seq_len=2048, micro_batch=4)
    t = step_time(bare, run, Layout(), hw, global_batch=4, efficiency=0.5)
    flops = model_flops_per_token(bare, 2048) * 4 * 2048
    assert t.seconds == pytest.approx(flops / (989.4e12 * 0.5))
    assert t.mfu == pytest.approx(0.5) and t.comm_bytes == 0 and t.time_model == "datasheet"
    full = step_time(bare, RunSpec(seq_len=2048, micro_batch=4, recompute="full"), Layout(), hw, global_batch=4,
                     efficiency=0.5)
    assert full.seconds == pytest.approx(t.seconds * 4 / 3) and full.mfu == pytest.approx(0.5 * 3 / 4)


def _board(memory_gbs):
    """One H100 whose memory bandwidth is ``memory_gbs`` GB/s (None: unknown)."""
    return Hardware(gpu=replace(lookup_gpu("H100-80GB"), memory_gbs=memory_gbs), gpus_per_node=1)


def test_a_shaped_model_adds_memory_bound_work_at_the_datasheet_bandwidth():
    run = RunSpec(seq_len=2048, micro_batch=4)
    compute_only = step_time(MODEL, run, Layout(), _board(None), global_batch=4, efficiency=0.5)
    # without a memory bandwidth: the model's own GEMMs (x3: forward and two backward products) and the
    # attention's QK^T and AV (12·L·h·s per token) at peak x efficiency
    gemms = 3 * sum(2 * m * k * n * count for m, k, n, count in gemm_shapes(MODEL, run))
    attention = 12 * 32 * 4096 * 2048 * (4 * 2048)
    assert compute_only.seconds == pytest.approx((gemms + attention) / (989.4e12 * 0.5))
    full_bw = step_time(MODEL, run, Layout(), _board(3350), global_batch=4, efficiency=0.5)
    half_bw = step_time(MODEL, run, Layout(), _board(1675), global_batch=4, efficiency=0.5)
    memory_bound = full_bw.seconds - compute_only.seconds
    assert memory_bound > 0 and half_bw.seconds - full_bw.seconds == pytest.approx(memory_bound)
    assert full_bw.seconds == step_time(MODEL, run, Layout(), parse_hardware("1xH100-80GB"), global_batch=4,
                                        efficiency=0.5).seconds
    # selective recomputation (the trainer's save list keeps every matmul's and the fused attention's output) runs
    # the blocks' memory-bound forward again: each byte a block saves without recomputation written and read once
    # more, and no FLOPs
    selective = step_time(MODEL, replace(run, recompute="selective"), Layout(), _board(3350), global_batch=4,
                          efficiency=0.5)
    blocks = 32 * block_bytes(MODEL, run)
    assert selective.seconds - full_bw.seconds == pytest.approx(2 * blocks / 3350e9)
    assert selective.model_flops == full_bw.model_flops
    full = step_time(MODEL, replace(run, recompute="full"), Layout(), _board(3350), global_batch=4, efficiency=0.5)
    assert full_bw.seconds < selective.seconds < full.seconds


def test_small_models_are_memory_bound_where_large_ones_are_not():
    """The datasheet no longer promises a 124M model the MFU of a 7B one: at hidden 768 the saved activations'
    traffic is a large share of the step (an H100 measured GPT-2 small at 70 ms, 9.7 % MFU)."""
    hw = parse_hardware("1xH100-80GB")
    gpt2 = from_numbers(124e6, layers=12, hidden=768, heads=12, vocab=50257)
    small = step_time(gpt2, RUN_AUTOCAST_1024x8, Layout(), hw, global_batch=8)
    large = step_time(MODEL, RunSpec(seq_len=2048, micro_batch=4, precision="bf16-autocast"), Layout(), hw,
                      global_batch=4)
    assert 0.4 < large.mfu < 0.5 and small.mfu < 0.8 * large.mfu


def test_the_optimizer_step_comes_after_the_backward_and_not_at_all_when_offloaded():
    hw = parse_hardware("8xH100-80GB")
    run = RunSpec(seq_len=2048, micro_batch=1)
    layout = Layout(dims=ParallelDims(pp=8), microbatches=8)
    pp = step_time(MODEL, run, layout, hw, global_batch=8)
    passes = compute_seconds(MODEL, run, layout, rates_for(hw.gpu))
    assert pp.optimizer > 0 and pp.bubble == pytest.approx(passes * 7 / 8)  # the bubble idles passes, not the step
    z3 = Layout(dims=ParallelDims(dp_shard=8), zero_stage=3)
    on_gpu = step_time(MODEL, run, z3, hw, global_batch=8)
    offloaded = step_time(MODEL, run, replace(z3, offload=True), hw, global_batch=8)
    assert on_gpu.optimizer > 0 and offloaded.optimizer == 0 and offloaded.offload > 0
    # FSDP2's copies in and out of its buffers are the GPU's work; offloaded, the host link's (in ``offload``)
    assert on_gpu.overhead > 0 and offloaded.overhead == 0
    assert on_gpu.seconds == pytest.approx(on_gpu.compute + on_gpu.optimizer + on_gpu.overhead + on_gpu.exposed_dp)


def test_bubble_overlap_and_slow_links_cost_time():
    hw = parse_hardware("8xH100-80GB")
    run = RunSpec(seq_len=2048, micro_batch=1)
    pp = step_time(MODEL, run, Layout(dims=ParallelDims(pp=8), microbatches=8), hw, global_batch=8)
    assert pp.bubble == pytest.approx((pp.compute - pp.bubble) * 7 / 8)
    ddp = step_time(MODEL, run, Layout(dims=ParallelDims(dp_replicate=8)), hw, global_batch=8)
    assert ddp.comm_bytes == pytest.approx(2 * 7 / 8 * 2 * 7e9)
    assert ddp.exposed_dp == pytest.approx(max(0.0, ddp.dp_comm - ddp.compute * 2 / 3))
    slow = step_time(MODEL, run, Layout(dims=ParallelDims(dp_replicate=8)), parse_hardware("8xH100-80GB", intra="pcie"),
                     global_batch=8)
    # one all-reduce per 25 MiB DDP bucket, each priced by NCCL's model on the link at NCCL's figure for it
    buckets = math.ceil(2 * 7e9 / DDP_BUCKET_BYTES)
    for t, link, bus in ((ddp, "nvlink", 450e9 * NCCL_LINK_FRACTION["nvlink"]),
                         (slow, "pcie", 64e9 * NCCL_LINK_FRACTION["pcie"])):
        group = Group(ranks=8, nodes=1, bus_bytes_per_s=bus, link=link)
        assert t.dp_comm == pytest.approx(buckets * collective_seconds("all_reduce", 2 * 7e9 / buckets, group))
    assert slow.seconds > ddp.seconds
    z3 = step_time(MODEL, run, Layout(dims=ParallelDims(dp_shard=8), zero_stage=3), hw, global_batch=8)
    assert z3.comm_bytes == pytest.approx(ddp.comm_bytes * 1.5)  # ZeRO-3: 1.5x the all-reduce volume
    tp = step_time(MODEL, run, Layout(dims=ParallelDims(tp=8), microbatches=8), hw, global_batch=8)
    assert tp.tp_comm > 0 and tp.seconds > ddp.seconds


def test_multi_node_shares_the_nics():
    """A data-parallel ring across nodes gets its share of the node's NICs: an eighth of the network is slower by
    8x on the bytes, the per-collective latency (which grows with the ring) unchanged."""
    run = RunSpec(seq_len=2048, micro_batch=1)
    one = parse_hardware("8xH100-80GB", nodes=2, inter_gbps=3200)
    thin = parse_hardware("8xH100-80GB", nodes=2, inter_gbps=400)
    layout = Layout(dims=ParallelDims(dp_replicate=16))
    fast = step_time(MODEL, run, layout, one, global_batch=16)
    slow = step_time(MODEL, run, layout, thin, global_batch=16)
    buckets = math.ceil(2 * 7e9 / DDP_BUCKET_BYTES)
    for t, gbps in ((fast, 3200), (slow, 400)):
        group = Group(ranks=16, nodes=2, bus_bytes_per_s=gbps / 8 * 1e9 * NCCL_LINK_FRACTION["net"], link="nvlink")
        assert t.dp_comm == pytest.approx(buckets * collective_seconds("all_reduce", 2 * 7e9 / buckets, group))
    assert 4 < slow.dp_comm / fast.dp_comm < 8


def test_zero3_over_many_ranks_pays_for_its_ring_and_its_collective_count():
    """ZeRO-3 of GPT-3 175B over 1,536 A100s at one sequence per GPU (Narayanan et al. 2021, table 2): a ring of 1,536
    ranks costs milliseconds per collective, and DeepSpeed's one collective per parameter tensor costs far more than
    FSDP2's one per block; at 8 ranks the same schedules are close."""
    gpt3 = from_numbers(174.6e9, layers=96, hidden=12288, heads=96, vocab=51200, ffn=4 * 12288)
    run = RunSpec(seq_len=2048, micro_batch=1, precision="bf16", recompute="full")
    big = Hardware(gpu=lookup_gpu("A100-80GB"), gpus_per_node=8, nodes=192, inter_gbps=1600)
    layout = Layout(dims=ParallelDims(dp_shard=1536), zero_stage=3)
    unit = step_time(gpt3, run, layout, big, global_batch=1536)
    parameter = step_time(gpt3, run, layout, big, global_batch=1536, stack="deepspeed-zero3-2021")
    blocks, root = parameter_tensors(gpt3)
    assert len(blocks) == 12 and len(root) == 3  # 4 GEMM weights and biases, 2 LayerNorms; embedding, head, norm
    assert parameter.dp_comm > unit.dp_comm + 3 * 96 * 8 * 1e-3  # >= 1 ms per small tensor's collective
    small = Hardware(gpu=lookup_gpu("A100-80GB"), gpus_per_node=8)
    tiny = Layout(dims=ParallelDims(dp_shard=8), zero_stage=3)
    assert step_time(gpt3, run, tiny, small, global_batch=8, stack="deepspeed-zero3-2021").dp_comm == pytest.approx(
        step_time(gpt3, run, tiny, small, global_batch=8).dp_comm, rel=0.05)
    with pytest.raises(ValueError, match="stack 'megatron' is not one of"):
        step_time(gpt3, run, layout, big, global_batch=1536, stack="megatron")


def test_a_stage_boundary_across_nodes_is_priced_on_the_gpus_nic_and_only_on_the_critical_path():
    """TP 8 x PP 4 on 4 nodes: every stage fills a node, so each of the 3 boundaries crosses the network and a send
    of one micro-batch's activations (of one tp rank) runs on that GPU's 400 Gbit/s NIC (a rail-optimized node's
    eighth of 3,200) at NCCL's fraction of it; the step waits for the sends on the schedule's critical path
    (2(p-1) + 2(m-1)(1 - 1/p) for 1F1B), not all 2m a rank makes. TP 2 x PP 4 in one node sends over NVLink."""
    run = RunSpec(seq_len=4096, micro_batch=1)
    act = 4096 * 4096 * run.recipe.activation_bytes
    network = parse_hardware("8xH100-80GB", nodes=4, inter_gbps=3200)
    layout = Layout(dims=ParallelDims(tp=8, pp=4), microbatches=16)
    t = step_time(MODEL, run, layout, network, global_batch=16)
    send = act / 8 / (50e9 * NCCL_LINK_FRACTION["net"]) + 25e-6  # the network's small-message latency
    assert t.pp_comm == pytest.approx((6 + 2 * 15 * 3 / 4) * send)
    assert t.comm_bytes >= 2 * 16 * act / 8  # every send's bytes are still sent
    thin = step_time(MODEL, run, layout, parse_hardware("8xH100-80GB", nodes=4, inter_gbps=800), global_batch=16)
    assert thin.pp_comm > 3 * t.pp_comm  # a quarter of the NIC: about 4x the bytes' time
    inside = step_time(MODEL, run, Layout(dims=ParallelDims(tp=2, pp=4), microbatches=16),
                       parse_hardware("8xH100-80GB"), global_batch=16)
    nvlink = act / 2 / parse_hardware("8xH100-80GB").intra_bandwidth + 10e-6
    assert inside.pp_comm == pytest.approx((6 + 2 * 15 * 3 / 4) * nvlink)
    # PP 8 of TP 2 on 2 nodes: 4 stages a node, one boundary of the 7 crosses
    half = step_time(MODEL, run, Layout(dims=ParallelDims(tp=2, pp=8), microbatches=16),
                     parse_hardware("8xH100-80GB", nodes=2, inter_gbps=3200), global_batch=16)
    near = act / 2 / parse_hardware("8xH100-80GB").intra_bandwidth + 10e-6
    far = act / 2 / (50e9 * NCCL_LINK_FRACTION["net"]) + 25e-6
    assert half.pp_comm == pytest.approx((14 + 2 * 15 * 7 / 8) * (6 * near + far) / 7)


def test_llama3_405b_slows_from_8k_to_16k_gpus_by_the_bubble_the_paper_measured():
    """The Llama 3 paper (arXiv:2407.21783, table 4 and section 3.3.2): TP 8 x PP 16, 16M tokens of 8192 per step,
    430 TFLOP/s per GPU on 8,192 GPUs (DP 64, 32 micro-batches) and 400 on 16,384 (DP 128, 16), the drop "due to the
    lower batch size per DP group": 0.930 of the rate at twice the bubble. Its stage cut puts one block in each
    chunk, so v = 8; planned with (p-1)/(v m) the per-GPU rate falls to within 3 % of 0.930 of it, where 1F1B's
    bubble would make it 0.78."""
    llama = from_hf_config({"model_type": "llama", "num_hidden_layers": 126, "hidden_size": 16384,
                            "num_attention_heads": 128, "num_key_value_heads": 8, "intermediate_size": 53248,
                            "vocab_size": 128256})
    run = RunSpec(seq_len=8192, micro_batch=1, precision="bf16-fsdp", recompute="none")

    def rate_ratio(v: int) -> float:
        seconds = {}
        for dp in (64, 128):
            hw = parse_hardware("8xH100-80GB", nodes=16 * dp, inter_gbps=3200)
            layout = Layout(dims=ParallelDims(dp_shard=dp, tp=8, pp=16), zero_stage=2, microbatches=2048 // dp,
                            pp_schedule="interleaved_1f1b" if v > 1 else "1f1b", pp_stages_per_rank=v)
            seconds[dp] = step_time(llama, run, layout, hw, global_batch=2048).seconds
        return seconds[64] / 2 / seconds[128]  # per-GPU rate at 16K over that at 8K

    assert rate_ratio(8) == pytest.approx(400 / 430, rel=0.03)
    assert rate_ratio(1) < 0.85
