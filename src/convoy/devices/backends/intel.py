"""Intel data-centre and discrete GPUs (Level Zero) via ``xpu-smi discovery --json``.

    from convoy.devices.backends.intel import IntelBackend, devices_from_xpu_smi
    devices_from_xpu_smi(json.loads(text))

Without ``xpu-smi`` no Intel device is reported (integrated graphics are not training devices).
"""

from __future__ import annotations

import shutil

from convoy.devices.backends.base import Backend, run_json_tool
from convoy.devices.inventory import Device

TYPE_CHECKING = False  # typing is not imported at run time: `convoy select` starts without it
if TYPE_CHECKING:
    from typing import Any

__all__ = ["IntelBackend", "devices_from_xpu_smi"]


class IntelBackend(Backend):
    vendor = "intel"
    source = "xpu-smi"

    def available(self) -> bool:
        return shutil.which("xpu-smi") is not None

    def discover(self) -> list[Device]:
        data = run_json_tool(["xpu-smi", "discovery", "--json"])
        return devices_from_xpu_smi(data) if data else []


def devices_from_xpu_smi(data: Any) -> list[Device]:
    """Parse ``xpu-smi discovery --json`` (``{"device_list": [{"device_id", "device_name", "uuid",
    "pci_bdf_address", "memory_physical_size_byte", ...}]}``), in PCI order."""
    items = data.get("device_list", []) if isinstance(data, dict) else []
    items = sorted(items, key=lambda d: str(d.get("pci_bdf_address", "")))
    devices = []
    for i, item in enumerate(items):
        size = item.get("memory_physical_size_byte") or item.get("max_mem_alloc_size_byte") or 0
        devices.append(Device(
            index=i,
            uuid=str(item.get("uuid") or f"XPU-{item.get('pci_bdf_address', i)}"),
            name=str(item.get("device_name", "Intel GPU")),
            vendor="intel",
            pci_bus_id=str(item.get("pci_bdf_address", "")),
            memory_total_mib=int(size) // 2**20,
        ))
    return devices
