"""The interface every discovery backend implements, and the sysfs helpers several share.

    class MyBackend(Backend):
        vendor = "myvendor"
        def available(self) -> bool: ...
        def discover(self) -> list[Device]: ...

A backend never starts an accelerator runtime (no CUDA context, no HIP init): it reads the vendor's
management library, command-line tool or sysfs, so ``CUDA_VISIBLE_DEVICES`` and friends stay unset.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from abc import ABC, abstractmethod
from pathlib import Path

from convoy.devices.inventory import Device

TYPE_CHECKING = False  # typing is not imported at run time: `convoy select` starts without it
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

__all__ = ["Backend", "run_tool", "run_json_tool", "SYSFS_PCI"]

SYSFS_PCI = Path("/sys/bus/pci/devices")


class Backend(ABC):
    """One vendor's way of listing its devices."""

    vendor: str = ""
    source: str = ""

    @abstractmethod
    def available(self) -> bool:
        """Cheap check: could this vendor have devices here (library, tool or sysfs entry present)?"""

    @abstractmethod
    def discover(self) -> list[Device]:
        """The devices, in index (PCI-bus) order. Empty when none; never raises for a missing driver."""


def run_tool(argv: Sequence[str], timeout: float = 10.0) -> str | None:
    """Output of a vendor tool, or ``None`` when it is missing, fails or hangs."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def run_json_tool(argv: Sequence[str], timeout: float = 10.0) -> Any:
    text = run_tool(argv, timeout)
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None
