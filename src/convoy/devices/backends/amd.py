"""AMD GPUs (ROCm) from sysfs: ``/sys/bus/pci/devices/*`` with vendor 0x1002, read by the amdgpu driver,
and their xGMI links from the KFD topology (``/sys/class/kfd/kfd/topology/nodes/*``).

    from convoy.devices.backends.amd import AmdBackend, devices_from_sysfs
    devices_from_sysfs(Path("/sys/bus/pci/devices"), kfd_root=Path("/sys/class/kfd/kfd/topology"))

Memory comes from ``mem_info_vram_total``/``mem_info_vram_used`` (bytes), utilisation from
``gpu_busy_percent``, the UUID from ``unique_id`` (as ``GPU-<hex>``, the form ``ROCR_VISIBLE_DEVICES``
takes).

xGMI peers: every KFD node is a directory whose ``properties`` file holds ``name value`` lines. A GPU
node has a non-zero ``gpu_id``; its ``location_id`` is the PCI ``bus << 8 | devfn`` and ``domain`` the PCI
domain (a partitioned MI300 ORs its partition number into ``location_id``, so convoy matches
domain:bus:slot and ignores the function), and ``unique_id`` is the same number as the PCI device's
``unique_id`` (decimal here, hex there). Each ``io_links/<k>/properties`` names ``node_from``, ``node_to``
and ``type``; type 11 is ``CRAT_IOLINK_TYPE_XGMI`` (2 is PCIe), which the kernel writes for every peer
in the same xGMI hive (``weight`` is 15 per hop). Those peers go into ``nvlink_peers``, the field
``order="topology"`` reads. A missing or odd topology gives no links; it never fails discovery.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from convoy.devices.backends.base import SYSFS_PCI, Backend
from convoy.devices.inventory import Device

TYPE_CHECKING = False  # typing is not imported at run time: `convoy select` starts without it
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = ["AmdBackend", "devices_from_sysfs", "xgmi_peers", "SYSFS_KFD", "IOLINK_TYPE_XGMI"]

SYSFS_KFD = Path("/sys/class/kfd/kfd/topology")
IOLINK_TYPE_XGMI = 11
"""``CRAT_IOLINK_TYPE_XGMI`` in the kernel's ``kfd_crat.h``; ``rocm-smi --showtopotype`` prints it as XGMI."""


class AmdBackend(Backend):
    vendor = "amd"
    source = "sysfs"

    def __init__(self, pci_root: Path = SYSFS_PCI, kfd_root: Path = SYSFS_KFD) -> None:
        self.pci_root = pci_root
        self.kfd_root = kfd_root

    def available(self) -> bool:
        return Path("/dev/kfd").exists()

    def discover(self) -> list[Device]:
        return devices_from_sysfs(self.pci_root, kfd_root=self.kfd_root)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _int(path: Path) -> int | None:
    text = _read(path)
    return int(text) if text is not None and text.isdigit() else None


def _children(path: Path) -> list[Path]:
    try:
        return sorted(path.iterdir())
    except OSError:  # missing, not a directory, or not readable
        return []


def devices_from_sysfs(root: Path, *, kfd_root: Path | None = None) -> list[Device]:
    """The amdgpu devices under the PCI sysfs ``root``, in PCI-bus order; with ``kfd_root``, their xGMI peers."""
    devices: list[Device] = []
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
    if kfd_root is None or len(devices) < 2:
        return devices
    peers = xgmi_peers(kfd_root, devices)
    return [replace(d, nvlink_peers=peers.get(d.index, ())) for d in devices]


def _amd_pci(root: Path) -> list[tuple[str, Path]]:
    found = []
    for path in _children(root):
        if _read(path / "vendor") == "0x1002" and (_read(path / "class") or "").startswith(("0x03", "0x12")):
            found.append((path.name.lower(), path))
    return found


def xgmi_peers(kfd_root: Path, devices: Sequence[Device]) -> dict[int, tuple[int, ...]]:
    """Device index -> indices of the devices it reaches over xGMI, read from the KFD topology at
    ``kfd_root`` (``/sys/class/kfd/kfd/topology``). Empty when the topology is missing or lists none."""
    nodes = {int(p.name): p for p in _children(kfd_root / "nodes") if p.name.isdigit()}
    owner = _node_owners(nodes, devices)
    links: dict[int, set[int]] = {}
    for node, index in owner.items():
        for link in _children(nodes[node] / "io_links"):
            props = _properties(link / "properties")
            if props.get("type") != IOLINK_TYPE_XGMI:
                continue
            peer = owner.get(props.get("node_to", -1))
            if peer is None or peer == index:  # a CPU, an unknown node, or a partition of the same GPU
                continue
            links.setdefault(index, set()).add(peer)
            links.setdefault(peer, set()).add(index)  # an xGMI link carries both directions
    return {index: tuple(sorted(found)) for index, found in links.items()}


def _properties(path: Path) -> dict[str, int]:
    """A KFD ``properties`` file (``name value`` per line); lines that are not that are skipped."""
    out: dict[str, int] = {}
    for line in (_read(path) or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _node_owners(nodes: Mapping[int, Path], devices: Sequence[Device]) -> dict[int, int]:
    """KFD node id -> device index, for the GPU nodes that belong to a listed device."""
    by_bus = {d.pci_bus_id.lower(): d.index for d in devices}
    by_slot: dict[str, int | None] = {}
    for d in devices:
        slot = d.pci_bus_id.lower().rsplit(".", 1)[0]
        by_slot[slot] = None if slot in by_slot else d.index  # ambiguous slots match by full id only
    by_unique = {}
    for d in devices:
        text = d.uuid[len("GPU-"):] if d.uuid.startswith("GPU-") else ""
        try:
            by_unique[int(text, 16)] = d.index
        except ValueError:
            pass
    owners: dict[int, int] = {}
    for node, path in nodes.items():
        if _int(path / "gpu_id") == 0:
            continue  # a CPU node
        props = _properties(path / "properties")
        index = None
        location = props.get("location_id")
        if location:
            domain, bus, devfn = props.get("domain", 0), (location >> 8) & 0xFF, location & 0xFF
            slot = f"{domain:04x}:{bus:02x}:{devfn >> 3:02x}"
            index = by_bus.get(f"{slot}.{devfn & 7:x}")
            if index is None:
                index = by_slot.get(slot)
        if index is None and props.get("unique_id"):
            index = by_unique.get(props["unique_id"])
        if index is not None:
            owners[node] = index
    return owners
