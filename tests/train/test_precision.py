"""Mixed precision as one object per mode (``train/precision.py``), held by the strategy."""

from __future__ import annotations

import pytest
import torch

from convoy import Accelerator
from convoy.train.precision import AutocastPrecision, Precision, ScaledPrecision, precision_for, restore_forward


@pytest.mark.parametrize("mode, kind, dtype", [("no", Precision, None), ("bf16", AutocastPrecision, torch.bfloat16),
                                               ("fp16", ScaledPrecision, torch.float16)])
def test_each_mode_has_its_object(mode, kind, dtype):
    precision = precision_for(mode, device_type="cpu")
    assert type(precision) is kind and precision.compute_dtype == dtype
    assert precision.scales_loss == (mode == "fp16") and (precision.scaler is not None) == (mode == "fp16")
    policy = precision.fsdp_policy()
    assert (policy.param_dtype, policy.reduce_dtype) == (dtype, torch.float32 if dtype else None)


class Recorded(torch.nn.Linear):
    """A layer that notes the dtype its own forward computed in."""

    def forward(self, x):
        out = super().forward(x)
        self.seen = out.dtype
        return out


def test_bf16_computes_the_forward_in_bf16_and_hands_back_fp32():
    converted = precision_for("bf16", device_type="cpu").convert_module(Recorded(4, 4))
    out = converted(torch.randn(2, 4))
    assert converted.seen == torch.bfloat16 and out.dtype == torch.float32
    assert restore_forward(converted) and converted(torch.randn(2, 4)).dtype == torch.float32
    assert converted.seen == torch.float32 and not restore_forward(converted)


def test_fp16_skips_a_step_whose_gradients_are_not_finite_and_lowers_the_scale():
    precision = precision_for("fp16", device_type="cpu", scaler_kwargs={"init_scale": 1024.0})
    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    precision.scale_loss(weight.sum()).backward()
    assert weight.grad.tolist() == [1024.0, 1024.0]
    assert precision.optimizer_step(optimizer)[1] is False and weight.tolist() == pytest.approx([0.9, 0.9])
    optimizer.zero_grad()
    precision.scale_loss(weight.sum() * float("inf")).backward()
    _, skipped = precision.optimizer_step(optimizer)
    assert skipped and weight.tolist() == pytest.approx([0.9, 0.9]) and precision.scaler.get_scale() < 1024.0


def test_the_strategy_holds_the_accelerators_precision():
    accelerator = Accelerator(cpu=True, mixed_precision="fp16")
    model = accelerator.prepare(torch.nn.Linear(2, 2))
    assert accelerator.strategy.precision.scaler is accelerator.scaler is not None
    assert model(torch.randn(3, 2)).dtype == torch.float32
