"""Accelerate's memory helpers: retry a function at a smaller batch size after an out-of-memory error, and
release objects' memory.

    from convoy.utils import find_executable_batch_size, release_memory

    @find_executable_batch_size(starting_batch_size=128)
    def train(batch_size):            # called with 128, then 115, 103, ... after each out-of-memory error
        accelerator.free_memory()     # drop what the failed try prepared
        ...
    train()

As Accelerate 1.x does, the size is multiplied by 0.9 after each failure (``reduce_batch_size_fn`` picks another
rule, e.g. ``lambda: batch_size // 2``), and an error counts when it is a ``RuntimeError`` whose message is an
allocator's out-of-memory line: CUDA/ROCm/XPU's ``torch.OutOfMemoryError`` (" out of memory."), MPS's, a CPU
allocator's ("DefaultCPUAllocator: can't allocate memory"), Habana's, or cuDNN's "not supported".
"""

from __future__ import annotations

import functools
import gc
import inspect
from collections.abc import Callable
from typing import Any

from convoy.errors import ConfigError

__all__ = ["find_executable_batch_size", "should_reduce_batch_size", "release_memory", "clear_device_cache"]

OUT_OF_MEMORY_LINES = (
    " out of memory.",  # CUDA, HIP, XPU (torch.OutOfMemoryError)
    "MPS backend out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
    "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed",  # Habana
)
"""Accelerate's ``should_reduce_batch_size`` list (``accelerate/utils/memory.py``)."""


def should_reduce_batch_size(exception: BaseException) -> bool:
    """``exception`` is an out-of-memory error (or cuDNN's "not supported") a smaller batch may avoid."""
    if isinstance(exception, RuntimeError) and len(exception.args) == 1 and isinstance(exception.args[0], str):
        return any(line in exception.args[0] for line in OUT_OF_MEMORY_LINES)
    return False


def clear_device_cache(garbage_collection: bool = False) -> None:
    """Empty the accelerator's caching allocator (and collect garbage first when asked)."""
    if garbage_collection:
        gc.collect()
    import sys

    torch = sys.modules.get("torch")  # no tensor was ever made when torch is not imported
    if torch is None:
        return
    for backend in ("xpu", "mlu", "musa", "npu"):
        module = getattr(torch, backend, None)
        if module is not None and module.is_available():
            module.empty_cache()
            return
    if torch.backends.mps.is_available():
        torch.mps.empty_cache()
    elif torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def release_memory(*objects: Any) -> list[None]:
    """Drop the references ``objects`` hold here, collect garbage and empty the device cache; returns as many
    Nones, to reassign: ``a, b = release_memory(a, b)``."""
    nones: list[None] = [None] * len(objects)
    del objects
    clear_device_cache(garbage_collection=True)
    return nones


def find_executable_batch_size(function: Callable[..., Any] | None = None, starting_batch_size: int = 128,
                               reduce_batch_size_fn: Callable[[], int] | None = None) -> Any:
    """Decorate ``function(batch_size, *args, **kwargs)``: call it with ``starting_batch_size``, and after each
    out-of-memory error (``should_reduce_batch_size``) again with a smaller size, until it returns. The caller
    leaves ``batch_size`` out: ``train(model)``."""
    if function is None:
        return functools.partial(find_executable_batch_size, starting_batch_size=starting_batch_size,
                                 reduce_batch_size_fn=reduce_batch_size_fn)
    if isinstance(starting_batch_size, bool) or not isinstance(starting_batch_size, int) or starting_batch_size < 1:
        raise ConfigError(f"find_executable_batch_size(starting_batch_size={starting_batch_size!r}): give the "
                          "first batch size to try, a whole number >= 1")
    batch_size = starting_batch_size

    def smaller() -> int:
        return int(batch_size * 0.9)

    reduce = reduce_batch_size_fn or smaller

    @functools.wraps(function)
    def decorator(*args: Any, **kwargs: Any) -> Any:
        nonlocal batch_size
        clear_device_cache(garbage_collection=True)
        params = list(inspect.signature(function).parameters)
        if len(params) < len(args) + 1:
            given = ", ".join(f"{name}={value!r}" for name, value in zip(params[1:], args[1:]))
            raise TypeError(f"batch size was passed to `{function.__name__}` as its first argument; the decorator "
                            f"passes it: call `{function.__name__}({given})`")
        while True:
            if batch_size < 1:
                raise RuntimeError("No executable batch size found, reached zero.")
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as err:
                if not should_reduce_batch_size(err):
                    raise
                del err  # its traceback holds the failed try's tensors
                clear_device_cache(garbage_collection=True)
                batch_size = reduce()

    return decorator
