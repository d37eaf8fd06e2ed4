"""AMD GPUs (ROCm) from sysfs: ``/sys/bus/pci/devices/*`` with vendor 0x1002, read by the amdgpu driver.

    from convoy.devices.backends.amd import AmdBackend, devices_from_sysfs
    devices_from_sysfs(Path("/sys/bus/pci/devices"))

Memory comes from ``mem_info_vram_total``/``mem_info_vram_used`` (bytes), utilisation from
``gpu_busy_percent``, the UUID from ``unique_id`` (as ``GPU-<hex>``, the form ``ROCR_VISIBLE_DEVICES``
takes). xGMI peers are not read yet: ``nvlink_peers`` stays empty, so ``order="topology"`` treats the
GPUs as unconnected.
"""

from __future__ import annotations

from pathlib import Path

from convoy.devices.backends.base import SYSFS_PCI, Backend
from convoy.devices.inventory import Device

__all__ = ["AmdBackend", "devices_from_sysfs"]


class AmdBackend(Backend):
    vendor = "amd"
    source = "sysfs"

    def available(self) -> bool:
        return Path("/dev/kfd").exists()

    def discover(self) -> list[Device]:
        return devices_from_sysfs(SYSFS_PCI)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _int(path: Path) -> int | None:
    text = _read(path)
    return int(text) if text is not None and text.isdigit() else None


def devices_from_sysfs(root: Path) -> list[Device]:
    devices = []
    for bus_id, path in _amd_pci(root):
        total = _int(path / "mem_info_vram_total")
        if total is None:
            continue  # not driven by amdgpu (or an APU without dedicated VRAM accounting)
        used = _int(path / "mem_info_vram_used") or 0
        busy = _int(path / "gpu_busy_percent")
        unique = _read(path / "unique_id")
        device_id = _read(path / "device") or "?"
        name = _read(path / "product_name") or f"AMD GPU {device_id}"
        devices.append(Device(
            index=len(devices),
            uuid=f"GPU-{unique}" if unique else f"PCI-{bus_id}",
            name=name,
            vendor="amd",
            pci_bus_id=bus_id,
            memory_total_mib=total // 2**20,
            memory_used_mib=used // 2**20,
            utilization_pct=None if busy is None else float(busy),
        ))
    return devices


def _amd_pci(root: Path) -> list[tuple[str, Path]]:
    if not root.is_dir():
        return []
    found = []
    for path in sorted(root.iterdir()):
        if _read(path / "vendor") == "0x1002" and (_read(path / "class") or "").startswith(("0x03", "0x12")):
            found.append((path.name, path))
    return found
