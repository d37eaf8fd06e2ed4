"""Mixed precision in one object, built once per ``Accelerator`` and held by its strategy (``Strategy.precision``).

    precision = precision_for("bf16", device_type="cuda")
    model = precision.convert_module(model)            # forward under autocast, 16-bit outputs back in fp32
    with precision.forward_context(): ...              # the same autocast, for code outside the forward
    fully_shard(model, mp_policy=precision.fsdp_policy())
    precision.scale_loss(loss).backward()              # fp16 only scales it (torch.amp.GradScaler)
    result, skipped = precision.optimizer_step(optimizer)

One class per mode: ``Precision`` (``"no"``: fp32, every method a no-op), ``AutocastPrecision`` (``"bf16"``:
``torch.autocast``, and FSDP2 gathering 16-bit weights and reducing in fp32), ``ScaledPrecision`` (``"fp16"``: the
same with the loss scaled against fp16's narrow range) and ``Float8Precision`` (``"fp8"``: bf16's, with the big
linears swapped for torchao's ``Float8Linear`` by ``convert_layers``, the strategy's first step, and the float8
weights' scales computed after each optimizer step under FSDP2). A strategy asks the object and never the mode's
name.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch

from convoy.config.schema import MixedPrecision
from convoy.train import collectives

__all__ = ["Precision", "AutocastPrecision", "ScaledPrecision", "Float8Precision", "precision_for",
           "restore_forward"]

#: where ``convert_module`` keeps the model's own ``forward`` (``restore_forward`` puts it back)
_ORIGINAL_FORWARD = "_convoy_original_forward"


class Precision:
    """``mixed_precision="no"``: fp32 throughout; nothing is converted, cast or scaled."""

    mode: ClassVar[MixedPrecision] = MixedPrecision.NO

    def __init__(self, *, device_type: str = "cpu", autocast_kwargs: Mapping[str, Any] | None = None) -> None:
        self.device_type = device_type  # where the forward runs: the device type autocast is entered for
        self.autocast_kwargs = dict(autocast_kwargs or {})  # torch.autocast's enabled/cache_enabled (AutocastKwargs)

    @property
    def compute_dtype(self) -> torch.dtype | None:
        """The dtype the forward computes in under autocast; None: fp32, no autocast."""
        name = self.mode.compute_dtype
        return getattr(torch, name) if name else None

    @property
    def scales_loss(self) -> bool:
        """True when backward needs the loss scaled (fp16), which only a backward convoy calls can do."""
        return False

    @property
    def scaler(self) -> Any:
        """The ``torch.amp.GradScaler`` of fp16 (``accelerator.scaler``, saved with each checkpoint); else None."""
        return None

    @property
    def float8(self) -> Any:
        """What fp8 converts (``convoy.train.parallel.float8.Float8Training``); None in every other mode."""
        return None

    def convert_layers(self, module: torch.nn.Module, *, fsdp: bool = False) -> list[str]:
        """The strategy's first step on ``module``, before tensor parallel, recompute, compile and sharding: swap
        layers for this precision's (fp8: ``Float8Linear``), in place; the names swapped. ``fsdp``: FSDP2 will
        shard ``module``."""
        return []

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """The prepared model, its forward run in this precision (returned; changed in place)."""
        return module

    def after_load(self) -> None:
        """Bring what this precision derives from the weights up to date once a checkpoint replaced them
        (``load_state``); collective where it communicates. fp8: the float8 weights' precomputed scales."""

    def forward_context(self, autocast_kwargs: Mapping[str, Any] | None = None
                        ) -> contextlib.AbstractContextManager[None]:
        """Compute in this precision inside (``autocast_kwargs`` override the ones given at construction)."""
        return contextlib.nullcontext()

    def convert_output(self, data: Any) -> Any:
        """A forward's outputs as the loop reads them (fp32 where the forward computed in 16 bits)."""
        return data

    def fsdp_policy(self) -> Any:
        """FSDP2's ``MixedPrecisionPolicy`` for the whole-model engines (zero2, zero3, and ``parallel``'s FSDP2)."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(param_dtype=None, reduce_dtype=None)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to call backward on."""
        return loss

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide ``optimizer``'s gradients by the loss scale (before clipping); call once per step."""

    def optimizer_step(self, optimizer: torch.optim.Optimizer, closure: Callable[[], Any] | None = None
                       ) -> tuple[Any, bool]:
        """Step ``optimizer``; returns its result and whether the step was skipped (inf/nan fp16 gradients)."""
        return (optimizer.step(closure) if closure is not None else optimizer.step()), False

    def __repr__(self) -> str:
        return f"{type(self).__name__}(mode={self.mode.value!r}, device_type={self.device_type!r})"


class AutocastPrecision(Precision):
    """``mixed_precision="bf16"``: the forward under ``torch.autocast`` in bf16, its 16-bit outputs handed back in
    fp32 (Accelerate's behaviour), and FSDP2 gathering bf16 weights and reducing gradients in fp32."""

    mode = MixedPrecision.BF16

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        original = module.forward

        @functools.wraps(original)
        def forward(*args: Any, **kwargs: Any) -> Any:
            with self.forward_context():
                out = original(*args, **kwargs)
            return self.convert_output(out)

        module.__dict__[_ORIGINAL_FORWARD] = original
        module.forward = forward
        return module

    def forward_context(self, autocast_kwargs: Mapping[str, Any] | None = None
                        ) -> contextlib.AbstractContextManager[None]:
        options = self.autocast_kwargs if autocast_kwargs is None else autocast_kwargs
        return torch.autocast(device_type=self.device_type, dtype=self.compute_dtype, **options)

    def convert_output(self, data: Any) -> Any:
        return collectives.map_tensors(lambda t: t.float() if t.dtype in (torch.float16, torch.bfloat16) else t, data)

    def fsdp_policy(self) -> Any:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)


class ScaledPrecision(AutocastPrecision):
    """``mixed_precision="fp16"``: as bf16 in fp16, and the loss scaled by a ``torch.amp.GradScaler`` (its
    arguments from ``GradScalerKwargs``), which skips a step whose gradients hold inf or nan."""

    mode = MixedPrecision.FP16

    def __init__(self, *, device_type: str = "cpu", autocast_kwargs: Mapping[str, Any] | None = None,
                 scaler_kwargs: Mapping[str, Any] | None = None) -> None:
        super().__init__(device_type=device_type, autocast_kwargs=autocast_kwargs)
        self._scaler = torch.amp.GradScaler(device_type, **dict(scaler_kwargs or {}))

    @property
    def scales_loss(self) -> bool:
        return True

    @property
    def scaler(self) -> Any:
        return self._scaler

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return self._scaler.scale(loss)

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        self._scaler.unscale_(optimizer)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, closure: Callable[[], Any] | None = None
                       ) -> tuple[Any, bool]:
        scale_before = self._scaler.get_scale()
        result = self._scaler.step(optimizer, closure) if closure is not None else self._scaler.step(optimizer)
        self._scaler.update()
        # GradScaler lowers the scale exactly when it skipped the step for inf/nan gradients
        return result, self._scaler.get_scale() < scale_before


class Float8Precision(AutocastPrecision):
    """``mixed_precision="fp8"``: bf16's autocast and FSDP2 policy around torchao's ``Float8Linear`` GEMMs
    (``convoy.train.parallel.float8``), as torchtitan and Accelerate run them. With tensorwise scaling under FSDP2 the
    weights are gathered in float8 and their scales computed in one all-reduce after each optimizer step."""

    mode = MixedPrecision.FP8

    def __init__(self, *, device_type: str = "cpu", autocast_kwargs: Mapping[str, Any] | None = None,
                 float8: Any = None) -> None:
        from convoy.train.parallel.float8 import Float8Training, import_torchao

        super().__init__(device_type=device_type, autocast_kwargs=autocast_kwargs)
        import_torchao()  # the install line now, not at the first prepare()
        self._float8 = float8 if float8 is not None else Float8Training()
        self._scaled: list[torch.nn.Module] = []  # models whose float8 weights FSDP2 gathers: scales after a step

    @property
    def float8(self) -> Any:
        return self._float8

    def convert_layers(self, module: torch.nn.Module, *, fsdp: bool = False) -> list[str]:
        from convoy.train.parallel.float8 import apply_float8, needs_precompute

        converted = apply_float8(module, self._float8, fsdp=fsdp)
        if converted and needs_precompute(module):
            self._scaled.append(module)
        return converted

    def optimizer_step(self, optimizer: torch.optim.Optimizer, closure: Callable[[], Any] | None = None
                       ) -> tuple[Any, bool]:
        from convoy.train.parallel.float8 import precompute_scales

        result = super().optimizer_step(optimizer, closure)
        stepped = {id(p) for group in optimizer.param_groups for p in group["params"]}
        for module in self._scaled:  # the models this optimizer steps (FSDP2 shards in place: the same objects)
            if any(id(p) in stepped for p in module.parameters()):
                precompute_scales(module)
        return result

    def after_load(self) -> None:
        from convoy.train.parallel.float8 import precompute_scales

        for module in self._scaled:  # else the next all-gather casts the loaded weights with the old weights' scales
            precompute_scales(module)


def precision_for(mode: MixedPrecision | str, *, device_type: str = "cpu",
                  autocast_kwargs: Mapping[str, Any] | None = None,
                  scaler_kwargs: Mapping[str, Any] | None = None, float8: Any = None) -> Precision:
    """The precision object of ``mode`` (``"no"``, ``"bf16"``, ``"fp16"``, ``"fp8"``) for a forward on
    ``device_type``; ``scaler_kwargs`` are read by fp16 only, ``float8`` (a ``Float8Training``) by fp8 only."""
    mode = MixedPrecision(mode)
    if mode is MixedPrecision.FP8:
        return Float8Precision(device_type=device_type, autocast_kwargs=autocast_kwargs, float8=float8)
    if mode is MixedPrecision.FP16:
        return ScaledPrecision(device_type=device_type, autocast_kwargs=autocast_kwargs, scaler_kwargs=scaler_kwargs)
    if mode is MixedPrecision.BF16:
        return AutocastPrecision(device_type=device_type, autocast_kwargs=autocast_kwargs)
    return Precision(device_type=device_type, autocast_kwargs=autocast_kwargs)


def restore_forward(module: Any) -> bool:
    """Take ``convert_module``'s forward off ``module`` (``unwrap_model(keep_fp32_wrapper=False)``); True when it
    had one."""
    original = module.__dict__.pop(_ORIGINAL_FORWARD, None)
    if original is None:
        return False
    module.__dict__.pop("forward", None)
    return True
