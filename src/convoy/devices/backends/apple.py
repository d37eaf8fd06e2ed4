"""Apple silicon: one GPU (``mps``) sharing the machine's unified memory.

    from convoy.devices.backends.apple import AppleBackend
    AppleBackend().discover()   # [] on anything but macOS on arm64
"""

from __future__ import annotations

import platform

from convoy.devices.backends.base import Backend, run_tool
from convoy.devices.inventory import Device

__all__ = ["AppleBackend"]


class AppleBackend(Backend):
    vendor = "apple"
    source = "sysctl"

    def available(self) -> bool:
        return platform.system() == "Darwin" and platform.machine() == "arm64"

    def discover(self) -> list[Device]:
        if not self.available():
            return []
        memsize = (run_tool(["sysctl", "-n", "hw.memsize"]) or "0").strip()
        brand = (run_tool(["sysctl", "-n", "machdep.cpu.brand_string"]) or "Apple silicon").strip()
        return [Device(index=0, uuid="MPS-0", name=f"{brand} GPU", vendor="apple",
                       memory_total_mib=int(memsize) // 2**20 if memsize.isdigit() else 0)]
