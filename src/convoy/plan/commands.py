"""The commands that run a planned layout: ``convoy launch`` arguments and the equivalent ``Accelerator(...)``.

    from convoy.plan.commands import launch_args, launch_command, accelerator_call
    launch_args(candidate, hw, precision="bf16", recompute="none")
    # ('--nnodes', '2', '--nproc-per-node', '8', '--strategy', 'ddp', '--dp', '4', '--tp', '2', '--pp', '2',
    #  '--pp-microbatches', '16', '--mixed-precision', 'bf16', '--pp-schedule', '1f1b')
    launch_command(candidate, hw, precision="bf16")  # 'convoy launch --nnodes 2 ... --rdzv-backend c10d
                                                     #  --rdzv-endpoint HOST:29500 train.py'
    accelerator_call(candidate, precision="bf16")    # 'Accelerator(strategy="ddp", mixed_precision="bf16", ...)'

One vocabulary from plan to run: the strategy is the candidate's (``Accelerator(strategy=...)`` and
``convoy launch --strategy`` take the same names), the degrees are ``--dp`` (or HSDP's ``--dp-replicate`` and
``--dp-shard``), ``--tp`` and ``--pp``, the precision the plan costed ``--mixed-precision`` (``mixed_precision_for``),
the micro-batches of a step ``--gradient-accumulation-steps`` (or, in a pipeline, ``--pp-microbatches``: the
schedule runs them in one call), offload ``--cpu-offload`` (``strategy_options={"cpu_offload": True}``),
activation recomputation ``--recompute`` (``Accelerator(recompute=...)``), a pipeline runs the schedule the
planner costs (``--pp-schedule``), and compile and float8 are ``--compile`` (``compile=``) and
``--mixed-precision fp8 --fp8-recipe`` (``mixed_precision="fp8", fp8_recipe=``). On several nodes the same line
runs on each: c10d's rendezvous at the first node gives every node its rank. Each flag is the launcher's own
spelling; ``tests/plan/test_plan_runs.py`` launches them. Torch-free.
"""

from __future__ import annotations

from convoy.plan.candidates import Candidate
from convoy.plan.hardware import Hardware
from convoy.plan.run import PRECISIONS

__all__ = ["launch_args", "launch_command", "accelerator_call", "planned_schedule", "mixed_precision_for",
           "accumulation_steps", "with_speedups"]

#: the placeholder the printed command puts where the first node's address goes (several nodes)
FIRST_NODE = "HOST:29500"


def planned_schedule(candidate: Candidate) -> tuple[str, int] | None:
    """The pipeline schedule the planner costs for ``candidate`` and the stages each process holds (None without a
    pipeline): the layout's (``convoy.plan.timing.choose_schedule``), which the trainer runs as asked."""
    layout = candidate.layout
    return (layout.pp_schedule, layout.pp_stages_per_rank) if layout.dims.pp_enabled else None


#: the trainer's ``mixed_precision`` for a precision recipe's matmul dtype (``Precision.compute``)
_MIXED_PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}


def mixed_precision_for(precision: str, fp8: str = "none") -> str:
    """The ``mixed_precision`` (``--mixed-precision``) that runs a plan costed in ``precision`` (a
    ``convoy.plan.run.PRECISIONS`` name): ``"bf16"`` for every bf16 recipe, ``"fp16"``, ``"no"`` for fp32;
    ``"fp8"`` with a float8 recipe (``fp8``, the bf16 recipe's float8 linears)."""
    return "fp8" if fp8 != "none" else _MIXED_PRECISION[PRECISIONS[precision].compute]


def accumulation_steps(candidate: Candidate) -> int:
    """Micro-batches each data-parallel rank runs per optimizer step, as the plan costed them (the global batch
    over dp x micro-batch): gradient accumulation steps, or with a pipeline the micro-batches its schedule cuts one
    batch into (``pp_microbatches``)."""
    return candidate.layout.microbatches


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


def launch_args(candidate: Candidate, hw: Hardware, *, precision: str, recompute: str = "none",
                compile: str = "none", fp8: str = "none") -> tuple[str, ...]:
    """The ``convoy launch`` arguments (before the script) that run ``candidate`` on ``hw`` as planned in
    ``precision``: the machines and processes, the strategy, the degrees, the micro-batches of a step, the
    precision, offload, recomputation, the pipeline schedule, and compile and float8 (``--compile blocks``,
    ``--mixed-precision fp8 --fp8-recipe tensorwise``)."""
    args = ["--nnodes", str(hw.nodes), "--nproc-per-node", str(hw.gpus_per_node), "--strategy", candidate.strategy]
    for flag, value in _degrees(candidate):
        args += [f"--{flag}", str(value)]
    steps = accumulation_steps(candidate)
    if candidate.layout.dims.pp_enabled:
        args += ["--pp-microbatches", str(steps)]
    elif steps > 1:
        args += ["--gradient-accumulation-steps", str(steps)]
    args += ["--mixed-precision", mixed_precision_for(precision, fp8), *_recipe_args(fp8)]
    if candidate.layout.offload:
        args.append("--cpu-offload")
    if recompute != "none":
        args += ["--recompute", recompute]
    schedule = planned_schedule(candidate)
    if schedule is not None:
        args += ["--pp-schedule", schedule[0]]
        if schedule[1] > 1:
            args += ["--pp-stages-per-rank", str(schedule[1])]
    return tuple(args) + _speedup_args(compile)


def _speedup_args(compile: str) -> tuple[str, ...]:
    """``--compile`` for what the plan chose (none for eager)."""
    return ("--compile", compile) if compile != "none" else ()


def _recipe_args(fp8: str) -> tuple[str, ...]:
    """``--fp8-recipe`` after ``--mixed-precision fp8`` (none without float8)."""
    return ("--fp8-recipe", fp8) if fp8 != "none" else ()


def with_speedups(args: tuple[str, ...], *, compile: str, fp8: str) -> tuple[str, ...]:
    """``launch_args`` ``args`` with their compile and float8 choice replaced by ``compile`` and ``fp8``'s: the
    ``--mixed-precision`` value becomes ``fp8`` with a recipe, and bf16 (the float8 recipe's own) without one."""
    out: list[str] = []
    items = iter(args)
    for arg in items:
        if arg in ("--compile", "--fp8-recipe"):
            next(items, None)
            continue
        out.append(arg)
        if arg == "--mixed-precision":
            value = next(items, "bf16")
            out += ["fp8" if fp8 != "none" else "bf16" if value == "fp8" else value, *_recipe_args(fp8)]
    return tuple(out) + _speedup_args(compile)


def launch_command(candidate: Candidate, hw: Hardware, *, precision: str, recompute: str = "none",
                   script: str = "train.py", compile: str = "none", fp8: str = "none") -> str:
    """``launch_args`` as one command line to copy. On several nodes the same line runs on each node: torch's c10d
    rendezvous at the first node's address (``HOST:29500``) numbers the nodes as they arrive (a static one would
    need each node's ``--node-rank``)."""
    meet = ["--rdzv-backend", "c10d", "--rdzv-endpoint", FIRST_NODE] if hw.nodes > 1 else []
    args = launch_args(candidate, hw, precision=precision, recompute=recompute, compile=compile, fp8=fp8)
    return " ".join(["convoy", "launch", *args, *meet, script])


def accelerator_call(candidate: Candidate, *, precision: str, recompute: str = "none", compile: str = "none",
                     fp8: str = "none") -> str:
    """The ``Accelerator(...)`` call that builds the same layout in a script started with as many processes
    (``compile="blocks"``, ``mixed_precision="fp8", fp8_recipe="tensorwise"`` where the plan chose them)."""
    parts = [f'strategy="{candidate.strategy}"']
    degrees = _degrees(candidate)
    if degrees:
        inner = ", ".join(f'"{flag.replace("-", "_")}": {value}' for flag, value in degrees)
        parts.append(f"parallelism={{{inner}}}")
    parts.append(f'mixed_precision="{mixed_precision_for(precision, fp8)}"')
    if fp8 != "none":
        parts.append(f'fp8_recipe="{fp8}"')
    steps = accumulation_steps(candidate)
    if steps > 1 and not candidate.layout.dims.pp_enabled:
        parts.append(f"gradient_accumulation_steps={steps}")
    if recompute != "none":
        parts.append(f'recompute="{recompute}"')
    if compile != "none":
        parts.append(f'compile="{compile}"')
    options = []
    if candidate.layout.offload:
        options.append('"cpu_offload": True')
    schedule = planned_schedule(candidate)
    if schedule is not None:
        options += ['"loss_fn": loss_fn', f'"pp_schedule": "{schedule[0]}"']
        if schedule[1] > 1:
            options.append(f'"pp_stages_per_rank": {schedule[1]}')
        options.append(f'"pp_microbatches": {steps}')
    if options:
        parts.append("strategy_options={" + ", ".join(options) + "}")
    return f"Accelerator({', '.join(parts)})"
