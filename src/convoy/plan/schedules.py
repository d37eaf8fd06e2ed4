"""Pipeline schedules as the trainer runs them (``torch.distributed.pipelining``): idle time, activations held,
transfers between stages, and which schedules a layout can run.

    from convoy.plan.schedules import pipeline_bubble, in_flight, transfers, schedule_options
    pipeline_bubble(16, 16)                                        # 1F1B: (p-1)/m = 0.9375 of the busy time
    pipeline_bubble(16, 16, schedule="interleaved_1f1b", stages_per_rank=4)   # (p-1)/(v m) = 0.234
    pipeline_bubble(16, 8, schedule="interleaved_1f1b", stages_per_rank=4)    # m < p: (p-1 + (v-1)(p-m))/(v m) = 1.22
    critical_transfers(16, 16, schedule="interleaved_1f1b", stages_per_rank=4)  # 2(v p - 1) = 126 sends in a row
    in_flight(4, 8, schedule="interleaved_1f1b", stages_per_rank=2)           # 1.375 micro-batches of a rank's layers
    schedule_options(pp=4, microbatches=8, layers=32)              # (("1f1b", 1), ("interleaved_1f1b", 2), ...)

The names are ``SCHEDULES``' (``strategy_options["pp_schedule"]``; v is ``pp_stages_per_rank``). The idle fraction
is of the busy time (a rank's forward and backward work), so a step takes busy x (1 + bubble); stages are assumed
to do equal work, which the trainer's even cut of the layer list gives.

The bubble and the transfers on the critical path were checked against an event simulation of torch's own op order
(``ScheduleInterleaved1F1B._calculate_single_rank_operations``: warm-up of (v-1) r + 2(p-1-rank) chunk forwards,
then one forward and one backward, r = m / max(1, m // p) micro-batches per round), each op waiting for its input
from the stage before (``tests/plan/test_schedules.py``): at p = 16, v = 2, 4, 8 and m = 2-48 the simulated idle
time is the formulas' exactly.
"""

from __future__ import annotations

from convoy.errors import PlanError

__all__ = ["SCHEDULES", "INTERLEAVED", "pipeline_bubble", "in_flight", "transfers", "critical_transfers",
           "schedule_options", "check_schedule", "DEFAULT_SCHEDULE"]

#: schedule name -> several stages per rank (the trainer's ``convoy.train.parallel.pipeline.SCHEDULES``):
#: ``gpipe`` every forward, then every backward (Huang et al. 2019); ``1f1b`` one forward, one backward in the steady
#: state (Narayanan et al. 2021, section 2.2.1); ``interleaved_1f1b`` v chunks of L/(v p) layers per rank, chunk i on
#: rank i mod p (the same paper, section 2.2.2); ``looped_bfs`` v chunks per rank, every micro-batch through a rank's
#: first chunk, then its next (Lamy-Poirier 2022, "Breadth-First Pipeline Parallelism")
SCHEDULES = {"gpipe": False, "1f1b": False, "interleaved_1f1b": True, "looped_bfs": True}
INTERLEAVED = tuple(name for name, multi in SCHEDULES.items() if multi)
DEFAULT_SCHEDULE = "1f1b"


def check_schedule(schedule: str, stages_per_rank: int) -> None:
    """``PlanError`` for a schedule the trainer does not run, or stages per rank it does not take."""
    if schedule not in SCHEDULES:
        raise PlanError(f"pipeline schedule {schedule!r} is unknown; choose one of {', '.join(SCHEDULES)}")
    if isinstance(stages_per_rank, bool) or not isinstance(stages_per_rank, int) or stages_per_rank < 1:
        raise PlanError(f"pipeline stages per rank {stages_per_rank!r} must be a whole number >= 1")
    if not SCHEDULES[schedule] and stages_per_rank != 1:
        raise PlanError(f"schedule {schedule!r} runs one stage per rank; {', '.join(INTERLEAVED)} run "
                        f"{stages_per_rank}")


def pipeline_bubble(pp: int, microbatches: int, *, schedule: str = DEFAULT_SCHEDULE, stages_per_rank: int = 1
                    ) -> float:
    """Idle time over busy time of one rank: (p-1)/m, or (p-1)/(v m) for the schedules with v stages per rank
    (Narayanan et al. 2021, section 2.2.2; the Llama 3 paper, section 3.3.2, states the same for its schedule, whose
    micro-batch count need not be a multiple of p, as torch's need not). With fewer micro-batches than stages a
    rank's next chunk waits for the first micro-batch to come round the p ranks, p - m chunk slots, at each of
    the v - 1 chunk changes of the forward and of the backward: (p-1 + (v-1)(p-m)) / (v m)."""
    check_schedule(schedule, stages_per_rank)
    if pp <= 1:
        return 0.0
    m, v = max(1, microbatches), stages_per_rank
    return (pp - 1 + (v - 1) * max(0, pp - m)) / (v * m)


def in_flight(pp: int, microbatches: int, *, schedule: str = DEFAULT_SCHEDULE, stages_per_rank: int = 1) -> float:
    """Micro-batches of activations the first rank holds at its peak, in units of one micro-batch through all of
    its layers: 1F1B min(p, m); GPipe and looped BFS all m; interleaved 1F1B runs torch's warm-up of (v-1) r + 2(p-1)
    chunk forwards before its first backward (``_get_warmup_ops``, r = m / max(1, m // p) micro-batches per round),
    so it holds min((v-1) r + 2(p-1) + 1, v m) chunks, divided by v (with m = p: p + (p-1)/v, Korthikanti et al.
    2022's factor 1 + (p-1)/(v p) over 1F1B)."""
    check_schedule(schedule, stages_per_rank)
    m, v = max(1, microbatches), stages_per_rank
    if pp <= 1:
        return 1.0
    if schedule == "1f1b":
        return float(min(pp, m))
    if schedule in ("gpipe", "looped_bfs"):
        return float(m)
    per_round = m // max(1, m // pp)
    return min((v - 1) * per_round + 2 * (pp - 1) + 1, v * m) / v


def transfers(pp: int, microbatches: int, *, stages_per_rank: int = 1) -> int:
    """Activation sends plus gradient sends of the busiest rank per pipeline call: 2 v m (a rank at an end of
    a plain pipeline sends one way only; the planner charges the middle ranks')."""
    return 0 if pp <= 1 else 2 * stages_per_rank * max(1, microbatches)


def critical_transfers(pp: int, microbatches: int, *, schedule: str = DEFAULT_SCHEDULE, stages_per_rank: int = 1
                       ) -> float:
    """Stage-to-stage sends on a step's critical path, each a wait beside the compute (sends are asynchronous; the
    rest overlap a rank's other work): the first micro-batch's activations through the p - 1 boundaries and the
    last one's gradients back, 2(p-1). 1F1B has no slack in its steady state, where each backward waits for the
    gradient of the forward just sent: 2(m-1)(1 - 1/p) more. Interleaved 1F1B, with one micro-batch per rank per
    round (r = p, or m < p), waits for the round trip through all v p chunks: 2(v p - 1); with more (r > p) its
    extra warm-up hides all but 2(p-1). Looped BFS passes every chunk boundary once each way: 2(v p - 1)."""
    check_schedule(schedule, stages_per_rank)
    if pp <= 1:
        return 0.0
    m, v = max(1, microbatches), stages_per_rank
    if schedule in ("1f1b",):
        return 2 * (pp - 1) + 2 * (m - 1) * (1 - 1 / pp)
    if schedule == "gpipe":
        return 2.0 * (pp - 1)
    if schedule == "interleaved_1f1b" and m // max(1, m // pp) > pp:
        return 2.0 * (pp - 1)
    return 2.0 * (v * pp - 1)


def schedule_options(*, pp: int, microbatches: int, layers: int | None) -> tuple[tuple[str, int], ...]:
    """(schedule, stages per rank) pairs a pp-stage pipeline of ``layers`` blocks can run with ``microbatches``:
    1F1B always; interleaved 1F1B with v = 2, 4, 8 ... while p v <= layers and torch's rounds divide the
    micro-batches (m % max(1, m // p) == 0). GPipe and looped BFS hold every micro-batch at once and idle no
    less than 1F1B and interleaved 1F1B: the planner never chooses them (they are planned when asked for)."""
    if pp <= 1:
        return ((DEFAULT_SCHEDULE, 1),)
    options = [(DEFAULT_SCHEDULE, 1)]
    m = max(1, microbatches)
    if m % max(1, m // pp):
        return tuple(options)
    v = 2
    while layers is not None and pp * v <= layers and v <= 8:
        options.append(("interleaved_1f1b", v))
        v *= 2
    return tuple(options)
