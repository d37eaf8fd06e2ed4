"""Intel Gaudi (Habana) accelerators via ``hl-smi``; ``HABANA_VISIBLE_MODULES`` takes *module ids*.

    from convoy.devices.backends.habana import HabanaBackend, devices_from_hl_smi
    devices_from_hl_smi(csv_text)
"""

from __future__ import annotations

import shutil

from convoy.devices.backends.base import Backend, run_tool
from convoy.devices.inventory import Device

__all__ = ["HabanaBackend", "devices_from_hl_smi", "HL_SMI_QUERY"]

HL_SMI_QUERY = ["hl-smi", "-Q", "index,module_id,bus_id,name,uuid,memory.total,memory.used,utilization.aip",
                "-f", "csv,noheader,nounits"]


class HabanaBackend(Backend):
    vendor = "habana"
    source = "hl-smi"

    def available(self) -> bool:
        return shutil.which("hl-smi") is not None

    def discover(self) -> list[Device]:
        text = run_tool(HL_SMI_QUERY)
        return devices_from_hl_smi(text) if text else []


def devices_from_hl_smi(text: str) -> list[Device]:
    """Parse the CSV of ``HL_SMI_QUERY`` (one device per line, memory in MiB)."""
    rows = []
    for line in text.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 8 or not cells[0].isdigit():
            continue
        rows.append(cells)
    rows.sort(key=lambda c: c[2])  # PCI order
    devices = []
    for i, (_, module, bus, name, uuid, total, used, util) in enumerate(r[:8] for r in rows):
        devices.append(Device(
            index=i, uuid=uuid, name=name, vendor="habana", pci_bus_id=bus,
            memory_total_mib=int(float(total)), memory_used_mib=int(float(used)),
            utilization_pct=float(util) if util.replace(".", "", 1).isdigit() else None,
            extra={"module_id": int(module)} if module.isdigit() else {},
        ))
    return devices
