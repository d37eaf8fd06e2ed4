"""The planner's context-parallel layouts: activations per GPU divided by cp, the weights sharded over dp x cp, torch's
ring (its K/V all-gathers and fp32 gradient rotations beside the step kernels, its fp32 merges), cp candidates only
for a loop that splits sequences, and the launch line carrying --cp."""

from __future__ import annotations

from dataclasses import replace

from convoy.plan.api import plan_for
from convoy.plan.candidates import TrainerFacts, enumerate_candidates
from convoy.plan.dims import ParallelDims
from convoy.plan.hardware import parse_hardware
from convoy.plan.memory import Layout, memory_per_gpu
from convoy.plan.model import from_numbers
from convoy.plan.ring import ring_kernels, ring_traffic_bytes
from convoy.plan.run import RunSpec
from convoy.plan.timing import context_parallel_seconds, step_time

MODEL = from_numbers(8e9, layers=32, hidden=4096, heads=32, kv_heads=8, vocab=128256)
HW = parse_hardware("8xH100-80GB")


def _layout(**degrees: int) -> Layout:
    return Layout(dims=ParallelDims(**degrees), zero_stage=3)


def test_cp_divides_the_activations_and_shards_the_weights_over_dp_x_cp():
    run = RunSpec(seq_len=65536)
    plain = memory_per_gpu(MODEL, run, _layout(dp_shard=8))
    split = memory_per_gpu(MODEL, run, _layout(dp_shard=4, cp=2))
    assert split.activations < 0.51 * plain.activations  # half the tokens' activations
    assert split.temporary < 0.51 * plain.temporary  # the logits of this rank's tokens only
    # FSDP2 over dp_shard x cp: the same 8-way shards of weights, gradients and optimizer state
    assert (split.params, split.grads, split.optimizer) == (plain.params, plain.grads, plain.optimizer)


def test_the_ring_hides_behind_long_blocks_all_but_the_backwards_last_gradient_transfer():
    """torch's backward sends dk, dv (fp32) on after every step; the last one is awaited after the loop, with no
    kernel beside it: on NVLink with long blocks that transfer is all that is exposed, the same per layer at any cp
    with the same tokens per GPU, and small beside the step."""
    layers = MODEL.num_layers
    per_layer = []
    for cp in (2, 4):
        run = RunSpec(seq_len=32768 * cp, recompute="full")
        seconds, sent = context_parallel_seconds(MODEL, run, _layout(dp_shard=8 // cp, cp=cp), HW, _rates())
        step = step_time(MODEL, run, _layout(dp_shard=8 // cp, cp=cp), HW, global_batch=8 // cp)
        assert sent > 0 and 0 < seconds < 0.02 * step.seconds, (seconds, step.seconds)
        per_layer.append(seconds / layers)
    assert abs(per_layer[0] / per_layer[1] - 1) < 0.01, per_layer


def test_the_ring_is_exposed_when_the_group_crosses_a_slow_network():
    run = RunSpec(seq_len=8192 * 16)
    fast = parse_hardware("8xH100-80GB", nodes=2)
    slow = parse_hardware("8xH100-80GB", nodes=2, inter_gbps=1.0)
    layout = _layout(dp_shard=1, cp=16)
    on_fast, sent = context_parallel_seconds(MODEL, run, layout, fast, _rates())
    on_slow, same = context_parallel_seconds(MODEL, run, layout, slow, _rates())
    assert sent == same and on_slow > 50 * on_fast, (on_slow, on_fast)


def test_short_blocks_expose_more_of_the_rings_traffic_on_nvlink():
    """Per byte sent, a ring of 2k-token blocks leaves several times more exposed than one of 32k-token blocks: the
    kernels beside the transfers shrink as the square of the block, the transfers only as the block."""
    def exposed_per_byte(local: int) -> float:
        seconds, sent = context_parallel_seconds(MODEL, RunSpec(seq_len=local * 8), _layout(cp=8), HW, _rates())
        return seconds / sent

    assert exposed_per_byte(2048) > 3 * exposed_per_byte(32768)


def test_the_ring_sends_k_and_v_for_every_query_head():
    """torchtitan's repeat_kv and convoy's enable_gqa repeat K/V before the ring: a GQA model sends what the same
    model with as many K/V heads as query heads sends."""
    gqa = from_numbers(8e9, layers=32, hidden=4096, heads=32, kv_heads=8, vocab=128256)
    mha = from_numbers(8e9, layers=32, hidden=4096, heads=32, kv_heads=32, vocab=128256)
    run, layout = RunSpec(seq_len=65536), _layout(dp_shard=4, cp=2)
    assert context_parallel_seconds(gqa, run, layout, HW, _rates())[1] == \
        context_parallel_seconds(mha, run, layout, HW, _rates())[1]


def test_cp_costs_more_per_token_at_larger_cp_for_the_same_tokens_per_gpu():
    """torchtitan's table 2 shape: cp doubles with the sequence, 32k tokens per GPU. The attention per GPU grows as
    cp (its s^2 / cp), and the ring adds its merges and transfers on top: each step slower than the one before."""
    steps = []
    for cp in (1, 2, 4, 8):
        run = RunSpec(seq_len=32768 * cp, recompute="full")
        layout = _layout(dp_shard=8 // cp, cp=cp)
        steps.append(step_time(MODEL, run, layout, HW, global_batch=8 // cp).seconds)
    assert steps == sorted(steps) and steps[3] > 2 * steps[1], steps


def test_the_rings_fp32_merges_weigh_more_beside_short_blocks():
    """The merge traffic grows as the tokens per rank, the attention kernels as their square: with short blocks the
    merges are a large part of the ring's time, with long ones a small part."""
    rates = _rates()

    def merge_share(local: int) -> float:
        cp = 8
        first, later = ring_kernels(rates, batch=1, heads=32, seq=local * cp, head_dim=128, cp=cp, dtype="bf16")
        forward, backward = ring_traffic_bytes(batch=1, heads=32, seq=local * cp, head_dim=128, cp=cp)
        merges = (forward + backward) / rates.memory_bytes_per_s
        return merges / (first + (cp - 1) * later + merges)

    assert merge_share(2048) > 3 * merge_share(32768)
    assert merge_share(32768) < 0.15


def test_same_tokens_same_flops_cp_costs_about_what_data_parallel_costs_at_a_sequence_both_fit():
    run = RunSpec(seq_len=8192)
    dp8 = step_time(MODEL, run, _layout(dp_shard=8), HW, global_batch=8)
    cp2 = step_time(MODEL, run, replace(_layout(dp_shard=4, cp=2), microbatches=2), HW, global_batch=8)
    assert 0.9 < cp2.seconds / dp8.seconds < 1.2, (cp2.seconds, dp8.seconds)


def test_cp_candidates_come_only_for_a_loop_that_splits_sequences():
    names = {c.name for c in enumerate_candidates(MODEL, HW, global_batch=8, micro_batch=1)}
    assert not any("cp" in n for n in names)
    facts = TrainerFacts(context_parallel=True)
    names = {c.name for c in enumerate_candidates(MODEL, HW, global_batch=8, micro_batch=1, facts=facts)}
    assert {"zero3+cp2", "zero3+cp8", "zero3+cp2+tp2"} <= names


def test_plan_recommends_cp_for_a_sequence_nothing_else_fits_and_the_line_carries_cp():
    run = RunSpec(seq_len=131072)
    plan = plan_for(MODEL, run, HW, global_batch=8, allowed=("zero3", "tp", "cp"))
    rec = plan.recommendation
    assert "cp" in rec.row.name, rec.row.name  # type: ignore[union-attr]
    assert "--cp" in rec.row.launch_args, rec.row.launch_args  # type: ignore[union-attr]
    assert plan_for(MODEL, run, HW, global_batch=8, allowed=("zero3", "tp")).recommendation.row.name.count("cp") == 0


def _rates():
    from convoy.plan.speed.rates import rates_for

    return rates_for(HW.gpu)


def test_the_printed_cp_line_is_accepted_by_the_launcher(monkeypatch, capsys, tmp_path):
    from pathlib import Path

    from convoy.cli.main import main

    inventory = Path(__file__).parents[1] / "inventories" / "8xh100_nvswitch.json"
    monkeypatch.setenv("CONVOY_INVENTORY", str(inventory))
    monkeypatch.delenv("CONVOY_PARALLELISM", raising=False)
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    rec = plan_for(MODEL, RunSpec(seq_len=131072), HW, global_batch=8, allowed=("zero3", "tp", "cp")).recommendation
    code = main(["launch", *rec.row.launch_args, "--dry-run", str(script)])  # type: ignore[union-attr]
    out, err = capsys.readouterr()
    degrees = dict(rec.row.candidate.layout.dims.mesh_shape())  # type: ignore[union-attr]
    assert code == 0 and f"cp={degrees['cp']}" in out, (out, err)


def test_a_sequence_that_fits_only_with_knobs_says_what_context_parallelism_would_choose():
    """The issue's case: 8B on 8 H100s at 131,072 tokens fits only with full recompute; the plan (cp layouts off
    by default, the loop must ask for them) says that cp would be chosen and how to plan it."""
    from convoy.plan.api import plan

    p = plan(params=8e9, hardware="8xH100-80GB", seq_len=131072)
    assert p.recommendation.knob and not p.recommendation.row.candidate.layout.dims.cp_enabled
    said = [b for b in p.recommendation.breaks if "context parallelism" in b]
    assert len(said) == 1 and "cp=" in said[0] and "--strategies ...,cp" in said[0], p.recommendation.breaks
    short = plan(params=8e9, hardware="8xH100-80GB", seq_len=4096)
    assert not any("context parallelism" in b for b in short.recommendation.breaks)
