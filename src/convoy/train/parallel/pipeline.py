"""Pipeline parallelism on ``torch.distributed.pipelining``: stages, schedules, micro-batches.

    from convoy.train.parallel.pipeline import PipelineConfig, PipelineModule, stage_boundaries
    stage_boundaries(model, 2)                                   # ("layers.2",): stage 1 starts there
    pipe = PipelineModule(model, config=PipelineConfig(schedule="1f1b", microbatches=4),
                          loss_fn=F.cross_entropy, group=pp_group)
    loss = pipe(x, target=y)    # forward and backward of every micro-batch; grads are ready for opt.step()

The model is split by tracing (``torch.distributed.pipelining.pipeline`` with ``SplitPoint.BEGINNING`` at
each boundary), so the model's own ``forward`` needs no change; the boundaries are either given by name
(``split_at=("layers.4",)``) or cut evenly from the model's largest ``nn.ModuleList`` (``layers=`` names
another one). Tracing happens on the first call, with the first micro-batch as the example, so every
batch afterwards must have the same shape (use ``drop_last``). Stage parameters are the model's own
``Parameter`` objects: an optimizer built on the whole model keeps working (other stages' parameters get
no gradient and are skipped). Each process still builds the whole model before splitting. A weight shared by
modules on several stages (a tied embedding and head, ``convoy.train.parallel.ties``) is the model's own tensor
on each, made equal at build, and its gradient is summed over those stages after each training call, or once
before each step of an optimizer passed to ``hook_optimizer`` (what the Accelerator does).

Schedules (``SCHEDULES``): ``gpipe``, ``1f1b``, ``interleaved_1f1b`` and ``looped_bfs`` (the last two hold
several stages per process, ``stages_per_rank``, default 2). Gradients are the mean over micro-batches
(the schedule scales them), so with a mean loss they equal the full-batch gradient.

A transformers causal LM trains the way transformers' loops call it: ``out = pipe(input_ids=ids, labels=labels)``
then ``out.loss`` (a ``PipelineOutput``); the labels are the last stage's target and the model's own causal-LM loss
(shifted labels) is the pipeline's loss, no ``loss_fn`` needed; its ``use_cache`` is off while it is traced.
Keyword inputs are passed on as the forward's leading positional arguments (``input_ids``, ``attention_mask``).

Naive model parallelism (one process, layers spread over its devices) is ``pp`` with one micro-batch and
no second process; convoy does not move layers between devices in one process, see docs/parallelism.md.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_map_only

from convoy.errors import ConvoyError, NotSupportedYetError, StrategyError
from convoy.train.parallel.causal_lm import (
    PipelineOutput,
    cache_off,
    causal_lm_loss,
    count_targets,
    is_causal_lm,
    trace_failure,
)
from convoy.train.parallel.ties import TiedCopies, find_ties

__all__ = ["SCHEDULES", "PipelineConfig", "PipelineModule", "SingleStage", "stage_boundaries", "find_layers"]

#: schedule name -> (class name in torch.distributed.pipelining, several stages per process)
SCHEDULES: dict[str, tuple[str, bool]] = {
    "gpipe": ("ScheduleGPipe", False),
    "1f1b": ("Schedule1F1B", False),
    "interleaved_1f1b": ("ScheduleInterleaved1F1B", True),
    "looped_bfs": ("ScheduleLoopedBFS", True),
}


@dataclass(frozen=True, kw_only=True)
class PipelineConfig:
    """How to cut the model and run the micro-batches."""

    schedule: str = "1f1b"
    """One of ``SCHEDULES``."""
    microbatches: int | None = None
    """Micro-batches per step; must divide the batch. Default: the number of stages."""
    stages_per_rank: int | None = None
    """Stages held by each process; only multi-stage schedules take more than 1 (default 2 for them)."""
    split_at: tuple[str, ...] | None = None
    """Module names where stages 1, 2, ... begin, in model order. Default: cut ``layers`` evenly."""
    layers: str | None = None
    """Name of the ``nn.ModuleList`` to cut evenly; default: the model's largest one."""

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise StrategyError(f"pipeline schedule {self.schedule!r} is unknown; choose one of {', '.join(SCHEDULES)}")
        for name in ("microbatches", "stages_per_rank"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise StrategyError(f"pipeline {name}={value!r} must be a whole number >= 1")
        multi = SCHEDULES[self.schedule][1]
        if not multi and self.stages_per_rank not in (None, 1):
            raise StrategyError(f"schedule {self.schedule!r} runs one stage per process; use interleaved_1f1b "
                                f"or looped_bfs for stages_per_rank={self.stages_per_rank}")
        if self.split_at is not None and not isinstance(self.split_at, tuple):
            object.__setattr__(self, "split_at", tuple(self.split_at))

    def local_stages(self) -> int:
        if self.stages_per_rank is not None:
            return self.stages_per_rank
        return 2 if SCHEDULES[self.schedule][1] else 1

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> PipelineConfig:
        """Build from ``strategy_options`` keys ``pp_schedule``, ``pp_microbatches``, ``pp_stages_per_rank``,
        ``pp_split_at``, ``pp_layers``."""
        keys = {"pp_schedule": "schedule", "pp_microbatches": "microbatches", "pp_stages_per_rank": "stages_per_rank",
                "pp_split_at": "split_at", "pp_layers": "layers"}
        kwargs = {field: options[key] for key, field in keys.items() if key in options}
        if isinstance(kwargs.get("split_at"), str):
            kwargs["split_at"] = tuple(s.strip() for s in kwargs["split_at"].split(",") if s.strip())
        return cls(**kwargs)


def find_layers(model: nn.Module, name: str | None = None) -> tuple[str, int]:
    """(name, length) of the ``nn.ModuleList`` to cut: ``name`` if given, else the longest one."""

    lists = [(n, len(m)) for n, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m)]
    if name is not None:
        found = [entry for entry in lists if entry[0] == name]
        if not found:
            raise StrategyError(f"pipeline layers={name!r} is not a non-empty nn.ModuleList of "
                                f"{type(model).__name__}; lists: {[n for n, _ in lists] or 'none'}")
        return found[0]
    if not lists:
        raise StrategyError(f"{type(model).__name__} has no nn.ModuleList of layers to cut into stages; "
                            f"pass split_at=('<module name>', ...)")
    return max(lists, key=lambda entry: entry[1])


def stage_boundaries(model: nn.Module, num_stages: int, *, split_at: Sequence[str] | None = None,
                     layers: str | None = None) -> tuple[str, ...]:
    """Module names where stages 1..num_stages-1 begin; ``StrategyError`` when the cut is impossible."""
    if num_stages < 1:
        raise StrategyError(f"pipeline stages={num_stages}: need at least 1")
    names = [n for n, _ in model.named_modules() if n]
    if split_at is not None:
        split_at = tuple(split_at)
        unknown = [s for s in split_at if s not in names]
        if unknown:
            raise StrategyError(f"pipeline split_at {unknown[0]!r} is not a module of {type(model).__name__}")
        if len(split_at) != num_stages - 1:
            raise StrategyError(f"{num_stages} stages need {num_stages - 1} split points, got {len(split_at)} "
                                f"({', '.join(split_at) or 'none'})")
        order = [names.index(s) for s in split_at]
        if order != sorted(order) or len(set(order)) != len(order):
            raise StrategyError(f"pipeline split_at {list(split_at)} must be distinct and in the model's order")
        return split_at
    list_name, count = find_layers(model, layers)
    if num_stages > count:
        raise StrategyError(f"{num_stages} pipeline stages are more than the {count} layers of "
                            f"{list_name!r}; choose pp x stages_per_rank <= {count}")
    return tuple(f"{list_name}.{(i * count) // num_stages}" for i in range(1, num_stages))


def _pipelining_module():
    import torch.distributed.pipelining as pipelining

    return pipelining


class PipelineModule:
    """This process's stages of a model and the schedule that runs them. Built on the first call.

    Not an ``nn.Module`` on purpose: calling it runs forward *and* backward (``target=`` given), which a
    module's ``__call__`` must not hide. ``parameters()`` are this process's stages' parameters.
    """

    def __init__(self, model: nn.Module, *, config: PipelineConfig, loss_fn: Callable[..., torch.Tensor] | None,
                 group: Any, device: torch.device | None = None,
                 wrap_stage: Callable[[nn.Module], nn.Module] | None = None,
                 trace_stand_ins: Callable[[], Mapping[str, nn.Module]] | None = None,
                 loss_scale: float = 1.0) -> None:
        self.model = model
        self.config = config
        self.loss_fn = loss_fn
        # a transformers causal LM without a loss_fn: its own loss, each micro-batch's share of the batch's
        self.causal_lm = is_causal_lm(model)
        self._lm_loss = causal_lm_loss(model) if self.causal_lm and loss_fn is None else None
        self._num_targets = 0  # this call's valid targets (last stage), what the micro-batch losses divide by
        self.loss_scale = loss_scale  # 1 / gradient accumulation steps: each call adds loss_scale x its gradient
        self._losses: list[torch.Tensor] = []  # this call's micro-batch losses, unscaled (last stage)
        self.group = group
        self.device = device or torch.device("cpu")
        self.pp_size = dist.get_world_size(group)
        self.pp_rank = dist.get_rank(group)
        self.num_stages = self.pp_size * config.local_stages()
        self.boundaries = stage_boundaries(model, self.num_stages, split_at=config.split_at, layers=config.layers)
        self.microbatches = config.microbatches or self.num_stages
        self.stage_indices = tuple(self.pp_rank + k * self.pp_size for k in range(config.local_stages()))
        self.training = True
        self._wrap_stage = wrap_stage
        self._trace_stand_ins = trace_stand_ins
        self._stages: list[Any] = []
        self._stage_modules: list[nn.Module] = []
        self._schedule: Any = None
        self._on_build: list[Callable[[PipelineModule], None]] = []
        # weights shared between modules, found before any split (ties.py): a copy on each stage using one,
        # gradients summed over those stages before the optimizer steps
        self.ties = find_ties(model)
        self._tied: TiedCopies | None = None
        self._tied_pending = False  # gradients reached the copies since they were last summed
        self._tie_sync_deferred = False  # summed by an optimizer's step pre-hook (hook_optimizer), not per call

    # --- building -------------------------------------------------------------------------------------
    @property
    def built(self) -> bool:
        return self._schedule is not None

    @property
    def is_first(self) -> bool:
        return 0 in self.stage_indices

    @property
    def is_last(self) -> bool:
        return self.num_stages - 1 in self.stage_indices

    def on_build(self, callback: Callable[[PipelineModule], None]) -> None:
        """Run ``callback(self)`` once the stages exist (now, if they already do)."""
        if self.built:
            callback(self)
        else:
            self._on_build.append(callback)

    def _example(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        def first(t: Any) -> Any:
            if isinstance(t, torch.Tensor):
                if t.shape[0] % self.microbatches:
                    raise StrategyError(f"batch of {t.shape[0]} does not split into {self.microbatches} "
                                        f"micro-batches; make the batch size a multiple of {self.microbatches}")
                return t.chunk(self.microbatches)[0]
            return t

        return tuple(first(a) for a in args), {k: first(v) for k, v in kwargs.items()}

    def build(self, *args: Any, **kwargs: Any) -> None:
        """Trace the model with one micro-batch of ``args`` and build this process's stages and schedule."""
        pp = _pipelining_module()
        mb_args, mb_kwargs = self._example(args, kwargs)
        # tensor-parallel modules are traced as plain stand-ins of their local shapes, then put back
        stand_ins = dict(self._trace_stand_ins()) if self._trace_stand_ins is not None else {}
        originals = {name: self.model.get_submodule(name) for name in stand_ins}
        try:
            for name, stand_in in stand_ins.items():
                self.model.set_submodule(name, stand_in)
            with warnings.catch_warnings():
                # torch's Pipe.from_tracing deep-copies the traced graph's pytree specs, which builds a LeafSpec,
                # a class torch itself deprecated (torch/utils/_pytree.py): a FutureWarning about torch's own code
                # on every rank, which no user code can change
                warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                                        category=FutureWarning)
                with cache_off(self.model):  # a key/value cache is no training output, and no stage can send it
                    pipe = pp.pipeline(self.model, mb_args=mb_args, mb_kwargs=mb_kwargs or None,
                                       split_spec={name: pp.SplitPoint.BEGINNING for name in self.boundaries})
        except Exception as exc:  # tracing errors come from deep inside torch.export
            cause = _convoy_cause(exc)
            if cause is not None:  # convoy's own check (e.g. in a stand-in) said what is wrong: say that
                raise cause from None
            raise NotSupportedYetError(trace_failure(exc, self.model)) from exc
        finally:
            for name, module in originals.items():
                self.model.set_submodule(name, module)
        if pipe.num_stages != self.num_stages:
            raise StrategyError(f"pipeline: tracing produced {pipe.num_stages} stages, expected "
                                f"{self.num_stages}; the split points {self.boundaries} are not all on the "
                                f"forward path")
        for index in self.stage_indices:
            stage = pipe.build_stage(index, self.device, group=self.group)
            _restore_modules(stage.submod, originals)
            self._stage_modules.append(stage.submod)
            self._stages.append(stage)
        self._tied = self._tie_stages(pipe)  # before wrapping: one copy per stage, equal on every stage
        for stage in self._stages:
            if self._wrap_stage is not None:
                wrapped = self._wrap_stage(stage.submod)
                if wrapped is not stage.submod and hasattr(stage.submod, "graph"):
                    # a traced stage reads its fx graph (inputs/outputs) on the first step; torch's stage
                    # runs a DDP-wrapped submod with no_sync per micro-batch, so the wrapper needs the graph
                    wrapped.graph = stage.submod.graph
                stage.submod = wrapped
        self._tie_model_to_copies()
        self._schedule = self._make_schedule(self.loss_fn)
        callbacks, self._on_build = self._on_build, []
        for callback in callbacks:
            callback(self)

    def _make_schedule(self, loss_fn: Any) -> Any:
        pp = _pipelining_module()
        cls_name, multi = SCHEDULES[self.config.schedule]
        cls = getattr(pp, cls_name)
        stages = self._stages if multi else self._stages[0]

        def scaled(output: Any, target: Any) -> torch.Tensor:
            # each micro-batch's loss is divided here rather than by the schedule's scale_grads, which divides
            # every gradient present at the end of a step, also those accumulated by earlier calls
            if self._lm_loss is not None:  # already this micro-batch's share of the batch's mean
                loss = self._lm_loss(output, target, num_items=self._num_targets)
                self._losses.append(loss.detach())
                return loss * self.loss_scale
            loss = loss_fn(output, target)
            self._losses.append(loss.detach())
            return loss * (self.loss_scale / self.microbatches)

        try:
            return cls(stages, n_microbatches=self.microbatches,
                       loss_fn=scaled if loss_fn or self._lm_loss else None, scale_grads=False)
        except ValueError as exc:
            raise StrategyError(f"pipeline schedule {self.config.schedule!r} with {self.microbatches} "
                                f"micro-batches on {self.pp_size} processes: {exc}") from exc

    # --- running --------------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, target: Any = None, **kwargs: Any) -> Any:
        """Training (``target`` given): run forward and backward over the micro-batches and return the mean
        loss (on every stage). In eval mode or under ``torch.no_grad()`` with ``target``: forward only, the
        mean loss on every stage (a validation loss). Without ``target``: forward only; the last stage returns
        the output, the others ``None``.

        A transformers causal LM called its own way (``input_ids=..., labels=...``: ``labels`` is the target)
        returns a ``PipelineOutput`` instead: ``.loss`` on every stage, ``.logits`` on the last one."""

        transformers_call = self.causal_lm and target is None
        labels = kwargs.pop("labels", None)
        if labels is not None:
            if target is not None:
                raise StrategyError("a pipeline takes the labels once: pass labels=... or target=..., not both")
            target, transformers_call = labels, True
        args = self._positional(args, kwargs)
        # micro-batches are dim-0 chunks of the inputs; torch 2.11's stages check their strides against the traced
        # example, so a sliced batch (tokens[:, :-1]) is made dense first, as the example is
        args = tree_map_only(torch.Tensor, lambda t: t.contiguous(), args)
        if not self.built:
            self.build(*args)
        if target is None:
            if torch.is_grad_enabled() and self.training:
                raise StrategyError("a pipeline-parallel model trains with its labels, forward and backward together "
                                    "stage by stage: model(input_ids=..., labels=...) for a transformers causal LM, "
                                    "else model(inputs, target=labels) with strategy_options={'loss_fn': fn}")
            output = self._forward_only(*args)
            return PipelineOutput(logits=output) if transformers_call else output
        if self.loss_fn is None and self._lm_loss is None:
            raise StrategyError("pipeline training needs a loss function: strategy_options={'loss_fn': fn}")
        feed = args if self.is_first else ()
        target = target if self.is_last else None
        if target is not None and self._lm_loss is not None:
            self._num_targets = count_targets(target)
        self._losses = []
        if torch.is_grad_enabled() and self.training:
            output = self._schedule.step(*feed, target=target)
            self._tied_pending = True
            if not self._tie_sync_deferred:
                self.sync_tied_gradients()
        else:
            with _no_grad():
                output = self._schedule.eval(*feed, target=target)
        loss = self._mean_loss(self._losses)
        if transformers_call:
            return PipelineOutput(loss=loss, logits=output if isinstance(output, torch.Tensor) else None)
        return loss

    def _positional(self, args: tuple, kwargs: dict[str, Any]) -> tuple:
        """``args`` and keyword inputs as the forward's leading positional arguments (a pipeline's inputs are
        cut into micro-batches and fed to the first stage only). Switches that training fixes are dropped."""
        if kwargs.pop("use_cache", None):
            raise StrategyError("use_cache=True under pp: pipeline stages cannot pass a key/value cache; train "
                                "with use_cache=False (or leave it out)")
        kwargs.pop("return_dict", None)  # a pipeline returns its own output
        for key in [k for k, v in kwargs.items() if v is None]:
            del kwargs[key]
        if not kwargs:
            return args
        params = [name for name, p in inspect.signature(self.model.forward).parameters.items()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        out = list(args)
        for name in params[len(args):]:
            if not kwargs:
                break
            if name not in kwargs:
                raise StrategyError(f"pipeline inputs are the forward's leading arguments, in order: "
                                    f"{', '.join(sorted(kwargs))} come after {name!r}, which is missing; pass "
                                    f"{name}= too or leave the later ones out")
            out.append(kwargs.pop(name))
        if kwargs:
            raise StrategyError(f"pipeline input {next(iter(kwargs))!r} is not an argument of "
                                f"{type(self.model).__name__}.forward; pass tensors the forward takes")
        return tuple(out)

    def _mean_loss(self, losses: list) -> torch.Tensor:
        if self.is_last and self._lm_loss is not None:  # each micro-batch's loss is its share: they add up
            loss = torch.stack([part.detach().float() for part in losses]).sum().to(self.device)
        elif self.is_last:
            loss = torch.stack([part.detach().float() for part in losses]).mean().to(self.device)
        else:
            loss = torch.zeros((), dtype=torch.float32, device=self.device)
        last_rank = dist.get_global_rank(self.group, (self.num_stages - 1) % self.pp_size)
        dist.broadcast(loss, src=last_rank, group=self.group)
        return loss

    def _forward_only(self, *args: Any) -> Any:
        feed = args if self.is_first else ()
        # torch's eval still applies the loss function when the schedule has one, and there is no target
        # here: the schedule runs without it for this call
        loss_fn, self._schedule._loss_fn = self._schedule._loss_fn, None
        try:
            with _no_grad():
                return self._schedule.eval(*feed)
        finally:
            self._schedule._loss_fn = loss_fn

    # --- tied weights ---------------------------------------------------------------------------------------
    def _tie_stages(self, pipe: Any) -> TiedCopies | None:
        """Each tie held by several stages: the model's own tensor on each (torch's splitter gave each a copy),
        equal on every process (the first holding stage's value), and the process groups joining those stages'
        processes, made here on every process."""
        if not self.ties:
            return None
        stage_names = [[n for n, _ in pipe.get_stage_module(s).named_parameters(remove_duplicate=False)]
                       for s in range(self.num_stages)]
        originals = [self.model.get_parameter(tie.names[0]) for tie in self.ties]
        local = dict(zip(self.stage_indices, self._stage_modules))
        tied = TiedCopies(self.ties, stage_names=stage_names, pp_size=self.pp_size, pp_rank=self.pp_rank,
                          local=local, originals=originals, group_for=self._tie_groups())
        for index, tie in enumerate(tied.ties):
            here = tied.local_holders(index)
            if len(here) > 1 and self._wrap_stage is not None:
                # each stage's data-parallel wrapper (DDP, FSDP2) would reduce and shard one tensor on its own
                raise NotSupportedYetError(
                    f"pipeline: stages {here} on one process both use the weight {tie.describe()} share, with "
                    f"data parallelism over each stage; cut the model so that they land on different processes "
                    f"(pp_split_at), or use a schedule with one stage per process")
        for _, ranks in tied.spread():  # made on every process, in the same order, before any is used
            tied.group(ranks)
        if tied.spread():
            tied.broadcast()
        return tied

    def _tie_groups(self) -> Callable[[tuple[int, ...]], Any]:
        """``ranks`` (pipeline ranks) -> the process group joining this process with the processes at those
        pipeline ranks and the same place on the other axes: the pipeline group itself when ``ranks`` are all of
        them, else a subgroup made here on every process of the job (groups are made collectively)."""
        made: dict[tuple[int, ...], Any] = {}

        def group_for(ranks: tuple[int, ...]) -> Any:
            if len(ranks) == self.pp_size:
                return self.group
            if ranks not in made:
                made[ranks] = _pipeline_subgroup(self.group, self.pp_size, ranks)
            return made[ranks]

        return group_for

    def sync_tied_gradients(self) -> None:
        """Sum the gradients of each tied weight's copies over the stages holding them (collective over their
        processes); a no-op when no gradient reached them since the last sum. Runs after each training call, or
        once before each optimizer step when ``hook_optimizer`` was called (gradient accumulation sums once)."""
        if self._tied is None or not self._tied_pending:
            return
        self._tied_pending = False
        self._tied.sum_gradients()

    def hook_optimizer(self, optimizer: Any) -> None:
        """Sum tied gradients once, just before ``optimizer`` steps (and before a gradient norm), not per call."""
        if self._tied is None or not self._tied.spread():
            return
        self._tie_sync_deferred = True
        optimizer.register_step_pre_hook(lambda *_: self.sync_tied_gradients())

    def tied_norm_skip(self) -> set[int]:
        """ids of this process's tied copies a gradient norm skips, so that each tied weight counts once."""
        return self._tied.counted_once() if self._tied is not None else set()

    def _tie_model_to_copies(self) -> None:
        """After wrapping: the whole model names this process's copy of each tie it holds (under every name), so
        that optimizers re-pointed by name follow it and state dicts name it once per tie."""
        if self._tied is None:
            return
        self._tied.refresh()
        for tie, copies in zip(self._tied.ties, self._tied.copies):
            for name in tie.names if copies else ():
                parent, _, leaf = name.rpartition(".")
                self.model.get_submodule(parent).register_parameter(leaf, copies[0])

    # --- the nn.Module surface a training loop touches ----------------------------------------------------
    def stage_modules(self) -> list[nn.Module]:
        """This process's stage modules (unwrapped), in stage order."""
        return list(self._stage_modules)

    def named_parameters(self):
        """This process's stages' parameters once built; before the first call, the whole model's."""
        if not self.built:
            yield from self.model.named_parameters()
            return
        for module in self._stage_modules:
            yield from module.named_parameters()

    def parameters(self):
        for _, p in self.named_parameters():
            yield p

    def state_dict(self) -> dict[str, torch.Tensor]:
        """This process's stages' entries, under the original model's names: what the model's own state dict
        holds (a traced stage keeps the model's non-persistent buffers, such as rotary tables, as its own)."""
        transient = _transient_buffers(self.model)
        out: dict[str, Any] = {}
        for module in self._stage_modules:
            out.update((k, v) for k, v in module.state_dict().items() if k not in transient)
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load this process's stages' entries from ``state`` (the whole model's, or more), strictly."""
        transient = _transient_buffers(self.model)
        for module in self._stage_modules:
            own = [k for k in module.state_dict() if k not in transient]
            missing = [k for k in own if k not in state]
            if missing:
                raise StrategyError(f"pipeline stage state is missing {missing[0]!r} ({len(missing)} entries)")
            module.load_state_dict({k: state[k] for k in own}, strict=False)

    def train(self, mode: bool = True) -> PipelineModule:
        self.training = mode
        self.model.train(mode)
        for module in self._stage_modules:
            module.train(mode)
        return self

    def eval(self) -> PipelineModule:
        return self.train(False)


class SingleStage:
    """pp = 1 with a ``loss_fn``: the pipeline's call contract on the model itself, so a pipeline training
    loop (``loss = model(x, target=y)``; ``accelerator.backward(loss)`` then a no-op) runs unchanged on one
    process, or with data parallelism only, with no tracing and no schedule (nothing to split at degree 1).

    ``module`` is the model or its data-parallel wrapper; ``loss_scale`` is 1 / gradient accumulation steps.
    """

    def __init__(self, module: nn.Module, *, loss_fn: Callable[..., torch.Tensor], loss_scale: float = 1.0
                 ) -> None:
        self.module = module
        self.loss_fn = loss_fn
        self.loss_scale = loss_scale
        self.training = True

    # what a loop may read of a PipelineModule: one stage, which is first and last
    num_stages, stage_indices, is_first, is_last, built = 1, (0,), True, True, True

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, target: Any = None, **kwargs: Any) -> Any:
        """With ``target``: the loss (detached), its backward already run when training. Without: the output."""

        if target is None:
            return self.module(*args, **kwargs)
        loss = self.loss_fn(self.module(*args, **kwargs), target)
        if torch.is_grad_enabled() and self.training:
            (loss * self.loss_scale).backward()
        return loss.detach()

    def parameters(self):
        return self.module.parameters()

    def named_parameters(self, *args: Any, **kwargs: Any):
        return self.module.named_parameters(*args, **kwargs)

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        return self.module.state_dict(*args, **kwargs)

    def train(self, mode: bool = True) -> SingleStage:
        self.training = mode
        self.module.train(mode)
        return self

    def eval(self) -> SingleStage:
        return self.train(False)


def _transient_buffers(model: nn.Module) -> set[str]:
    """Names of ``model``'s non-persistent buffers (not in its state dict)."""
    return {f"{name}.{buffer}" if name else buffer for name, module in model.named_modules()
            for buffer in module._non_persistent_buffers_set}


def _restore_modules(submod: nn.Module, originals: Mapping[str, nn.Module]) -> None:
    """Put the model's own (tensor-parallel) modules back where a stage traced their stand-ins: the traced
    graph calls each module by name, so the stage then runs the real module with its DTensor hooks."""
    present = {name for name, _ in submod.named_modules()}
    for name, module in originals.items():
        if name in present:
            submod.set_submodule(name, module)


def _pipeline_subgroup(group: Any, pp_size: int, ranks: tuple[int, ...]) -> Any:
    """The process group of ``ranks`` (pipeline ranks) among this process's pipeline group's peers: every
    process of the job makes every such group (``new_group`` is collective), in the same order."""
    mine = [dist.get_global_rank(group, r) for r in range(pp_size)]
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    found = None
    for peers in sorted({tuple(p) for p in every}):
        sub = dist.new_group([peers[r] for r in ranks])
        if peers == tuple(mine) and dist.get_rank() in [peers[r] for r in ranks]:
            found = sub
    return found


def _convoy_cause(exc: BaseException) -> ConvoyError | None:
    """The first convoy error in ``exc``'s chain of causes (torch.export wraps errors raised while tracing)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ConvoyError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _no_grad():
    return torch.no_grad()
