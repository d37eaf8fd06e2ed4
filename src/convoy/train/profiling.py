"""``Accelerator.profile()`` and ``ProfileKwargs``: ``torch.profiler`` around a block, as Accelerate has them.

    from convoy.utils import ProfileKwargs
    accelerator = Accelerator(kwargs_handlers=[ProfileKwargs(activities=["cpu"], output_trace_dir="trace")])
    with accelerator.profile() as prof:       # a torch.profiler.profile
        train_one_epoch()
    accelerator.print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10))

With ``output_trace_dir`` each process writes a Chrome trace there, ``profile_<process index>.json`` (Accelerate's
file names), and the processes then wait for each other. ``schedule_option`` (``wait``, ``warmup``, ``active``,
``repeat``, ``skip_first``) with ``prof.step()`` in the loop records some steps only.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

from convoy.train.kwargs_handlers import ProfileKwargs

__all__ = ["ProfileKwargs", "PROFILE_PATTERN_NAME", "profile"]

PROFILE_PATTERN_NAME = "profile_{suffix}.json"
"""A process's trace file under ``output_trace_dir`` (Accelerate's ``utils/constants.py``)."""


@contextlib.contextmanager
def profile(handler: ProfileKwargs, *, process_index: int, barrier: Callable[[], None]) -> Iterator[Any]:
    """Run the block under ``handler``'s profiler; then write this process's trace (when ``output_trace_dir`` is
    set) and wait for the other processes."""
    with handler.build() as profiler:
        yield profiler
    if handler.output_trace_dir is None:
        return
    os.makedirs(handler.output_trace_dir, exist_ok=True)
    profiler.export_chrome_trace(os.path.join(handler.output_trace_dir,
                                              PROFILE_PATTERN_NAME.format(suffix=process_index)))
    barrier()
