"""Device profiles shipped with convoy: rates measured on a GPU users plan for, used before it is in hand.

    from convoy.plan.speed.profiles import profile_for, shipped_profiles
    record, origin = profile_for(lookup_gpu("H100-80GB"))     # (Calibration, "measured on ...") or None
    shipped_profiles()                                        # {"H100-80GB": ...}

A profile is a ``Calibration`` record measured on one board of a table row (``convoy.plan.hardware.GPUS``), stored
as ``device_profiles/<row>.json`` beside this module::

    {"gpu": "H100-80GB", "measured": "the board, driver, torch, date", "origin": "how", "record": {...}}

``convoy.plan.speed.rates.rates_for`` uses it when the planned GPU is not calibrated here, and only for the board
as its datasheet describes it (not under ``--peak-tflops``). To add one, run ``convoy plan <config> --calibrate`` on
the GPU and copy its cache entry into a new file there. A profile that cannot be read or holds values no
measurement gives (``records.rates_problem``) is one warning naming the file; the other profiles stand.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Iterable, Iterator, Mapping

from convoy.errors import ConvoyWarning
from convoy.plan.hardware import GPUS, GpuSpec
from convoy.plan.speed.cache_file import parse_json_object
from convoy.plan.speed.records import Calibration, rates_problem

TYPE_CHECKING = False  # typing is not imported at run time: a plan starts without it
if TYPE_CHECKING:
    from typing import Any

__all__ = ["profile_for", "shipped_profiles"]

_PACKAGE = "convoy.plan.speed.device_profiles"


@functools.cache
def shipped_profiles() -> Mapping[str, tuple[Calibration, str]]:
    """Every sound shipped profile by table name: (record, on what it was measured). Read once per process."""
    out: dict[str, tuple[Calibration, str]] = {}
    for name, raw in _profile_files():
        what = f"device profile {name!r} (shipped with convoy)"
        data = parse_json_object(raw, what, fix="plans use the shape-aware model; reinstall convoy")
        if not data:
            continue
        problem = _problem(data)
        if problem is not None:
            warnings.warn(f"{what}: {problem}: not used; plans use the shape-aware model; reinstall convoy",
                          ConvoyWarning, stacklevel=2)
            continue
        out[data["gpu"]] = (Calibration.from_dict(data["record"]), str(data.get("measured", "")))
    return out


def _profile_files() -> Iterator[tuple[str, bytes]]:
    """(file name, its bytes) of each shipped profile."""
    # read from the directory where convoy is installed as files: importlib.resources costs a plan's start
    # (zipfile and its readers, about 10 ms); from a zip or another loader, through it
    folder = os.path.join(os.path.dirname(__file__), "device_profiles")
    if os.path.isdir(folder):
        for name in os.listdir(folder):
            if name.endswith(".json"):
                with open(os.path.join(folder, name), "rb") as handle:
                    yield name, handle.read()
        return
    from importlib import resources

    entries: Iterable[Any] = resources.files(_PACKAGE).iterdir()
    for entry in entries:
        if entry.name.endswith(".json"):
            yield entry.name, entry.read_bytes()


def _problem(data: Mapping[str, Any]) -> str | None:
    if not isinstance(data.get("gpu"), str) or not isinstance(data.get("record"), dict):
        return "not a profile (\"gpu\" and \"record\" expected)"
    try:
        record = Calibration.from_dict(data["record"])
    except TypeError as err:
        return f"its record is not a calibration record ({err})"
    return rates_problem(record)


def profile_for(gpu: GpuSpec) -> tuple[Calibration, str] | None:
    """The shipped profile of ``gpu``'s table row, or None (no profile; or ``gpu``'s peak is not the row's)."""
    row = GPUS.get(gpu.name.lower())
    if row is None or (row.bf16_tflops, row.fp16_tflops, row.fp32_tflops) != (
            gpu.bf16_tflops, gpu.fp16_tflops, gpu.fp32_tflops):
        return None
    return shipped_profiles().get(row.name)
