"""``strategy="zero2"``, ``"zero3"`` and ``"fsdp"``: parameters, gradients and optimizer state sharded
with FSDP2 (``torch.distributed.fsdp.fully_shard``), never the legacy ``FullyShardedDataParallel``.

    accelerator = Accelerator(strategy="zero3")   # reshard after forward: least memory
    accelerator = Accelerator(strategy="zero2")   # keep parameters gathered between forward and backward
    accelerator = Accelerator(strategy="fsdp")    # the same as zero3, under PyTorch's name

Options (``Accelerator(strategy_options={...})``): ``auto_wrap`` (module classes, or their names, to shard one by
one; default: every block held in an ``nn.ModuleList``), ``cpu_offload`` (bool; uses
``CPUOffloadPolicy(pin_memory=False)`` on machines without an accelerator, where pinning fails).

Mixed precision maps onto ``MixedPrecisionPolicy`` (``Strategy.precision.fsdp_policy()``): ``bf16``/``fp16``
compute in that dtype and reduce gradients in fp32. A model FSDP2 cannot shard (``fsdp_limit``: a scalar parameter,
as in Accelerate's ``RegressionModel``; a non-contiguous one; trainable parameters of two dtypes in one shard unit)
is refused at ``prepare`` in one line; outputs FSDP2 cannot see into (a ``SimpleNamespace``, a dataclass) are opened
for its hooks (``convoy.train.strategies.fsdp_outputs``). Legacy FSDP is avoided on purpose: on CPU it trains wrong
numbers with SHARD_GRAD_OP + ``use_orig_params`` + auto-wrap, and HYBRID_SHARD diverges (see docs/training.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, cast

import torch
from torch.distributed.device_mesh import init_device_mesh

from convoy.errors import NotSupportedYetError, StrategyError
from convoy.train.parallel.compile import apply_compile, compile_config
from convoy.train.parallel.recompute import apply_recompute
from convoy.train.precision import Precision
from convoy.train.settings import TrainSettings
from convoy.train.strategies.base import ParameterOrigins, Strategy, SupportsNoSync
from convoy.train.strategies.fsdp_outputs import fully_shard_exposed
from convoy.train.strategies.options import ShardOptions, StrategyOptions

__all__ = ["Zero2Strategy", "Zero3Strategy", "FSDPStrategy", "fsdp_limit", "shard_model"]


class _FullyShardStrategy(Strategy, SupportsNoSync):
    distributed_type = "FSDP"
    needs_process_group = True
    reshard_after_forward: ClassVar[bool] = True
    options = ShardOptions.keys()
    options_type = ShardOptions
    config: ShardOptions

    def __init__(self, context: TrainSettings, precision: Precision | None = None) -> None:
        super().__init__(context, precision)
        self._mesh: Any = None
        # id(original parameter) -> (prepared module, parameter name), to re-point optimizers built
        # before prepare(): fully_shard replaces every Parameter with a sharded one.
        self._origins = ParameterOrigins()

    def setup_environment(self) -> None:
        if self._mesh is None:
            self._mesh = init_device_mesh(self.root_device.type, (self.context.world_size,))

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        self.setup_environment()
        module = module.to(self.root_device)
        names = {id(p): n for n, p in module.named_parameters()}
        # fp8's Float8Linear swap first (torchtitan's order): tensorwise weights are then all-gathered in float8
        self.precision.convert_layers(module, fsdp=True)
        mp = self.precision.fsdp_policy()
        offload = offload_policy(self.config)
        # checkpointed before sharding (torchtitan's order): the blocks are FSDP's units, whose hooks gather the
        # weights outside the recomputed region, and again for the backward before the block is recomputed
        apply_recompute(module, self.context.recompute, classes=self.config.auto_wrap)
        apply_compile(module, compile_config(self.context), classes=self.config.auto_wrap)  # before sharding, too
        shard_model(module, self.config.auto_wrap, named=f"strategy={self.name!r}", mesh=self._mesh,
                    reshard_after_forward=self.reshard_after_forward, mp_policy=mp, offload_policy=offload)
        self._origins.record(module, names)
        return module

    def setup_optimizer(self, optimizer: torch.optim.Optimizer, module: torch.nn.Module | None = None
                        ) -> torch.optim.Optimizer:
        if any(self._origins.knows(p) for p in optimizer.state):
            raise NotSupportedYetError(f"strategy={self.name!r}: the optimizer already has state (it has "
                                       "stepped); pass it through prepare() before its first step")
        self._origins.repoint(optimizer)
        return optimizer

    def no_sync(self, module: torch.nn.Module) -> contextlib.AbstractContextManager[None]:
        return no_gradient_sync(module)

    def clip_grad_norm_(self, module: torch.nn.Module | None, parameters: Any, max_norm: float,
                        norm_type: float = 2.0) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)
        return norm.full_tensor() if isinstance(norm, DTensor) else norm

    def full_model_state_dict(self, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        # cpu_offload=True is avoided: it crashed (SIGSEGV) with legacy FSDP on CPU; copying after is safe.
        full = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True))
        return {k: v.detach().cpu() for k, v in cast(dict[str, torch.Tensor], full).items()}  # a model's: tensors


def offload_policy(options: Mapping[str, Any] | StrategyOptions) -> Any:
    """FSDP2's offload policy for the strategy options: ``CPUOffloadPolicy`` with ``cpu_offload`` (pinned memory
    only where an accelerator is, as pinning fails without one), else none."""
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    if ShardOptions.parse(options).cpu_offload:
        return CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    return OffloadPolicy()


@contextlib.contextmanager
def no_gradient_sync(module: torch.nn.Module) -> Iterator[None]:
    """Inside, an FSDP2 module's backward keeps its gradients local (no reduce-scatter); a no-op for others."""
    if not hasattr(module, "set_requires_gradient_sync"):
        yield
        return
    module.set_requires_gradient_sync(False)  # type: ignore[operator]  # FSDPModule's method, not a submodule
    try:
        yield
    finally:
        module.set_requires_gradient_sync(True)  # type: ignore[operator]  # FSDPModule's method, not a submodule


def shard_units(module: torch.nn.Module, classes: Any) -> list[torch.nn.Module]:
    """Sub-modules sharded one by one (innermost first), so only one block is gathered at a time: those of
    ``classes`` (``strategy_options["auto_wrap"]``: module classes, or class names as Accelerate's
    ``transformer_cls_names_to_wrap``), else every child of a ``ModuleList``. A name no module of the model has is
    one ``StrategyError``, as in Accelerate."""

    if classes:
        names = {c for c in classes if isinstance(c, str)}
        missing = names - {type(m).__name__ for m in module.modules()}
        if missing:
            raise StrategyError(f"auto_wrap: the model has no module of class {sorted(missing)[0]!r} to shard on its "
                                f"own; give class names the model has, such as {type(module).__name__!r}'s blocks")
        wanted = tuple(c for c in classes if not isinstance(c, str))
        found = [m for m in module.modules()
                 if m is not module and (isinstance(m, wanted) or type(m).__name__ in names)]
    else:
        found = [child for m in module.modules() if isinstance(m, torch.nn.ModuleList) for child in m]
    return list(reversed(found))


def fsdp_limit(module: torch.nn.Module, classes: Any = None) -> str | None:
    """Why FSDP2's ``fully_shard`` cannot shard ``module`` as convoy shards it (the units of ``shard_units``, then
    the root), in a few words naming the parameter; None when it can. The checks ``fully_shard`` makes, at
    wrapping (``_verify_managed_param``: a 0-dim parameter, as it splits along the first dimension; ``FSDPParam``:
    a non-contiguous one) and at the first forward (``FSDPParamGroup._init_mp_dtypes``: one dtype for the
    trainable parameters of a unit)."""
    owner: dict[int, str] = {}  # id(parameter) -> its unit's name: an inner unit claims it before the root
    names = {id(m): n for n, m in module.named_modules()}
    for unit in [*shard_units(module, classes), module]:
        for param in unit.parameters():
            owner.setdefault(id(param), names.get(id(unit), "") or "the model")
    dtypes: dict[str, tuple[str, torch.dtype]] = {}
    for name, param in module.named_parameters():
        if param.dim() == 0:
            return f"parameter {name!r} is a scalar (0-dim), and fully_shard splits along the first dimension"
        if not param.is_contiguous():
            return f"parameter {name!r} is not contiguous (stride {tuple(param.stride())}), which fully_shard refuses"
        if param.requires_grad:
            unit_name = owner.get(id(param), "the model")
            first, dtype = dtypes.setdefault(unit_name, (name, param.dtype))
            if dtype != param.dtype:
                return (f"trainable parameters {first!r} ({dtype}) and {name!r} ({param.dtype}) are sharded "
                        f"together (in {unit_name}), and FSDP2 takes one dtype per unit")
    return None


def shard_model(module: torch.nn.Module, classes: Any, *, named: str, **kwargs: Any) -> torch.nn.Module:
    """``fully_shard`` the units of ``module`` (``shard_units(module, classes)``) and then ``module`` with
    ``kwargs``, their outputs opened for FSDP2's hooks (``fully_shard_exposed``); a model FSDP2 cannot shard
    (``fsdp_limit``) is one ``StrategyError`` naming ``named`` (the strategy asked for) and what runs it instead."""
    why = fsdp_limit(module, classes)
    if why is not None:
        fix = " (a scalar can become a 1-element tensor, torch.tensor([v]))" if "scalar" in why else ""
        raise StrategyError(f"{named} shards the model with FSDP2, which cannot shard it: {why}; use strategy "
                            f"'ddp' or 'zero1', or change the parameter{fix}")
    for unit in [*shard_units(module, classes), module]:
        fully_shard_exposed(unit, **kwargs)
    return module


class Zero3Strategy(_FullyShardStrategy):
    """Parameters, gradients and optimizer state sharded; parameters freed again after forward."""

    reshard_after_forward = True


class FSDPStrategy(Zero3Strategy):
    """PyTorch's name for ZeRO-3."""


class Zero2Strategy(_FullyShardStrategy):
    """Gradients and optimizer state sharded; parameters stay gathered from forward until backward."""

    reshard_after_forward = False
