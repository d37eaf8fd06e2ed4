"""``strategy="auto"``: the planner's layout (data parallel, or tp/pp where the model and the loop allow), else a rule.

    layout = choose_strategy(world_size=4, num_parameters=7e9, device_bytes=80 * 2**30)
    layout.name, layout.reason   # ("zero3", "the model needs ~104.3 GiB for fp32 weights, gradients and Adam ...")
    layout = choose_strategy(world_size=2, num_parameters=n, device_bytes=b, planner=planner_hook(None),
                             model=model, options={})
    layout.name, layout.dims     # ("parallel", ParallelDims(tp=2)) when the planner's winner splits the model

The trainer's side of the planner. Here, where the model can be inspected, is decided what the planner may
split: tp degrees that divide the world size and for which the model has a tensor-parallel plan that keeps its
tied weights whole or split alike, with known, divisible attention heads; pp degrees only for a loop that trains
with ``loss = model(x, target=y)`` (``options["loss_fn"]``), at cuts that put tied weights on different
processes; no FSDP2 layout for a model ``fully_shard`` cannot wrap (``fsdp_limit``). The planner
(``convoy.plan.api.plan_for``, the function behind ``convoy plan`` too) compares the candidates; a model that
fits one process is never split. Its answer is an ``AutoLayout`` that ``convoy.train.strategies.build`` turns into
a strategy, with recompute and CPU offload applied when the planner turned those knobs.

``planner`` may be the user's: a callable taking the facts as keywords (those its signature names) and returning
an ``AutoLayout``, a ``(name, reason)`` pair, or None (``choose_strategy``'s own rule then answers). On a GPU,
rank 0 plans for its own device (``planner_hook(..., device="cuda:0")``), with the rates measured on it at the
model's shapes (``convoy.plan.speed.measure``, cached); without one, the CPU processes are planned as such.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from convoy.config.schema import DP_ENGINES
from convoy.errors import NotSupportedYetError, PlanError, StrategyError
from convoy.plan.api import recommend_for_module
from convoy.plan.candidates import Candidate, TrainerFacts
from convoy.plan.dims import ParallelDims, divisors
from convoy.plan.hardware import CPU, GpuSpec, lookup_gpu
from convoy.plan.model import ModelSpec, resolve_model
from convoy.plan.recommend import NOT_SPLIT, Recommendation
from convoy.plan.run import RunSpec
from convoy.plan.speed.rates import rates_for
from convoy.plan.speed.records import Calibration, time_model
from convoy.train.strategies.options import ParallelOptions

__all__ = ["AutoLayout", "TRAINER_STRATEGIES", "TRAINER_KNOBS", "choose_strategy", "planner_hook", "auto_strategy",
           "ConvoyPlanner", "TrainerPrecision",
           "trainer_precision", "measured_device", "shards_with_fsdp", "layout_shards_with_fsdp", "model_fsdp_limit",
           "dp_engine_for", "training_bytes", "device_memory_bytes", "tp_degrees", "pp_degrees", "model_head_counts"]

# fp32 weights (4) + gradients (4) + Adam's two moments (8); activations come on top, hence the headroom.
BYTES_PER_PARAMETER = 16
HEADROOM = 0.8

Planner = Callable[..., "AutoLayout | tuple[str, str] | None"]

#: the data-parallel strategies the training layer implements (convoy.train.strategies registry).
TRAINER_STRATEGIES = ("single", "ddp", "zero1", "zero2", "zero3", "fsdp", "hsdp")
#: what auto turns when nothing fits as asked (``convoy.plan.knobs``), as ``convoy plan`` does: activation
#: recomputation (the settings' ``recompute``), then CPU offload (``cpu_offload``), both applied by the strategies
TRAINER_KNOBS = ("recompute", "offload")
_SHAPE_KEYS = ("layers", "hidden", "heads", "vocab", "ffn", "kv_heads")


@dataclass(frozen=True, kw_only=True)
class AutoLayout:
    """What ``Accelerator(strategy="auto")`` builds: a strategy, its parallel degrees, and why."""

    name: str
    """The ``Accelerator(strategy=...)`` name: ``single``, ``ddp``, ``zero1``-``zero3``, or ``parallel`` (tp/pp)."""
    reason: str
    """One line saying why (printed by the Accelerator)."""
    dims: ParallelDims | None = None
    """The degrees for strategy ``parallel`` (tp or pp above 1); None for the data-parallel strategies."""
    dp_engine: str | None = None
    """How ``parallel`` realises dp > 1 (``fsdp``, ``zero2``, ``ddp``, ``zero1``); None when dp = 1 or not
    ``parallel``."""
    cpu_offload: bool = False
    """FSDP2's shards in host memory (``strategy_options["cpu_offload"]``): the knob the planner turned when
    nothing else fit."""
    recompute: str | None = None
    """Activation recomputation the planner turned on when nothing fit without it (``"selective"``, ``"full"``);
    None: the run's own setting stands."""

    def __post_init__(self) -> None:
        if (self.name == "parallel") != (self.dims is not None):
            raise StrategyError(f"layout {self.name!r}: parallel degrees go with strategy 'parallel' only")

    def describe(self) -> str:
        """``"zero3"``, ``"zero3 with cpu_offload"``, ``"zero3 with recompute='full'"``, or
        ``"parallel (dp=1,tp=2,pp=1)"``."""
        name = f"{self.name} ({self.dims.describe()})" if self.dims is not None else self.name
        turned = [f"recompute={self.recompute!r}"] if self.recompute else []
        turned += ["cpu_offload"] if self.cpu_offload else []
        return name + (f" with {' and '.join(turned)}" if turned else "")


def dp_engine_for(strategy: str, dims: ParallelDims) -> str | None:
    """The trainer's ``dp_engine`` (of strategy "parallel") for a candidate's strategy name at ``dims``: the one
    ``convoy launch --strategy NAME`` runs beside these degrees (``convoy.config.schema.DP_ENGINES``; hsdp: FSDP2
    on the 2-D dp mesh); None when dp = 1. A name it does not know (a custom planner's) replicates with DDP."""
    if not dims.dp_enabled:
        return None
    return {"hsdp": "fsdp", **DP_ENGINES}.get(strategy, "ddp")


#: the strategies the trainer runs with FSDP2's ``fully_shard`` (with data parallelism alone)
_FSDP_STRATEGIES = ("zero2", "zero3", "fsdp", "hsdp")


def shards_with_fsdp(strategy: str, dims: ParallelDims) -> bool:
    """True when the trainer runs ``strategy`` at ``dims`` on FSDP2: zero2, zero3/fsdp and hsdp over data
    parallelism alone (on any number of processes), and strategy "parallel" with dp > 1 whose engine is FSDP2's,
    or beside tp, whose DTensor weights every engine keeps with FSDP2 (``convoy.train.strategies.parallel``)."""
    if dims.is_trivial and not dims.hsdp_enabled:
        return strategy in _FSDP_STRATEGIES
    return dims.dp_enabled and (dims.tp_enabled or dp_engine_for(strategy, dims) in ("fsdp", "zero2"))


def layout_shards_with_fsdp(layout: AutoLayout) -> bool:
    """``shards_with_fsdp`` for an answer: a data-parallel name, or strategy "parallel" with its ``dp_engine``."""
    if layout.cpu_offload:
        return True
    if layout.dims is None:
        return layout.name in _FSDP_STRATEGIES
    d = layout.dims
    # ParallelStrategy's default engine
    engine = layout.dp_engine or ("zero1" if d.pp_enabled and not d.tp_enabled else "fsdp")
    return d.dp_enabled and (d.tp_enabled or engine in ("fsdp", "zero2"))


def _left_out(fsdp_limit: str) -> str:
    return f"FSDP2 layouts (zero2, zero3) were left out: it cannot shard this model ({fsdp_limit})."


def model_fsdp_limit(model: Any, options: Mapping[str, Any] | ParallelOptions) -> str | None:
    """Why FSDP2 cannot wrap ``model`` as the trainer would shard it (``fsdp_limit``); None when it can or
    ``model`` is no module (a config, a parameter count)."""
    if not isinstance(model, torch.nn.Module):
        return None
    from convoy.train.strategies.fsdp import fsdp_limit

    return fsdp_limit(model, ParallelOptions.parse(options).auto_wrap)


def training_bytes(num_parameters: int) -> int:
    return int(num_parameters) * BYTES_PER_PARAMETER


def device_memory_bytes(device_type: str, local_world_size: int = 1) -> int:
    """Memory one process can use: the GPU's free memory, or this machine's RAM shared by its processes."""
    if device_type == "cuda":
        free, _ = torch.cuda.mem_get_info()
        return int(free)
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        total = 16 * 2**30
    return int(total // max(1, local_world_size))


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def model_head_counts(model: Any) -> dict[str, int]:
    """Every head count the model states: its config's and its modules' (``name.attr`` -> count)."""
    from convoy.train.parallel.tensor import HEAD_ATTRS

    found: dict[str, int] = {}
    config = getattr(model, "config", None)
    for owner, prefix in [(config, "config")] + [(m, n or "model") for n, m in model.named_modules()]:
        for attr in HEAD_ATTRS:
            value = getattr(owner, attr, None)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                found[f"{prefix}.{attr}"] = value
    return found


def tp_degrees(model: Any, *, world_size: int, options: Mapping[str, Any] | ParallelOptions) -> tuple[int, ...]:
    """The tp degrees above 1 (dividing ``world_size``) that ``model`` can be split by; () when none."""
    if model is None or world_size < 2:
        return ()
    heads = model_head_counts(model)
    if not heads:  # the planner cannot cost tp, and a head count the split would break is unknown
        return ()
    from convoy.train.parallel.tensor import check_tp_plan, resolve_tp_plan

    config = ParallelOptions.parse(options)
    try:
        plan = resolve_tp_plan(model, config.tp_plan, sequence_parallel=config.sequence_parallel)
    except (StrategyError, NotSupportedYetError):
        return ()
    styles = {style for _, style in plan.styles}
    if not any(s.startswith("colwise") for s in styles) or not any(s.startswith("rowwise") for s in styles):
        return ()  # a lone split (e.g. nn.MultiheadAttention's out_proj beside its packed in_proj) is no tp plan
    out = []
    for tp in divisors(world_size)[1:]:
        if any(count % tp for count in heads.values()):
            continue
        try:
            check_tp_plan(model, plan, tp)
        except (StrategyError, NotSupportedYetError):  # the degree breaks a split, or this torch cannot run it
            continue
        out.append(tp)
    return tuple(out)


def pp_degrees(model: Any, *, world_size: int, options: Mapping[str, Any] | ParallelOptions) -> tuple[int, ...]:
    """The pp degrees above 1 ``model`` can be cut into, when ``options`` has ``loss_fn``; () otherwise."""
    given = ParallelOptions.parse(options)
    if model is None or world_size < 2 or given.loss_fn is None:
        return ()
    from convoy.train.parallel.pipeline import stage_boundaries
    from convoy.train.parallel.ties import find_ties, stages_on_one_process

    config = given.pipeline()  # bad pipeline options are the user's error: raise
    ties = find_ties(model)
    order = [name for name, _ in model.named_modules()]
    out = []
    for pp in divisors(world_size)[1:]:
        try:
            cut = stage_boundaries(model, pp * config.local_stages(), split_at=config.split_at, layers=config.layers)
        except StrategyError:
            continue
        if stages_on_one_process(ties, order, cut, pp) is None:  # the pipeline refuses a tie split on one process
            out.append(pp)
    return tuple(out)


def auto_strategy(*, num_parameters: int, world_size: int, device_bytes: int, precision: str = "fp32",
                  model: Any = None, tp_degrees: Collection[int] = (), pp_degrees: Collection[int] = (),
                  pipeline: bool = False, mixed_precision: str | None = None, device: str | None = None,
                  device_type: str | None = None, fsdp_limit: str | None = None, heads: int | None = None,
                  nodes: int = 1, recompute: str = "none", compile: str = "none", fp8: str = "none",
                  **kwargs: Any) -> AutoLayout | None:
    """The ``planner`` hook of ``choose_strategy``: the ``AutoLayout`` to build, or None when
    no layout the trainer runs fits (the caller's own rule then answers).

    - ``tp_degrees``, ``pp_degrees``: the degrees the trainer checked ``model`` can take. Without them only the
      data-parallel strategies are compared, for the parameter count alone; with them the planner reads
      ``model``'s shape (``heads=`` and the other shape keys in ``kwargs`` override it) and compares tp and pp.
    - ``pipeline``: the loop trains with ``model(x, target=y)``, so only pipeline layouts are compared.
    - ``mixed_precision`` (``"bf16"``/``"fp16"``): each candidate is costed in the recipe the trainer runs it in
      (``trainer_precision``) instead of ``precision``.
    - ``device`` (``"cuda:0"``): that GPU's table row and, for a model with a shape, rates measured on it
      (``convoy.plan.speed.measure``, cached per device and torch version). ``device_type="cpu"``: CPU processes,
      planned as such (``convoy.plan.hardware.CPU``).
    - ``fsdp_limit`` (why FSDP2 cannot wrap the model): the layouts it would shard are left out, and the reason
      says why.
    - ``compile``, ``fp8``: the run's ``torch.compile`` setting and float8 recipe; every layout is costed with them,
      as ``convoy plan --compile --fp8`` costs it (float8 only on a board with float8 tensor cores: elsewhere it
      runs emulated, which the planner does not price). The layout is chosen with them; they are not chosen here.
    """
    tp_degrees = tuple(t for t in tp_degrees if t > 1)
    pp_degrees = tuple(p for p in pp_degrees if p > 1)
    split = model is not None and bool(tp_degrees or pp_degrees)
    # the trainer's facts are the planner's inputs: convoy plan with the same facts gives the same answer
    facts = TrainerFacts(tp_degrees=tp_degrees, pp_degrees=pp_degrees, pipeline_only=pipeline and bool(pp_degrees),
                         fsdp=not fsdp_limit)
    if mixed_precision == "fp8":  # the bf16 recipe around float8's GEMMs (priced by fp8= below)
        mixed_precision = "bf16"
    if mixed_precision in ("bf16", "fp16"):
        precision = f"{mixed_precision}-autocast"
        kwargs = {**kwargs, "precision_for": TrainerPrecision(str(mixed_precision))}
    shape = {k: v for k, v in kwargs.items() if k in _SHAPE_KEYS} | ({"heads": heads} if heads else {})
    kwargs = {k: v for k, v in kwargs.items() if k not in _SHAPE_KEYS}
    timed = ""
    try:
        if split:
            spec = resolve_model(model, **shape)
        else:  # a bare parameter count: no shape, so no activations (what auto compared before tp and pp)
            spec = ModelSpec(name=f"{num_parameters:,} parameters", num_params=int(num_parameters))
        if device is not None and spec.has_shape:  # step times that rates at the model's shapes can improve
            run = RunSpec(precision=precision, **{k: kwargs[k] for k in ("seq_len", "micro_batch") if k in kwargs})
            gpu, calibration, timed = measured_device(device, spec, run, tp_degrees=(1, *tp_degrees))
            kwargs = {**kwargs, "calibration": calibration, **({"gpu": gpu} if gpu else {})}
        elif device is not None and device.startswith("cuda"):  # by its size alone: the GPU's row and profile
            kwargs = {**kwargs, **({"gpu": gpu} if (gpu := _table_row(device)) else {})}
        elif device_type == "cpu":
            kwargs = {**kwargs, "gpu": CPU}
        rec = recommend_for_module(spec, world_size=world_size, device_memory_bytes=device_bytes,
                                   precision=precision, allowed=None, facts=facts, knobs=TRAINER_KNOBS, nodes=nodes,
                                   recompute=recompute, compile=compile, fp8=_priced_fp8(fp8, kwargs.get("gpu")),
                                   **kwargs)
    except PlanError:
        return None
    return _as_layout(rec, pipeline=pipeline, timed=timed, left_out=_left_out(fsdp_limit) if fsdp_limit and
                      world_size > 1 else "")


def _priced_fp8(fp8: str, gpu: Any) -> str:
    """``fp8`` where the planned board has float8 tensor cores, else ``"none"`` (emulated float8 is not priced)."""
    if fp8 == "none" or gpu is None:
        return "none"
    spec = gpu if isinstance(gpu, GpuSpec) else lookup_gpu(str(gpu))
    return fp8 if spec.fp8_tflops is not None else "none"


def _as_layout(rec: Recommendation, *, pipeline: bool, timed: str, left_out: str) -> AutoLayout:
    """The planner's recommendation as the layout the strategy builder builds, and the one line saying why: the
    guide's case, the choice (and why not DDP), the knob turned when nothing fit as asked."""
    dims = rec.dims
    assert rec.row is not None and dims is not None  # recommend_for_module raises when nothing fits
    picked = (r for r in rec.reasons[1:] if r.startswith(("DDP ", "No layout fits as asked", "Turning ")))
    reason = " ".join([rec.reasons[0], *picked])
    not_split = [r for r in rec.reasons if r.startswith(NOT_SPLIT.split("{")[0])]  # case 1: tp/pp left out
    timed = ((f" Step times: {timed}." if timed else "") + (f" {left_out}" if left_out else "")
             + "".join(f" {r}" for r in not_split))
    hsdp = dims.hsdp_enabled
    turned = rec.recompute if "recompute" in rec.knob else None  # the knob the planner turned, if any
    if dims.is_trivial and not hsdp:
        return AutoLayout(name=rec.strategy or "single", reason=reason + timed, cpu_offload=rec.cpu_offload,
                          recompute=turned)
    if pipeline and dims.pp_enabled:
        reason += (" strategy_options has loss_fn (a loop that trains with model(x, target=y)), so only "
                   "pipeline layouts were compared.")
    if not rec.knob:
        reason += f" {rec.reasons[1]}"
    return AutoLayout(name="parallel", reason=f"{reason}{timed}", dims=dims, cpu_offload=rec.cpu_offload,
                      recompute=turned, dp_engine=dp_engine_for(rec.strategy or "ddp", dims))


#: the strategies that shard with FSDP2's ``MixedPrecisionPolicy`` (16-bit gathered weights) under mixed precision
_GATHER_16BIT = ("zero2", "zero3", "hsdp")


def trainer_precision(mixed_precision: str, candidate: Candidate) -> str:
    """The planner's recipe for ``candidate`` run by the Accelerator with ``mixed_precision`` ``"bf16"`` or
    ``"fp16"``: every strategy runs the forward under ``torch.autocast``; FSDP2 over the whole model (zero2,
    zero3/fsdp, hsdp, and strategy "parallel"'s dp x tp, whose candidate is zero3) also gathers 16-bit weights
    (``MixedPrecisionPolicy``), so it keeps no autocast weight copies and a 16-bit residual stream
    (``"bf16-fsdp"``); the others keep fp32 weights (``"bf16-autocast"``): single, ddp, zero1, and pipeline
    stages (FSDP2 per stage gathers fp32: the stages' traced dtypes stay those of the model)."""
    d = candidate.layout.dims
    gathers_16bit = candidate.strategy in _GATHER_16BIT and d.dp_enabled and not d.pp_enabled
    return f"{mixed_precision}-fsdp" if gathers_16bit else f"{mixed_precision}-autocast"


def measured_device(device: str, model: ModelSpec, run: RunSpec, *,
                    tp_degrees: tuple[int, ...] = (1,)) -> tuple[str | None, Calibration | None, str]:
    """What a plan knows of ``device`` beyond its free memory: its table row's name (a CUDA device the table
    has; None otherwise), its rates measured at ``model``'s shapes for each of ``tp_degrees`` (None when they
    cannot be: the GPU's shipped profile or the shape-aware model is kept), and a sentence saying which time model
    applies. Measuring is best effort: a failure (a full GPU, an unwritable cache) leaves the plan on those rates,
    never stops the job."""
    from convoy.plan.speed.measure import calibrate

    gpu = None
    try:
        if device.startswith("cuda"):
            try:
                gpu = lookup_gpu(torch.cuda.get_device_name(torch.device(device))).name
            except PlanError:
                pass  # a GPU the table lacks: the generic device, and the measured rates
        # this GPU only (peer=False): measuring the link would put a CUDA context on another rank's GPU
        record = calibrate(model, run, device=device, tp=tp_degrees, peer=False)
    except Exception as err:  # noqa: BLE001 -- see the docstring: the choice still stands without rates
        why = str(err).splitlines()[0] if str(err) else type(err).__name__
        return gpu, None, f"measuring {device} failed, {why}; {_unmeasured_rates(gpu)}"
    finally:
        if device.startswith("cuda"):
            try:  # the measurement's buffers (an out-of-memory one's too) go back to the GPU
                torch.cuda.empty_cache()
            except Exception:  # noqa: BLE001 -- a broken CUDA context: the fallback above stands
                pass
    return gpu, record, time_model(record)


def _unmeasured_rates(gpu: str | None) -> str:
    """What a plan times steps with when its device could not be measured: the table row's rates
    (``convoy.plan.speed.rates.rates_for``: its shipped profile, else the shape-aware model), or a generic device's."""
    if gpu is None:
        return "step times use the shape-aware model on a generic device"
    return f"step times use {rates_for(lookup_gpu(gpu)).describe()}"


@dataclass(frozen=True)
class TrainerPrecision:
    """``trainer_precision`` for one ``mixed_precision``: the ``precision_for`` of the plan (a candidate's recipe)."""

    mixed_precision: str

    def __call__(self, candidate: Candidate) -> str:
        return trainer_precision(self.mixed_precision, candidate)


@dataclass(frozen=True, kw_only=True)
class ConvoyPlanner:
    """convoy's planner as the ``planner`` of ``choose_strategy`` (``planner_hook``): ``auto_strategy`` for this
    run's precision and device, called with every fact ``choose_strategy`` has."""

    mixed_precision: str | None = None
    device: str | None = None
    device_type: str | None = None
    recompute: str = "none"
    """The run's activation recomputation (``Accelerator(recompute=...)``), planned as asked."""
    compile: str = "none"
    """The run's ``torch.compile`` setting (``Accelerator(compile=...)``), planned as asked."""
    fp8: str = "none"
    """The run's float8 recipe (``Accelerator(mixed_precision="fp8", fp8_recipe=...)``), planned as asked."""

    def __call__(self, *, num_parameters: int, world_size: int, device_bytes: int, model: Any = None,
                 tp_degrees: Collection[int] = (), pp_degrees: Collection[int] = (), pipeline: bool = False,
                 heads: int | None = None, nodes: int = 1, fsdp_limit: str | None = None) -> AutoLayout | None:
        return auto_strategy(num_parameters=num_parameters, world_size=world_size, device_bytes=device_bytes,
                             model=model, tp_degrees=tp_degrees, pp_degrees=pp_degrees, pipeline=pipeline,
                             mixed_precision=self.mixed_precision, device=self.device, device_type=self.device_type,
                             fsdp_limit=fsdp_limit, heads=heads, nodes=nodes, recompute=self.recompute,
                             compile=self.compile, fp8=self.fp8)


def planner_hook(mixed_precision: str | None, *, device: str | None = None,
                 device_type: str | None = None, recompute: str = "none", compile: str = "none",
                 fp8: str = "none") -> ConvoyPlanner:
    """convoy's planner as the ``planner`` of ``choose_strategy``, for this run's precision (the Accelerator's
    ``mixed_precision``: each candidate is costed in the recipe the trainer runs it in, ``trainer_precision``)
    on ``device`` (its table row and measured rates, see ``auto_strategy``; None: a generic device, or with
    ``device_type="cpu"`` CPU processes), with the run's ``recompute``, ``compile`` and float8 recipe ``fp8``."""
    return ConvoyPlanner(mixed_precision=str(mixed_precision) if mixed_precision else None, device=device,
                         device_type=device_type, recompute=recompute, compile=compile, fp8=fp8)


def _table_row(device: str) -> str | None:
    """The hardware table's name for the CUDA ``device`` (None for a board the table lacks)."""
    try:
        return lookup_gpu(torch.cuda.get_device_name(torch.device(device))).name
    except (PlanError, RuntimeError, AssertionError):  # a board the table lacks, or no CUDA after all
        return None


def _ask(planner: Planner, *, num_parameters: int, world_size: int, device_bytes: int, model: Any,
         tp_degrees: tuple[int, ...], pp_degrees: tuple[int, ...], pipeline: bool, heads: int | None, nodes: int,
         fsdp_limit: str | None) -> AutoLayout | None:
    """Ask ``planner`` for a layout: convoy's own (``ConvoyPlanner``) by a plain call with every fact; a planner of
    the user's with the keywords its signature takes (``heads``, ``nodes`` and ``fsdp_limit`` only when known,
    above 1 and set), answering a layout or a ``(name, reason)`` pair."""
    if isinstance(planner, ConvoyPlanner):
        return planner(num_parameters=num_parameters, world_size=world_size, device_bytes=device_bytes, model=model,
                       tp_degrees=tp_degrees, pp_degrees=pp_degrees, pipeline=pipeline, heads=heads, nodes=nodes,
                       fsdp_limit=fsdp_limit)
    kwargs = {"num_parameters": num_parameters, "world_size": world_size, "device_bytes": device_bytes,
              "model": model, "tp_degrees": tp_degrees, "pp_degrees": pp_degrees, "pipeline": pipeline,
              **({"heads": heads} if heads else {}), **({"nodes": nodes} if nodes > 1 else {}),
              **({"fsdp_limit": fsdp_limit} if fsdp_limit else {})}
    params: Mapping[str, inspect.Parameter]
    try:
        params = inspect.signature(planner).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        params = {}
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    answer = planner(**kwargs)
    if answer is None or isinstance(answer, AutoLayout):
        return answer
    name, reason = answer
    return AutoLayout(name=name, reason=reason)


def choose_strategy(*, world_size: int, num_parameters: int, device_bytes: int, planner: Planner | None = None,
                    model: Any = None, options: Mapping[str, Any] | None = None, nodes: int = 1,
                    split: bool = True) -> AutoLayout:
    """The layout ``"auto"`` stands for, and one line saying why. Pure (given ``planner``).

    ``model`` and ``options`` (the ``strategy_options``) decide which tp and pp degrees the planner may
    propose (see the module docstring; ``split=False``: none, as the job gave its degrees); without ``model``
    only data-parallel strategies are compared. A ``model`` FSDP2 cannot wrap (``model_fsdp_limit``) never gets
    an FSDP2 layout, whoever proposes it (the planner's candidates are filtered; a ``planner`` of the user's that
    answers one is not followed). ``nodes``: the machines the ``world_size`` processes run on, evenly (the
    planner keeps tp inside one and costs collectives that cross them on the network); given to the planner when
    above 1.
    """
    config = ParallelOptions.parse(options or {})  # what auto reads of the options: the tp, pp and FSDP2 ones
    limit = model_fsdp_limit(model, config)
    if not split:
        model = None
    if planner is not None:
        tps = tp_degrees(model, world_size=world_size, options=config)
        pps = pp_degrees(model, world_size=world_size, options=config)
        split = bool(tps or pps)
        heads = _config_heads(model) if split else None
        answer = _ask(planner, num_parameters=num_parameters, world_size=world_size, device_bytes=device_bytes,
                      model=model if split else None, tp_degrees=tps, pp_degrees=pps,
                      pipeline=config.loss_fn is not None, heads=heads, nodes=nodes, fsdp_limit=limit)
        if answer is not None and limit and layout_shards_with_fsdp(answer):
            answer = None  # a planner that did not take fsdp_limit: the rule below answers instead
        pipeline_loop = config.loss_fn is not None
        if pipeline_loop and (not pps or (answer is not None and (answer.dims is None or not answer.dims.pp_enabled))):
            # the loop's model(x, target=y) runs unsplit too (strategy "parallel" at pp=1)
            return _whole_model_per_process(world_size, answer, pipeline_fits=bool(pps))
        if answer is not None:
            return answer
        if pps and pipeline_loop:
            return _most_split_pipeline(world_size, pps)
    need = training_bytes(num_parameters)
    if world_size == 1:
        return AutoLayout(name="single", reason=f"one process; the model needs ~{_gib(need)} for weights, "
                                                "gradients and Adam state")
    if need <= HEADROOM * device_bytes:
        return AutoLayout(name="ddp", reason=(
            f"the model needs ~{_gib(need)} for fp32 weights, gradients and Adam state, which fits one device "
            f"({_gib(device_bytes)} available), so each of the {world_size} processes keeps a full replica (DDP)"
            + (f". {_left_out(limit)}" if limit else "")))
    if limit:
        return AutoLayout(name="zero1", reason=(
            f"the model needs ~{_gib(need)} for fp32 weights, gradients and Adam state, more than {HEADROOM:.0%} of "
            f"one device ({_gib(device_bytes)}), but FSDP2 cannot shard it ({limit}), so only the optimizer state "
            f"is sharded over {world_size} processes (zero1)"))
    return AutoLayout(name="zero3", reason=(
        f"the model needs ~{_gib(need)} for fp32 weights, gradients and Adam state, more than {HEADROOM:.0%} of "
        f"one device ({_gib(device_bytes)}), so it is sharded over {world_size} processes (FSDP2, zero3)"))


def _whole_model_per_process(world_size: int, answer: AutoLayout | None, *, pipeline_fits: bool = False
                             ) -> AutoLayout:
    """The loop trains with ``model(x, target=y)`` and the model is not split into stages: no pipeline degree fits
    this job (one process, or too few layers), or the planner chose a layout without one (``pipeline_fits``: one
    was possible; a model that fits under data parallelism is not split). Strategy "parallel" at pp = 1 keeps
    that call working (``SingleStage``), with the planner's tp or data-parallel choice."""
    if answer is not None and answer.dims is not None:
        return answer  # tp chosen: strategy "parallel" runs the loop at pp = 1 as well
    dims = ParallelDims(dp_replicate=world_size)
    chosen = answer.name if answer is not None and answer.name != "single" else "ddp"
    engine = dp_engine_for(chosen, dims)
    why = answer.reason if answer is not None else "no planner answer"
    unsplit = ("no pipeline is needed" if pipeline_fits else
               f"no pipeline layout was asked for or fits {world_size} process(es)")
    return AutoLayout(name="parallel", dims=dims, dp_engine=engine, reason=(
        f"strategy_options has loss_fn (a loop that trains with model(x, target=y)) and {unsplit}, so each "
        f"process runs the whole model (pp=1){f' with {engine}' if engine else ''}: {why}"))


def _most_split_pipeline(world_size: int, pps: tuple[int, ...]) -> AutoLayout:
    """The loop trains with ``model(x, target=y)``, which only a pipeline runs, and no pipeline layout fits by
    the planner's estimate (which guesses the sequence length and micro-batch): the most split one is used."""
    pp = max(pps)
    dims = ParallelDims(dp_replicate=world_size // pp, pp=pp)
    return AutoLayout(name="parallel", dims=dims, dp_engine="zero1" if dims.dp_enabled else None, reason=(
        f"strategy_options has loss_fn (a loop that trains with model(x, target=y)), so only pipeline layouts "
        f"are compared, and none fits by the planner's estimate (sequence 2048, micro-batch 1); the most split "
        f"one, pp={pp}, is used. Give parallelism= to choose the degrees yourself."))


def _config_heads(model: Any) -> int | None:
    """The attention heads a Hugging Face-style config states (wins over what the planner finds in modules)."""
    from convoy.train.parallel.tensor import model_num_heads

    return model_num_heads(model) if model is not None else None
