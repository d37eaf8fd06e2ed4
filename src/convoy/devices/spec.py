"""The device request grammar: what ``devices=`` (or ``--devices``) may say, resolved to index lists.

    >>> from convoy.devices.spec import parse_devices
    >>> parse_devices(3, 4), parse_devices("1,3", 4), parse_devices("3,1", 4), parse_devices("0-2,6", 8)
    ([0, 1, 2], [1, 3], [3, 1], [0, 1, 2, 6])
    >>> parse_devices(-1, 2), parse_devices("all", 2), parse_devices(0, 4), parse_devices(None, 4)
    ([0, 1], [0, 1], [], [])

The table is Lightning's ``devices=``: an int ``n`` or a string without a comma is a *count* (the first
``n``), ``-1``/``"-1"`` is every device, a list/tuple of ints or a string with a comma is an *index list*
kept in the given order, and ``0``, ``"0"``, ``[]``, ``None`` and ``""`` mean no accelerator. convoy adds
inclusive ranges inside index strings (``"0-3,6"``, also ``"0-3"`` alone) and the words ``"all"`` and
``"auto"`` (every device; ``select_devices`` narrows ``"auto"`` further with its filters).

Anything else raises :class:`convoy.errors.DeviceSpecError` (a ``ValueError``) naming the offending token
and what is available. The parser is pure: it never looks at the machine, only at ``num_available``.

Digits are ASCII only (``"²"`` and ``"٣"`` are refused: Python's ``int()`` reads them, CUDA does not), a
number has at most 12 digits, and a range is checked against ``num_available`` before it is expanded, so
any request is answered in time and memory bounded by ``num_available``. ``-1`` and ``"all"`` ask for every
device and are refused when there is none (Lightning: "GPUs requested but none are available"); ``"auto"``
then means the CPU.
"""

from __future__ import annotations

import operator
import re
from typing import Any

from convoy.errors import DeviceSpecError

__all__ = ["parse_devices", "describe_available", "is_count"]

_INT = re.compile(r"^-?[0-9]+$")
_RANGE = re.compile(r"^([0-9]+)\s*-\s*([0-9]+)$")
#: more digits than this is no device index or count on any machine; refused before ``int()`` reads it.
_MAX_DIGITS = 12
_ALL_WORDS = ("all", "auto")


def describe_available(num_available: int, noun: str = "device") -> str:
    """``'4 devices are available (0-3)'``: the tail of every error message about a request."""
    if num_available <= 0:
        return f"no {noun}s are available"
    if num_available == 1:
        return f"1 {noun} is available (0)"
    return f"{num_available} {noun}s are available (0-{num_available - 1})"


def is_count(spec: Any) -> bool:
    """True when ``spec`` asks for a number of devices (``3``, ``"3"``, ``-1``, ``"all"``) rather than
    naming them. Counts may be filled by any eligible device; index lists name exact devices."""
    if spec is None or isinstance(spec, bool):
        return False
    if isinstance(spec, str):
        text = spec.strip()
        return text.lower() in _ALL_WORDS or (bool(_INT.match(text)) and "," not in text)
    if isinstance(spec, (list, tuple)):
        return False
    try:
        operator.index(spec)
    except TypeError:
        return False
    return True


def parse_devices(spec: Any, num_available: int) -> list[int]:
    """Resolve a device request to a list of indices in ``range(num_available)``, in the order to use.

    Raises:
        DeviceSpecError: the request is malformed or asks for devices that do not exist.
    """
    if isinstance(num_available, bool) or not isinstance(num_available, int) or num_available < 0:
        raise DeviceSpecError(f"num_available must be an int >= 0, got {num_available!r}")
    shown = _show(spec)
    if spec is None:
        return []
    if isinstance(spec, bool):
        raise DeviceSpecError(
            f"devices={shown}: a bool is not a device request; use a count (2), an index list ('0,1') "
            f"or -1 for all; {describe_available(num_available)}"
        )
    if isinstance(spec, str):
        return _parse_text(spec, num_available, shown)
    if isinstance(spec, (list, tuple)):
        return _check_indices([_list_item(item, shown, num_available) for item in spec], num_available, shown)
    if isinstance(spec, float):
        raise DeviceSpecError(
            f"devices={shown}: {spec!r} is a float; use a whole count like 2 or an index list like '0,1'; "
            f"{describe_available(num_available)}"
        )
    try:
        count = operator.index(spec)
    except TypeError:
        raise DeviceSpecError(
            f"devices={shown}: a {type(spec).__name__} is not a device request; use a count (2), an index "
            f"list ('0,1' or [0, 1]), a range ('0-3') or 'all'; {describe_available(num_available)}"
        ) from None
    return _count(count, num_available, shown)


def _show(spec: Any) -> str:
    if isinstance(spec, int) and not isinstance(spec, bool):
        return _num(spec)
    if isinstance(spec, (list, tuple)) and len(spec) > 20:
        spec = type(spec)(spec[:20])
    try:
        text = repr(spec) if not isinstance(spec, (list, tuple)) else repr(type(spec)(
            _num(i) if isinstance(i, int) and not isinstance(i, bool) else i for i in spec))
    except Exception:  # a user object whose repr fails still gets its one-line error
        text = f"<{type(spec).__name__}>"
    return text if len(text) <= 60 else text[:57] + "..."


def _num(n: int) -> str:
    """``str(n)``, or a short description for an int too long to print (``str()`` refuses past 4300 digits)."""
    if n.bit_length() < 40:
        return str(n)
    return f"{'-' if n < 0 else ''}<a number of about {int(n.bit_length() * 0.30103) + 1} digits>"


def _count(count: int, num_available: int, shown: str) -> list[int]:
    if count == -1:
        return _every(num_available, shown)
    if count < 0:
        raise DeviceSpecError(
            f"devices={shown}: {_num(count)} is negative; the only negative request is -1 (all devices); "
            f"{describe_available(num_available)}"
        )
    if count > num_available:
        raise DeviceSpecError(
            f"devices={shown}: asks for {_num(count)} devices but {describe_available(num_available)}"
        )
    return list(range(count))


def _every(num_available: int, shown: str) -> list[int]:
    if num_available == 0:
        raise DeviceSpecError(f"devices={shown} asks for every device but none are available; use 'auto' (the CPU "
                              f"when there is no accelerator) or 0 for no accelerator")
    return list(range(num_available))


def _int(token: str, shown: str, num_available: int) -> int:
    """``int(token)`` for an ASCII integer token, refusing numbers too long to be a device index or count."""
    if len(token.lstrip("-")) > _MAX_DIGITS:
        raise DeviceSpecError(f"devices={shown}: {token[:12]}... ({len(token)} characters) is too large to be a "
                              f"device count or index; {describe_available(num_available)}")
    return int(token)


def _list_item(item: Any, shown: str, num_available: int) -> int:
    if isinstance(item, bool) or not isinstance(item, int):
        try:
            if isinstance(item, bool) or isinstance(item, float):
                raise TypeError
            return operator.index(item)
        except TypeError:
            raise DeviceSpecError(
                f"devices={shown}: list item {item!r} is not a device index; list items must be ints "
                f"like [0, 2]; {describe_available(num_available)}"
            ) from None
    return item


def _parse_text(text: str, num_available: int, shown: str) -> list[int]:
    body = text.strip()
    if body == "":
        return []
    if body.lower() == "auto":
        return list(range(num_available))
    if body.lower() == "all":
        return _every(num_available, shown)
    if "," not in body:
        if _INT.match(body):
            return _count(_int(body, shown, num_available), num_available, shown)
        match = _RANGE.match(body)
        if match:
            return _check_indices(_expand_range(match, body, shown, num_available), num_available, shown)
        raise DeviceSpecError(
            f"devices={shown}: cannot parse {body!r}; use a count ('2'), an index list ('0,2'), a range "
            f"('0-3'), '-1' or 'all'; {describe_available(num_available)}"
        )
    indices: list[int] = []
    tokens = [token.strip() for token in body.split(",")]
    for token in tokens:
        if token == "":
            continue  # Lightning accepts a trailing comma: "2," is [2]
        match = _RANGE.match(token)
        if match:
            indices.extend(_expand_range(match, token, shown, num_available))
            if len(indices) > num_available:  # a repeat for sure: say so before the list grows further
                return _check_indices(indices, num_available, shown)
        elif _INT.match(token):
            index = _int(token, shown, num_available)
            if index < 0:
                raise DeviceSpecError(
                    f"devices={shown}: index {index} is negative; indices count from 0 and -1 (all) is "
                    f"only valid alone; {describe_available(num_available)}"
                )
            indices.append(index)
        else:
            raise DeviceSpecError(
                f"devices={shown}: cannot parse {token!r} as an index or a range like '0-3'; "
                f"{describe_available(num_available)}"
            )
    if not indices:
        raise DeviceSpecError(
            f"devices={shown}: the list names no device; write indices like '0,2'; "
            f"{describe_available(num_available)}"
        )
    return _check_indices(indices, num_available, shown)


def _expand_range(match: re.Match[str], token: str, shown: str, num_available: int) -> list[int]:
    start, stop = _int(match.group(1), shown, num_available), _int(match.group(2), shown, num_available)
    if stop < start:
        raise DeviceSpecError(
            f"devices={shown}: range {token!r} runs backwards; write it low-high like "
            f"'{stop}-{start}'; {describe_available(num_available)}"
        )
    if stop >= num_available:  # checked before expanding: '0-99999999999' must not build a list first
        raise DeviceSpecError(
            f"devices={shown}: range {token!r} reaches index {stop}, which is out of range; "
            f"{describe_available(num_available)}"
        )
    return list(range(start, stop + 1))


def _check_indices(indices: list[int], num_available: int, shown: str) -> list[int]:
    seen: set[int] = set()
    for index in indices:
        if index < 0:
            raise DeviceSpecError(
                f"devices={shown}: index {_num(index)} is negative; indices count from 0; "
                f"{describe_available(num_available)}"
            )
        if index >= num_available:
            raise DeviceSpecError(
                f"devices={shown}: index {_num(index)} is out of range; {describe_available(num_available)}"
            )
        if index in seen:
            raise DeviceSpecError(
                f"devices={shown}: index {index} appears twice; name each device once; "
                f"{describe_available(num_available)}"
            )
        seen.add(index)
    return list(indices)
