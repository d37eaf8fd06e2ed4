"""``accelerator.plan_report()``: the first steps measured beside the plan for the layout that ran them, logged
once, kept in the calibration cache, and what a later plan of the same case does with it."""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from convoy import Accelerator
from convoy.plan.api import plan_for
from convoy.plan.candidates import enumerate_candidates
from convoy.plan.dims import ParallelDims
from convoy.plan.hardware import CPU, Hardware, parse_hardware
from convoy.plan.model import describe_module
from convoy.plan.run import RunSpec
from convoy.plan.speed.observed import observed_in
from convoy.plan.speed.records import cached_records
from convoy.train.plan_report import MEASURED_STEPS, WARMUP_STEPS, trainer_layout
from convoy.train.strategies import Strategy, register_strategy
from tests.distributed import run_script

SCRIPTS = Path(__file__).parent / "scripts"
LOGGER = "convoy.train.plan_report"


def _script_module():
    """tests/train/scripts/plan_report.py as a module (its TinyGPT is the model the 2-process job trains)."""
    spec = importlib.util.spec_from_file_location("plan_report_script", SCRIPTS / "plan_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TokenModel(nn.Module):
    """Called as ``model(input_ids=...)``, as a transformers model is; ``config`` optional."""

    def __init__(self, config=None) -> None:
        super().__init__()
        self.emb = nn.Embedding(32, 16)
        self.blocks = nn.ModuleList(nn.Linear(16, 16) for _ in range(2))
        self.head = nn.Linear(16, 32)
        if config is not None:
            self.config = config

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(input_ids)
        for block in self.blocks:
            x = torch.relu(block(x))
        return self.head(x)


def _train(acc: Accelerator, model: nn.Module, steps: int, *, accumulation: int = 1) -> list[str]:
    """``steps`` optimizer steps of batches (3, 12); returns the report's ``missing`` after each."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model, optimizer = acc.prepare(model, optimizer)
    seen = []
    for _ in range(steps):
        for _ in range(accumulation):
            with acc.accumulate(model):
                ids = torch.randint(0, 32, (3, 12))
                acc.backward(nn.functional.cross_entropy(model(input_ids=ids).flatten(0, 1), ids.flatten()))
                optimizer.step()
                optimizer.zero_grad()
        seen.append(acc.plan_report().missing)
    return seen


def test_one_process_reports_after_the_first_steps_logs_once_and_keeps_it(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    caplog.set_level(logging.INFO, logger=LOGGER)
    acc = Accelerator(cpu=True, gradient_accumulation_steps=2)
    assert "no optimizer prepared" in acc.plan_report().missing
    missing = _train(acc, TokenModel(), WARMUP_STEPS + MEASURED_STEPS + 2, accumulation=2)
    last = WARMUP_STEPS + MEASURED_STEPS
    assert all(f"{n} of {last} optimizer steps done" in m for n, m in enumerate(missing[:last - 1], 1))
    assert missing[last - 1:] == ["no allocator peak on the cpu"] * 3
    report = acc.plan_report()
    assert report.steps == MEASURED_STEPS and report.measured_seconds > 0 and report.planned_seconds > 0
    assert report.time_ratio == report.planned_seconds / report.measured_seconds
    assert report.measured_peak_bytes is None and report.memory_ratio is None  # no allocator peak on the CPU
    assert report.planned_peak_bytes > 0 and (report.layout, report.hardware) == ("single", "1 CPU process")
    # the case the plan was made for: the input's (batch, sequence), the accumulation, SGD with momentum, fp32
    assert "| s12 b3 |" in report.case and " m2" in report.case and "fp32 sgd-momentum" in report.case
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.INFO]
    assert lines == [f"convoy: {report.describe()}"]
    assert re.fullmatch(r"convoy: step [0-9.]+ (us|ms|s), planned [0-9.]+ (us|ms|s) \(ran ([0-9]+ % (faster|slower) "
                        r"than planned|[0-9.,]+x (faster|slower) than planned|as planned)\) -- single on 1 CPU "
                        r"process, steps 3-7(, measured while the machine was busy \(load [0-9.]+ on [0-9]+ cores?\))?"
                        + re.escape(CPU_SOURCE), lines[0]), lines[0]
    (record,) = cached_records(path=tmp_path / "convoy" / "calibration.json")
    seen = observed_in(record)[report.case]
    assert (seen.measured_s, seen.planned_s, seen.steps) == (report.measured_seconds, report.planned_seconds,
                                                             MEASURED_STEPS)
    assert record.device_type == "cpu" and not record.has_rates


def test_a_plan_that_cannot_be_made_leaves_the_measurement_and_the_training(tmp_path, monkeypatch, caplog):
    """A strategy another package registered has no layout in the planner."""
    @register_strategy("test-plan-report-custom", replace=True)
    class Custom(Strategy):
        def setup_module(self, module):
            return module

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    acc = Accelerator(cpu=True, strategy="test-plan-report-custom")
    _train(acc, TokenModel(), WARMUP_STEPS + MEASURED_STEPS + 3)
    report = acc.plan_report()
    assert report.measured_seconds > 0 and report.planned_seconds is None and report.time_ratio is None
    why = ("no plan (strategy 'test-plan-report-custom' is not one the planner lays out; it plans single, ddp, "
           "zero1-3, fsdp and parallel)")
    assert report.missing == f"no allocator peak on the cpu; {why}"
    messages = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == LOGGER]
    # nothing at info where no plan applies: the reason and the measurement at debug
    assert messages == [(logging.DEBUG, f"plan report: {why}"), (logging.DEBUG, f"convoy: {report.describe()}")]
    assert f"; no plan: no allocator peak on the cpu; {why}" in messages[-1][1]
    assert not (tmp_path / "convoy").exists()  # nothing kept without a plan


def test_a_config_the_planner_cannot_read_plans_the_module():
    class Unreadable:
        def to_dict(self):
            raise RuntimeError("config cannot be read")

    acc = Accelerator(cpu=True)
    _train(acc, TokenModel(config=Unreadable()), WARMUP_STEPS + MEASURED_STEPS)
    report = acc.plan_report()
    assert report.planned_seconds > 0 and report.case.startswith(f"{sum(p.numel() for p in TokenModel().parameters())} "
                                                                 "params")


def test_an_optimizer_without_step_hooks_is_said_not_timed():
    class Plain:  # the step() of an object that is no torch.optim.Optimizer: nothing to hook
        param_groups: list = []

        def step(self):
            pass

    from convoy.train.plan_report import PlanWatch

    watch = PlanWatch(lambda: (None, 1), main_process=True)
    watch.watch_optimizer(Plain())
    assert watch.report().missing == "Plain has no step hooks to time steps by"


def _strategy(name: str, world: int, *, dims=None, engine=None, **options):
    return SimpleNamespace(name=name, context=SimpleNamespace(world_size=world, options=options), dims=dims,
                           dp_engine=engine)


@pytest.mark.parametrize("strategy, world, expected", [
    (_strategy("single", 1), 1, "single"),
    (_strategy("ddp", 4), 4, "ddp"),
    (_strategy("zero1", 4), 4, "zero1"),
    (_strategy("zero2", 4), 4, "zero2"),
    (_strategy("zero2", 4, cpu_offload=True), 4, "zero2+offload"),
    (_strategy("zero3", 4), 4, "zero3"),
    (_strategy("fsdp", 4, cpu_offload=True), 4, "zero3+offload"),
    (_strategy("parallel", 4, dims=ParallelDims(dp_shard=2, tp=2), engine="fsdp"), 4, "zero3+tp2"),
    (_strategy("parallel", 4, dims=ParallelDims(tp=4), engine="fsdp"), 4, "tp4"),
    (_strategy("parallel", 4, dims=ParallelDims(dp_replicate=2, pp=2), engine="zero1"), 4, "zero1+pp2"),
    (_strategy("parallel", 4, dims=ParallelDims(dp_replicate=2, pp=2), engine="ddp"), 4, "ddp+pp2"),
    (_strategy("parallel", 8, dims=ParallelDims(dp_shard=2, tp=2, pp=2), engine="fsdp"), 8, "zero2+tp2+pp2"),
    (_strategy("parallel", 4, dims=ParallelDims(dp_shard=2, pp=2), engine="fsdp"), 4, "zero2+pp2"),
])
def test_the_layout_that_ran_is_the_planners_candidate_of_that_name(strategy, world, expected):
    """What the trainer runs is keyed exactly as ``convoy plan`` keys the candidate of the same name, so the second
    plan finds the first job's measurement."""
    model = describe_module(_script_module().TinyGPT(heads=4, layers=4), name="tiny")
    candidate, chunks = trainer_layout(strategy, accumulation=2)
    assert candidate.name == expected
    hw = Hardware(gpu=CPU, gpus_per_node=world, intra="pcie")
    pp = candidate.layout.dims.pp
    global_batch = candidate.layout.dims.dp * candidate.layout.microbatches  # micro-batch 1
    planned = {c.name: c for c in enumerate_candidates(model, hw, global_batch=global_batch, micro_batch=1)}
    assert planned[expected].layout == candidate.layout
    assert chunks == (pp if pp > 1 else 1) and candidate.layout.microbatches == 2 * chunks


def test_pipeline_micro_batches_come_from_the_options():
    strategy = _strategy("parallel", 4, dims=ParallelDims(dp_replicate=2, pp=2), engine="zero1", pp_microbatches=8)
    candidate, chunks = trainer_layout(strategy, accumulation=1)
    assert (chunks, candidate.layout.microbatches) == (8, 8)


@pytest.mark.slow
def test_two_processes_report_log_once_and_the_second_plan_takes_the_measurement(tmp_path):
    result = run_script(SCRIPTS / "plan_report.py", nproc=2, args=["--strategy", "zero3", "--mixed-precision", "bf16"],
                        env={"XDG_CACHE_HOME": str(tmp_path)}, timeout=180)
    assert result.returncode == 0, result.output[-4000:]
    logged = [line for line in result.output.splitlines() if "LOG convoy.train.plan_report" in line]
    assert len(logged) == 1 and "rank0" in logged[0], result.output[-4000:]
    assert ", planned " in logged[0] and "-- zero3 on 2 CPU processes, steps 3-7" in logged[0], logged
    assert logged[0].endswith(CPU_SOURCE), logged
    reports = {int(line.split()[2]): json.loads(line.split(" ", 3)[3])
               for line in result.output.splitlines() if " REPORT " in line}
    early = next(json.loads(line.split("EARLY ", 1)[1]) for line in result.output.splitlines() if "EARLY " in line)
    assert early["measured_seconds"] is None and early["missing"].startswith("3 of 7 optimizer steps done")
    assert set(reports) == {0, 1}
    for rank, report in reports.items():
        assert report["steps"] == MEASURED_STEPS and report["measured_seconds"] > 0, report
        assert report["planned_seconds"] > 0 and report["planned_peak_bytes"] > 0
        assert report["missing"] == "no allocator peak on the cpu"
        assert math.isclose(report["time_ratio"], report["planned_seconds"] / report["measured_seconds"])
        assert report["measured_peak_bytes"] is None and report["layout"] == "zero3"
        assert (report["case"] != "") == (rank == 0)  # the main process keeps it
    case = reports[0]["case"]
    assert "zero3 dp2 " in case and "| s16 b4 |" in case and "bf16-fsdp adamw" in case and "2 cpu per node x 1" in case
    (record,) = cached_records(path=tmp_path / "convoy" / "calibration.json")
    seen = observed_in(record)[case]
    assert (seen.measured_s, seen.planned_s) == (reports[0]["measured_seconds"], reports[0]["planned_seconds"])

    # the second plan of this case on this machine: the measured step; the other layouts as the model says
    model = describe_module(_script_module().TinyGPT(), name="tiny")
    run = RunSpec(seq_len=16, micro_batch=4, precision="bf16-fsdp")
    hw = Hardware(gpu=CPU, gpus_per_node=2, intra="pcie")
    first = plan_for(model, run, hw, global_batch=8, allowed=["ddp", "zero3"])
    second = plan_for(model, run, hw, global_batch=8, allowed=["ddp", "zero3"], observed=observed_in(record))
    # (the job's own plan is the CPU's counted operators, convoy.plan.speed.cpu_step; a plan without the module is the
    # model's)
    assert second.row("zero3").time.seconds == pytest.approx(seen.measured_s)
    assert second.row("ddp").time.seconds == first.row("ddp").time.seconds
    elsewhere = plan_for(model, run, parse_hardware("2xH100-80GB"), global_batch=8, observed=observed_in(record))
    assert not elsewhere.observations  # another machine shape is another case


def test_the_prepared_model_can_be_copied_and_pickled_while_it_is_watched():
    import copy
    import pickle

    acc = Accelerator(cpu=True)
    model = TokenModel()
    model, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    twin = copy.deepcopy(model)  # an EMA copy: the watch (and the Accelerator it reads) is not copied
    assert next(iter(twin._forward_pre_hooks.values())) is next(iter(model._forward_pre_hooks.values()))
    restored = pickle.loads(pickle.dumps(model))  # torch.save(model): the hook travels as a no-op
    ids = torch.randint(0, 32, (2, 5))
    assert torch.equal(restored(input_ids=ids), model(input_ids=ids))


def test_a_pickled_accelerator_carries_the_report_so_far():
    """Accelerate's checks pickle the Accelerator (test_pickle_accelerator); the copy watches nothing."""
    import pickle

    acc = Accelerator(cpu=True)
    _train(acc, TokenModel(), 3)
    copy = pickle.loads(pickle.dumps(acc))
    assert copy.plan_report() == acc.plan_report() and "3 of 7 optimizer steps done" in copy.plan_report().missing


ROOT = Path(__file__).resolve().parents[2]
#: where the plan of a job on CPU processes comes from, as its line says (``convoy plan`` plans GPUs)
CPU_SOURCE = ("; planned from step 2's operators at this CPU's measured rates (convoy plan plans GPUs, not CPU "
              "processes)")
#: the info line of a job on 2 CPU processes (``PlanReport.describe``)
LINE = re.compile(r"convoy: step ([0-9.]+) (us|ms|s), planned ([0-9.]+) (us|ms|s) \(ran (?:[0-9]+ % (?:faster|slower) "
                  r"than planned|[0-9.,]+x (?:faster|slower) than planned|as planned)\) -- (\S+) on 2 CPU processes, "
                  r"steps 3-7(, measured while the machine was busy \(load [0-9.]+ on [0-9]+ cores?\))?"
                  + re.escape(CPU_SOURCE) + "$")
_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def test_the_line_says_which_way_the_plan_is_off_in_a_users_words():
    """What ran against the plan, relative to the plan ("plan 59 % slow" read as if the run were slow) and never in
    scientific notation ("plan 1.9e+02x fast"); where a CPU plan comes from, and a machine busy while measuring."""
    from convoy.train.plan_report import PlanReport

    base = PlanReport(layout="zero3", hardware="2xH100-80GB (nvlink)", steps=5, measured_seconds=0.005)
    assert replace_report(base, planned_seconds=0.0041).describe() == \
        "step 5.0 ms, planned 4.1 ms (ran 22 % slower than planned) -- zero3 on 2xH100-80GB (nvlink), steps 3-7"
    gpu = replace_report(base, planned_seconds=0.0065, measured_peak_bytes=int(1.2 * 2**30),
                         planned_peak_bytes=int(1.1 * 2**30))
    assert gpu.describe() == ("step 5.0 ms, planned 6.5 ms (ran 23 % faster than planned); peak 1.2 GiB, planned "
                              "1.1 GiB (9 % more than planned) -- zero3 on 2xH100-80GB (nvlink), steps 3-7")
    assert "(ran 5.0x slower than planned)" in replace_report(base, planned_seconds=0.001).describe()
    assert "(ran 2.5x faster than planned)" in replace_report(base, planned_seconds=0.0125).describe()
    assert "(ran 190x faster than planned)" in replace_report(base, planned_seconds=0.95).describe()
    assert "(ran 1,200x faster than planned)" in replace_report(base, planned_seconds=6.0).describe()
    assert "(ran as planned)" in replace_report(base, planned_seconds=0.005).describe()
    assert not base.logged and replace_report(base, planned_seconds=0.001).logged
    cpu = replace_report(base, planned_seconds=0.004, hardware="2 CPU processes", busy="load 5.3 on 2 cores",
                         planned_from="from step 2's operators at this CPU's measured rates")
    assert cpu.describe() == ("step 5.0 ms, planned 4.0 ms (ran 25 % slower than planned) -- zero3 on 2 CPU "
                              "processes, steps 3-7, measured while the machine was busy (load 5.3 on 2 cores); "
                              "planned from step 2's operators at this CPU's measured rates")


def test_a_busy_machine_is_one_whose_load_is_above_its_cores_and_the_jobs_processes(monkeypatch):
    import os

    from convoy.train import plan_report

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    for load, processes, said in ((1.6, 2, ""), (5.26, 2, "load 5.3 on 2 cores"), (3.5, 4, "")):
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, 0.0, 0.0))
        assert plan_report._busy(processes) == said, (load, processes)


def replace_report(report, **changes):
    from dataclasses import replace

    return replace(report, **changes)


@pytest.mark.slow
@pytest.mark.parametrize("script, args, launched, layout", [
    ("examples/classifier.py", ["--epochs", "1"], {}, "ddp"),  # make demo's job
    ("examples/tiny_gpt.py", ["--steps", "10"], {"CONVOY_STRATEGY": "zero3"}, "zero3"),  # --strategy zero3
    ("examples/tiny_gpt_pp.py", ["--steps", "10"], {"CONVOY_PARALLELISM": "pp=2"}, "pp2"),  # --pp 2
    ("examples/tiny_gpt_tp.py", ["--steps", "10"], {}, "tp2"),
    ("benchmarks/step_overhead.py", ["--sizes", "tiny", "--rounds", "1", "--steps", "10"], {}, "ddp"),
], ids=["demo", "tiny_gpt", "tiny_gpt_pp", "tiny_gpt_tp", "step_overhead"])
def test_the_first_runs_plan_on_two_cpu_processes_is_within_2x_of_its_step(script, args, launched, layout,
                                                                            tmp_path):
    """The plan line of the demo, the examples and the step benchmark: once, rank 0's, within 2x of the step. The
    machine is shared and a step of a few ms on 2 cores is mostly the wait for the other process to be scheduled,
    which load moves by 2-3x between the round trip the plan is measured at (step 2) and steps 3-7: a job
    off by more than 2x is run again, up to three times in all; a plan off by more than 2x fails all three, unless
    the line says the machine was busy (load above the cores), which is what it must say then."""
    seen = []
    for attempt in range(3):
        result = run_script(ROOT / script, nproc=2, args=args, timeout=300,
                            env={"XDG_CACHE_HOME": str(tmp_path / str(attempt)), **launched})
        assert result.returncode == 0, result.output[-4000:]
        lines = [line for line in result.output.splitlines() if "convoy: step " in line]
        assert len(lines) == 1 and lines[0].startswith("[rank0]: "), result.output[-4000:]
        match = LINE.search(lines[0])
        assert match and match.group(5) == layout, lines[0]
        ratio = float(match.group(3)) * _UNIT[match.group(4)] / (float(match.group(1)) * _UNIT[match.group(2)])
        seen.append((ratio, lines[0]))
        if 0.5 <= ratio <= 2 or match.group(6):  # or the line says the machine was busy, as it must under load
            return
    raise AssertionError(f"planned / measured outside 0.5-2 in all three runs: {seen}")


def test_the_cpu_plan_costs_each_module_a_parallel_style_split_and_no_other(tmp_path):
    # the styles' hooks are Python that runs no operator (convoy.plan.speed.cpu_step.TP_MODULE_OPS):
    # counted per split module
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from convoy.train.plan_report import _tp_modules

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8), nn.LayerNorm(8), nn.Linear(8, 4))
        assert _tp_modules(model) == 0
        parallelize_module(model, init_device_mesh("cpu", (1,)), {"0": ColwiseParallel(), "2": RowwiseParallel()})
        assert _tp_modules(model) == 2
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_the_plan_line_is_a_line_of_its_own_with_the_rank_prefix_under_a_progress_bar():
    """The line comes at step 7, while the loop's tqdm bar is drawn: it was glued to the bar (``[rank0]:  58%|...
    convoy: step ...``); now the bar is cleared first, and the line has the rank prefix at its start."""
    result = run_script(SCRIPTS / "plan_line_under_bar.py", nproc=1)
    assert result.returncode == 0, result.output
    said = [line for line in result.output.splitlines() if "convoy: step" in line]
    assert len(said) == 1 and said[0].startswith("[rank0]: convoy: step "), result.output
    assert "than planned" in said[0] or "as planned" in said[0], said
