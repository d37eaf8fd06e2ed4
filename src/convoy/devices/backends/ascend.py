"""Huawei Ascend NPUs via ``npu-smi info -m`` (the chip-to-logical-id table).

    from convoy.devices.backends.ascend import AscendBackend, devices_from_npu_smi
    devices_from_npu_smi(text)

``ASCEND_RT_VISIBLE_DEVICES`` takes the *logical* ids this table lists. Memory is not read yet (0).
"""

from __future__ import annotations

import shutil

from convoy.devices.backends.base import Backend, run_tool
from convoy.devices.inventory import Device

__all__ = ["AscendBackend", "devices_from_npu_smi"]


class AscendBackend(Backend):
    vendor = "ascend"
    source = "npu-smi"

    def available(self) -> bool:
        return shutil.which("npu-smi") is not None

    def discover(self) -> list[Device]:
        text = run_tool(["npu-smi", "info", "-m"])
        return devices_from_npu_smi(text) if text else []


def devices_from_npu_smi(text: str) -> list[Device]:
    """Rows ``NPU ID  Chip ID  Chip Logic ID  Chip Name``; rows whose logic id is ``-`` (the MCU) skipped."""
    devices = []
    for line in text.splitlines():
        cells = line.split()
        if len(cells) < 4 or not (cells[0].isdigit() and cells[1].isdigit() and cells[2].isdigit()):
            continue
        npu, chip, logic, name = cells[0], cells[1], int(cells[2]), " ".join(cells[3:])
        devices.append(Device(index=logic, uuid=f"NPU-{npu}-{chip}", name=name, vendor="ascend"))
    return sorted(devices, key=lambda d: d.index)
