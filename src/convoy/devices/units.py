"""Amounts users type: memory (``"20GiB"``, ``"80%"``), percentages and durations (``"5m"``).

    convoy select 2 --min-free-memory 20GiB --max-utilization 10% --format env
    convoy run --devices 1 --free --wait 5m -- python train.py

    >>> from convoy.devices.units import parse_memory, parse_percent, parse_duration
    >>> parse_memory("20GiB").mib_of(81559), parse_memory("80%").mib_of(1000), parse_duration("5m")
    (20480, 800, 300.0)

A bare number of memory is MiB (what NVML and the inventory use). ``GB``/``MB`` are decimal (10^9/10^6
bytes), ``GiB``/``MiB`` binary, as their SI/IEC names say. Errors are :class:`DeviceSpecError` naming the
text and a valid example.
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
_AMOUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*|%)\s*$")


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
        if value < 0:
            raise DeviceSpecError(f"memory amount {value!r} is negative; write e.g. '20GiB' or '80%'")
        return MemoryAmount(mib=float(value), text=f"{value}MiB")
    match = _AMOUNT.match(str(value))
    if not match:
        raise DeviceSpecError(f"cannot read memory amount {value!r}; write e.g. '20GiB', '512MiB' or '80%'")
    number, unit = float(match.group(1)), match.group(2).lower()
    if unit == "%":
        if number > 100:
            raise DeviceSpecError(f"memory amount {value!r} is above 100%; write a percentage of 0-100")
        return MemoryAmount(fraction=number / 100, text=str(value).strip())
    if unit not in _BYTES:
        raise DeviceSpecError(f"unknown memory unit {match.group(2)!r} in {value!r}; "
                              f"use MiB, GiB, TiB, MB, GB, TB or %")
    return MemoryAmount(mib=number * _BYTES[unit] / 2**20, text=str(value).strip())


def parse_percent(value: str | int | float) -> float:
    """``"10%"``, ``"10"`` or ``10`` -> ``10.0`` (a percentage from 0 to 100)."""
    if isinstance(value, bool):
        raise DeviceSpecError(f"percentage {value!r} is a bool; write e.g. '10%'")
    text = str(value).strip().rstrip("%").strip()
    try:
        number = float(text)
    except ValueError:
        raise DeviceSpecError(f"cannot read percentage {value!r}; write e.g. '10%' or 10") from None
    if not 0 <= number <= 100:
        raise DeviceSpecError(f"percentage {value!r} is outside 0-100")
    return number


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|)\s*$")


def parse_duration(value: str | int | float) -> float:
    """``"30"``/``"30s"`` -> 30.0, ``"5m"`` -> 300.0, ``"1h"`` -> 3600.0, ``"inf"`` -> ``math.inf``."""
    if isinstance(value, bool):
        raise DeviceSpecError(f"duration {value!r} is a bool; write e.g. '30s' or '5m'")
    if isinstance(value, (int, float)):
        if value < 0:
            raise DeviceSpecError(f"duration {value!r} is negative; write e.g. '30s', '5m' or 'inf'")
        return float(value)
    if str(value).strip().lower() in ("inf", "forever"):
        return math.inf
    match = _DURATION.match(str(value))
    if not match:
        raise DeviceSpecError(f"cannot read duration {value!r}; write e.g. '30' (seconds), '30s', '5m', '1h' "
                              f"or 'inf'")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]
