"""The plan next to the measurement: after its first steps, the step time and peak memory this job measured beside
what ``convoy.plan`` predicts for the very layout it runs; and the measurement kept, so later plans improve.

    report = accelerator.plan_report()      # a PlanReport; complete once optimizer step 7 is done
    report.measured_seconds, report.planned_seconds, report.time_ratio           # ratio: planned / measured
    report.measured_peak_bytes, report.planned_peak_bytes, report.memory_ratio
    report.describe()   # logged once, on the main process, at info, with "convoy: " before it, on a line of its own:
    # step 71.0 ms, planned 76.6 ms (ran 7 % faster than planned); peak 12.7 GiB, planned 12.3 GiB (3 % more than
    # planned) -- zero3 on 2xH100-80GB (nvlink), steps 3-7     (at debug instead when no plan applies, with the reason)

Measured: the median of optimizer steps 3 to 7 (a step post-hook on the first prepared optimizer; steps 1 and 2
warm up; data loading included) and CUDA's peak allocated memory since step 2, on this process's device (rank 0's
on the main process: the first pipeline stage). The CPU has no allocator peak: time only; there step 2 also counts
the operators it runs and every rank times the collectives' round trip. The hooks are removed afterwards.

Planned: the model as ``convoy.plan`` reads it, the largest forward input's micro-batch and sequence, the trainer's
precision recipe, optimizer, recompute and the strategy's layout, on this device's table row at the rates a plan
uses here (``convoy.plan.speed.rates``); CPU processes at this CPU's measured rates
(``convoy.plan.speed.cpu_step``). A failure leaves the report without the plan, saying why: training never stops
for it. The main process keeps the observation in its device's calibration cache (``convoy.plan.speed.observed``),
which a later ``convoy plan`` of the same case on this machine takes as its step time.

On CPU processes ``convoy plan`` has no hardware to print a plan for: the line says where its plan comes from. A
machine busy with other work (the 1-minute load average above the cores, on CPU processes) moves 5 steps of a few
milliseconds by several times: the line says the steps were measured under load, and how much.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from convoy.errors import NotSupportedYetError, PlanError
from convoy.plan.candidates import Candidate
from convoy.plan.dims import ParallelDims
from convoy.plan.hardware import CPU, Hardware, lookup_gpu
from convoy.plan.memory import Layout, memory_per_gpu
from convoy.plan.model import ModelSpec, describe_module, resolve_model
from convoy.plan.run import RunSpec
from convoy.plan.schedules import pipeline_bubble
from convoy.plan.speed.cpu_step import cpu_step
from convoy.plan.speed.measure import device_identity
from convoy.plan.speed.measure_cpu import OpCounter, cpu_rates, round_trip_seconds
from convoy.plan.speed.observed import Observation, case_key
from convoy.plan.speed.rates import rates_for
from convoy.plan.speed.records import Calibration, load_calibration, save_calibration
from convoy.plan.timing import step_time
from convoy.plan.units import format_bytes, format_seconds
from convoy.train.logging import get_logger
from convoy.train.parallel.recompute import checkpoints_itself
from convoy.train.progress import above_progress_bars
from convoy.train.strategies.auto import device_memory_bytes, trainer_precision
from convoy.train.strategies.options import ParallelOptions

__all__ = ["PlanReport", "PlanWatch", "WARMUP_STEPS", "MEASURED_STEPS", "trainer_layout"]

#: optimizer steps left out before measuring, and steps measured after them
WARMUP_STEPS = 2
MEASURED_STEPS = 5

logger = get_logger(__name__)

_STAGES = {"single": 0, "ddp": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp": 3}
_OPTIMIZERS = {torch.optim.Adam: "adam", torch.optim.AdamW: "adamw"}


@dataclass(frozen=True, kw_only=True)
class PlanReport:
    """What this job measured over its first steps, beside what the plan said for its layout. A value that is
    missing is None, and ``missing`` says why."""

    layout: str = ""
    """The planner's name of the layout that ran (``"zero3"``, ``"ddp+tp2"``)."""
    hardware: str = ""
    """What it was planned on (``"2xH100-80GB (nvlink)"``, ``"2 CPU processes"``)."""
    steps: int = 0
    """Optimizer steps measured (after ``WARMUP_STEPS`` of warm-up)."""
    measured_seconds: float | None = None
    """Median seconds of one optimizer step."""
    planned_seconds: float | None = None
    """The plan's step time for this layout (the model's, never corrected by an earlier measurement)."""
    measured_peak_bytes: int | None = None
    """``torch.cuda.max_memory_allocated`` over the measured steps; None on the CPU."""
    planned_peak_bytes: int | None = None
    """The plan's peak allocated bytes (``MemoryBreakdown.allocated``)."""
    time_model: str = ""
    """Where the plan's rates came from (``"the H100-80GB profile"``)."""
    case: str = ""
    """The ``convoy.plan.speed.observed.case_key`` the measurement was kept under ("" when it was not)."""
    planned_from: str = ""
    """Where the plan comes from when ``convoy plan`` cannot print it (CPU processes); "" for a board's plan."""
    busy: str = ""
    """How busy the machine was while the steps were measured, when it was ("load 5.3 on 2 cores"); "" else."""
    missing: str = ""
    """Why a value is None, or the measurement was not kept ("" when nothing is missing)."""
    compiled: str = ""
    """What torch.compile did by the end of the measured steps (``"compiled: 4 graphs, 0 breaks"``;
    ``convoy.train.parallel.compile.CompileWatch``), "" when nothing is compiled."""

    def lacking(self, why: str) -> PlanReport:
        """This report with ``why`` added to what it lacks."""
        return replace(self, missing=f"{self.missing}; {why}" if self.missing else why)

    @property
    def time_ratio(self) -> float | None:
        """planned / measured (1.08: the plan said 8 % more than measured)."""
        if self.planned_seconds is None or not self.measured_seconds:
            return None
        return self.planned_seconds / self.measured_seconds

    @property
    def memory_ratio(self) -> float | None:
        if self.planned_peak_bytes is None or not self.measured_peak_bytes:
            return None
        return self.planned_peak_bytes / self.measured_peak_bytes

    def describe(self) -> str:
        """The one line the Accelerator logs: ``step 5.0 ms, planned 4.1 ms (ran 22 % slower than planned); peak
        1.2 GiB, planned 1.1 GiB (9 % more than planned) -- zero3 on 2xH100-80GB, steps 3-7``."""
        if self.measured_seconds is None:
            return f"no step time measured yet: {self.missing}"
        first = WARMUP_STEPS + 1
        steps = f"steps {first}-{first + self.steps - 1}"
        if self.busy:
            steps += f", measured while the machine was busy ({self.busy})"
        step = f"step {format_seconds(self.measured_seconds)}"
        if self.compiled:
            steps += f"; {self.compiled}"
        if self.planned_seconds is None:
            return f"{step} ({steps}); no plan: {self.missing}"
        line = f"{step}, planned {format_seconds(self.planned_seconds)} " \
               f"(ran {_versus(self.measured_seconds, self.planned_seconds, 'slower', 'faster')})"
        if self.measured_peak_bytes is not None and self.planned_peak_bytes is not None:
            peak, planned = (format_bytes(b, binary=True) for b in (self.measured_peak_bytes, self.planned_peak_bytes))
            line += f"; peak {peak}, planned {planned} " \
                    f"({_versus(self.measured_peak_bytes, self.planned_peak_bytes, 'more', 'less')})"
        line += f" -- {self.layout} on {self.hardware}, {steps}"
        return f"{line}; planned {self.planned_from}" if self.planned_from else line

    @property
    def logged(self) -> bool:
        """True when ``describe()`` is the info line (a plan to compare with); else it is logged at debug."""
        return self.measured_seconds is not None and self.planned_seconds is not None


def _versus(measured: float, planned: float, more: str, less: str) -> str:
    """The measurement against the plan in a user's words, relative to the plan: ``22 % slower than planned``,
    ``2.5x faster than planned``, ``as planned``; never in scientific notation (``190x``, ``1,200x``)."""
    if not planned or not measured:
        return "?"
    ratio = measured / planned
    if 0.995 <= ratio <= 1.005:
        return "as planned"
    word, times = (more, ratio) if ratio > 1 else (less, 1 / ratio)
    if 0.5 <= ratio <= 2:
        return f"{abs(ratio - 1) * 100:.0f} % {word} than planned"
    return f"{times:.1f}x {word} than planned" if times < 10 else f"{times:,.0f}x {word} than planned"


def _busy(processes: int) -> str:
    """``"load 5.3 on 2 cores"`` when the 1-minute load average is above the cores this process may run on and the
    job's own ``processes`` together, else "" (and "" where the system has no load average)."""
    import os

    try:
        load = os.getloadavg()[0]
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    except OSError:
        return ""
    return f"load {load:.1f} on {cores} core{'s' if cores > 1 else ''}" if load > max(cores, processes) else ""


def trainer_layout(strategy: Any, *, accumulation: int) -> tuple[Candidate, int]:
    """The planner's candidate for the layout ``strategy`` runs (its name, ZeRO stage, degrees, micro-batches per
    optimizer step, offload), and how many pipeline micro-batches one forward's batch is cut into (1 without pp).

    The trainer's realisation of each candidate is ``convoy.train.strategies.auto.runs_in_trainer``'s, read back:
    dp x tp is FSDP2 (zero3), dp x pp is DDP, ZeRO-1 or FSDP2 per stage (zero2 with pp); the pipeline's schedule
    and stages per rank are the layout's."""
    world = strategy.context.world_size
    options = ParallelOptions.parse(strategy.context.options)  # the pipeline's and cpu_offload, where given
    name = strategy.name
    chunks = 1
    schedule: dict[str, Any] = {}
    if name in _STAGES:
        stage = _STAGES[name]
        dims = ParallelDims() if world == 1 else (
            ParallelDims(dp_shard=world) if stage == 3 else ParallelDims(dp_replicate=world))
    elif name in ("parallel", "tp", "pp"):
        d, engine = strategy.dims, strategy.dp_engine
        if not d.dp_enabled:
            stage = 0
        elif d.pp_enabled:  # FSDP2 per stage (fsdp, zero2) is the planner's zero2 with pp
            stage = {"ddp": 0, "zero1": 1}.get(engine, 2)
        else:
            stage = {"fsdp": 3, "zero2": 2, "zero1": 1}.get(engine, 0)
        sharded = stage == 3 or (stage == 2 and d.pp_enabled)
        dims = d if sharded else ParallelDims(dp_replicate=d.dp, tp=d.tp, pp=d.pp)
        if d.pp_enabled:
            config = options.pipeline()
            chunks = config.microbatches or d.pp * config.local_stages()
            schedule = {"pp_schedule": config.schedule, "pp_stages_per_rank": config.local_stages()}
    else:
        raise NotSupportedYetError(f"strategy {name!r} is not one the planner lays out; it plans single, ddp, "
                                   "zero1-3, fsdp and parallel")
    hsdp = stage == 3 and dims.hsdp_enabled
    base = "hsdp" if hsdp else {0: "ddp" if dims.dp_enabled else "single", 1: "zero1", 2: "zero2", 3: "zero3"}[stage]
    offload = bool(options.cpu_offload)
    parts = [base] if dims.dp_enabled or dims.is_trivial or dims.cp_enabled else []
    parts += [f"cp{dims.cp}"] * dims.cp_enabled + [f"tp{dims.tp}"] * dims.tp_enabled
    parts += [f"pp{dims.pp}"] * dims.pp_enabled + ["offload"] * offload
    layout = Layout(dims=dims, zero_stage=stage, offload=offload, microbatches=accumulation * chunks, **schedule)
    return Candidate(name="+".join(parts), strategy=base, layout=layout), chunks


def _model_spec(model: Any) -> ModelSpec:
    """``model`` as the planner reads it: a transformers model by its config (what ``convoy plan config.json``
    reads), else by its modules."""
    config = getattr(model, "config", None)
    if config is not None and callable(getattr(config, "to_dict", None)):
        try:
            return resolve_model(config.to_dict())
        except Exception:  # noqa: BLE001 -- a config the planner (or transformers on the meta device) cannot read
            pass  # the module itself, then
    return describe_module(model, name=type(model).__name__)


def _run_spec(model: Any, optimizer: Any, *, precision: str, batch: tuple[int, int], chunks: int,
              recompute: str = "none", compile: str = "none", fp8: str = "none") -> RunSpec:
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer holds the local one
    kind = _OPTIMIZERS.get(type(inner))
    if isinstance(inner, torch.optim.SGD):
        kind = "sgd-momentum" if any(g.get("momentum") for g in inner.param_groups) else "sgd"
    config = getattr(model, "config", None)
    eager = getattr(config, "_attn_implementation", None) == "eager"
    return RunSpec(seq_len=batch[1], micro_batch=max(1, batch[0] // chunks), precision=precision,
                   optimizer=kind or "adamw", recompute=recompute, attention="eager" if eager else "flash",
                   compile=compile, fp8=fp8)


def _hardware(device: torch.device, context: Any) -> Hardware:
    per_node = context.local_world_size if context.local_world_size > 0 else context.world_size
    nodes = context.world_size // per_node if context.world_size % per_node == 0 else 1
    per_node = context.world_size // nodes
    if device.type == "cuda":
        gpu = lookup_gpu(torch.cuda.get_device_name(device))  # PlanError for a board the table lacks
        gpu = replace(gpu, memory_bytes=int(torch.cuda.get_device_properties(device).total_memory))
    elif device.type == "cpu":
        gpu = replace(CPU, memory_bytes=device_memory_bytes("cpu", per_node))
    else:
        raise NotSupportedYetError(f"the planner has no rates for {device.type} devices")
    intra = "nvlink" if gpu.nvlink_gbs is not None and per_node > 1 else "pcie"
    return Hardware(gpu=gpu, gpus_per_node=per_node, nodes=nodes, intra=intra)


def _rates_source(kind: str, gpu: str) -> str:
    return {"calibrated": "rates measured on this machine", "profile": f"the {gpu} profile",
            "modeled": f"the shape-aware model of the {gpu} datasheet"}.get(kind, f"the {gpu} datasheet")


def _input_shape(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, int] | None:
    """(batch, sequence) of a forward's input: ``input_ids``, else its first tensor; a 2-D float input is (batch,
    features), one position per sample."""
    first = kwargs.get("input_ids")
    if not isinstance(first, torch.Tensor):
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
    if first is None or first.dim() == 0:
        return None
    positions = first.shape[1] if first.dim() >= 3 or (first.dim() == 2 and not first.is_floating_point()) else 1
    return int(first.shape[0]), int(positions)


_STARTED: list[OpCounter] = []  # the operator counters started in this process (their dispatch mode is thread-wide)


def _stop_earlier_counters() -> None:
    """A new watch (a new Accelerator: the next test, a notebook's cell run again) leaves the counting mode an
    earlier one left on: a loop that ended one step after the counter started kept it on for the rest of the
    process, where dynamo then compiled nothing ("found no compiled frames")."""
    while _STARTED:
        counter = _STARTED.pop()
        if counter.counting:
            counter.stop()


class PlanWatch:
    """Measures the first steps and, once they are done, compares them with the plan (see the module docstring).
    ``job()`` gives the built strategy and the accumulation steps when the report is made."""

    def __init__(self, job: Callable[[], tuple[Any, int]], *, main_process: bool,
                 compiled: Callable[[], str] | None = None) -> None:
        self._job = job
        self._main = main_process
        self._compiled = compiled  # the compile summary when the run compiles (CompileWatch.summary)
        self._model: Any = None
        self._optimizer: Any = None
        self._hooks: list[Any] = []
        self._batch: tuple[int, int] | None = None
        self._steps = 0
        self._device: torch.device | None = None
        self._last = 0.0
        self._times: list[float] = []
        self._report: PlanReport | None = None
        self._counter: OpCounter | None = None
        self._round_trip = (0.0, 0.0, math.inf)
        _stop_earlier_counters()

    def watch_model(self, model: Any, prepared: Any, device: torch.device) -> None:
        """Plan ``model`` (the module given to ``prepare``; read when the report is made) and watch the inputs
        ``prepared`` (what ``prepare`` returned) is called with."""
        if self._model is not None or self._report is not None:
            return  # the first model is the one planned
        self._model, self._device = model, device
        # a compiled model runs no operator one by one, and dynamo refuses a frame under the counter's dispatch mode
        if device.type == "cpu" and self._compiled is None and not _compiled(prepared):
            self._counter = OpCounter()
        if isinstance(prepared, torch.nn.Module):
            self._hooks.append(prepared.register_forward_pre_hook(_InputHook(self), with_kwargs=True))
        elif callable(getattr(prepared, "forward", None)):  # a pipeline: its call runs forward and backward
            self._hooks.append(_ForwardWrap(prepared, _InputHook(self)))

    def watch_optimizer(self, optimizer: Any) -> None:
        """Count ``optimizer``'s steps (the first optimizer prepared: one step of it is one training step)."""
        if self._optimizer is not None or self._report is not None:
            return
        if not callable(getattr(optimizer, "register_step_post_hook", None)):
            self._report = PlanReport(missing=f"{type(optimizer).__name__} has no step hooks to time steps by")
            return
        self._optimizer = optimizer
        self._hooks.append(optimizer.register_step_post_hook(self._on_step))

    def report(self) -> PlanReport:
        if self._report is not None:
            return self._report
        if self._optimizer is None:
            return PlanReport(missing="no optimizer prepared yet: the report times optimizer steps")
        return PlanReport(missing=f"{self._steps} of {WARMUP_STEPS + MEASURED_STEPS} optimizer steps done (the "
                                  f"first {WARMUP_STEPS} are warm-up); the report comes after the last")

    def __getstate__(self) -> dict[str, Any]:
        """A pickled Accelerator (Accelerate's checks pickle one) carries the report made so far; the copy watches
        nothing: the hooks stay with the objects of this process."""
        return {"report": self.report(), "main": self._main}

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(self, lambda: (None, 1), main_process=state["main"])
        self._report = state["report"]

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        if self._counter is not None and self._counter.counting:
            self._counter.stop()

    # --- hooks: cheap on every call, and they never raise into the loop --------------------------------------
    def _on_forward(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            shape = _input_shape(args, kwargs)
        except Exception:  # noqa: BLE001 -- an input the heuristic does not know: no shape
            return
        if shape is not None:
            old = self._batch or (0, 0)
            self._batch = (max(old[0], shape[0]), max(old[1], shape[1]))

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._steps += 1
        try:
            if self._counter is not None and self._steps == WARMUP_STEPS - 1:
                self._counter.start()  # the operators of the last warm-up step: what the CPU plan costs
                _STARTED.append(self._counter)
            if self._steps < WARMUP_STEPS:
                return
            if self._counter is not None and self._counter.counting:
                self._counter.stop()
                self._round_trip = _round_trip()  # every rank reaches this hook at the same step
            self._sync()
            now = time.perf_counter()
            if self._steps == WARMUP_STEPS:
                if self._device is not None and self._device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(self._device)
            else:
                self._times.append(now - self._last)
            self._last = now
            if self._steps == WARMUP_STEPS + MEASURED_STEPS:
                self.close()
                self._finish()
        except Exception as err:  # noqa: BLE001 -- see the module docstring: never fails the job
            self.close()
            self._report = PlanReport(missing=f"measuring failed ({_first_line(err)})")
            logger.debug("plan report: %s", self._report.missing)

    def _sync(self) -> None:
        if self._device is not None and self._device.type == "cuda":
            torch.cuda.synchronize(self._device)

    # --- the report ------------------------------------------------------------------------------------
    def _finish(self) -> None:
        measured = PlanReport(steps=len(self._times), measured_seconds=statistics.median(self._times),
                              compiled=self._compiled() if self._compiled is not None else "")
        if self._device is not None and self._device.type == "cuda":
            measured = replace(measured, measured_peak_bytes=int(torch.cuda.max_memory_allocated(self._device)))
        else:
            measured = measured.lacking(f"no allocator peak on the {(self._device or torch.device('cpu')).type}")
        try:
            report = self._planned(measured)
        except Exception as err:  # noqa: BLE001 -- see the module docstring: never fails the job
            why = f"no plan ({_first_line(err)})"
            report = measured.lacking(why)
            logger.debug("plan report: %s", why)
        self._report = report
        if self._main:
            with above_progress_bars():  # its own line, not glued to a bar the loop is drawing
                logger.log(logging.INFO if report.logged else logging.DEBUG, "convoy: %s", report.describe())

    def _planned(self, measured: PlanReport) -> PlanReport:
        if self._model is None:
            return measured.lacking("no model was prepared")
        if self._batch is None:
            return measured.lacking("no forward input with a batch dimension was seen")
        spec = _model_spec(self._model)
        strategy, accumulation = self._job()
        context = strategy.context
        device = self._device if self._device is not None else torch.device("cpu")
        candidate, chunks = trainer_layout(strategy, accumulation=accumulation)
        hw = _hardware(device, context)
        # fp8: the bf16 recipe around torchao's float8 GEMMs (RunSpec.fp8), as convoy plan prices them on a board
        # with float8 tensor cores
        fp8 = context.planned_fp8 if hw.gpu.fp8_tflops is not None else "none"
        mixed = "bf16" if context.mixed_precision == "fp8" else str(context.mixed_precision)
        precision = trainer_precision(mixed, candidate) if mixed in ("bf16", "fp16") else "fp32"
        # the trainer's recomputation (Accelerator(recompute=...)), or a transformers model's own checkpointing
        recompute = context.recompute if context.recompute != "none" else (
            "full" if checkpoints_itself(self._model) else "none")
        run = _run_spec(self._model, self._optimizer, precision=precision, batch=self._batch, chunks=chunks,
                        recompute=recompute, compile=context.compile, fp8=fp8)
        layout = candidate.layout
        name, uuid, version = device_identity(str(device))
        mem = memory_per_gpu(spec, run, layout)
        if device.type == "cpu":
            planned, kind, source = self._cpu_plan(layout, chunks, recompute)
        else:
            record = load_calibration(device_name=name, device_uuid=uuid, torch_version=version)
            rates = rates_for(hw.gpu, calibration=record if record is not None and record.has_rates else None)
            t = step_time(spec, run, layout, hw, rates=rates,
                          global_batch=layout.dims.dp * run.micro_batch * layout.microbatches)
            planned, kind, source = t.seconds, rates.kind, _rates_source(rates.kind, hw.gpu.name)
        n = hw.gpus_per_node * hw.nodes
        cpu = hw.gpu.kind == "cpu"
        gpus = f"{n} CPU process{'es' if n > 1 else ''}" if cpu else hw.describe()
        report = replace(measured, layout=candidate.name, hardware=gpus, planned_seconds=planned,
                         planned_peak_bytes=mem.allocated, time_model=source,
                         planned_from="from step 2's operators at this CPU's measured rates (convoy plan plans "
                                      "GPUs, not CPU processes)" if cpu else "",
                         busy=_busy(context.local_world_size) if cpu else "")
        if not self._main:
            return report
        key = case_key(spec, run, layout, hw)
        assert measured.measured_seconds is not None  # _finish measured it: the median of the timed steps
        seen = Observation(measured_s=measured.measured_seconds, planned_s=planned, planned_bytes=mem.allocated,
                           measured_bytes=measured.measured_peak_bytes, rates=kind, steps=measured.steps,
                           at=time.time())
        try:
            save_calibration(Calibration(device_name=name, device_uuid=uuid, torch_version=version,
                                         device_type=device.type, observed={key: seen.as_dict()}))
        except PlanError as err:
            logger.debug("plan report: the measurement is not kept for later plans (%s)", err)
            return report.lacking(f"not kept for later plans ({_first_line(err)})")
        return replace(report, case=key)


    def _cpu_plan(self, layout: Layout, chunks: int, recompute: str) -> tuple[float, str, str]:
        """(seconds, rates kind, where they come from) of the CPU step: the operators counted on the last warm-up
        step at this CPU's rates for a step that recomputes as ``recompute`` says (``convoy.plan.speed.cpu_step``),
        plus the pipeline's idle time for its schedule."""
        if self._counter is None:
            why = "the model is compiled" if self._compiled is not None or _compiled(self._model) else \
                "no operators were counted on the CPU"
            raise PlanError(f"{why}: the CPU plan prices the operators it counts one by one")
        ops = self._counter.ops
        mesh = None
        if ops.dtensor_ops:
            mesh = next((p.device_mesh for p in self._model.parameters() if hasattr(p, "device_mesh")), None)
        collective, transfer, bandwidth = self._round_trip
        context = self._job()[0].context
        local = context.local_world_size if context.local_world_size > 0 else context.world_size
        rates = replace(cpu_rates(mesh=mesh, processes=local, save=self._main), collective_seconds=collective,
                        transfer_seconds=transfer, collective_bytes_per_s=bandwidth)
        ops = replace(ops, fsdp_units=_fsdp_units(self._model) * layout.microbatches,
                      tp_modules=_tp_modules(self._model) * layout.microbatches)
        dims = layout.dims
        bubble = pipeline_bubble(dims.pp, chunks, schedule=layout.pp_schedule,
                                 stages_per_rank=layout.pp_stages_per_rank) if dims.pp_enabled else 0.0
        step = cpu_step(ops, rates, bubble=bubble, recompute=recompute)
        logger.debug("plan report: %s at %s: %s", ops, rates, step)
        return step.seconds, "cpu-ops", rates.describe(recompute)


def _compiled(model: Any) -> bool:
    """True when a module of ``model`` (or of a pipeline's stages) runs compiled (``Module.compile()``)."""
    modules = model.stage_modules() if callable(getattr(model, "stage_modules", None)) else [model]
    return any(getattr(m, "_compiled_call_impl", None) is not None for module in modules
               if isinstance(module, torch.nn.Module) for m in module.modules())


def _round_trip() -> tuple[float, float, float]:
    """(seconds per collective, per transfer, bytes/s) between the job's CPU processes (0, 0 and inf in a process
    alone)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return 0.0, 0.0, math.inf
    return round_trip_seconds()


def _fsdp_units(model: Any) -> int:
    """FSDP2 units in ``model`` (modules ``fully_shard`` made ``FSDPModule``s)."""
    from torch.distributed.fsdp import FSDPModule

    return sum(isinstance(m, FSDPModule) for m in model.modules())


def _tp_modules(model: Any) -> int:
    """Modules in ``model`` a tensor-parallel style split: parameters of their own that are DTensors, and the
    style's forward hooks (FSDP2's DTensor parameters have none; ``_fsdp_units`` costs those)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    def split(m: Any) -> bool:
        own = any(isinstance(p, DTensor) for p in m.parameters(recurse=False))
        return own and not isinstance(m, FSDPModule) and bool(m._forward_pre_hooks or m._forward_hooks)

    return sum(split(m) for m in model.modules())


class _ForwardWrap:
    """A forward pre-hook for an object that is no ``nn.Module`` (a pipeline): its ``forward`` attribute wraps the
    class's, until ``remove()``."""

    def __init__(self, target: Any, hook: _InputHook) -> None:
        self.target = target
        inner = type(target).forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            hook(target, args, kwargs)
            return inner(target, *args, **kwargs)

        target.forward = forward

    def remove(self) -> None:
        self.target.__dict__.pop("forward", None)


class _InputHook:
    """The forward pre-hook on the user's model: hands the inputs to the watch. The model may be copied or pickled
    while it is on (an EMA copy, ``torch.save(model)``): a copy shares it, a pickle holds a hook that does nothing,
    so neither drags the watch (the model again, the optimizer, the Accelerator) along."""

    def __init__(self, watch: PlanWatch | None) -> None:
        self.watch = watch

    def __call__(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self.watch is not None:
            self.watch._on_forward(args, kwargs)

    def __deepcopy__(self, memo: dict[int, Any]) -> _InputHook:
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (_InputHook, (None,))


def _first_line(err: BaseException) -> str:
    lines = str(err).strip().splitlines()
    return lines[0] if lines else type(err).__name__
