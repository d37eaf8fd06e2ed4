"""Pipeline schedules as the trainer runs them: idle time, activations held, transfers, and the planner's choice."""

from __future__ import annotations

import pytest

from convoy.errors import PlanError
from convoy.plan.dims import ParallelDims
from convoy.plan.memory import Layout, memory_per_gpu
from convoy.plan.model import from_numbers
from convoy.plan.run import RunSpec
from convoy.plan.schedules import critical_transfers, in_flight, pipeline_bubble, schedule_options, transfers


def test_the_bubble_of_16_stages_and_16_micro_batches_shrinks_with_stages_per_rank():
    assert pipeline_bubble(16, 16) == 15 / 16
    assert pipeline_bubble(16, 16, schedule="gpipe") == 15 / 16
    assert pipeline_bubble(16, 16, schedule="interleaved_1f1b", stages_per_rank=4) == 15 / 64
    assert pipeline_bubble(16, 16, schedule="looped_bfs", stages_per_rank=2) == 15 / 32
    assert pipeline_bubble(1, 8) == 0


def test_activations_held_follow_each_schedule():
    assert in_flight(4, 8) == 4 and in_flight(4, 2) == 2  # 1F1B: min(p, m)
    assert in_flight(4, 8, schedule="gpipe") == 8 and in_flight(4, 8, schedule="looped_bfs", stages_per_rank=2) == 8
    # torch's interleaved warm-up on rank 0: (v-1) p + 2 (p-1) chunk forwards, then one more: 4 + 6 + 1 = 11 chunks
    # of half the rank's layers = 5.5 micro-batches of all of them: p (1 + (p-1)/(v p)), Korthikanti et al.'s factor
    assert in_flight(4, 8, schedule="interleaved_1f1b", stages_per_rank=2) == 5.5 == 4 * (1 + 3 / 8)
    assert in_flight(4, 16, schedule="interleaved_1f1b", stages_per_rank=2) == 5.5
    assert in_flight(4, 4, schedule="interleaved_1f1b", stages_per_rank=2) == 4  # capped at all v m chunks
    assert in_flight(4, 1, schedule="interleaved_1f1b", stages_per_rank=2) == 1


def test_interleaving_sends_v_times_as_often():
    assert transfers(4, 8) == 16 and transfers(4, 8, stages_per_rank=4) == 64 and transfers(1, 8) == 0


def test_the_schedules_a_layout_can_run():
    assert schedule_options(pp=4, microbatches=8, layers=32) == (("1f1b", 1), ("interleaved_1f1b", 2),
                                                                  ("interleaved_1f1b", 4), ("interleaved_1f1b", 8))
    assert schedule_options(pp=4, microbatches=8, layers=8) == (("1f1b", 1), ("interleaved_1f1b", 2))
    assert schedule_options(pp=4, microbatches=9, layers=32) == (("1f1b", 1),)  # torch: 9 % (9 // 4) != 0
    assert schedule_options(pp=1, microbatches=8, layers=32) == (("1f1b", 1),)


@pytest.mark.parametrize("schedule, v", [("nope", 1), ("1f1b", 2), ("interleaved_1f1b", 0)])
def test_a_schedule_the_trainer_does_not_run_is_refused(schedule, v):
    with pytest.raises(PlanError):
        Layout(dims=ParallelDims(pp=2), pp_schedule=schedule, pp_stages_per_rank=v)


def test_the_first_stage_holds_the_activations_of_its_schedule():
    model = from_numbers(1.3e9, layers=24, hidden=2048, heads=16, vocab=50304)
    run = RunSpec(seq_len=2048, micro_batch=1, precision="bf16-autocast")
    dims = ParallelDims(pp=4)
    plain = memory_per_gpu(model, run, Layout(dims=dims, microbatches=8))
    chunks = memory_per_gpu(model, run, Layout(dims=dims, microbatches=8, pp_schedule="interleaved_1f1b",
                                               pp_stages_per_rank=2))
    gpipe = memory_per_gpu(model, run, Layout(dims=dims, microbatches=8, pp_schedule="gpipe"))
    assert plain.params == chunks.params == gpipe.params
    # 1F1B holds 4 micro-batches of the rank's 6 blocks, interleaving 5.5, GPipe all 8 (casts and head aside)
    from convoy.plan.memory import layer_activation_bytes

    per_mb = 6 * layer_activation_bytes(model, run)
    assert chunks.activations - plain.activations == pytest.approx(1.5 * per_mb, abs=8)
    assert gpipe.activations - plain.activations == pytest.approx(4 * per_mb, abs=8)


def test_the_planner_runs_a_deep_pipeline_interleaved_when_that_fits_and_is_faster():
    from pathlib import Path

    from convoy.plan.api import plan
    from convoy.plan.timing import choose_schedule, step_time

    config = Path(__file__).parent / "configs" / "llama2_70b.json"
    p = plan(str(config), hardware="8xH100-80GB", nodes=4, recompute="full")
    row = p.row("zero2+pp8")
    assert row.candidate.layout.pp_schedule == "interleaved_1f1b" and row.candidate.layout.pp_stages_per_rank > 1
    assert row.launch_args[-4:] == ("--pp-schedule", "interleaved_1f1b", "--pp-stages-per-rank",
                                    str(row.candidate.layout.pp_stages_per_rank))
    assert row.fits and row.time.bubble < 0.25 * (row.time.compute - row.time.bubble)
    plain = Layout(dims=row.candidate.layout.dims, zero_stage=2, microbatches=row.candidate.layout.microbatches)
    assert step_time(p.model, p.run, plain, p.hardware, global_batch=p.global_batch).seconds > row.time.seconds
    flat = p.row("zero3").candidate.layout
    assert choose_schedule(p.model, p.run, flat, p.hardware, global_batch=p.global_batch) is flat


def test_fsdp2_per_pipeline_stage_keeps_whole_gradients_and_shards_the_rest():
    model = from_numbers(1.3e9, layers=24, hidden=2048, heads=16, vocab=50304)
    run = RunSpec(seq_len=2048, micro_batch=1, precision="fp32")
    zero1 = memory_per_gpu(model, run, Layout(dims=ParallelDims(dp_replicate=2, pp=2), zero_stage=1, microbatches=4))
    fsdp = memory_per_gpu(model, run, Layout(dims=ParallelDims(dp_shard=2, pp=2), zero_stage=2, microbatches=4))
    assert fsdp.grads == zero1.grads and fsdp.optimizer == zero1.optimizer  # whole gradients until the last micro-batch
    assert fsdp.params == pytest.approx(1.5 * zero1.params, rel=1e-6)  # gathered weights beside the fp32 shard
    assert fsdp.buffers < zero1.buffers  # no DDP buckets


def _rank_ops(p: int, v: int, m: int, rank: int) -> list[tuple[str, int, int]]:
    """torch's interleaved 1F1B op order of one rank (``ScheduleInterleaved1F1B``: r = m / max(1, m // p)
    micro-batches per round; warm-up (v-1) r + 2(p-1-rank) chunk forwards, then one forward and one backward), or
    1F1B's (v = 1: warm-up p-1-rank): ("F" | "B", chunk, micro-batch)."""
    r = m // max(1, m // p)

    def forward(k: int) -> tuple[int, int]:
        return (k // r) % v, (k // (r * v)) * r + k % r

    total = m * v
    warm = min((v - 1) * r + 2 * (p - 1 - rank), total) if v > 1 else min(p - 1 - rank, m)
    order = [forward(k) for k in range(total)]
    backward = [(v - 1 - c, j) for c, j in order]
    ops = [("F", *order[k]) for k in range(warm)]
    for k in range(total - warm):
        ops += [("F", *order[warm + k]), ("B", *backward[k])]
    return ops + [("B", *backward[k]) for k in range(total - warm, total)]


def _simulate(p: int, v: int, m: int, *, send: float = 0.0) -> float:
    """Seconds of one step when each rank runs its ops in order, a chunk's forward takes 1 and its backward 2, and
    each op waits for its input from the neighbouring stage (``send`` seconds after that stage finished it)."""
    ops = [_rank_ops(p, v, m, k) for k in range(p)]
    done: dict[tuple[str, int, int], float] = {}
    at, clock, last = [0] * p, [0.0] * p, p * v - 1
    moved = True
    while moved:
        moved = False
        for k in range(p):
            while at[k] < len(ops[k]):
                kind, chunk, mb = ops[k][at[k]]
                stage = chunk * p + k
                source = ("F", stage - 1, mb) if kind == "F" else ("B", stage + 1, mb)
                edge = (kind == "F" and stage > 0) or (kind == "B" and stage < last)
                ready = done.get(source) if edge else (0.0 if kind == "F" else done.get(("F", stage, mb)))
                if ready is None:
                    break
                clock[k] = max(clock[k], ready + (send if edge else 0.0)) + (1.0 if kind == "F" else 2.0)
                done[(kind, stage, mb)] = clock[k]
                at[k] += 1
                moved = True
    assert at == [len(o) for o in ops], "the op order deadlocked"
    return max(clock)


@pytest.mark.parametrize("v", [2, 4, 8])
@pytest.mark.parametrize("m", [4, 8, 12, 16, 20, 24, 32, 48])
def test_the_interleaved_bubble_at_16_stages_is_what_torchs_op_order_idles(v, m):
    """At p = 16 (Llama 3 405B's pipeline depth) the idle time of torch's interleaved 1F1B, simulated from its own
    op order, is (p-1)/(v m) for m >= p, multiple of p or not (the Llama 3 paper's flexible micro-batch count), and
    (p-1 + (v-1)(p-m))/(v m) below it (Megatron's formula would say 0.47 at v = 4, m = 8; the schedule idles 1.22)."""
    if m % max(1, m // 16):
        pytest.skip("torch runs interleaved 1F1B only when the rounds divide the micro-batches")
    busy = v * m * 3.0
    simulated = _simulate(16, v, m) / busy - 1
    assert pipeline_bubble(16, m, schedule="interleaved_1f1b", stages_per_rank=v) == pytest.approx(simulated)
    if m >= 16:
        assert simulated == pytest.approx(15 / (v * m))


@pytest.mark.parametrize("p, v, m", [(16, 1, 8), (16, 1, 16), (16, 1, 32), (4, 1, 16), (16, 2, 16), (16, 4, 16),
                                     (16, 4, 32), (16, 4, 8), (16, 2, 20), (8, 2, 12), (8, 2, 16)])
def test_the_sends_a_step_waits_for_are_those_on_the_schedules_critical_path(p, v, m):
    """Each stage-to-stage send of ``send`` seconds lengthens the simulated step by ``critical_transfers`` x send
    (within 10 %, or 2 sends: 1F1B's steady state is priced by a straight line), not by all 2 v m sends a rank
    makes: interleaved 1F1B at p = 16, v = 4, m = 32 waits for 126 of its 256."""
    schedule = "interleaved_1f1b" if v > 1 else "1f1b"
    send = 0.05
    waited = (_simulate(p, v, m, send=send) - _simulate(p, v, m)) / send
    planned = critical_transfers(p, m, schedule=schedule, stages_per_rank=v)
    assert planned == pytest.approx(waited, rel=0.10, abs=2)
    if (p, v, m) == (16, 4, 32):
        assert (planned, transfers(p, m, stages_per_rank=v)) == (126, 256)
