"""Progress bars on the main process only, and a switch to turn them all off.

    from convoy.train.progress import progress_bar, disable_progress_bars
    for batch in progress_bar(loader, desc="train"):    # a tqdm bar on rank 0; silent on the others
        ...
    disable_progress_bars()        # e.g. in CI logs; enable_progress_bars() turns them back on

A line written while a bar is drawn would be glued to it (the bar ends in a carriage return, not a newline):
``with above_progress_bars(): ...`` clears the bars, lets the line be written, and draws them again.

The switch is process-wide state with a documented reset: ``enable_progress_bars()`` restores the default.
Other libraries' bars (transformers, datasets) read ``TQDM_DISABLE=1`` when tqdm is imported, so a launcher
that wants them silent on non-zero ranks sets that variable in those ranks' environment.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from convoy.train.logging import is_main_process

__all__ = ["progress_bar", "tqdm", "disable_progress_bars", "enable_progress_bars", "progress_bars_enabled",
           "above_progress_bars"]

_enabled = True


def disable_progress_bars() -> None:
    """Make every later ``progress_bar`` silent in this process, on every rank."""
    global _enabled
    _enabled = False


def enable_progress_bars() -> None:
    """Undo ``disable_progress_bars`` (bars show on the main process again)."""
    global _enabled
    _enabled = True


def progress_bars_enabled() -> bool:
    return _enabled


def progress_bar(iterable: Iterable[Any] | None = None, *, main_process_only: bool = True, **kwargs: Any):
    """``tqdm(iterable, **kwargs)``, disabled off the main process (unless ``main_process_only=False``)
    and everywhere after ``disable_progress_bars()``. An explicit ``disable=True`` is kept."""
    from tqdm.auto import tqdm

    off = not _enabled or (main_process_only and not is_main_process())
    kwargs["disable"] = bool(kwargs.get("disable")) or off
    resumed = getattr(iterable, "resumes_at", 0)  # a loader load_state put mid-epoch: the bar starts there
    if isinstance(resumed, int) and resumed > 0 and "initial" not in kwargs:
        kwargs["initial"] = resumed
    return tqdm(iterable, **kwargs)


@contextlib.contextmanager
def above_progress_bars() -> Iterator[None]:
    """Write a line of its own while tqdm bars are drawn: tqdm's ``external_write_mode`` clears them first and
    draws them again after (nothing to do when tqdm was never imported: no bar can be drawn)."""
    tqdm_module = sys.modules.get("tqdm")
    if tqdm_module is None:
        yield
        return
    with tqdm_module.tqdm.external_write_mode(file=sys.stderr):
        yield
def tqdm(*args: Any, main_process_only: bool = True, **kwargs: Any) -> Any:
    """Accelerate's ``accelerate.utils.tqdm``: ``tqdm.auto.tqdm(*args, **kwargs)``, disabled on every process but
    the local main one (``main_process_only=False``: shown on each). A bool as the first argument is refused, as
    Accelerate refuses it (its old ``tqdm(main_process_only, ...)`` order)."""
    from tqdm.auto import tqdm as _tqdm

    from convoy.errors import ConfigError
    from convoy.train.logging import local_process_rank

    if args and isinstance(args[0], bool):
        raise ConfigError("tqdm(True/False, ...): pass main_process_only= as a keyword; the first argument is the "
                          "iterable")
    disable = kwargs.pop("disable", False)
    if main_process_only and not disable:
        disable = local_process_rank() != 0
    return _tqdm(*args, **kwargs, disable=disable)
