"""Amounts users type: memory (``"20GiB"``, ``"80%"``), percentages and durations (``"5m"``).

    convoy select 2 --min-free-memory 20GiB --max-utilization 10% --format env
    convoy run --devices 1 --free --wait 5m -- python train.py

    >>> from convoy.devices.amounts import parse_memory, parse_percent, parse_duration
    >>> parse_memory("20GiB").mib_of(81559), parse_memory("80%").mib_of(1000), parse_duration("5m")
    (20480, 800, 300.0)

A bare number of memory is MiB (what NVML and the inventory use). ``GB``/``MB`` are decimal (10^9/10^6
bytes), ``GiB``/``MiB`` binary, as their SI/IEC names say. Errors are :class:`DeviceSpecError` naming the
text and a valid example. Numbers are ASCII digits only, and every amount must be finite: ``nan``, ``inf`` and
numbers too large for a float (400 nines) are refused (a duration may be ``inf``: wait forever).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from convoy.errors import DeviceSpecError

__all__ = ["MemoryAmount", "parse_memory", "parse_percent", "parse_duration"]

_BYTES = {
    "": 2**20,  # bare number: MiB
    "b": 1,
    "k": 2**10, "kib": 2**10, "kb": 10**3,
    "m": 2**20, "mib": 2**20, "mb": 10**6,
    "g": 2**30, "gib": 2**30, "gb": 10**9,
    "t": 2**40, "tib": 2**40, "tb": 10**12,
}
_AMOUNT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*|%)\s*$")


@dataclass(frozen=True)
class MemoryAmount:
    """Either an absolute amount (``mib``) or a fraction of each device's total (``fraction``)."""

    mib: float | None = None
    fraction: float | None = None
    text: str = ""

    def mib_of(self, total_mib: int) -> int:
        """The amount in MiB for a device with ``total_mib`` of memory."""
        if self.fraction is not None:
            return int(total_mib * self.fraction)
        return int(math.ceil(self.mib or 0))

    def __str__(self) -> str:
        return self.text


def parse_memory(value: str | int | float | MemoryAmount) -> MemoryAmount:
    """``"20GiB"``, ``"20GB"``, ``"512MiB"``, ``"80%"`` (of each device's total), or a number of MiB."""
    if isinstance(value, MemoryAmount):
        return value
    if isinstance(value, bool):
        raise DeviceSpecError(f"memory amount {value!r} is a bool; write e.g. '20GiB' or '80%'")
    if isinstance(value, (int, float)):
        number = _finite(value, "memory amount")
        if number < 0:
            raise DeviceSpecError(f"memory amount {value!r} is negative; write e.g. '20GiB' or '80%'")
        return MemoryAmount(mib=number, text=f"{value}MiB")
    if not isinstance(value, str):
        raise DeviceSpecError(f"memory amount {_short(value)} is a {type(value).__name__}; write e.g. '20GiB' or '80%'")
    match = _AMOUNT.match(value)
    if not match:
        raise DeviceSpecError(f"cannot read memory amount {_short(value)}; write e.g. '20GiB', '512MiB' or '80%'")
    number, unit = _finite(float(match.group(1)), "memory amount", value), match.group(2).lower()
    if unit == "%":
        if number > 100:
            raise DeviceSpecError(f"memory amount {value!r} is above 100%; write a percentage of 0-100")
        return MemoryAmount(fraction=number / 100, text=str(value).strip())
    if unit not in _BYTES:
        raise DeviceSpecError(f"unknown memory unit {match.group(2)!r} in {value!r}; "
                              f"use MiB, GiB, TiB, MB, GB, TB or %")
    return MemoryAmount(mib=_finite(number * _BYTES[unit] / 2**20, "memory amount", value), text=str(value).strip())


def _short(value: object) -> str:
    try:
        text = repr(value)
    except ValueError:  # an int past Python's 4300-digit printing limit
        text = f"<a {type(value).__name__} too long to print>"
    return text if len(text) <= 40 else text[:37] + "..."


def _finite(number: float | int, what: str, shown: object = None) -> float:
    """``float(number)``, refusing nan, infinities and ints too large for a float, with one line."""
    try:
        result = float(number)
    except OverflowError:
        result = math.inf
    if not math.isfinite(result):
        example = "'30s', '5m' or 'inf'" if what == "duration" else "'20GiB' or '80%'"
        raise DeviceSpecError(f"{what} {_short(number if shown is None else shown)} is not a finite number; "
                              f"write e.g. {example}")
    return result


def parse_percent(value: str | int | float) -> float:
    """``"10%"``, ``"10"`` or ``10`` -> ``10.0`` (a percentage from 0 to 100)."""
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):  # float(b'5') reads bytes
        raise DeviceSpecError(f"percentage {_short(value)} is a {type(value).__name__}; write e.g. '10%' or 10")
    text = str(value).strip().rstrip("%").strip() if isinstance(value, str) else value
    try:
        if isinstance(text, str) and not re.fullmatch(r"[0-9]+(\.[0-9]*)?|\.[0-9]+", text):
            raise ValueError(text)
        number = float(text)
    except (TypeError, ValueError, OverflowError):
        raise DeviceSpecError(f"cannot read percentage {_short(value)}; write e.g. '10%' or 10") from None
    if not 0 <= number <= 100:
        raise DeviceSpecError(f"percentage {value!r} is outside 0-100")
    return number


_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(s|m|h|)\s*$")


def parse_duration(value: str | int | float) -> float:
    """``"30"``/``"30s"`` -> 30.0, ``"5m"`` -> 300.0, ``"1h"`` -> 3600.0, ``"inf"`` -> ``math.inf``."""
    if isinstance(value, bool):
        raise DeviceSpecError(f"duration {value!r} is a bool; write e.g. '30s' or '5m'")
    if isinstance(value, (int, float)):
        if value != value or value < 0:  # nan, or negative
            raise DeviceSpecError(f"duration {value!r} is not a number of seconds >= 0; write e.g. '30s', '5m' "
                                  f"or 'inf'")
        return math.inf if value == math.inf else _finite(value, "duration")
    if not isinstance(value, str):
        raise DeviceSpecError(f"duration {_short(value)} is a {type(value).__name__}; write e.g. '30s', '5m' or 'inf'")
    if value.strip().lower() in ("inf", "forever"):
        return math.inf
    match = _DURATION.match(value)
    if not match:
        raise DeviceSpecError(f"cannot read duration {_short(value)}; write e.g. '30' (seconds), '30s', '5m', '1h' "
                              f"or 'inf'")
    return _finite(float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)], "duration", value)
