"""The device request grammar: what ``devices=`` (or ``--devices``) may say, resolved to index lists.

    >>> from convoy.devices.spec import parse_devices
    >>> parse_devices(3, 4), parse_devices("1,3", 4), parse_devices("3,1", 4), parse_devices("0-2,6", 8)
    ([0, 1, 2], [1, 3], [3, 1], [0, 1, 2, 6])
    >>> parse_devices(-1, 2), parse_devices("all", 2), parse_devices(0, 4), parse_devices(None, 4)
    ([0, 1], [0, 1], [], [])

The table is Lightning's ``devices=``: an int ``n`` or a string without a comma is a *count* (the first
``n``), ``-1``/``"-1"`` is every device, a list/tuple of ints or a string with a comma is an *index list*
kept in the given order, and ``0``, ``"0"``, ``[]``, ``None`` and ``""`` mean no accelerator (a *blank*
string, ``" "``, is refused, as Lightning refuses it: it is what ``--devices "$N "`` says when ``N`` is unset;
spaces around a request or its items are fine: ``" 1, 3 "`` is ``[1, 3]``). convoy adds
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

import bisect
import math
import operator
import re

from convoy.errors import DeviceSpecError

TYPE_CHECKING = False  # typing is not imported at run time: `convoy select` starts without it
if TYPE_CHECKING:
    from typing import Any

__all__ = ["parse_devices", "check_devices", "describe_available", "is_count"]

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
    return [index for part in _resolve(spec, num_available) for index in part]


def check_devices(spec: Any) -> None:
    """Raise ``DeviceSpecError`` for what ``parse_devices`` refuses on every machine: the syntax, a negative
    index or count (other than -1), a range that runs backwards, an index named twice, a list that names
    none. A count or an index that some machine has passes (whether this one has it is ``parse_devices``'s
    question when a job starts). What ``convoy config`` writes and convoy.toml reads (``config.schema``)."""
    _resolve(spec, None)


def _resolve(spec: Any, num_available: int | None) -> list[range]:
    """``parse_devices``'s grammar, as ranges of indices in order; ``num_available`` None: no machine (nothing
    is out of range, 'all' and 'auto' name no index). Ranges are never expanded here, so a request is checked
    in time bounded by its length."""
    shown = _show(spec)
    if spec is None:
        return []
    if isinstance(spec, bool):
        raise DeviceSpecError(
            f"devices={shown}: a bool is not a device request; use a count (2), an index list ('0,1') "
            f"or -1 for all{_tail(num_available)}"
        )
    if isinstance(spec, str):
        return _parse_text(spec, num_available, shown)
    if isinstance(spec, (list, tuple)):
        items = [_list_item(item, shown, num_available) for item in spec]
        return _check_indices([range(i, i + 1) for i in items], num_available, shown)
    if isinstance(spec, float):
        raise DeviceSpecError(
            f"devices={shown}: {spec!r} is a float; use a whole count like 2 or an index list like '0,1'"
            f"{_tail(num_available)}"
        )
    try:
        count = operator.index(spec)
    except TypeError:
        raise DeviceSpecError(
            f"devices={shown}: a {type(spec).__name__} is not a device request; use a count (2), an index "
            f"list ('0,1' or [0, 1]), a range ('0-3') or 'all'{_tail(num_available)}"
        ) from None
    return _count(count, num_available, shown)


def _tail(num_available: int | None) -> str:
    """``'; 4 devices are available (0-3)'``, the end of every message; nothing without a machine."""
    return "" if num_available is None else f"; {describe_available(num_available)}"


def _show(spec: Any) -> str:
    """The request as the user wrote it (``[1, 1]``, ``'1,1'``, ``(2,)``), at most 60 characters."""
    if isinstance(spec, (list, tuple)):
        items = [_item(i) for i in spec[:20]] + (["..."] if len(spec) > 20 else [])
        ends = "[]" if isinstance(spec, list) else "()"
        text = ends[0] + ", ".join(items) + ("," if ends == "()" and len(items) == 1 else "") + ends[1]
    else:
        text = _item(spec)
    return text if len(text) <= 60 else text[:57] + "..."


def _item(value: Any) -> str:
    """An int as its digits (not ``'1'``: it was no string), anything else as its repr."""
    if isinstance(value, int) and not isinstance(value, bool):
        return _num(value)
    try:
        return repr(value)
    except Exception:  # a user object whose repr fails still gets its one-line error
        return f"<{type(value).__name__}>"


def _num(n: int) -> str:
    """``str(n)``, or a short description for an int too long to print (``str()`` refuses past 4300 digits)."""
    if n.bit_length() < 40:
        return str(n)
    return f"{'-' if n < 0 else ''}<a number of about {int(n.bit_length() * 0.30103) + 1} digits>"


def _count(count: int, num_available: int | None, shown: str) -> list[range]:
    if count == -1:
        return _every(num_available, shown)
    if count < 0:
        raise DeviceSpecError(
            f"devices={shown}: {_num(count)} is negative; the only negative request is -1 (all devices)"
            f"{_tail(num_available)}"
        )
    if num_available is not None and count > num_available:
        raise DeviceSpecError(
            f"devices={shown}: asks for {_num(count)} devices but {describe_available(num_available)}"
        )
    return [range(count)] if num_available is not None else []


def _every(num_available: int | None, shown: str) -> list[range]:
    if num_available is None:
        return []
    if num_available == 0:
        raise DeviceSpecError(f"devices={shown} asks for every device but none are available; use 'auto' (the CPU "
                              f"when there is no accelerator) or 0 for no accelerator")
    return [range(num_available)]


def _int(token: str, shown: str, num_available: int | None) -> int:
    """``int(token)`` for an ASCII integer token, refusing numbers too long to be a device index or count."""
    if len(token.lstrip("-")) > _MAX_DIGITS:
        raise DeviceSpecError(f"devices={shown}: {token[:12]}... ({len(token)} characters) is too large to be a "
                              f"device count or index{_tail(num_available)}")
    return int(token)


def _list_item(item: Any, shown: str, num_available: int | None) -> int:
    if isinstance(item, bool) or not isinstance(item, int):
        try:
            if isinstance(item, bool) or isinstance(item, float):
                raise TypeError
            return operator.index(item)
        except TypeError:
            raise DeviceSpecError(
                f"devices={shown}: list item {item!r} is not a device index; list items must be ints "
                f"like [0, 2]{_tail(num_available)}"
            ) from None
    return item


def _parse_text(text: str, num_available: int | None, shown: str) -> list[range]:
    if text == "":
        return []  # the table's "" (no accelerator); a blank one is refused below
    body = text.strip()
    if body == "":
        raise DeviceSpecError(f"devices={shown} is blank; give a count (2), indices ('0,2'), 'all' or 'auto', or 0 "
                              f"for no accelerator (is a variable in it unset?){_tail(num_available)}")
    if body.lower() == "auto":
        return [range(num_available)] if num_available is not None else []
    if body.lower() == "all":
        return _every(num_available, shown)
    if "," not in body:
        if _INT.match(body):
            return _count(_int(body, shown, num_available), num_available, shown)
        match = _RANGE.match(body)
        if match:
            return _check_indices([_expand_range(match, body, shown, num_available)], num_available, shown)
        raise DeviceSpecError(
            f"devices={shown}: cannot parse {body!r}; use a count ('2'), an index list ('0,2'), a range "
            f"('0-3'), '-1' or 'all'{_tail(num_available)}"
        )
    parts: list[range] = []
    for raw in body.split(","):
        token = raw.strip()
        if raw == "":
            continue  # Lightning accepts a trailing comma: "2," is [2]
        if token == "":  # Lightning refuses it too (int(""))
            raise DeviceSpecError(f"devices={shown}: an item between commas is blank; write indices like '0,2' "
                                  f"(is a variable in it unset?){_tail(num_available)}")
        match = _RANGE.match(token)
        if match:
            parts.append(_expand_range(match, token, shown, num_available))
        elif _INT.match(token):
            index = _int(token, shown, num_available)
            if index < 0:
                raise DeviceSpecError(
                    f"devices={shown}: index {index} is negative; indices count from 0 and -1 (all) is "
                    f"only valid alone{_tail(num_available)}"
                )
            parts.append(range(index, index + 1))
        else:
            raise DeviceSpecError(
                f"devices={shown}: cannot parse {token!r} as an index or a range like '0-3'"
                f"{_tail(num_available)}"
            )
    if not parts:
        raise DeviceSpecError(
            f"devices={shown}: the list names no device; write indices like '0,2'{_tail(num_available)}"
        )
    return _check_indices(parts, num_available, shown)


def _expand_range(match: re.Match[str], token: str, shown: str, num_available: int | None) -> range:
    """The indices of ``'a-b'`` as a ``range`` (never a list: '0-99999999999' costs nothing to check)."""
    start, stop = _int(match.group(1), shown, num_available), _int(match.group(2), shown, num_available)
    if stop < start:
        raise DeviceSpecError(
            f"devices={shown}: range {token!r} runs backwards; write it low-high like "
            f"'{stop}-{start}'{_tail(num_available)}"
        )
    if num_available is not None and stop >= num_available:
        raise DeviceSpecError(
            f"devices={shown}: range {token!r} reaches index {stop}, which is out of range; "
            f"{describe_available(num_available)}"
        )
    return range(start, stop + 1)


def _check_indices(parts: list[range], num_available: int | None, shown: str) -> list[range]:
    """Every index >= 0, in range, and named once, checked in the order given over ranges (each a single
    index or a range), without expanding them: the first index at fault is the one named."""
    taken: list[tuple[int, int]] = []  # the indices seen so far, as sorted disjoint [start, stop) intervals
    for part in parts:
        if part.start < 0:
            raise DeviceSpecError(
                f"devices={shown}: index {_num(part.start)} is negative; indices count from 0"
                f"{_tail(num_available)}"
            )
        if num_available is not None and part.stop > num_available and len(part) == 1:
            raise DeviceSpecError(
                f"devices={shown}: index {_num(part.start)} is out of range; {describe_available(num_available)}"
            )
        at = bisect.bisect_right(taken, (part.start, math.inf))
        before = taken[at - 1] if at else None
        if before is not None and before[1] > part.start:  # an earlier range covers this one's first index
            repeat = part.start
        elif at < len(taken) and taken[at][0] < part.stop:  # this range reaches a later-starting earlier one
            repeat = taken[at][0]
        else:
            bisect.insort(taken, (part.start, part.stop))
            continue
        raise DeviceSpecError(
            f"devices={shown}: index {_num(repeat)} appears twice; name each device once{_tail(num_available)}"
        )
    return parts
