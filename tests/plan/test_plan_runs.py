"""The plan is the run: every layout ``convoy plan`` recommends, or offers as fitting, is accepted by ``convoy
launch``'s own checks and the Accelerator's, from the arguments the plan prints; a few train on CPU processes.

A grid of models (several sizes, and a case-3 shape whose one layer is 3 GiB of weights) x boards x node counts x
sequence lengths is planned; each distinct ``launch_args`` of a recommendation or a fitting row is dry-run by
``convoy launch`` (on an inventory of the board's node) and resolved into the strategy the ranks would build
(``resolve_settings`` + ``named_layout`` + the strategy's constructor, no process group), and each printed
``Accelerator(...)`` call is evaluated and resolved the same way. Before, 7 of 9 recommendations were refused by
the launcher (ddp beside tp, ddp at dp=1, hsdp).

    .venv/bin/python -m pytest -q tests/plan/test_plan_runs.py
"""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import replace
from pathlib import Path

import pytest

from convoy.plan.api import plan_for
from convoy.plan.hardware import parse_hardware
from convoy.plan.model import from_numbers, resolve_model
from convoy.plan.run import RunSpec

CONFIGS = Path(__file__).parent / "configs"
INVENTORY = Path(__file__).parents[1] / "inventories" / "8xh100_nvswitch.json"
SCRIPTS = Path(__file__).parent / "scripts"

MODELS = {
    "1.3B": lambda: from_numbers(1.3e9),
    "gpt2": lambda: resolve_model(str(CONFIGS / "gpt2.json")),
    "llama2-7b": lambda: resolve_model(str(CONFIGS / "llama2_7b.json")),
    "13B": lambda: from_numbers(13e9, layers=40, hidden=5120, heads=40, vocab=32000),
    "llama2-70b": lambda: resolve_model(str(CONFIGS / "llama2_70b.json")),
    "case-3 30B": lambda: from_numbers(30e9, layers=8, hidden=16384, heads=128, vocab=32000),
    "175B": lambda: from_numbers(175e9, layers=96, hidden=12288, heads=96, vocab=50257),
}
BOARDS = (("8xH100-80GB", None), ("8xA100-80GB", "pcie"), ("8xA100-40GB", None), ("4xL40S", None))
NODES = (1, 2, 4)
SEQ = (2048, 8192)


def _plans():
    """Every plan of the grid (``convoy.plan``'s recommendation, with knobs) and one node of 1 GPU per model."""
    for name, make in MODELS.items():
        model = make()
        for seq in SEQ:
            run = RunSpec(seq_len=seq, precision="bf16")
            yield name, plan_for(model, run, parse_hardware("1xH100-80GB"), explain_breaks=False)
            for board, intra in BOARDS:
                for nodes in NODES:
                    hw = parse_hardware(board, nodes=nodes, intra=intra)
                    yield name, plan_for(model, run, hw, explain_breaks=False)


def _launched(args: tuple[str, ...], script: Path) -> tuple[int, str]:
    """``convoy launch --dry-run ARGS script`` in this process: its exit code and what it printed (several nodes
    meet as the plan's line says: c10d at the first node)."""
    from convoy.cli.main import main

    nodes = int(args[args.index("--nnodes") + 1])
    meet = ["--rdzv-backend", "c10d", "--rdzv-endpoint", "node0:29500"] if nodes > 1 else []
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(["launch", "--dry-run", *args, *meet, str(script)])
    return code, out.getvalue()


def _every_rank_env(printed: str) -> dict[str, str]:
    """The variables ``convoy launch --dry-run`` prints under "environment (every rank):"."""
    lines = printed.split("environment (every rank):\n", 1)[1].split("environment (per rank", 1)[0].splitlines()
    return dict(line.strip().split("=", 1) for line in lines if line.startswith("  "))


def _planned_env(row, p) -> dict[str, str]:
    """What a worker must find for ``row`` of plan ``p``: every planned quantity as its ``CONVOY_*`` variable,
    worked out from the plan's own record (not from the arguments), and the accumulation tied to the global
    batch."""
    from convoy.plan.commands import mixed_precision_for

    layout, dims = row.candidate.layout, row.candidate.layout.dims
    steps = layout.microbatches
    assert steps * p.run.micro_batch * dims.dp == p.global_batch, (row.name, steps, p.global_batch)
    want = {"CONVOY_STRATEGY": row.candidate.strategy,
            "CONVOY_MIXED_PRECISION": {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}[p.run.recipe.compute]}
    assert want["CONVOY_MIXED_PRECISION"] == mixed_precision_for(row.precision)
    if dims.pp_enabled:
        want |= {"CONVOY_PP_MICROBATCHES": str(steps), "CONVOY_PP_SCHEDULE": layout.pp_schedule}
        if layout.pp_stages_per_rank > 1:
            want["CONVOY_PP_STAGES_PER_RANK"] = str(layout.pp_stages_per_rank)
    elif steps > 1:
        want["CONVOY_GRADIENT_ACCUMULATION_STEPS"] = str(steps)
    if layout.offload:
        want["CONVOY_CPU_OFFLOAD"] = "True"
    if row.recompute != "none":
        want["CONVOY_RECOMPUTE"] = row.recompute
    return want


def _rank_settings(args: tuple[str, ...], monkeypatch) -> dict[str, str]:
    """The environment a rank of ``convoy launch ARGS`` gets from the launcher's settings (``CONVOY_*``)."""
    from convoy.cli import launch as cli
    from convoy.cli.main import _command_parser
    from convoy.launch.rank_env import convoy_env

    request, _ = cli.build_request(_command_parser("launch", cli).parse_args([*args, "train.py"]))
    nodes, per_node = (int(args[args.index(flag) + 1]) for flag in ("--nnodes", "--nproc-per-node"))
    return {**convoy_env(request.settings), "WORLD_SIZE": str(nodes * per_node), "LOCAL_WORLD_SIZE": str(per_node),
            "RANK": "0", "LOCAL_RANK": "0"}


def _built(env: dict[str, str], *, explicit=None, options=None):
    """The strategy a rank builds from ``env`` (and the Accelerator's arguments): resolved settings, the named
    layout, the strategy object, without a process group."""
    from convoy.train.settings import resolve_settings
    from convoy.train.strategies.base import create_strategy
    from convoy.train.strategies.build import named_layout

    settings = resolve_settings(explicit=explicit, env=env, cpu=True, options=options)
    name, opts = named_layout(settings)
    if name == "auto":
        return name
    return create_strategy(name, replace(settings, strategy=name, options=opts))


def test_every_recommendation_and_fitting_row_is_accepted_by_the_launcher_and_the_accelerator(tmp_path, monkeypatch):
    """Each distinct line is dry-run, and every quantity the plan costed reaches the workers' environment:
    precision, accumulation (the global batch over dp x micro-batch), degrees, schedule, recompute, offload and
    nodes. Before, the line carried no precision and no accumulation: a bf16 plan ran fp32, one micro-batch a step."""
    from convoy.plan.dims import ParallelDims
    from tests.train.parallel.tiny_gpt import lm_loss

    monkeypatch.setenv("CONVOY_INVENTORY", str(INVENTORY))
    script = tmp_path / "train.py"
    script.write_text("")
    offered: dict[tuple[str, ...], tuple[str, object, object]] = {}  # launch_args -> a case, its row and plan
    calls: dict[str, tuple[str, ...]] = {}  # Accelerator(...) -> the launch_args of the same row
    recommended, knobs, accumulated = 0, set(), set()
    for name, p in _plans():
        rec = p.recommendation
        where = f"{name} on {p.hardware.describe()} at seq {p.run.seq_len}"
        rows = [r for r in p.rows if r.fits and not r.candidate.layout.offload]
        if rec.row is not None:
            recommended += 1
            knobs.add(rec.knob)
            rows.append(rec.row)
            calls[rec.accelerator] = rec.launch_args
            assert rec.command.split()[2:-1][:len(rec.launch_args)] == list(rec.launch_args), rec.command
            meet = rec.command.split()[2 + len(rec.launch_args):-1]
            assert meet == (["--rdzv-backend", "c10d", "--rdzv-endpoint", "HOST:29500"] if p.hardware.nodes > 1
                            else []), rec.command
        for row in rows:
            offered.setdefault(row.launch_args, (f"{row.name} for {where}", row, p))
    assert recommended > 100 and {"", "offload", "recompute"} <= knobs, (recommended, knobs)
    for args, (case, row, p) in sorted(offered.items(), key=lambda item: item[0]):
        code, printed = _launched(args, script)
        assert code == 0, (case, args, printed)
        assert f"nodes:      {p.hardware.nodes} " in printed, (case, printed)
        assert f"world size {p.hardware.world_size}" in printed, (case, printed)
        got, want = _every_rank_env(printed), _planned_env(row, p)
        assert {k: got.get(k) for k in want} == want, (case, args)
        launched = ParallelDims.parse(got.get("CONVOY_PARALLELISM", f"dp={p.hardware.world_size}"),
                                      world_size=p.hardware.world_size)
        planned = row.candidate.layout.dims
        degrees = ("dp_replicate", "dp_shard") if planned.hsdp_enabled else ("dp",)
        assert [getattr(launched, a) for a in (*degrees, "tp", "pp")] == \
            [getattr(planned, a) for a in (*degrees, "tp", "pp")], (case, got)
        accumulated.add("pp" if row.candidate.layout.dims.pp_enabled else int(want.get(
            "CONVOY_GRADIENT_ACCUMULATION_STEPS", 1)) > 1)
        env = _rank_settings(args, monkeypatch)
        pp = "--pp" in args
        strategy = _built(env, options={"loss_fn": lm_loss} if pp else None)
        assert strategy.name == args[args.index("--strategy") + 1] or strategy.name == "parallel", (case, strategy)
        dims = getattr(strategy, "dims", None)
        if dims is not None:
            assert dims.world_size == int(args[1]) * int(args[3]), (case, dims)
    assert accumulated == {"pp", True, False}, accumulated  # the grid plans each kind of step
    for call, args in calls.items():
        given = eval(call, {"Accelerator": lambda **kw: kw, "loss_fn": lm_loss})  # noqa: S307 - our own output
        nodes, per_node = int(args[1]), int(args[3])
        env = {"WORLD_SIZE": str(nodes * per_node), "LOCAL_WORLD_SIZE": str(per_node), "RANK": "0", "LOCAL_RANK": "0"}
        explicit = {k: v for k, v in given.items() if k != "strategy_options"}
        built = _built(env, explicit=explicit, options=given.get("strategy_options"))
        if built != "auto":  # the call says what the line says
            launched = _built(_rank_settings(args, monkeypatch), options={"loss_fn": lm_loss})
            for field in ("mixed_precision", "gradient_accumulation_steps", "recompute"):
                assert getattr(built.context, field) == getattr(launched.context, field), (call, args, field)
            for key in ("pp_microbatches", "pp_schedule", "pp_stages_per_rank", "cpu_offload"):
                assert built.context.options.get(key) == launched.context.options.get(key), (call, args, key)
    print(f"{len(offered)} distinct launch_args, {len(calls)} Accelerator calls")


def test_the_printed_line_says_the_precision_and_the_accumulation_the_plan_costed(capsys):
    """The issue's case: 7B on 8 x H100 at a global batch of 64 is costed in bf16 with 8 micro-batches per rank;
    fp32 prints another line (before, both printed the same line, without either)."""
    from convoy.cli.main import main

    lines = {}
    for precision in ("bf16", "fp32"):
        assert main(["plan", "--params", "7e9", "--hardware", "8xH100-80GB", "--global-batch", "64",
                     "--precision", precision, "--fp8", "none", "--json"]) == 0  # float8 not chosen on top
        rec = json.loads(capsys.readouterr().out)["recommendation"]
        lines[precision] = rec["command"]
        dp = int(rec["launch_args"][rec["launch_args"].index("--dp") + 1]) if "--dp" in rec["launch_args"] else 8
        assert f"--gradient-accumulation-steps {64 // dp}" in rec["command"], rec["command"]
        assert f"gradient_accumulation_steps={64 // dp}" in rec["accelerator"], rec["accelerator"]
    assert "--mixed-precision bf16" in lines["bf16"] and "--mixed-precision no" in lines["fp32"], lines


def test_the_json_recommendation_carries_the_arguments_the_issue_found_refused(capsys):
    """The issue's cases: each recommendation's launch_args are what convoy launch now runs."""
    from convoy.cli.main import main

    cases = {("--params", "7e9", "--hardware", "8xH100-80GB", "--nodes", "2"): ("zero1", "ddp"),
             ("--params", "7e9", "--hardware", "8xH100-80GB", "--nodes", "2", "--seq-len", "4096"): ("hsdp",),
             ("--params", "30e9", "--layers", "8", "--hidden", "16384", "--heads", "128",
              "--hardware", "8xH100-80GB"): ("parallel",)}
    for argv, strategies in cases.items():
        assert main(["plan", *argv, "--json"]) == 0
        rec = json.loads(capsys.readouterr().out)["recommendation"]
        assert rec["strategy"] in strategies, (argv, rec["strategy"])
        assert rec["launch_args"][rec["launch_args"].index("--strategy") + 1] == rec["strategy"]


# --- a few layouts the plan offers, trained on CPU processes from its printed arguments ----------------------------

def _row_args(hardware: str, nodes: int, name: str) -> tuple[str, ...]:
    """The launch_args of row ``name`` of the plan of the tiny GPT the script trains, on ``hardware`` x ``nodes``."""
    from tests.train.parallel.tiny_gpt import TinyConfig, TinyGPT

    model = resolve_model(TinyGPT(TinyConfig()))
    p = plan_for(model, RunSpec(seq_len=8, micro_batch=1, precision="fp32"), parse_hardware(hardware, nodes=nodes),
                 global_batch=8, explain_breaks=False)
    return next(r for r in p.rows if r.name == name).launch_args


@pytest.mark.slow
def test_layouts_train_from_the_printed_arguments(monkeypatch):
    """Rows the plan offers for a tiny GPT on 8 GPUs (one node, or two of 4 for HSDP) -- ddp beside tp, hsdp, ddp
    beside pp, zero1 beside tp and pp, zero3 with CPU offload -- launched as their launch_args say (the launcher's
    variables for the ranks, ``CONVOY_*``), train 3 steps on 8 CPU processes to the parameters of one process. One
    launch trains them all (8 processes on 2 cores cost more to start than to train)."""
    from tests.distributed import run_script

    layouts = []
    for hardware, nodes, name in (("8xH100-80GB", 1, "ddp+tp2"), ("4xH100-80GB", 2, "hsdp"),
                                  ("8xH100-80GB", 1, "ddp+pp2"), ("8xH100-80GB", 1, "zero1+tp2+pp2"),
                                  ("8xH100-80GB", 1, "zero3+offload")):
        args = _row_args(hardware, nodes, name)
        assert int(args[1]) * int(args[3]) == 8, args
        env = {k: v for k, v in _rank_settings(args, monkeypatch).items() if k.startswith("CONVOY_")}
        layouts.append([f"{name} ({' '.join(args[4:])})", env])
    result = run_script(SCRIPTS / "train_as_planned.py", nproc=8, args=[json.dumps(layouts)], timeout=300)
    assert result.returncode == 0, result.output
    ok = [line for line in result.output.splitlines() if line.endswith(" OK")]
    for label, _ in layouts:
        assert sum(f" {label} (" in line for line in ok) == 8, (label, result.output)


@pytest.mark.parametrize("world, nodes, gib, precision", [
    (4, 1, 80, "fp32"),  # zero2
    (4, 1, 32, "fp32"),  # zero3 with cpu_offload: nothing fits as asked
    (8, 1, 16, "bf16"),  # tp8 (parallel, dp = 1)
    (8, 1, 20, "bf16"),  # zero3 beside tp4
    (8, 1, 24, "bf16"),  # zero1 beside tp4
    (16, 2, 20, "bf16"),  # hsdp beside tp4
    (4, 1, 12, "bf16"),  # nothing fits: both decline
])
def test_strategy_auto_builds_what_convoy_plan_recommends_for_the_same_case(world, nodes, gib, precision, monkeypatch):
    """One function decides: ``auto_strategy`` with the trainer's facts, and ``plan_for`` (what ``convoy plan``
    calls) with the same facts, give one layout: the strategy built from auto's answer is the one built from the
    plan's launch arguments (degrees, engine, offload)."""
    from convoy.plan.candidates import TrainerFacts
    from convoy.plan.hardware import GpuSpec, Hardware
    from convoy.train.settings import resolve_settings
    from convoy.train.strategies.auto import TRAINER_KNOBS, auto_strategy
    from convoy.train.strategies.base import create_strategy

    config = json.loads((CONFIGS / "llama2_7b.json").read_text())
    tps = tuple(t for t in (2, 4, 8) if (world // nodes) % t == 0)
    layout = auto_strategy(num_parameters=6_738_415_616, world_size=world, device_bytes=gib * 2**30,
                           precision=precision, model=config, tp_degrees=tps, **({"nodes": nodes} if nodes > 1 else {}))
    gpu = GpuSpec(name="device", memory_bytes=gib * 2**30, bf16_tflops=100.0, fp16_tflops=100.0, fp32_tflops=25.0,
                  nvlink_gbs=None, pcie_gbs=16, source="generic device (no table row)")
    hw = Hardware(gpu=gpu, gpus_per_node=world // nodes, nodes=nodes, intra="pcie")
    p = plan_for(resolve_model(config), RunSpec(precision=precision), hw,
                 facts=TrainerFacts(tp_degrees=tps, pp_degrees=()),
                 knobs=TRAINER_KNOBS)
    rec = p.recommendation
    assert (layout is None) == (rec.row is None), (layout, rec.reasons)
    if layout is None:
        return
    from_plan = _built(_rank_settings(rec.launch_args, monkeypatch))
    env = {"WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world // nodes)}
    options = {**({"dp_engine": layout.dp_engine} if layout.dp_engine else {}),
               **({"cpu_offload": True} if layout.cpu_offload else {})}
    from_auto = create_strategy(layout.name, replace(resolve_settings(env=env, cpu=True), strategy=layout.name,
                                                      parallel_dims=layout.dims, options=options))
    assert getattr(from_auto, "dims", None) == getattr(from_plan, "dims", None), (layout, rec.launch_args)
    assert getattr(from_auto, "dp_engine", None) == getattr(from_plan, "dp_engine", None), (layout, rec.launch_args)
    assert from_auto.context.options.get("cpu_offload") == from_plan.context.options.get("cpu_offload")
    assert from_auto.distributed_type == from_plan.distributed_type, (layout, rec.launch_args)


@pytest.mark.slow
def test_the_multi_node_line_runs_as_printed_on_each_node():
    """The plan's line for 2 nodes, run as printed on each (the first node's address for HOST, CPU processes),
    forms one job of 2 ranks on 2 nodes in the planned precision and accumulation. Before, the line had a static
    rendezvous and no --node-rank: both nodes were node 0, the second exited on EADDRINUSE and the first hung."""
    import shlex
    import sys

    from convoy.launch.ports import free_port
    from tests.distributed import cpu_env
    from tests.processes import finish, start
    from tests.train.parallel.tiny_gpt import TinyConfig, TinyGPT

    p = plan_for(resolve_model(TinyGPT(TinyConfig())), RunSpec(seq_len=8, micro_batch=1, precision="bf16"),
                 parse_hardware("1xH100-80GB", nodes=2), global_batch=8, explain_breaks=False)
    line = p.recommendation.command.replace("HOST:", "127.0.0.1:").replace(":29500", f":{free_port()}")
    argv = shlex.split(line)[2:-1]
    assert argv[:2] == ["--nnodes", "2"] and "--node-rank" not in argv, line
    nodes = [start([sys.executable, "-m", "convoy", "launch", "--devices", "0", *argv,
                    str(SCRIPTS / "show_settings.py")], env=cpu_env()) for _ in range(2)]
    outs = [finish(node, timeout=120) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outs
    said = "\n".join(outs)
    for rank in (0, 1):
        assert (f"node {rank} rank {rank} of 2: mixed_precision=bf16 gradient_accumulation_steps=4 "
                f"strategy={p.recommendation.strategy}") in said, said
