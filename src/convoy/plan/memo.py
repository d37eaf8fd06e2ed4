"""The planner's remembered pure functions: one plan prices the same shapes, blocks and layouts many times.

    from convoy.plan.memo import hashed_once, remembered

    @remembered
    def block_bytes(model: ModelSpec, run: RunSpec, *, tp: int = 1) -> float: ...

    @hashed_once                      # over @dataclass(frozen=True): its hash computed once per object
    @dataclass(frozen=True)
    class GpuSpec: ...

A remembered function must be pure and take frozen (hashable) records and numbers; its result must not be
mutated by a caller (return tuples and frozen records). Arguments that do not hash (a caller's own rates object)
are computed afresh each time. ``forget()`` empties every cache (for a process that changes a table in place).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable

TYPE_CHECKING = False  # typing is not imported at run time: a plan starts without it
if TYPE_CHECKING:
    from typing import Any, ParamSpec, TypeVar

    P = ParamSpec("P")
    T = TypeVar("T")
    C = TypeVar("C", bound=type)

__all__ = ["remembered", "hashed_once", "forget"]

#: results kept per function before its cache starts again; a 70B plan on 8 GPUs asks about 1,300 step times and
#: 550 different ones
MAXSIZE = 4096

_CACHES: list[dict[Any, Any]] = []


class _Key(list):
    """Arguments as a dict key whose hash is computed once (``functools.lru_cache``'s ``_HashedSeq``)."""

    __slots__ = ("hashvalue",)

    def __init__(self, items: tuple[Any, ...]) -> None:
        self[:] = items
        self.hashvalue = hash(items)

    def __hash__(self) -> int:  # type: ignore[override]
        return self.hashvalue


def remembered(fn: Callable[P, T]) -> Callable[P, T]:
    """``fn`` with its results kept per arguments (at most ``MAXSIZE``, then it starts again)."""
    cache: dict[_Key, Any] = {}
    _CACHES.append(cache)

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            key = _Key((args, tuple(kwargs.items())))
        except TypeError:  # an argument that does not hash
            return fn(*args, **kwargs)
        try:
            return cache[key]
        except KeyError:
            pass
        value = fn(*args, **kwargs)
        if len(cache) >= MAXSIZE:
            cache.clear()
        cache[key] = value
        return value

    return call


_HASHES: dict[int, tuple[weakref.ref[Any], int]] = {}


def hashed_once(cls: C) -> C:
    """``cls`` (a frozen dataclass) with its hash computed once per object and kept beside it (not in it: its
    ``__dict__`` stays its fields), so that a remembered function's key of large records hashes quickly."""
    computed: Callable[[Any], int] = vars(cls)["__hash__"]  # the dataclass's own, over its fields

    def __hash__(self: Any) -> int:
        kept = _HASHES.get(id(self))
        if kept is not None and kept[0]() is self:
            return kept[1]
        value = computed(self)
        at = id(self)

        def drop(_: weakref.ref[Any]) -> None:  # the object is gone: its id may be another's next
            _HASHES.pop(at, None)

        _HASHES[at] = (weakref.ref(self, drop), value)
        return value

    cls.__hash__ = __hash__  # type: ignore[assignment]
    return cls


def forget() -> None:
    """Empty every remembered function's cache."""
    for cache in _CACHES:
        cache.clear()
