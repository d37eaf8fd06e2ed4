"""The commands that run a planned layout: ``convoy launch`` arguments and the equivalent ``Accelerator(...)``.

    from convoy.plan.commands import launch_args, launch_command, accelerator_call
    launch_args(candidate, hw, recompute="none")
    # ('--nnodes', '2', '--nproc-per-node', '8', '--strategy', 'ddp', '--dp', '4', '--tp', '2', '--pp', '2',
    #  '--pp-schedule', '1f1b')
    launch_command(candidate, hw)      # 'convoy launch --nnodes 2 ... --rdzv-endpoint HOST:29500 train.py'
    accelerator_call(candidate)        # 'Accelerator(strategy="ddp", parallelism={"dp": 4, "tp": 2, "pp": 2}, ...)'

One vocabulary from plan to run: the strategy is the candidate's (``Accelerator(strategy=...)`` and
``convoy launch --strategy`` take the same names), the degrees are ``--dp`` (or HSDP's ``--dp-replicate`` and
``--dp-shard``), ``--tp`` and ``--pp``, offload is ``--cpu-offload`` (``strategy_options={"cpu_offload": True}``),
activation recomputation ``--recompute`` (``Accelerator(recompute=...)``), and a pipeline runs the schedule the
planner costs (``--pp-schedule``). Each flag is the launcher's own spelling; ``tests/plan/test_plan_runs.py``
launches them. Torch-free.
"""

from __future__ import annotations

from convoy.plan.candidates import Candidate
from convoy.plan.hardware import Hardware

__all__ = ["launch_args", "launch_command", "accelerator_call", "planned_schedule"]

#: the placeholder the printed command puts where the first node's address goes (several nodes)
FIRST_NODE = "HOST:29500"


def planned_schedule(candidate: Candidate) -> tuple[str, int] | None:
    """The pipeline schedule the planner costs for ``candidate`` and the stages each process holds (None without a
    pipeline): the layout's (``convoy.plan.timing.choose_schedule``), which the trainer runs as asked."""
    layout = candidate.layout
    return (layout.pp_schedule, layout.pp_stages_per_rank) if layout.dims.pp_enabled else None


def _degrees(candidate: Candidate) -> list[tuple[str, int]]:
    """The degrees as the launcher's flags name them (without the dp of a layout that has none)."""
    d = candidate.layout.dims
    if d.hsdp_enabled:
        out = [("dp-replicate", d.dp_replicate), ("dp-shard", d.dp_shard)]
    elif d.dp_enabled and not d.is_trivial:
        out = [("dp", d.dp)]
    else:
        out = []
    return out + [(axis, getattr(d, axis)) for axis in ("cp", "tp", "pp") if getattr(d, axis) > 1]


def launch_args(candidate: Candidate, hw: Hardware, *, recompute: str = "none") -> tuple[str, ...]:
    """The ``convoy launch`` arguments (before the script) that run ``candidate`` on ``hw``: the machines and
    processes, the strategy, the degrees, offload, recomputation and the pipeline schedule."""
    args = ["--nnodes", str(hw.nodes), "--nproc-per-node", str(hw.gpus_per_node), "--strategy", candidate.strategy]
    for flag, value in _degrees(candidate):
        args += [f"--{flag}", str(value)]
    if candidate.layout.offload:
        args.append("--cpu-offload")
    if recompute != "none":
        args += ["--recompute", recompute]
    schedule = planned_schedule(candidate)
    if schedule is not None:
        args += ["--pp-schedule", schedule[0]]
        if schedule[1] > 1:
            args += ["--pp-stages-per-rank", str(schedule[1])]
    return tuple(args)


def launch_command(candidate: Candidate, hw: Hardware, *, recompute: str = "none", script: str = "train.py") -> str:
    """``launch_args`` as one command line to copy: on several nodes, run on each with the first node's address
    (``HOST:29500``)."""
    meet = ["--rdzv-endpoint", FIRST_NODE] if hw.nodes > 1 else []
    return " ".join(["convoy", "launch", *launch_args(candidate, hw, recompute=recompute), *meet, script])


def accelerator_call(candidate: Candidate, *, recompute: str = "none") -> str:
    """The ``Accelerator(...)`` call that builds the same layout in a script started with as many processes."""
    parts = [f'strategy="{candidate.strategy}"']
    degrees = _degrees(candidate)
    if degrees:
        inner = ", ".join(f'"{flag.replace("-", "_")}": {value}' for flag, value in degrees)
        parts.append(f"parallelism={{{inner}}}")
    if recompute != "none":
        parts.append(f'recompute="{recompute}"')
    options = []
    if candidate.layout.offload:
        options.append('"cpu_offload": True')
    schedule = planned_schedule(candidate)
    if schedule is not None:
        options += ['"loss_fn": loss_fn', f'"pp_schedule": "{schedule[0]}"']
        if schedule[1] > 1:
            options.append(f'"pp_stages_per_rank": {schedule[1]}')
    if options:
        parts.append("strategy_options={" + ", ".join(options) + "}")
    return f"Accelerator({', '.join(parts)})"
