"""``convoy.Accelerator``: Accelerate's quick-tour API on PyTorch's own engines.

    from convoy import Accelerator                      # was: from accelerate import Accelerator
    accelerator = Accelerator(mixed_precision="bf16", strategy="zero3")
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    for inputs, targets in loader:
        with accelerator.accumulate(model):
            loss = loss_fn(model(inputs), targets)
            accelerator.backward(loss)
            optimizer.step(); scheduler.step(); optimizer.zero_grad()
    accelerator.save_state()                            # project_dir/checkpoints/checkpoint_<n>

Run it with ``convoy launch train.py`` (or torchrun): the process group is started here from
``RANK``/``WORLD_SIZE``, also on a CPU-only machine. Every distributed decision is the strategy's
(``convoy.train.strategies``); this class only keeps the API and the loop's state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from convoy.config.schema import is_whole
from convoy.errors import ConfigError, shown
from convoy.launch.rank_env import read_deepspeed_config
from convoy.train import checkpoint, collectives, data, operations, profiling, tracking
from convoy.train.arguments import check_arguments, check_plain_arguments, is_flag
from convoy.train.checkpoint.hooks import StateHooks
from convoy.train.coordination import Trigger, join_uneven_inputs
from convoy.train.data import DataLoaderConfiguration, PreparedDataLoader
from convoy.train.data.loop import LoopPosition
from convoy.train.deepspeed_sections import build_placeholders, steps_once
from convoy.train.deepspeed_view import deepspeed_in_effect
from convoy.train.kwargs_handlers import (
    AutocastKwargs,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    collect_handlers,
    handler_of,
    refuse_arguments,
)
from convoy.train.logging import get_logger
from convoy.train.parallel.compile import CompileWatch
from convoy.train.parallel.mesh import ParallelMesh
from convoy.train.plan_report import PlanReport, PlanWatch
from convoy.train.plugins import ParallelismConfig, dynamo_arguments, plugin_arguments
from convoy.train.precision import Precision, precision_for, restore_forward
from convoy.train.process_group import stop_process_group
from convoy.train.process_view import (
    AcceleratorState,
    DistributedType,
    GradientState,
    distributed_type_for,
    process_device,
)
from convoy.train.profiling import ProfileKwargs
from convoy.train.settings import TrainSettings, overridden, resolve_settings
from convoy.train.strategies.base import Strategy, SupportsNoSync
from convoy.train.strategies.build import build_strategy, declared_distributed_type, named_layout, start_job
from convoy.train.wrappers import PreparedOptimizer, PreparedScheduler

__all__ = ["Accelerator", "ProjectConfiguration", "DataLoaderConfiguration"]

_EVERY_PROCESS = ("save_state", "load_state", "save_model")
"""Methods every process calls (watched: one called under ``is_main_process`` is named at once, not a hang)."""


@dataclass(frozen=True, kw_only=True)
class ProjectConfiguration:
    """Where checkpoints go (Accelerate's names)."""

    project_dir: str | None = None
    """Root of the run's files; checkpoints go to ``project_dir/checkpoints/checkpoint_<n>``."""
    automatic_checkpoint_naming: bool = False
    """Name every ``save_state`` directory ``checkpoint_<n>`` even when a directory is given."""
    total_limit: int | None = None
    """Keep only this many newest automatic checkpoints."""
    iteration: int = 0
    """Number of the next automatic checkpoint."""
    logging_dir: str | None = None
    """Where trackers write (``log_with=``); defaults to ``project_dir``."""

    def __post_init__(self) -> None:
        for name in ("project_dir", "logging_dir"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise ConfigError(f"ProjectConfiguration({name}={shown(value)}): give a directory path (a str or "
                                  "Path), or None")
        if not is_flag(self.automatic_checkpoint_naming):
            raise ConfigError(f"ProjectConfiguration(automatic_checkpoint_naming="
                              f"{shown(self.automatic_checkpoint_naming)}): give True or False")
        # 0 has two readings in Hugging Face's libraries: Accelerate's save_state then keeps only the newest
        # checkpoint, the Trainer's save_total_limit keeps them all. Either reading would surprise someone, and one
        # deletes their checkpoints: refused, as negative numbers are.
        if self.total_limit is not None and not is_whole(self.total_limit, 1):
            raise ConfigError(f"ProjectConfiguration(total_limit={shown(self.total_limit)}): give how many of the "
                              "newest checkpoints to keep, a whole number >= 1, or None to keep them all")
        if not is_whole(self.iteration):
            raise ConfigError(f"ProjectConfiguration(iteration={shown(self.iteration)}): give the number of the "
                              "next automatic checkpoint, a whole number >= 0")
        for name in ("total_limit", "iteration"):  # numpy's ints are taken, and kept as Python's
            if getattr(self, name) is not None:
                object.__setattr__(self, name, int(getattr(self, name)))


def _dataloader_config(config: Any, *, split_batches: bool | None, even_batches: bool | None
                       ) -> DataLoaderConfiguration:
    """``dataloader_config`` (default: ``DataLoaderConfiguration()``) with the constructor's old ``split_batches``
    and ``even_batches`` arguments, which win where given, as in Accelerate."""
    config = config or DataLoaderConfiguration()
    return dataclasses.replace(
        config, split_batches=bool(config.split_batches if split_batches is None else split_batches),
        even_batches=bool(config.even_batches if even_batches is None else even_batches))


class Accelerator:
    """The training loop's handle on devices, processes and checkpoints. See the module docstring."""

    def __init__(self, device_placement: bool = True, split_batches: bool | None = None,
                 mixed_precision: str | None = None, gradient_accumulation_steps: int | None = None,
                 cpu: bool = False, strategy: str | None = None, step_scheduler_with_optimizer: bool = True,
                 even_batches: bool | None = None, project_dir: str | os.PathLike[str] | None = None,
                 project_config: ProjectConfiguration | None = None, dataloader_config: Any = None,
                 rng_types: Any = None, log_with: Any = None, strategy_options: dict[str, Any] | None = None,
                 collective_timeout: float | None = None, planner: Callable[..., Any] | None = None,
                 parallelism: Any = None, gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
                 kwargs_handlers: list[Any] | None = None, recompute: str | None = None, fsdp_plugin: Any = None,
                 deepspeed_plugin: Any = None, parallelism_config: Any = None, fp8_recipe: str | None = None,
                 fp8_emulate: bool | None = None, compile: str | None = None, dynamo_plugin: Any = None,
                 dynamo_backend: Any = None, **unsupported: Any) -> None:
        # Resolved in named steps, each reading what the ones before it settled.
        # 1. flags: the plain arguments and the kwargs handlers, checked before anything reads them
        refuse_arguments(unsupported)
        check_plain_arguments({"device_placement": device_placement, "split_batches": split_batches, "cpu": cpu,
                               "step_scheduler_with_optimizer": step_scheduler_with_optimizer,
                               "even_batches": even_batches}, project_dir=project_dir, rng_types=rng_types)
        if gradient_accumulation_plugin is not None and gradient_accumulation_steps is not None:
            raise ConfigError("pass gradient_accumulation_steps or gradient_accumulation_plugin, not both")
        self._handlers = collect_handlers(kwargs_handlers)
        self._fp8_arguments = {"fp8_recipe": fp8_recipe, "fp8_emulate": fp8_emulate}
        # 2. plugins: Accelerate's plugin objects, read as the arguments they stand for
        plugins = plugin_arguments(
            fsdp_plugin=fsdp_plugin, deepspeed_plugin=deepspeed_plugin, parallelism_config=parallelism_config,
            explicit=dynamo_arguments(
                {"mixed_precision": mixed_precision, "strategy": strategy, "parallelism": parallelism,
                 "recompute": recompute, "compile": compile,
                 "gradient_accumulation_steps": gradient_accumulation_plugin.num_steps
                 if gradient_accumulation_plugin is not None else gradient_accumulation_steps,
                 "fp8_recipe": fp8_recipe, "fp8_emulate": fp8_emulate},
                dynamo_plugin=dynamo_plugin, dynamo_backend=dynamo_backend),
            strategy_options=strategy_options)
        # 3. settings: argument > launcher's environment > settings file > default
        self.settings = self._resolve_settings(plugins, cpu=cpu, collective_timeout=collective_timeout,
                                               mixed_precision=mixed_precision)
        self._set_accumulation(gradient_accumulation_plugin)
        # a DeepSpeed config's (the script's plugin, else the launcher's file), clipped at each optimizer step
        self._gradient_clipping = plugins.gradient_clipping or self.settings.gradient_clipping
        # the DeepSpeed config in effect (the script's plugin, else the launcher's file): its sections build
        # DummyOptim/DummyScheduler, and it is state.deepspeed_plugin
        self._deepspeed, differ = deepspeed_in_effect(deepspeed_plugin, fsdp_plugin=fsdp_plugin,
                                                      launched=read_deepspeed_config(os.environ),
                                                      accumulation_steps=self._accumulation_steps)
        if differ:
            get_logger(__name__).warning("convoy: %s", differ)
        # 4. strategy: its name and options checked now, the strategy itself built at the first prepare()
        self._check_strategy(plugins.options, dataloader_config=dataloader_config, project_config=project_config)
        # 5. precision: one object, handed to the strategy when it is built
        self._precision = self._make_precision()
        self.scaler = self._precision.scaler  # the fp16 GradScaler (Accelerate's attribute), else None
        # 6. data: how prepared loaders shard and place batches
        self.dataloader_config = _dataloader_config(dataloader_config, split_batches=split_batches,
                                                    even_batches=even_batches)
        self.device_placement = device_placement
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        # 7. project: where checkpoints and trackers write
        self._set_project(project_config, project_dir=project_dir, log_with=log_with)
        # 8. the loop's state and the objects prepare() will hold
        self._set_loop(planner)
        # 9. the job: this process's device and process group, and the process state Accelerate's names read
        start_job(self.settings)
        self.state = AcceleratorState._from_settings(self.settings, declared_distributed_type(self.settings))
        self.state.deepspeed_plugin = self._deepspeed
        GradientState._register(self)
        # the handlers as given (Accelerate's attributes; each None when not given)
        self.profile_handler = self._handlers.profile
        self.ddp_handler, self.init_handler, self.scaler_handler, self.autocast_handler = (
            handler_of(kwargs_handlers, kind) for kind in (DistributedDataParallelKwargs, InitProcessGroupKwargs,
                                                           GradScalerKwargs, AutocastKwargs))
        self.rng_types = list(rng_types) if isinstance(rng_types, (list, tuple)) else \
            [rng_types] if rng_types is not None else ["generator"]  # Accelerate's default
        self.log_with = list(self._trackers.requested)  # the trackers that will run (names, tracker objects)

    def _resolve_settings(self, plugins: Any, *, cpu: bool, collective_timeout: float | None,
                          mixed_precision: str | None) -> TrainSettings:
        """The settings record: the arguments (with the plugins' put in) over the launcher's environment; the
        mixed precision an earlier Accelerator of this process set is kept, and another one refused."""
        explicit = dict(plugins.explicit)
        if explicit["mixed_precision"] is None:
            explicit["mixed_precision"] = AcceleratorState._held_mixed_precision()
        if collective_timeout is None:
            collective_timeout = self._handlers.timeout_s
        settings = resolve_settings(explicit={
            **explicit, "collective_timeout": collective_timeout, "backend": self._handlers.backend}, cpu=cpu,
            options=plugins.options, defaults=self._handlers.ddp, strategy_family=plugins.family)
        AcceleratorState._check_mixed_precision(settings.mixed_precision,
                                                where=f"Accelerator(mixed_precision={shown(mixed_precision)})")
        # the script's arguments win over the launcher's settings (Accelerate's rule); a difference is said once
        differ = overridden(explicit={**plugins.explicit, "collective_timeout": collective_timeout},
                            options=plugins.options, env=os.environ)
        if differ:
            get_logger(__name__).warning("convoy: %s", differ)
        return settings

    def _set_accumulation(self, plugin: GradientAccumulationPlugin | None) -> None:
        self.gradient_accumulation_plugin = plugin or GradientAccumulationPlugin(
            num_steps=self.settings.gradient_accumulation_steps)
        # a whole number >= 1: GradientAccumulationPlugin refuses None
        self._accumulation_steps = cast(int, self.gradient_accumulation_plugin.num_steps)

    def _check_strategy(self, options: Any, *, dataloader_config: Any, project_config: Any) -> None:
        """Fail early: a data-parallel strategy beside tp/pp degrees runs as strategy "parallel" (``named_layout``),
        whose options (loss_fn, pp_schedule, ...) the script's are checked against."""
        built, _ = named_layout(self.settings)
        check_arguments(strategy=built, strategy_options=options or {}, dataloader_config=dataloader_config,
                        project_config=project_config)

    def _make_precision(self) -> Precision:
        """The run's mixed precision (``convoy.train.precision``), with the ``AutocastKwargs``/``GradScalerKwargs``/
        ``AORecipeKwargs`` given; fp8 on a board without float8 tensor cores is refused here unless emulated."""
        from convoy.train.parallel.float8 import float8_for

        if self.settings.mixed_precision != "fp8":
            given = "kwargs_handlers: AORecipeKwargs" if self._handlers.ao is not None else next(
                (f"Accelerator({name}={value!r})" for name, value in self._fp8_arguments.items() if value is not None),
                None)
            if given is not None:
                raise ConfigError(f"{given} configures fp8; give mixed_precision='fp8' with it (this run's is "
                                  f"{self.settings.mixed_precision.value!r})")
        return precision_for(self.settings.mixed_precision, device_type=self.settings.device_type,
                             autocast_kwargs=self._handlers.autocast, scaler_kwargs=self._handlers.scaler,
                             float8=float8_for(self.settings, self._handlers.ao))

    def _set_project(self, config: ProjectConfiguration | None, *, project_dir: Any, log_with: Any) -> None:
        project = config or ProjectConfiguration()
        if project_dir is not None:
            project = dataclasses.replace(project, project_dir=str(project_dir))
        if project.logging_dir is None and project.project_dir is not None:
            project = dataclasses.replace(project, logging_dir=project.project_dir)
        self.project_configuration = project
        self._trackers = tracking.TrackerHub(tracking.resolve_log_with(log_with, project.logging_dir),
                                             project.logging_dir)
        self.save_iteration = project.iteration

    def _set_loop(self, planner: Callable[..., Any] | None) -> None:
        self._planner = planner
        self._loop = LoopPosition()
        # what torch.compile does in this run: graphs and breaks for the plan line, a recompile after the first step
        self._compile_watch = CompileWatch() if self.settings.compile != "none" else None
        self._plan_watch = self._new_plan_watch()
        self.step = 0  # micro-steps seen by accumulate()
        self._strategy: Strategy | None = None
        self._models: list[Any] = []
        self._optimizers: list[PreparedOptimizer] = []
        self._optimizer_models: list[Any] = []
        self._schedulers: list[PreparedScheduler] = []
        self._dataloaders: list[PreparedDataLoader] = []
        self._custom: list[Any] = []
        self._state_hooks = StateHooks()
        self._trigger = Trigger()

    # --- properties ------------------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return process_device(device_type=self.settings.device_type, local_rank=self.settings.local_rank,
                              world_size=self.settings.world_size)

    @property
    def num_processes(self) -> int:
        return self.settings.world_size

    @property
    def process_index(self) -> int:
        return self.settings.rank

    @property
    def local_process_index(self) -> int:
        return self.settings.local_rank

    @property
    def is_main_process(self) -> bool:
        return self.settings.rank == 0

    @property
    def is_local_main_process(self) -> bool:
        return self.settings.local_rank == 0

    @property
    def is_last_process(self) -> bool:
        return self.settings.rank == self.settings.world_size - 1

    @property
    def use_distributed(self) -> bool:
        return self.settings.world_size > 1

    @property
    def distributed_type(self) -> DistributedType:
        """Accelerate's name of the set-up (``DistributedType.NO``, ``MULTI_CPU``, ``MULTI_GPU``, ``FSDP``, ...);
        a ``str`` enum, so it also equals ``"MULTI_CPU"``. The same as ``accelerator.state.distributed_type``."""
        return self.state.distributed_type

    @property
    def gradient_state(self) -> GradientState:
        """The loop's state under Accelerate's names (``sync_gradients``, ``end_of_dataloader``, ...)."""
        return GradientState(_accelerator=self)

    @property
    def split_batches(self) -> bool:
        return self.dataloader_config.split_batches

    @property
    def even_batches(self) -> bool:
        return self.dataloader_config.even_batches

    @even_batches.setter
    def even_batches(self, value: bool) -> None:
        self.dataloader_config.even_batches = value

    @property
    def mixed_precision(self) -> str:
        return self.settings.mixed_precision.value

    @property
    def fp8_recipe_handler(self) -> Any:
        """Accelerate's attribute: the fp8 recipe handler (``AORecipeKwargs``, the one given or the recipe's
        defaults) under ``mixed_precision="fp8"``; None otherwise."""
        if self.settings.mixed_precision != "fp8":
            return None
        from convoy.train.kwargs_handlers import AORecipeKwargs

        return self._handlers.ao or AORecipeKwargs()

    @property
    def fp8_backend(self) -> str:
        """Accelerate's ``FP8BackendType`` value: ``"AO"`` (torchao) under fp8, else ``"NO"``."""
        return "AO" if self.settings.mixed_precision == "fp8" else "NO"

    @property
    def ao_recipe_handler(self) -> Any:
        """Accelerate's attribute: torchao's recipe handler, convoy's only fp8 backend (``fp8_recipe_handler``)."""
        return self.fp8_recipe_handler

    te_recipe_handler = None
    """Accelerate's Transformer Engine recipe handler: always None (convoy's fp8 is torchao's)."""
    msamp_recipe_handler = None
    """Accelerate's MS-AMP recipe handler: always None (convoy's fp8 is torchao's)."""
    delayed_fp8_autocast = False
    """Accelerate's Transformer Engine-only flag: always False here."""

    @property
    def has_fp8_handler(self) -> bool:
        """Accelerate's attribute: an fp8 recipe handler is in use."""
        return self.fp8_recipe_handler is not None

    @property
    def fp8_enabled(self) -> bool:
        """Accelerate's attribute: the run trains in fp8."""
        return self.settings.mixed_precision == "fp8"

    @property
    def gradient_accumulation_steps(self) -> int:
        return self._accumulation_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, steps: int) -> None:
        if not is_whole(steps, 1):
            raise ConfigError(f"gradient_accumulation_steps={steps!r} must be a whole number >= 1")
        self._accumulation_steps = int(steps)

    @property
    def sync_gradients(self) -> bool:
        return self._loop.sync_gradients

    @property
    def optimizer_step_was_skipped(self) -> bool:
        return any(o.step_was_skipped for o in self._optimizers)

    @property
    def project_dir(self) -> str | None:
        return self.project_configuration.project_dir

    @property
    def strategy(self) -> Strategy:
        """The strategy object (built at the first ``prepare`` of a model when ``strategy="auto"``)."""
        return self._ensure_strategy(None)

    # --- strategy --------------------------------------------------------------------------------------
    def _ensure_strategy(self, model: Any) -> Strategy:
        if self._strategy is not None:
            return self._strategy
        strategy = build_strategy(self.settings, model=model, planner=self._planner, precision=self._precision)
        self._strategy = strategy
        self.state.distributed_type = distributed_type_for(  # the strategy auto chose names the set-up
            world_size=self.num_processes, device_type=self.settings.device_type,
            strategy_kind=strategy.distributed_type)
        for loader in self._dataloaders:  # prepared before auto chose: shard over its data-parallel groups
            loader.reshard(num_shards=strategy.data_parallel_size, shard=strategy.data_parallel_rank)
        return strategy

    # --- prepare ---------------------------------------------------------------------------------------
    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Prepare models, optimizers, dataloaders and schedulers (any order); returned in the same order."""
        self.state.device  # noqa: B018 - after AcceleratorState._reset_state() this raises Accelerate's error
        ds_config = None if self._deepspeed is None else self._deepspeed.deepspeed_config
        args = build_placeholders(args, ds_config, processes=self.num_processes,  # DummyOptim/DummyScheduler
                                  split_batches=self.split_batches)
        out: list[Any] = list(args)
        kinds = [self._kind(obj) for obj in args]
        for i, obj in enumerate(args):
            if kinds[i] == "model":
                out[i] = self.prepare_model(obj)
        originals: dict[int, PreparedOptimizer] = {}
        for i, obj in enumerate(args):
            if kinds[i] == "optimizer":
                out[i] = self.prepare_optimizer(obj)
                originals[id(obj)] = out[i]
        for i, obj in enumerate(args):
            if kinds[i] == "dataloader":
                out[i] = self.prepare_data_loader(obj)
        for i, obj in enumerate(args):
            if kinds[i] == "scheduler":
                out[i] = self.prepare_scheduler(obj, _originals=originals)
        return out[0] if len(out) == 1 else tuple(out)

    @staticmethod
    def _kind(obj: Any) -> str:
        if isinstance(obj, torch.nn.Module):
            return "model"
        if isinstance(obj, torch.optim.Optimizer):
            return "optimizer"
        if isinstance(obj, (DataLoader, PreparedDataLoader)):
            return "dataloader"
        if isinstance(obj, torch.optim.lr_scheduler.LRScheduler) or (
                hasattr(obj, "step") and hasattr(obj, "optimizer") and hasattr(obj, "state_dict")):
            return "scheduler"
        return "other"

    def prepare_model(self, model: torch.nn.Module, device_placement: bool | None = None,
                      evaluation_mode: bool = False) -> torch.nn.Module:
        strategy = self._ensure_strategy(model)
        prepared = self._precision.convert_module(strategy.setup_module(model))
        self._models.append(prepared)
        self._plan_watch.watch_model(model, prepared, self.device)
        return prepared

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer, device_placement: bool | None = None
                          ) -> PreparedOptimizer:
        if isinstance(optimizer, PreparedOptimizer):
            return optimizer
        strategy = self._ensure_strategy(None)
        inner = strategy.setup_optimizer(optimizer, None)
        first_now = next((p for g in inner.param_groups for p in g["params"]), None)
        owner = next((m for m in self._models if any(p is first_now for p in m.parameters())), None)
        prepared = PreparedOptimizer(inner, state=self._loop, precision=self._precision)
        if self._compile_watch is not None and not self._optimizers:  # before the plan's hook, which removes itself
            inner.register_step_post_hook(self._compile_watch.step)
        if self._gradient_clipping is not None:  # as DeepSpeed's engine: the global norm, before each real step
            params, norm = [p for g in inner.param_groups for p in g["params"]], self._gradient_clipping
            prepared.before_step = lambda: self.clip_grad_norm_(params, norm)
        self._plan_watch.watch_optimizer(inner)
        self._optimizers.append(prepared)
        self._optimizer_models.append(owner)
        return prepared

    def prepare_data_loader(self, data_loader: Any, device_placement: bool | None = None) -> PreparedDataLoader:
        if data.is_prepared(data_loader):
            return data_loader
        strategy = self._ensure_strategy(None) if self._strategy is not None or self.settings.strategy != "auto" \
            else None
        place = self.device_placement if device_placement is None else device_placement
        prepared = data.shard_data_loader(
            data_loader, config=self.dataloader_config, device=self.device if place else None, state=self._loop,
            num_shards=strategy.data_parallel_size if strategy else self.settings.world_size,
            shard=strategy.data_parallel_rank if strategy else self.settings.rank,
            broadcast=collectives.broadcast_object, reader=self.is_main_process)
        self._dataloaders.append(prepared)
        return prepared

    def prepare_scheduler(self, scheduler: Any, _originals: dict[int, PreparedOptimizer] | None = None
                          ) -> PreparedScheduler:
        if isinstance(scheduler, PreparedScheduler):
            return scheduler
        originals = _originals or {}
        target = getattr(scheduler, "optimizer", None)
        prepared_opt = originals.get(id(target))
        if prepared_opt is None:
            prepared_opt = next((o for o in self._optimizers if o is target or o.optimizer is target), None)
        if prepared_opt is not None and prepared_opt.optimizer is not target and prepared_opt is not target:
            scheduler.optimizer = prepared_opt  # the strategy replaced the optimizer (zero1): follow it
        prepared = PreparedScheduler(scheduler, [prepared_opt] if prepared_opt else list(self._optimizers),
                                     state=self._loop, step_with_optimizer=self.step_scheduler_with_optimizer,
                                     split_batches=self.split_batches,
                                     num_processes=1 if steps_once(scheduler) else self.num_processes)
        self._schedulers.append(prepared)
        return prepared

    # --- the plan next to the measurement (convoy.train.plan_report; convoy's own, not an Accelerate name) ----
    def plan_report(self) -> PlanReport:
        """This job's measured step time and peak memory over its first steps (optimizer steps 3 to 7) beside what
        ``convoy.plan`` predicts for the layout it runs; until then, a report whose ``missing`` says how far it is.
        Logged once on the main process, and kept for later plans on this device (docs/training.md)."""
        return self._plan_watch.report()

    def _new_plan_watch(self) -> PlanWatch:
        watch = self._compile_watch
        return PlanWatch(self._plan_job, main_process=self.is_main_process,
                         compiled=watch.summary if watch is not None else None)

    def _plan_job(self) -> tuple[Strategy, int]:
        """What the report plans: the strategy that runs, and the micro-steps per optimizer step."""
        return self.strategy, self.gradient_accumulation_steps

    # --- the parallel layout (Accelerate 1.10+'s ND-parallel names) -----------------------------------------
    def _settled_strategy(self) -> Strategy | None:
        """The strategy, built now if the settings decide it; None while ``"auto"`` without degrees waits for the
        model that ``prepare`` brings (asking these names first must not make it choose without the model)."""
        if self._strategy is None and self.settings.strategy == "auto" and self.settings.parallel_dims is None:
            return None
        return self.strategy

    def _layout(self) -> ParallelMesh | None:
        """The built mesh of a layout strategy (dp x cp x tp x pp), else None (a plain data-parallel strategy)."""
        mesh = getattr(self._settled_strategy(), "mesh", None)
        return mesh if isinstance(mesh, ParallelMesh) else None

    @property
    def parallelism_config(self) -> ParallelismConfig | None:
        """The degrees this job runs, as Accelerate's ``ParallelismConfig`` (None for a plain data-parallel
        strategy, which builds no mesh)."""
        pm = self._layout()
        if pm is None:
            return None
        d = pm.dims
        return ParallelismConfig(dp_replicate_size=d.dp_replicate, dp_shard_size=d.dp_shard, tp_size=d.tp,
                                 cp_size=d.cp)

    @property
    def is_composable_parallelism_enabled(self) -> bool:
        """Accelerate's attribute (its ``is_fsdp2``): the layout is built from torch's composable APIs (FSDP2, a
        device mesh)."""
        return bool(self.is_fsdp2)

    @property
    def should_save_model(self) -> bool:
        """Accelerate's attribute: whether this process takes part in saving the model; every process does (the
        save gathers from all of them), as in Accelerate 1.15."""
        return True

    @property
    def torch_device_mesh(self) -> Any:
        """The job's ``DeviceMesh`` (dimensions ``pp, dp_replicate, dp_shard, cp, tp`` above 1; flattened ``dp``,
        ``dp_shard_cp``, ``dp_cp`` where they exist), or None for a plain data-parallel strategy."""
        pm = self._layout()
        return None if pm is None else pm.mesh

    @property
    def data_parallel_rank(self) -> int:
        """Which data shard this process reads (over dp_replicate x dp_shard; cp, tp and pp ranks of one group
        read the same samples). Accelerate's counts dp_replicate only; its ``data_parallel_shard_rank`` is below."""
        strategy = self._settled_strategy()
        return self.process_index if strategy is None else strategy.data_parallel_rank

    @property
    def data_parallel_shard_rank(self) -> int:
        """This process's rank in the dp_shard dimension (0 where it is 1)."""
        pm = self._layout()
        return 0 if pm is None or not pm.dims.dp_shard_enabled else pm.mesh.get_local_rank("dp_shard")

    @property
    def context_parallel_rank(self) -> int:
        """This process's rank in the cp ring (which part of each sequence it holds; 0 at cp = 1)."""
        pm = self._layout()
        return 0 if pm is None else pm.cp_rank

    @property
    def tensor_parallel_rank(self) -> int:
        pm = self._layout()
        return 0 if pm is None else pm.tp_rank

    @property
    def pipeline_parallel_rank(self) -> int:
        pm = self._layout()
        return 0 if pm is None else pm.pp_rank

    @property
    def non_data_parallel_size(self) -> int:
        """Processes that share each sample (cp x tp x pp): tokens per device is tokens per sample over this."""
        strategy = self._settled_strategy()
        return 1 if strategy is None else self.num_processes // strategy.data_parallel_size

    @contextlib.contextmanager
    def maybe_context_parallel(self, buffers: list[torch.Tensor] | None = None,
                               buffer_seq_dims: list[int] | None = None,
                               no_restore_buffers: set[torch.Tensor] | None = None) -> Iterator[None]:
        """Inside, ``buffers`` (inputs, already-shifted labels, positions) are this rank's part of each sequence
        (head-tail balanced) and ``F.scaled_dot_product_attention`` is ring attention over the cp ranks; restored
        on exit (but ``no_restore_buffers``). A no-op at cp = 1. Open one per step, around forward and backward.
        Labels must be shifted before the split: give ``shift_labels`` (``labels[..., 1:]`` padded with -100) to
        the loss, not ``labels=`` to a model that shifts inside (``convoy.train.parallel.context``)."""
        pm = self._layout()
        if pm is None or pm.cp is None:
            yield
            return
        from convoy.train.parallel.context import context_parallel

        rotate = getattr(getattr(self.strategy, "config", None), "cp_comm_strategy", "allgather")
        with context_parallel(pm.cp, buffers=buffers or [], buffer_seq_dims=buffer_seq_dims or [],
                              no_restore_buffers=no_restore_buffers, rotate=rotate, models=self._models):
            yield

    # --- the step --------------------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()``, divided by the accumulation steps and scaled for fp16."""
        if self.gradient_accumulation_steps > 1:
            loss = loss / self.gradient_accumulation_steps
        self.strategy.backward(self._precision.scale_loss(loss), **kwargs)

    @contextlib.contextmanager
    def no_sync(self, model: torch.nn.Module) -> Iterator[None]:
        """Inside, backward accumulates gradients locally without synchronising them."""
        strategy = self.strategy
        if isinstance(strategy, SupportsNoSync):
            with strategy.no_sync(model):
                yield
        else:
            yield

    @contextlib.contextmanager
    def accumulate(self, *models: torch.nn.Module) -> Iterator[None]:
        """One micro-step: gradients are synchronised (and the optimizer steps) every
        ``gradient_accumulation_steps`` micro-steps and at the end of the dataloader."""
        plugin = self.gradient_accumulation_plugin
        self.step += 1
        end = self._loop.end_of_dataloader and plugin.sync_with_dataloader
        self._loop.sync_gradients = end or self.step % self.gradient_accumulation_steps == 0
        if end:
            self.step = 0
        with contextlib.ExitStack() as stack:
            if not self._loop.sync_gradients and not plugin.sync_each_batch:
                for model in models:
                    stack.enter_context(self.no_sync(model))
            yield

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, model: torch.nn.Module) -> Iterator[None]:
        """The next backward inside synchronises gradients, also after forwards run under ``no_sync``."""
        strategy = self.strategy
        if isinstance(strategy, SupportsNoSync):
            with strategy.trigger_sync(model):
                yield
        else:
            yield

    @contextlib.contextmanager
    def join_uneven_inputs(self, joinables: list[Any], even_batches: bool | None = None) -> Iterator[None]:
        """Let processes with fewer batches finish (DDP's ``Join``); ``even_batches`` overrides the prepared
        loaders' setting inside."""
        with join_uneven_inputs(joinables, distributed_type=self.state.distributed_type, loaders=self._dataloaders,
                                even_batches=even_batches):
            yield

    @contextlib.contextmanager
    def autocast(self, autocast_handler: Any = None) -> Iterator[None]:
        """Compute in the mixed-precision dtype inside (no-op for ``mixed_precision="no"``); an
        ``AutocastKwargs`` (here or in ``kwargs_handlers``) sets ``enabled``/``cache_enabled``."""
        with self._precision.forward_context(autocast_handler.to_kwargs() if autocast_handler is not None else None):
            yield

    def unscale_gradients(self, optimizer: Any = None) -> None:
        for opt in [optimizer] if optimizer is not None else self._optimizers:
            if isinstance(opt, PreparedOptimizer) and self._loop.sync_gradients:
                opt.unscale_gradients()

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the global gradient norm (across processes and shards); returns the norm before clipping."""
        parameters = list(parameters)
        self.unscale_gradients()
        ids = {id(p) for p in parameters}
        owner = next((m for m in self._models if any(id(p) in ids for p in m.parameters())), None)
        return self.strategy.clip_grad_norm_(owner, parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        parameters = list(parameters)
        self.unscale_gradients()
        self.strategy.clip_grad_value_(parameters, clip_value)

    def unwrap_model(self, model: torch.nn.Module, keep_fp32_wrapper: bool = True,
                     keep_torch_compile: bool = True) -> torch.nn.Module:
        """The model without the strategy's wrapper; ``keep_torch_compile=False`` also takes off
        ``torch.compile``'s (the module it compiled)."""
        compiled: Any = model if hasattr(model, "_orig_mod") else None  # torch.compile(prepared model)
        inner = self.strategy.unwrap(compiled._orig_mod if compiled is not None else model)
        if not keep_torch_compile:
            inner = getattr(inner, "_orig_mod", inner)  # also a model compiled before prepare
        elif compiled is not None:  # Accelerate's answer: the compiled wrapper, around the unwrapped model
            compiled._orig_mod = inner
            inner = compiled
        if not keep_fp32_wrapper:
            for candidate in (model, inner):
                restore_forward(candidate)
        return inner

    # --- collectives -----------------------------------------------------------------------------------
    # Each is watched (_arrive): a rank that does not reach it within the collective timeout is named in the
    # CollectiveTimeoutError the others raise, instead of the job hanging until the process-group timeout.
    def _arrive(self, name: str) -> None:
        if collectives.is_distributed():
            from convoy.errors import CollectiveTimeoutError
            from convoy.train.hang import watch_call

            # No watch kept on the Accelerator: it would hold the c10d store alive past destroy_process_group(),
            # and gloo then aborts the process at exit. watch_call counts the calls in the store instead.
            try:
                watch_call(name, timeout=self.settings.collective_timeout_s)
            except CollectiveTimeoutError as err:
                named = [n for n in _EVERY_PROCESS if repr(n) in str(err)]
                if len(named) != 1:  # none, or two of them in another order: the message says it all
                    raise
                called = named[0]
                raise CollectiveTimeoutError(
                    f"{err}. {called}() is collective: call it on every process, not under `if "
                    f"accelerator.is_main_process:` (the main process writes the shared files itself)") from None

    def gather(self, tensor: Any) -> Any:
        self._arrive("gather")
        return collectives.gather(tensor)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """``gather``, minus the samples added to even out the last batch: metrics equal one process's."""
        tensors = not use_gather_object and collectives.all_tensors(input_data)
        self._arrive("gather_for_metrics")
        data = collectives.gather(input_data) if tensors else collectives.gather_object(input_data)
        remainder = self._loop.remainder
        if remainder is not None:
            data = collectives.truncate(data, remainder)
        return data

    def pad_across_processes(self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
        self._arrive("pad_across_processes")
        return collectives.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """All-reduce: ``"sum"`` (the default here, as in Accelerate's method), ``"mean"``, ``"max"``, ``"min"``."""
        self._arrive("reduce")
        return operations.reduce(tensor, reduction=reduction, scale=scale)

    def set_trigger(self) -> None:
        """Raise a flag on this process; the next ``check_trigger()`` is True on every process."""
        self._trigger.set()

    def check_trigger(self) -> bool:
        """True on every process when any process called ``set_trigger()`` since the last check (collective)."""
        self._arrive("check_trigger")
        return self._trigger.check(self.device)

    def broadcast(self, tensor: Any, from_process: int = 0) -> Any:
        self._arrive("broadcast")
        return collectives.broadcast(tensor, src=from_process)

    def wait_for_everyone(self) -> None:
        """A barrier (watched like the collectives above)."""
        if collectives.is_distributed():
            self._arrive("wait_for_everyone")  # every rank arrived, or the missing ones are named
            dist.barrier()  # and the backend's queued work (NCCL streams) is ordered, as Accelerate's barrier is

    # --- processes -------------------------------------------------------------------------------------
    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the local main process only."""
        if self.is_local_main_process:
            print(*args, **kwargs)

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """The main process runs the block first (downloads, caches), then the others."""
        if not self.is_main_process:
            self.wait_for_everyone()
        yield
        if self.is_main_process:
            self.wait_for_everyone()

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        if not self.is_local_main_process:
            self.wait_for_everyone()
        yield
        if self.is_local_main_process:
            self.wait_for_everyone()

    # Decorators: run the function on some processes only (the others get None); PartialState's own.
    def on_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self.state.on_main_process(function)

    def on_local_main_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self.state.on_local_main_process(function)

    def on_last_process(self, function: Callable[..., Any]) -> Callable[..., Any]:
        return self.state.on_last_process(function)

    def on_process(self, function: Callable[..., Any] | None = None, process_index: int = 0) -> Any:
        return self.state.on_process(function, process_index=process_index)

    def on_local_process(self, function: Callable[..., Any] | None = None, local_process_index: int = 0) -> Any:
        return self.state.on_local_process(function, local_process_index=local_process_index)

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """This process's contiguous share of a list, tuple, dict of lists or tensor."""
        yield collectives.split(inputs, self.num_processes, self.process_index, apply_padding)

    def skip_first_batches(self, dataloader: Any, num_batches: int = 0) -> Any:
        """A loader whose next iteration starts ``num_batches`` batches in (resuming mid-epoch)."""
        return data.skip_first_batches(dataloader, num_batches)

    def end_training(self) -> None:
        """Tear down the strategy and the process group this Accelerator started."""
        self._trackers.finish()
        self.wait_for_everyone()
        if self._strategy is not None:
            self._strategy.teardown()
        stop_process_group()

    def free_memory(self, *objects: Any) -> list[Any]:
        """Forget every prepared object (and the strategy), collect garbage and empty the device cache, so the
        memory can be reused (e.g. with a smaller batch); returns ``objects`` as Nones to reassign."""
        import gc

        for held in (self._models, self._optimizers, self._optimizer_models, self._schedulers, self._dataloaders,
                     self._custom):
            held.clear()
        self._strategy = None
        self.step = 0
        self._plan_watch.close()
        self._plan_watch = self._new_plan_watch()
        nones: list[Any] = [None] * len(objects)
        del objects  # this frame's references go before the collection
        gc.collect()
        if self.settings.device_type == "cuda":
            torch.cuda.empty_cache()
        return nones

    clear = free_memory

    # --- trackers (convoy.train.tracking) ----------------------------------------------------------------
    def init_trackers(self, project_name: str, config: dict[str, Any] | None = None,
                      init_kwargs: dict[str, dict[str, Any]] | None = None) -> None:
        """Open a run named ``project_name`` in every ``log_with`` tracker (main process), with ``config``."""
        self._trackers.init(project_name, config, init_kwargs or {}, self.is_main_process)

    def log(self, values: dict[str, Any], step: int | None = None,
            log_kwargs: dict[str, dict[str, Any]] | None = None) -> None:
        """Record ``values`` in every tracker (main process); without ``step``, the one after the last."""
        if self.is_main_process:
            self._trackers.log(values, step, log_kwargs or {})

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker called ``name`` (``unwrap=True``: the library's own object, e.g. the SummaryWriter)."""
        return self._trackers.get(name, unwrap)

    @property
    def trackers(self) -> list[Any]:
        return self._trackers.trackers

    @property
    def logging_dir(self) -> str | None:
        return self.project_configuration.logging_dir

    # --- saving ----------------------------------------------------------------------------------------
    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save and load these objects (each with ``state_dict``/``load_state_dict``) with ``save_state``."""
        bad = [o for o in objects if not (hasattr(o, "state_dict") and hasattr(o, "load_state_dict"))]
        if bad:
            raise ConfigError(f"register_for_checkpointing: {bad[0]!r} has no state_dict()/load_state_dict(); "
                              "register objects that have both")
        self._custom.extend(objects)

    def save(self, obj: Any, f: Any, safe_serialization: bool = False) -> None:
        """``torch.save(obj, f)`` on the main process only (``safe_serialization``: safetensors of a dict of
        tensors)."""
        if not self.is_main_process:
            return
        if safe_serialization:
            from safetensors.torch import save_file

            save_file(obj, f, metadata={"format": "pt"})
        else:
            torch.save(obj, f)

    def register_save_state_pre_hook(self, hook: Callable[..., Any]) -> Any:
        """``hook(models, weights, output_dir)`` runs at the start of each ``save_state``; returns a handle
        with ``.remove()``."""
        return self._state_hooks.register(self._state_hooks.save, hook)

    def register_load_state_pre_hook(self, hook: Callable[..., Any]) -> Any:
        """``hook(models, input_dir)`` runs at the start of each ``load_state``; returns a handle."""
        return self._state_hooks.register(self._state_hooks.load, hook)

    def save_model(self, model: torch.nn.Module, save_directory: str | os.PathLike[str],
                   max_shard_size: int | str = "10GB", safe_serialization: bool = True) -> None:
        """Unwrapped, consolidated weights in safetensors (transformers' file layout). Collective."""
        self._arrive("save_model")
        checkpoint.save_model(self._checkpoint_items(), model, save_directory, max_shard_size=max_shard_size,
                              safe_serialization=safe_serialization)

    def get_state_dict(self, model: torch.nn.Module, unwrap: bool = True) -> dict[str, Any]:
        return self.strategy.full_model_state_dict(model)

    def save_state(self, output_dir: str | os.PathLike[str] | None = None, safe_serialization: bool = True,
                   **kwargs: Any) -> str:
        """Write a complete checkpoint atomically; returns its directory. Collective: every process calls it."""
        self._arrive("save_state")
        return self._took_back(checkpoint.save_state(self._checkpoint_items(), output_dir))

    def load_state(self, input_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> str:
        """Restore the newest complete checkpoint under ``project_dir`` (or ``input_dir``); returns it.
        Collective: every process calls it."""
        self._arrive("load_state")
        loaded = self._took_back(checkpoint.load_state(self._checkpoint_items(), input_dir))
        self._precision.after_load()  # fp8: scales of the loaded weights
        return loaded

    def _checkpoint_items(self) -> checkpoint.CheckpointItems:
        """What ``save_state``/``load_state``/``save_model`` read and restore: this Accelerator's objects."""
        project = self.project_configuration
        return checkpoint.CheckpointItems(
            get_strategy=lambda: self.strategy, models=tuple(self._models),
            optimizers=tuple(zip([o.optimizer for o in self._optimizers], self._optimizer_models)),
            schedulers=tuple(self._schedulers), scaler=self.scaler, dataloaders=tuple(self._dataloaders),
            custom=tuple(self._custom), trackers=self._trackers, hooks=self._state_hooks, step=self.step,
            process_index=self.process_index, num_processes=self.num_processes, project_dir=project.project_dir,
            automatic_naming=project.automatic_checkpoint_naming, total_limit=project.total_limit,
            save_iteration=self.save_iteration, barrier=self.wait_for_everyone)

    def _took_back(self, result: checkpoint.CheckpointResult) -> str:
        """Take a save's or load's counters back into the loop; returns the checkpoint directory."""
        if result.save_iteration is not None:
            self.save_iteration = result.save_iteration
        if result.step is not None:
            self.step = result.step
        return str(result.path)

    # --- Accelerate's other attributes: the same meaning (docs/migrating.md) -------------------------------
    @property
    def deepspeed_plugin(self) -> Any:
        """The DeepSpeed config in effect, as Accelerate's scripts read it (``state.deepspeed_plugin``): the script's
        ``DeepSpeedPlugin`` or the launcher's ``deepspeed_config_file``, else None (``convoy.train.deepspeed_view``)."""
        return self.state.deepspeed_plugin

    @property
    def is_fsdp2(self) -> bool:
        return bool(self.state.is_fsdp2)

    @property
    def multi_device(self) -> bool:
        """Several processes, each on its own accelerator (not CPU processes, not FSDP), as Accelerate says."""
        return self.use_distributed and self.distributed_type.name.startswith("MULTI_") and \
            self.distributed_type != DistributedType.MULTI_CPU

    @property
    def native_amp(self) -> bool:
        """Mixed precision runs under ``torch.autocast`` (fp16 or bf16)."""
        return self.mixed_precision in ("fp16", "bf16")

    @property
    def dispatch_batches(self) -> bool | None:
        return self.dataloader_config.dispatch_batches

    @property
    def non_blocking(self) -> bool:
        return self.dataloader_config.non_blocking

    @property
    def use_seedable_sampler(self) -> bool:
        return self.dataloader_config.use_seedable_sampler

    @property
    def use_stateful_dataloader(self) -> bool:
        return self.dataloader_config.use_stateful_dataloader

    @property
    def has_lomo_optimizer(self) -> bool:
        return False  # a LOMO optimizer is refused at lomo_backward

    def lomo_backward(self, loss: torch.Tensor, learning_rate: float) -> None:
        from convoy.errors import NotSupportedYetError

        raise NotSupportedYetError("lomo_backward: LOMO's fused backward-and-update is not supported yet; use "
                                   "accelerator.backward(loss) with a torch optimizer")

    @staticmethod
    def verify_device_map(model: torch.nn.Module) -> bool:
        """True when ``model`` (or a submodule) was spread over several devices by a ``device_map``
        (transformers' ``hf_device_map``): such a model is not prepared for training, as in Accelerate."""
        return any(len(getattr(m, "hf_device_map", {})) > 1 for m in model.modules())

    # --- profiling (convoy.train.profiling) --------------------------------------------------------------
    @contextlib.contextmanager
    def profile(self, profile_handler: ProfileKwargs | None = None) -> Iterator[Any]:
        """``torch.profiler`` around the block (yields the profiler): ``profile_handler``, else the
        ``ProfileKwargs`` in ``kwargs_handlers``, else the defaults. With ``output_trace_dir``, each process writes
        ``profile_<process_index>.json`` there, and the processes then wait for each other."""
        handler = profile_handler or self.profile_handler or ProfileKwargs()
        with profiling.profile(handler, process_index=self.process_index, barrier=self.wait_for_everyone) as prof:
            yield prof

    def __repr__(self) -> str:
        return (f"Accelerator(strategy={self.settings.strategy!r}, num_processes={self.num_processes}, "
                f"process_index={self.process_index}, device={self.device}, "
                f"mixed_precision={self.mixed_precision!r})")
