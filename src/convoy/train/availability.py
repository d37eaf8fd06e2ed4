"""Accelerate's ``is_*_available`` checks, with Accelerate's meaning: is a library installed (found *and* its
distribution's metadata present, so a stray directory of that name does not count), is a device backend usable.

    from convoy.utils import is_xpu_available, is_schedulefree_available
    if is_schedulefree_available(): import schedulefree

The library checks never import the library; the device checks import torch (and a vendor's torch extension,
``torch_npu``, ``torch_mlu``, ... only when it is installed).
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import sys
from typing import Any

__all__ = [
    "is_package_available", "is_cuda_available", "is_mps_available", "is_xpu_available", "is_npu_available",
    "is_mlu_available", "is_musa_available", "is_hpu_available", "is_torch_xla_available", "is_bf16_available",
    "is_schedulefree_available", "is_tensorboard_available", "is_wandb_available", "is_comet_ml_available",
    "is_mlflow_available", "is_aim_available", "is_clearml_available", "is_dvclive_available",
    "is_swanlab_available", "is_trackio_available", "is_rich_available", "is_tqdm_available",
    "is_transformers_available", "is_datasets_available", "is_peft_available", "is_timm_available",
    "is_deepspeed_available", "is_torchao_available", "is_bnb_available", "is_safetensors_available",
    "is_pandas_available", "is_matplotlib_available",
]


def is_package_available(module: str, distribution: str | None = None) -> bool:
    """``module`` can be imported and its distribution (``distribution``, default the module's name) is
    installed: Accelerate's ``_is_package_available``."""
    try:
        if importlib.util.find_spec(module) is None:
            return False
    except (ImportError, ValueError):  # a parent package that fails to import, or a half-imported module
        return False
    try:
        importlib.metadata.metadata(distribution or module)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _installed(module: str, distribution: str | None = None) -> Any:
    def check() -> bool:
        return is_package_available(module, distribution)
    check.__name__ = f"is_{module}_available"
    check.__doc__ = f"``{distribution or module}`` is installed (Accelerate's meaning)."
    return check


is_schedulefree_available = _installed("schedulefree")
is_wandb_available = _installed("wandb")
is_comet_ml_available = _installed("comet_ml")
is_clearml_available = _installed("clearml")
is_dvclive_available = _installed("dvclive")
is_swanlab_available = _installed("swanlab")
is_tqdm_available = _installed("tqdm")
is_transformers_available = _installed("transformers")
is_datasets_available = _installed("datasets")
is_peft_available = _installed("peft")
is_timm_available = _installed("timm")
is_deepspeed_available = _installed("deepspeed")
is_safetensors_available = _installed("safetensors")
is_pandas_available = _installed("pandas")
is_matplotlib_available = _installed("matplotlib")


def is_tensorboard_available() -> bool:
    """``tensorboard`` or ``tensorboardX`` is installed."""
    return is_package_available("tensorboard") or is_package_available("tensorboardX")


def is_mlflow_available() -> bool:
    """``mlflow`` (or ``mlflow-skinny``) is installed."""
    return is_package_available("mlflow") or is_package_available("mlflow", "mlflow-skinny")


def is_trackio_available() -> bool:
    return sys.version_info >= (3, 10) and is_package_available("trackio")


def _version_at_least(distribution: str, minimum: str, below: str | None = None) -> bool:
    from packaging.version import Version

    found = Version(importlib.metadata.version(distribution))
    return found >= Version(minimum) and (below is None or found < Version(below))


def is_aim_available() -> bool:
    """``aim`` below 4.0 is installed (the versions Accelerate's tracker drives)."""
    return is_package_available("aim") and _version_at_least("aim", "0", below="4.0.0")


def is_torchao_available() -> bool:
    return is_package_available("torchao") and _version_at_least("torchao", "0.6.1")


def is_bnb_available(min_version: str | None = None) -> bool:
    return is_package_available("bitsandbytes") and (min_version is None
                                                     or _version_at_least("bitsandbytes", min_version))


def is_rich_available() -> bool:
    """``rich`` is installed and ``ACCELERATE_ENABLE_RICH`` is set to a true value, as in Accelerate."""
    return is_package_available("rich") and os.environ.get("ACCELERATE_ENABLE_RICH", "").lower() in {
        "1", "true", "yes", "on", "y"}


# --- devices --------------------------------------------------------------------------------------------
def is_cuda_available() -> bool:
    """A CUDA (or ROCm) device is usable; asked through NVML, so CUDA itself is not initialised (a later fork
    still works), as Accelerate asks."""
    import torch

    before = os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    try:
        return bool(torch.cuda.is_available())
    finally:
        if before is None:
            del os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"]
        else:
            os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = before


def is_mps_available(min_version: str = "1.12") -> bool:
    """Apple's Metal device is built into this torch and usable."""
    import torch

    return bool(torch.backends.mps.is_available() and torch.backends.mps.is_built())


def is_xpu_available(check_device: bool = False) -> bool:
    """An Intel XPU is usable through stock PyTorch."""
    import torch

    if check_device:
        try:
            torch.xpu.device_count()
        except RuntimeError:
            return False
    return hasattr(torch, "xpu") and bool(torch.xpu.is_available())


def _vendor_device(extension: str, attribute: str, check_device: bool) -> bool:
    """A device of a vendor's torch extension (``torch_npu`` -> ``torch.npu``): the extension is installed and
    imports, and reports a device."""
    if importlib.util.find_spec(extension) is None:
        return False
    try:
        importlib.import_module(extension)
    except Exception:  # e.g. torch_npu installed in a CPU-only container: not usable, as Accelerate says
        return False
    import torch

    backend = getattr(torch, attribute, None)
    if backend is None:
        return False
    if check_device:
        try:
            backend.device_count()
        except RuntimeError:
            return False
    return bool(backend.is_available())


@functools.lru_cache
def is_npu_available(check_device: bool = False) -> bool:
    """An Ascend NPU is usable (``torch_npu``)."""
    return _vendor_device("torch_npu", "npu", check_device)


@functools.lru_cache
def is_mlu_available(check_device: bool = False) -> bool:
    """A Cambricon MLU is usable (``torch_mlu``)."""
    return _vendor_device("torch_mlu", "mlu", check_device)


@functools.lru_cache
def is_musa_available(check_device: bool = False) -> bool:
    """A Moore Threads GPU is usable (``torch_musa``)."""
    return _vendor_device("torch_musa", "musa", check_device)


@functools.lru_cache
def is_hpu_available(init_hccl: bool = False) -> bool:
    """A Habana Gaudi is usable (``habana_frameworks.torch``)."""
    if importlib.util.find_spec("habana_frameworks") is None:
        return False
    return _vendor_device("habana_frameworks.torch", "hpu", False)


@functools.lru_cache
def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    """``torch_xla`` is installed (and ``USE_TORCH_XLA`` is not false); convoy runs no XLA job, but a script may
    branch on it."""
    if os.environ.get("USE_TORCH_XLA", "1").lower() in {"0", "false", "no", "off"}:
        return False
    if not is_package_available("torch_xla"):
        return False
    if check_is_tpu or check_is_gpu:
        import torch_xla.runtime as xr

        return xr.device_type() in (("TPU",) if check_is_tpu else ("GPU", "CUDA"))
    return True


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """bf16 is supported by this machine's accelerator (always on CPU), as Accelerate answers."""
    import torch

    if is_cuda_available():
        return bool(torch.cuda.is_bf16_supported())
    if is_xpu_available():
        return bool(torch.xpu.is_bf16_supported())
    if is_mps_available():
        return bool(torch.backends.mps.is_macos_or_newer(14, 0))
    return True
