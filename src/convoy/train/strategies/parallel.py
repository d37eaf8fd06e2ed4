"""Strategies ``"parallel"``, ``"tp"`` and ``"pp"``: any dp x tp x pp layout through the Accelerator.

    accelerator = Accelerator(parallelism={"dp": 2, "tp": 2})          # 2D: FSDP2 over dp, TP inside
    accelerator = Accelerator(strategy="ddp", parallelism={"dp": 2, "tp": 2})   # whole replicas over dp instead
    accelerator = Accelerator(strategy="hsdp", parallelism={"dp_replicate": 2, "dp_shard": 8})
    accelerator = Accelerator(strategy="tp")                          # tp = every process
    accelerator = Accelerator(parallelism={"dp": 2, "pp": 2},          # DP x PP, ZeRO-1 over dp
                              strategy_options={"loss_fn": F.cross_entropy, "pp_schedule": "1f1b"})
    convoy launch --nproc-per-node 4 --dp 2 --tp 2 train.py           # the same through CONVOY_PARALLELISM

The axes are applied in torchtitan's order: tp first (``parallelize_module`` with the resolved plan), then pp
(``PipelineModule`` traces the model and runs its schedule over the pp sub-mesh; the step is
``loss = model(inputs, target=labels)``, so ``accelerator.backward`` is a no-op), recompute on each block (of
each stage once built), then the dp engine over the dp mesh: FSDP2 (``"fsdp"``, ``"zero2"``, HSDP on a 2-D
mesh), DDP or ZeRO-1 (``"ddp"``, ``"zero1"``; beside tp, where the weights are DTensors, FSDP2's ``replicate``
and a ``fully_shard`` that keeps the gathered weights: ``realisation``). docs/parallelism.md has the options and
what each strategy name becomes.

What a caller must know: tied weights keep one value under every layout (``convoy.train.parallel.ties``);
checkpoints are ``torch.distributed.checkpoint`` directories loadable at any other layout, a pipeline's loaded
on its first call; with pp, gradient accumulation scales each micro-batch's loss and the dp reduction still runs
on the accumulating calls. fp16 with pp raises ``NotSupportedYetError``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from convoy.errors import NotSupportedYetError, StrategyError
from convoy.plan.dims import ParallelDims
from convoy.train.parallel.causal_lm import is_causal_lm
from convoy.train.parallel.compile import (
    apply_compile,
    compile_config,
    refuse_context_parallel,
    refuse_tensor_parallel,
)
from convoy.train.parallel.float8 import refuse_float8_tp
from convoy.train.parallel.float8 import tracing_stand_ins as float8_stand_ins
from convoy.train.parallel.mesh import ParallelMesh, build_mesh
from convoy.train.parallel.pipeline import PipelineConfig, PipelineModule, SingleStage, find_layers
from convoy.train.parallel.recompute import apply_recompute, recompute_units
from convoy.train.parallel.styles import plain_shards, strided_like
from convoy.train.parallel.tensor import apply_tensor_parallel, check_beside_fsdp, resolve_tp_plan, tracing_stand_ins
from convoy.train.parallel.ties import find_ties, share_in_state
from convoy.train.precision import Precision
from convoy.train.settings import TrainSettings
from convoy.train.strategies.base import ParameterOrigins, Strategy, SupportsNoSync
from convoy.train.strategies.fsdp import no_gradient_sync, offload_policy, shard_model
from convoy.train.strategies.options import ParallelOptions
from convoy.train.strategies.replicated import replicate_model

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from torch.distributed.device_mesh import DeviceMesh

__all__ = ["ParallelStrategy", "TensorParallelStrategy", "PipelineParallelStrategy", "HybridShardStrategy",
           "realisation"]

_DP_ENGINES = ("fsdp", "zero2", "ddp", "zero1")
_SHARDED = ("fsdp", "zero2")  # the engines that shard with FSDP2
#: the realisations (``realisation``) that shard with FSDP2's ``fully_shard``
_FULLY_SHARD = ("fsdp", "fsdp-kept")


def realisation(engine: str, tp: int) -> str:
    """How ``dp_engine`` ``engine`` is run over dp > 1 when tensor parallelism is ``tp``: ``"fsdp"`` (fully_shard,
    resharding after forward for ``fsdp``, keeping the gathered weights for ``zero2``: both ``fully_shard``),
    ``"ddp"`` (DistributedDataParallel), ``"zero1"`` (DDP and ZeroRedundancyOptimizer), and beside tp, whose
    weights are DTensors that DDP and ZeroRedundancyOptimizer do not take: ``"replicate"`` for ddp (FSDP2's
    replicate: whole replicas, gradients all-reduced) and ``"fsdp-kept"`` for zero1 (``fully_shard`` keeping the
    gathered weights from forward to backward: the optimizer state sharded as ZeRO-1 shards it, the gradients
    too, so the memory is at most ZeRO-1's and the traffic the same: reduce-scatter and all-gather)."""
    if engine in _SHARDED:
        return "fsdp"
    if tp > 1:
        return "replicate" if engine == "ddp" else "fsdp-kept"
    return engine


class ParallelStrategy(Strategy, SupportsNoSync):
    """dp x tp x pp from ``context.parallel_dims`` (pure data parallel over the world when absent)."""

    needs_process_group = True
    options = ParallelOptions.keys()
    options_type = ParallelOptions
    config: ParallelOptions

    def __init__(self, context: TrainSettings, precision: Precision | None = None) -> None:
        super().__init__(context, precision)
        unknown = sorted(set(context.options) - set(self.options))
        if unknown:
            raise StrategyError(f"strategy={self.name!r}: unknown option {unknown[0]!r}; options are "
                                f"{', '.join(self.options)}")
        dims = self.default_dims(context)
        dims.check_world_size(context.world_size)
        engine = self.default_engine(dims) if self.config.dp_engine is None else self.config.dp_engine
        if engine not in _DP_ENGINES:
            raise StrategyError(f"dp_engine={engine!r} is unknown; choose one of {', '.join(_DP_ENGINES)}")
        if self.shards_only and engine not in _SHARDED:
            raise StrategyError(f"strategy={self.name!r} shards each replica with FSDP2: dp_engine={engine!r} is "
                                f"not one it runs; use 'fsdp' or 'zero2', or strategy 'parallel' for {engine!r}")
        if dims.pp_enabled and self.precision.scales_loss:
            # the schedule runs backward itself, so the gradient scaler never scales the loss: training would
            # silently divide every gradient by the scale
            raise NotSupportedYetError("mixed_precision='fp16' with pp is not supported yet (its loss scaling "
                                       "cannot reach the pipeline's backward); use 'bf16'")
        if dims.hsdp_enabled and engine not in _SHARDED:
            raise StrategyError(f"dp_replicate x dp_shard (HSDP) needs dp_engine='fsdp', not {engine!r}")
        if dims.cp_enabled:
            _check_context_parallel(dims, engine, sequence_parallel=self.config.sequence_parallel)
        if not dims.hsdp_enabled:  # one dp axis: name it by how it is realised
            rep, shard = (1, dims.dp) if realisation(engine, dims.tp) in _FULLY_SHARD else (dims.dp, 1)
            dims = ParallelDims(dp_replicate=rep, dp_shard=shard, tp=dims.tp, pp=dims.pp, cp=dims.cp)
        self.dims = dims
        self.dp_engine = engine
        # cp ranks hold different shards of the weights (FSDP2 over dp_shard x cp) even when dp = 1
        self._realised = realisation(engine, dims.tp) if dims.dp_enabled or dims.cp_enabled else "none"
        self._pm: ParallelMesh | None = None
        # id(parameter before prepare) -> (prepared module, parameter name): parallelize_module and
        # fully_shard replace parameters, and an optimizer built before prepare() must follow them.
        self._origins = ParameterOrigins()
        self._pipelines: list[PipelineModule] = []
        self._own_backward = False  # a prepared model runs its own backward (pipeline or SingleStage)
        self._optimizers: list[Any] = []  # re-pointed again when a pipeline shards its stages on the first call
        self._group_names: dict[int, list[list[str]]] = {}  # id(optimizer) -> its groups' names, whole model

    #: True for a strategy that runs only the FSDP2 engines (``hsdp``)
    shards_only = False

    @classmethod
    def default_dims(cls, context: TrainSettings) -> ParallelDims:
        return context.parallel_dims or ParallelDims(dp_replicate=context.world_size)

    @staticmethod
    def default_engine(dims: ParallelDims) -> str:
        """ZeRO-1 with pp, as the multi-GPU guide recommends; else FSDP2 (with tp, the least memory)."""
        return "zero1" if dims.pp_enabled and not dims.tp_enabled else "fsdp"

    @property
    def distributed_type(self) -> str:  # type: ignore[override]
        hsdp = self.dims.hsdp_enabled
        engines = {"fsdp": "HSDP" if hsdp else "FSDP", "zero2": "HSDP" if hsdp else "FSDP", "ddp": "DDP",
                   "zero1": "ZERO1"}
        dp = engines[self.dp_engine] if self.dims.dp_enabled else ""
        dp = dp or (engines[self.dp_engine] if self.dims.cp_enabled else "")
        axes = [dp] + [name.upper() for name in ("cp", "tp", "pp") if getattr(self.dims, name) > 1]
        return "+".join(a for a in axes if a) or "NO"

    # --- environment ----------------------------------------------------------------------------------
    def setup_environment(self) -> None:
        if self._pm is None:
            self._pm = build_mesh(self.dims, device_type=self.root_device.type)

    @property
    def mesh(self) -> ParallelMesh:
        self.setup_environment()
        assert self._pm is not None
        return self._pm

    @property
    def data_parallel_rank(self) -> int:
        return self.mesh.dp_rank

    @property
    def data_parallel_size(self) -> int:
        return self.dims.dp

    # --- module and optimizer -------------------------------------------------------------------------
    def setup_module(self, module: torch.nn.Module) -> Any:
        pm = self.mesh
        module = module.to(self.root_device)
        names = {id(p): n for n, p in module.named_parameters()}
        stand_ins = None
        self._convert_layers(module)
        if self.dims.cp_enabled:
            refuse_context_parallel(compile_config(self.context))
        if self.dims.tp_enabled:
            refuse_tensor_parallel(compile_config(self.context), self.config.sequence_parallel)
            plan = resolve_tp_plan(module, self.config.tp_plan, sequence_parallel=self.config.sequence_parallel)
            if self.dims.dp_enabled and self.dp_engine in _SHARDED:
                check_beside_fsdp(module, plan)
            apply_tensor_parallel(module, _enabled(pm.tp), plan)
            if self.dims.pp_enabled:  # the pipeline traces plain stand-ins of the split modules (see tensor.py)
                stand_ins = functools.partial(tracing_stand_ins, module, plan)
        if self.dims.pp_enabled and self.precision.float8 is not None:  # stages call the real Float8Linear
            stand_ins = functools.partial(float8_stand_ins, module, stand_ins)
        if self.dims.pp_enabled:
            _check_pipeline_loss(module, self.config.loss_fn)
            # with tp, parallelize_module replaced the split parameters (DTensors, which the stages share):
            # an optimizer built before prepare() must follow them
            self._origins.record(module, names)
            wrap: Callable[[torch.nn.Module], torch.nn.Module] | None = None
            if self._realised in _FULLY_SHARD:
                wrap = functools.partial(self._shard_stage, module)
            elif self._realised == "replicate":
                wrap = functools.partial(self._replicate_stage, module)
            elif self.dims.dp_enabled:
                wrap = self._wrap_stage
            wrap = self._prepared_stages(module, wrap)
            config = self.config.pipeline()
            if self.dims.tp_enabled and self.config.sequence_parallel:
                _check_block_boundaries(module, config)
            pipe = PipelineModule(module, config=config,
                                  loss_fn=self.config.loss_fn, group=_enabled(pm.pp).get_group(),
                                  device=self.root_device, wrap_stage=wrap, trace_stand_ins=stand_ins,
                                  loss_scale=1.0 / self.context.gradient_accumulation_steps)
            # stages are built (and, with fsdp, sharded) on the first call: optimizers follow them then
            pipe.on_build(self._follow_stages)
            self._pipelines.append(pipe)
            self._own_backward = True
            return pipe
        # torchtitan's order: tensor parallelism, then activation checkpointing, then compile, then data parallelism
        apply_recompute(module, self.context.recompute, classes=self.config.auto_wrap)
        apply_compile(module, compile_config(self.context), classes=self.config.auto_wrap)
        if self.dims.dp_enabled or self.dims.cp_enabled:
            module = self._data_parallel(module)
        self._origins.record(self.unwrap(module), names)  # names are the model's, not a DDP wrapper's
        loss_fn = self.config.loss_fn
        if loss_fn is not None:  # a pipeline loop (model(x, target=y)) at pp = 1: nothing to split
            self._own_backward = True
            return SingleStage(module, loss_fn=loss_fn, loss_scale=1.0 / self.context.gradient_accumulation_steps)
        return module

    def _convert_layers(self, module: torch.nn.Module) -> None:
        """The precision's layer swap (fp8: ``Float8Linear``), the first step (torchtitan's order: float8, tensor
        parallel, recompute, compile, FSDP2), on the whole model, so a pipeline's last stage keeps the model's head;
        float8 with tensor parallel on gloo is refused."""
        float8 = self.precision.float8
        if self.dims.tp_enabled:
            refuse_float8_tp(float8, backend=self.context.backend, device_type=self.root_device.type)
        self.precision.convert_layers(module, fsdp=self.dims.dp_enabled and self.dp_engine in _SHARDED)

    def _prepared_stages(self, model: torch.nn.Module, wrap: Any) -> Any:
        """``wrap`` (the stages' data parallelism, or None) preceded by recomputation, then compilation, of each
        stage's blocks: the stages of a traced pipeline keep the model's module names but not its lists, so the
        blocks are named on the whole model first (a model without any is refused here, before tracing)."""
        mode, compiled = self.context.recompute, compile_config(self.context)
        blocks = [name for name, _ in recompute_units(model, self.config.auto_wrap)]
        if mode == "none" and not compiled.enabled:
            return wrap
        if not blocks and mode != "none":
            apply_recompute(model, mode)  # refuses a model that trains and has no blocks

        def prepare_stage(stage: torch.nn.Module) -> torch.nn.Module:
            apply_recompute(stage, mode, names=blocks)
            apply_compile(stage, compiled, names=blocks)
            return wrap(stage) if wrap is not None else stage

        return prepare_stage

    def _data_parallel(self, module: torch.nn.Module) -> torch.nn.Module:
        if self.dp_engine in _SHARDED:
            # as zero3 does (and torchtitan with tp): 16-bit gathered weights under mixed precision, so autocast
            # keeps no bf16 copy of every fp32 weight until the backward; zero2 keeps them from forward to backward
            resharded = {"reshard_after_forward": False} if self.dp_engine == "zero2" else {}
            mp = self.precision.fsdp_policy()
            return shard_model(module, self.config.auto_wrap, named=self._named(), mesh=self.mesh.dp_shard_mesh,
                               mp_policy=mp, offload_policy=offload_policy(self.config), **resharded)
        if self._realised == "fsdp-kept":  # zero1 beside tp: fp32 weights under autocast, as ZeRO-1 keeps them
            return shard_model(module, self.config.auto_wrap, named=self._named(), mesh=self.mesh.dp_shard_mesh,
                               reshard_after_forward=False)
        if self._realised == "replicate":
            return replicate_model(module, self.config.auto_wrap, named=self._named(), mesh=self.mesh.dp)
        return self._wrap_stage(module)

    def _named(self) -> str:
        """The layout, as a message names it: ``dp_engine='fsdp' beside tp=2``."""
        split = ", ".join(f"{axis}={getattr(self.dims, axis)}" for axis in ("cp", "tp", "pp")
                          if getattr(self.dims, axis) > 1)
        return f"dp_engine={self.dp_engine!r}" + (f" beside {split}" if split else "")

    def _follow_stages(self, pipe: PipelineModule) -> None:
        """Once the stages exist, each optimizer holds exactly this process's stage parameters (sharded
        ones where FSDP replaced them): no state for other stages' weights, and state dicts that name only
        what this process trains."""
        mine = {id(p) for p in pipe.parameters()}
        names = {id(p): n for n, p in pipe.model.named_parameters()}
        for optimizer in self._optimizers:
            self._origins.repoint(optimizer)
            # every rank's checkpoint names the whole model's groups, so any stage layout can load it
            self._group_names[id(optimizer)] = [[names[id(p)] for p in group["params"] if id(p) in names]
                                                for group in optimizer.param_groups]
            for group in optimizer.param_groups:
                group["params"] = [p for p in group["params"] if id(p) in mine]

    def _shard_stage(self, model: torch.nn.Module, stage: torch.nn.Module) -> torch.nn.Module:
        """FSDP2 over the dp mesh for one pipeline stage of ``model``. Parameters stay gathered between the
        micro-batches' forward and backward (``reshard_after_forward=False``, as torchtitan does with pp); the
        schedule itself turns gradient reduction off until the last micro-batch. ``model`` then holds the
        stage's sharded parameters too, so that its state dicts (and the optimizer's) name them."""
        self._origins.record(stage, {id(p): n for n, p in stage.named_parameters()})
        # A traced stage can end in a view (a reshape); FSDP2 warns that an in-place op on it would skip the
        # all-gather. The schedule only sends it on or feeds it to the loss, never in place: the warning,
        # printed by every rank, says nothing to the user here.
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(FSDPGraphModule\) returned a view")
        shard_model(stage, self.config.auto_wrap, named=self._named(), mesh=self.mesh.dp_shard_mesh,
                    reshard_after_forward=False, offload_policy=offload_policy(self.config))
        for name, param in stage.named_parameters():
            parent, _, leaf = name.rpartition(".")
            model.get_submodule(parent).register_parameter(leaf, param)
        return stage

    def _replicate_stage(self, model: torch.nn.Module, stage: torch.nn.Module) -> torch.nn.Module:
        """``replicate_model`` over the dp mesh for one pipeline stage of ``model`` whose weights are DTensors
        (ddp beside tp and pp); ``model`` then holds the stage's new parameters, as with ``_shard_stage``."""
        self._origins.record(stage, {id(p): n for n, p in stage.named_parameters()})
        warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(FSDPGraphModule\) returned a view")
        replicate_model(stage, self.config.auto_wrap, named=self._named(), mesh=self.mesh.dp)
        for name, param in stage.named_parameters():
            parent, _, leaf = name.rpartition(".")
            model.get_submodule(parent).register_parameter(leaf, param)
        return stage

    def _wrap_stage(self, module: torch.nn.Module) -> torch.nn.Module:
        """DDP over the dp group (used for whole models and for pipeline stages)."""

        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        return DistributedDataParallel(module, device_ids=device_ids, process_group=_enabled(self.mesh.dp).get_group(),
                                       find_unused_parameters=self.config.find_unused_parameters)

    def setup_optimizer(self, optimizer: torch.optim.Optimizer, module: Any = None) -> torch.optim.Optimizer:
        self._origins.repoint(optimizer)
        if self._realised != "zero1":
            self._optimizers.append(optimizer)  # ZeRO-1 stages keep their parameters; nothing to re-point
        if self._realised == "zero1":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            if not isinstance(optimizer, ZeroRedundancyOptimizer):
                groups = [dict(g) for g in optimizer.param_groups]
                # defaults can hold keys the constructor does not take (AdamW's decoupled_weight_decay)
                accepted = inspect.signature(type(optimizer).__init__).parameters
                defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
                optimizer = ZeroRedundancyOptimizer(groups, optimizer_class=type(optimizer),
                                                    process_group=_enabled(self.mesh.dp).get_group(), **defaults)
        for pipe in self._pipelines:  # weights tied across stages: their gradients summed once, before each step
            pipe.on_build(functools.partial(PipelineModule.hook_optimizer, optimizer=optimizer))
        return optimizer

    def unwrap(self, module: Any) -> torch.nn.Module:
        if isinstance(module, PipelineModule):
            return module.model  # parameters of other stages in it are never trained here
        if isinstance(module, SingleStage):
            module = module.module
        return module.module if isinstance(module, DistributedDataParallel) else module

    # --- a step ---------------------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        if self._own_backward and not loss.requires_grad:
            return  # a pipeline (or SingleStage) ran backward with the forward; its loss comes back detached
        loss.backward(**kwargs)

    def no_sync(self, module: Any) -> contextlib.AbstractContextManager[None]:
        if isinstance(module, PipelineModule):
            # gradients accumulate in the stages across calls (each scaled by loss_scale); the dp reduction
            # still runs on every call, which is correct (it is linear) but not saved: more pp_microbatches
            # give the same gradient with one reduction
            return contextlib.nullcontext()
        if isinstance(module, SingleStage):
            return self.no_sync(module.module)
        if isinstance(module, DistributedDataParallel):
            return module.no_sync()
        return no_gradient_sync(module)  # FSDP2 modules; a no-op for the others

    def clip_grad_norm_(self, module: Any, parameters: Any, max_norm: float, norm_type: float = 2.0
                        ) -> torch.Tensor:
        from convoy.train.parallel.norms import clip_grad_norm_

        pp_group = _enabled(self.mesh.pp).get_group() if self.dims.pp_enabled else None
        skip: set[int] = set()
        for pipe in self._pipelines:  # a weight tied across stages: its gradient summed first, counted once
            pipe.sync_tied_gradients()
            skip |= pipe.tied_norm_skip()
        return clip_grad_norm_(list(parameters), max_norm, norm_type=norm_type, pp_group=pp_group, skip=skip)

    # --- state ----------------------------------------------------------------------------------------
    def full_model_state_dict(self, module: Any) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if isinstance(module, PipelineModule):
            local = {k: _full(v).detach().cpu() for k, v in module.state_dict().items()}
            parts: list[Any] = [None] * self.dims.pp
            dist.all_gather_object(parts, local, group=_enabled(self.mesh.pp).get_group())
            # a tied weight's copies (one per stage using it) are equal: one tensor under each of its names
            return share_in_state({k: v for part in parts for k, v in part.items()}, module.ties)
        full = cast("dict[str, torch.Tensor]",  # a model's state: tensors
                    get_model_state_dict(self.unwrap(module), options=StateDictOptions(full_state_dict=True)))
        return share_in_state({k: v.detach().cpu() for k, v in full.items()}, find_ties(self.unwrap(module)))

    def checkpoint_state(self, module: Any, optimizer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        # packed tensor-parallel weights (_StridedShard) are saved as plain shards of the same tensors
        msd, osd = self._checkpoint_state(module, optimizer)
        return plain_shards(msd), plain_shards(osd)

    def _checkpoint_state(self, module: Any, optimizer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        if not isinstance(module, PipelineModule):
            if isinstance(optimizer, ZeroRedundancyOptimizer):
                msd = super().checkpoint_state(self.unwrap(module), None)[0]
                return msd, self._zero_state(self.unwrap(module), optimizer, keep=set(msd))
            return super().checkpoint_state(self.unwrap(module), optimizer)
        return self._pipeline_state(module, optimizer)

    @staticmethod
    def _zero_state(model: Any, optimizer: Any, *, keep: set[str]) -> dict[str, Any]:
        """A ZeroRedundancyOptimizer's state, gathered over its dp group, for the parameters named in ``keep``
        (those this process saves: a pipeline's other stages are not)."""
        from convoy.train.optimizer_names import param_names
        from convoy.train.strategies.ddp import gathered_zero_state

        named = gathered_zero_state(optimizer, param_names(model, optimizer))
        return {**named, "state": {k: v for k, v in named["state"].items() if k in keep}}

    def _pipeline_state(self, pipe: PipelineModule, optimizer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
        from torch.distributed.optim import ZeroRedundancyOptimizer

        if not pipe.built:
            raise StrategyError("a pipeline is built on its first training call; save after at least one step")
        msd = pipe.state_dict()  # only this process's stages: other stages' copies here are stale
        if optimizer is None:
            return msd, {}
        if isinstance(optimizer, ZeroRedundancyOptimizer):
            return msd, self._zero_state(pipe.model, optimizer, keep=set(msd))
        osd: dict[str, Any] = get_optimizer_state_dict(pipe.model, optimizer)
        groups = [dict(group, params=list(names)) for group, names in
                  zip(osd["param_groups"], self._group_names.get(id(optimizer), []))] or osd["param_groups"]
        return msd, {**osd, "param_groups": groups}

    def after_build(self, module: Any, callback: Any) -> None:
        if isinstance(module, PipelineModule):
            module.on_build(lambda _: callback())  # at once when already built
        else:
            callback()

    def load_checkpoint_state(self, module: Any, optimizer: Any, model_state: dict[str, Any],
                              optimizer_state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict
        from torch.distributed.optim import ZeroRedundancyOptimizer

        from convoy.train.optimizer_names import param_names
        from convoy.train.strategies.ddp import load_zero_state

        model = module.model if isinstance(module, PipelineModule) else self.unwrap(module)
        tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
        model_state = strided_like(tensors.get, model_state)  # back to the packed layouts checkpoint_state left
        optimizer_state = strided_like(tensors.get, optimizer_state) if optimizer_state else optimizer_state
        if isinstance(optimizer, ZeroRedundancyOptimizer) and optimizer_state:
            load_zero_state(optimizer, optimizer_state, param_names(model, optimizer))
            optimizer, optimizer_state = None, {}
        if not isinstance(module, PipelineModule):
            super().load_checkpoint_state(model, optimizer, model_state, optimizer_state)
            return
        if model_state:
            module.load_state_dict(model_state)
        if optimizer is not None and optimizer_state:
            set_optimizer_state_dict(model, optimizer, optimizer_state)


class TensorParallelStrategy(ParallelStrategy):
    """Tensor parallel; without ``parallelism`` every process is one tp rank."""

    @classmethod
    def default_dims(cls, context: TrainSettings) -> ParallelDims:
        return context.parallel_dims or ParallelDims(tp=context.world_size)


class PipelineParallelStrategy(ParallelStrategy):
    """Pipeline parallel; without ``parallelism`` every process is one stage."""

    @classmethod
    def default_dims(cls, context: TrainSettings) -> ParallelDims:
        return context.parallel_dims or ParallelDims(pp=context.world_size)


class HybridShardStrategy(ParallelStrategy):
    """``strategy="hsdp"``: FSDP2 over dp_replicate x dp_shard, parameters sharded inside each shard group and
    replicated across them (``fully_shard`` on the 2-D dp mesh), beside any tp and pp degrees. Without both dp
    degrees given, the shard group is the processes of one machine (``LOCAL_WORLD_SIZE`` / (tp x pp)): sharded
    over the fast links inside a node, replicated over the network, the planner's ``hsdp``."""

    shards_only = True

    @classmethod
    def default_dims(cls, context: TrainSettings) -> ParallelDims:
        dims = context.parallel_dims or ParallelDims(dp_replicate=context.world_size)
        if dims.hsdp_enabled:
            return dims
        model = dims.tp * dims.pp * dims.cp
        per_node = context.local_world_size // model if context.local_world_size % model == 0 else 1
        shard = math.gcd(dims.dp, max(1, per_node))
        return ParallelDims(dp_replicate=dims.dp // shard, dp_shard=shard, tp=dims.tp, pp=dims.pp, cp=dims.cp)

    @staticmethod
    def default_engine(dims: ParallelDims) -> str:
        return "fsdp"


def _check_block_boundaries(model: torch.nn.Module, config: PipelineConfig) -> None:
    """With sequence parallelism only the activations between blocks are plain sequence shards; anywhere else
    they are DTensors, which pipeline stages cannot send. Stages must begin at entries of the layer list."""
    if config.split_at is None:
        return  # the default cut is between entries of the layer list
    layers, count = find_layers(model, config.layers)
    blocks = {f"{layers}.{i}" for i in range(count)}
    for name in config.split_at:
        if name not in blocks:
            raise StrategyError(f"pp_split_at {name!r} with sequence_parallel: stages must begin at an entry of "
                                f"{layers!r} (e.g. '{layers}.1'); between blocks the activations are sequence "
                                "shards, elsewhere they are DTensors, which stages cannot send")


def _check_pipeline_loss(model: torch.nn.Module, loss_fn: Any) -> None:
    """At prepare, not at the first step: a pipeline trains with a loss, the model's own for a transformers
    causal LM, else ``loss_fn``."""
    if loss_fn is None and not is_causal_lm(model):
        raise StrategyError(f"pp needs a loss function for {type(model).__name__}: pass strategy_options="
                            f"{{'loss_fn': fn}} (fn(output, target) -> loss) and train with model(inputs, "
                            f"target=labels); transformers causal LMs need none (model(input_ids=..., labels=...))")
    if loss_fn is not None and not callable(loss_fn):
        raise StrategyError(f"strategy_options['loss_fn'] = {loss_fn!r} is not callable; pass fn(output, target)")


def _check_context_parallel(dims: ParallelDims, engine: str, *, sequence_parallel: bool) -> None:
    """cp runs beside FSDP2 (the weights sharded over dp_shard x cp, the gradients averaged over dp x cp), as
    torchtitan and Accelerate run it; what it is not yet tested beside is refused."""
    if engine not in _SHARDED:
        raise NotSupportedYetError(f"cp={dims.cp} beside dp_engine={engine!r} is not supported yet: context "
                                   f"parallelism runs with FSDP2 over dp_shard x cp; use strategy 'zero3' (or "
                                   f"'fsdp', 'zero2', 'parallel')")
    if dims.pp_enabled:
        raise NotSupportedYetError(f"cp={dims.cp} beside pp={dims.pp} is not supported yet; give cp with data and "
                                   f"tensor parallelism (dp x cp x tp)")
    if sequence_parallel and dims.tp_enabled:
        raise NotSupportedYetError(f"cp={dims.cp} with sequence_parallel is not supported yet (both split the "
                                   f"sequence); leave sequence_parallel off, cp already splits the activations")


def _enabled(mesh: DeviceMesh | None) -> DeviceMesh:
    """The sub-mesh of a degree above 1, which ``build_mesh`` always names (``ParallelMesh`` gives None for 1)."""
    assert mesh is not None
    return mesh


def _full(t: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t
