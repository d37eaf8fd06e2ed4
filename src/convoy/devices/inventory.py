"""What a machine has: one :class:`Device` per accelerator, gathered in an :class:`Inventory`.

    convoy devices --json > box.json                  # snapshot a machine
    CONVOY_INVENTORY=box.json convoy select 2 --free  # replay any decision elsewhere

    from convoy.devices.inventory import load_inventory
    inv = load_inventory("box.json")
    [d.memory_free_mib for d in inv.devices]

The JSON format is a contract (design.md): top level ``{"devices": [...]}``; per device ``index`` (NVML /
PCI-bus order), ``uuid``, ``name``, ``vendor``, ``pci_bus_id``, ``memory_total_mib``, ``memory_used_mib``,
``utilization_pct``, ``compute_capability``, ``compute_mode``, ``processes`` (``{"pid",
"used_memory_mib"}``), ``nvlink_peers`` (indices), and ``mig_devices`` for a GPU split into MIG slices.
Defaults for missing optional keys: ``vendor="nvidia"``, ``pci_bus_id=""``, ``memory_used_mib=0``,
``utilization_pct=None`` (unknown), ``compute_capability=None``, ``compute_mode="default"``, empty lists,
``multiprocessor_count``/``max_sm_clock_mhz`` ``None``. Unknown keys are kept in ``extra`` and written back.

Checked on load (``InventoryError`` naming the file, the device and the field): the file is UTF-8 JSON (no NaN, no
unreadably deep nesting); indices, pids and memory amounts are integers >= 0; ``utilization_pct`` is a finite
number in 0-100; ``vendor`` is one of ``DEVICE_VENDORS`` (any case); ``nvlink_peers`` name other devices of
the same vendor in the file; uuids (MIG slices' too) are unique. And what no machine reports: a device (or MIG
slice) using more memory than its ``memory_total_mib``, in all or in one or all of its processes; MIG slices
holding more than their GPU, or on a device that is not NVIDIA's (a total of 0 is one not reported).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from convoy.devices.vendors import DEVICE_VENDORS
from convoy.errors import InventoryError, shown
from convoy.reading import INVENTORY, load_json, path_and_name

TYPE_CHECKING = False  # typing is not imported at run time: `convoy select` starts without it
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

__all__ = ["Process", "MigDevice", "Device", "Inventory", "load_inventory", "inventory_from_dict", "as_inventory"]

COMPUTE_MODES = ("default", "exclusive_process", "prohibited", "exclusive_thread")
VENDORS = DEVICE_VENDORS  # in the order that breaks a tie for the main vendor (Inventory.vendor)


@dataclass(frozen=True)
class Process:
    """A process using a device."""

    pid: int
    """Operating-system process id (as the driver reports it; may be another container's pid)."""
    used_memory_mib: int | None = None
    """Device memory the process holds, when the driver reports it."""
    name: str | None = None
    """Command name, when known."""


@dataclass(frozen=True)
class MigDevice:
    """One MIG slice of an NVIDIA GPU (A100/H100). CUDA lets one process use one slice only."""

    uuid: str
    """``MIG-...`` UUID, what ``CUDA_VISIBLE_DEVICES`` takes."""
    profile: str
    """Profile name such as ``"3g.40gb"``."""
    memory_total_mib: int
    memory_used_mib: int = 0
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    processes: tuple[Process, ...] = ()


@dataclass(frozen=True)
class Device:
    """One accelerator, as discovery or an inventory file describes it."""

    index: int
    """Position in NVML / PCI-bus order: the number ``nvidia-smi`` shows."""
    uuid: str
    name: str
    vendor: str = "nvidia"
    pci_bus_id: str = ""
    memory_total_mib: int = 0
    memory_used_mib: int = 0
    utilization_pct: float | None = None
    """GPU utilisation in percent, ``None`` when unknown."""
    compute_capability: str | None = None
    """``"9.0"`` for NVIDIA; the architecture name (``"gfx90a"``) for AMD; ``None`` when unknown."""
    compute_mode: str = "default"
    """``"default"``, ``"exclusive_process"``, ``"prohibited"``."""
    processes: tuple[Process, ...] = ()
    nvlink_peers: tuple[int, ...] = ()
    """Indices of the devices this one reaches over NVLink/NVSwitch (or xGMI, for AMD)."""
    multiprocessor_count: int | None = None
    max_sm_clock_mhz: int | None = None
    mig_devices: tuple[MigDevice, ...] = ()
    """The MIG slices, when MIG mode is on; empty otherwise."""
    mig_parent_uuid: str | None = None
    """Set on a :class:`Device` that stands for one MIG slice: the UUID of the GPU it belongs to."""
    extra: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)
    """Keys of the inventory file convoy does not know, kept so that ``to_json`` writes them back."""

    @property
    def memory_free_mib(self) -> int:
        return max(self.memory_total_mib - self.memory_used_mib, 0)

    @property
    def is_mig_slice(self) -> bool:
        return self.mig_parent_uuid is not None

    @property
    def busy_reason(self) -> str | None:
        """Why a job should not take this device (``--free``), or ``None`` when it is free."""
        if self.compute_mode == "prohibited":
            return "compute mode is prohibited"
        if self.processes:
            used = sum(p.used_memory_mib or 0 for p in self.processes)
            pids = ", ".join(str(p.pid) for p in self.processes[:4])
            what = f"{len(self.processes)} process{'es' if len(self.processes) > 1 else ''} (pid {pids})"
            if self.compute_mode in ("exclusive_process", "exclusive_thread"):
                return f"exclusive-process mode and taken by {what}"
            return f"in use by {what}, {used} MiB"
        return None

    @property
    def label(self) -> str:
        """``'GPU 2 (NVIDIA H100 80GB HBM3)'``: how explanations and errors name a device."""
        if self.is_mig_slice:
            return f"GPU {self.index} MIG {self.uuid} ({self.name})"
        return f"GPU {self.index} ({self.name})"

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "vendor": self.vendor,
            "pci_bus_id": self.pci_bus_id,
            "memory_total_mib": self.memory_total_mib,
            "memory_used_mib": self.memory_used_mib,
            "utilization_pct": self.utilization_pct,
            "compute_capability": self.compute_capability,
            "compute_mode": self.compute_mode,
            "processes": [_process_dict(p) for p in self.processes],
            "nvlink_peers": list(self.nvlink_peers),
        }
        if self.multiprocessor_count is not None:
            data["multiprocessor_count"] = self.multiprocessor_count
        if self.max_sm_clock_mhz is not None:
            data["max_sm_clock_mhz"] = self.max_sm_clock_mhz
        if self.mig_devices:
            data["mig_devices"] = [
                {
                    "uuid": m.uuid,
                    "profile": m.profile,
                    "memory_total_mib": m.memory_total_mib,
                    "memory_used_mib": m.memory_used_mib,
                    "gpu_instance_id": m.gpu_instance_id,
                    "compute_instance_id": m.compute_instance_id,
                    "processes": [_process_dict(p) for p in m.processes],
                }
                for m in self.mig_devices
            ]
        for key, value in self.extra.items():
            data.setdefault(key, value)
        return data


def _process_dict(p: Process) -> dict[str, Any]:
    data: dict[str, Any] = {"pid": p.pid, "used_memory_mib": p.used_memory_mib}
    if p.name is not None:
        data["name"] = p.name
    return data


@dataclass(frozen=True)
class Inventory:
    """Every accelerator of one machine, in index order. Empty when the machine has none (CPU only)."""

    devices: tuple[Device, ...] = ()
    source: str = "none"
    """Where it came from: ``"nvml"``, ``"file:<path>"``, ``"rocm-smi"``, ``"sysfs"``, ``"none"``, ..."""

    @property
    def vendor(self) -> str:
        """The vendor a job would use: the most common one (ties: NVIDIA first), ``"cpu"`` when empty."""
        if not self.devices:
            return "cpu"
        counts: dict[str, int] = {}
        for device in self.devices:
            counts[device.vendor] = counts.get(device.vendor, 0) + 1
        rank = {v: i for i, v in enumerate(VENDORS)}
        return min(counts, key=lambda v: (-counts[v], rank.get(v, len(rank)), v))

    def by_uuid(self, uuid: str) -> Device | None:
        for device in self.devices:
            if device.uuid == uuid:
                return device
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"devices": [d.to_dict() for d in self.devices]}

    def to_json(self) -> str:
        """The inventory file format (what ``convoy devices --json`` prints)."""
        return json.dumps(self.to_dict(), indent=2) + "\n"


def load_inventory(path: str | os.PathLike[str]) -> Inventory:
    """Read an inventory file, bounded (``convoy.reading``: a regular file of at most 16 MiB, nesting bounded).
    Raises :class:`InventoryError` naming the file and what is wrong."""
    path, name = path_and_name(path)
    printable = path if path.isprintable() else repr(path)
    try:
        data = load_json(path, INVENTORY)
    except FileNotFoundError:
        raise InventoryError(f"inventory file {path!r} does not exist; write one with "
                             f"'convoy devices --json > {name if name.isprintable() else 'box.json'}'") from None
    return inventory_from_dict(data, source=f"file:{printable}")


def as_inventory(value: Any) -> Inventory | None:
    """``value`` as an :class:`Inventory`: an ``Inventory`` as it is, a path (str or ``os.PathLike``) loaded
    with ``load_inventory``, ``None`` as ``None`` (the caller discovers the machine); anything else refused."""
    if value is None or isinstance(value, Inventory):
        return value
    if isinstance(value, (str, os.PathLike)):
        return load_inventory(value)
    raise InventoryError(f"inventory={type(value).__name__}: give an Inventory, or the path of an inventory file "
                         f"('convoy devices --json > box.json')")


def inventory_from_dict(data: Any, *, source: str = "dict") -> Inventory:
    """Build an :class:`Inventory` from the parsed JSON format, validating every field."""
    if not isinstance(data, dict) or not isinstance(data.get("devices"), list):
        raise InventoryError(f"inventory ({source}): top level must be {{\"devices\": [...]}}, "
                             f"got {type(data).__name__}")
    devices = tuple(_device(item, i, source) for i, item in enumerate(data["devices"]))
    devices = tuple(sorted(devices, key=lambda d: (d.vendor != devices[0].vendor, d.vendor, d.index)))
    keys = [(d.vendor, d.index) for d in devices]
    if len(set(keys)) != len(keys):
        raise InventoryError(f"inventory ({source}): device indices repeat: {[d.index for d in devices]}; "
                             f"each vendor's indices must be unique")
    uuids = [d.uuid for d in devices] + [m.uuid for d in devices for m in d.mig_devices]
    if len(set(uuids)) != len(uuids):  # CUDA_VISIBLE_DEVICES names a device or a MIG slice by its uuid
        raise InventoryError(f"inventory ({source}): device uuids repeat; each must be unique")
    indices: dict[str, set[int]] = {}
    for device in devices:
        indices.setdefault(device.vendor, set()).add(device.index)
    for device in devices:
        known = indices[device.vendor] - {device.index}
        bogus = [p for p in device.nvlink_peers if p not in known]
        if bogus:
            raise InventoryError(f"inventory ({source}): {device.vendor} device {device.index} lists nvlink peer "
                                 f"{bogus[0]}, which is not another {device.vendor} device of the inventory "
                                 f"(indices: {sorted(known | {device.index})[:16]})")
    return Inventory(devices=devices, source=source)


_KNOWN = {
    "index", "uuid", "name", "vendor", "pci_bus_id", "memory_total_mib", "memory_used_mib",
    "utilization_pct", "compute_capability", "compute_mode", "processes", "nvlink_peers",
    "multiprocessor_count", "max_sm_clock_mhz", "mig_devices",
}


MAX_DEVICE_INDEX = 2**16 - 1
"""The largest device index an inventory may hold (drivers number a machine's devices from 0, far below it)."""


def _device(item: Any, position: int, source: str) -> Device:
    where = f"inventory ({source}): device #{position}"
    if not isinstance(item, dict):
        raise InventoryError(f"{where} must be an object, got {type(item).__name__}")
    for key in ("index", "uuid", "name"):
        if key not in item:
            raise InventoryError(f"{where} has no {key!r}; required keys are index, uuid, name")
    compute_mode = item.get("compute_mode") or "default"
    if compute_mode not in COMPUTE_MODES:
        raise InventoryError(f"{where}: compute_mode {shown(compute_mode)} is not one of {', '.join(COMPUTE_MODES)}")
    cc = item.get("compute_capability")
    device = Device(
        index=_count(item["index"], f"{where}: index", most=MAX_DEVICE_INDEX),
        uuid=_str(item["uuid"], f"{where}: uuid"),
        name=_str(item["name"], f"{where}: name"),
        vendor=_vendor(item.get("vendor", "nvidia"), f"{where}: vendor"),
        pci_bus_id=_str(item.get("pci_bus_id", ""), f"{where}: pci_bus_id"),
        memory_total_mib=_count(item.get("memory_total_mib", 0), f"{where}: memory_total_mib"),
        memory_used_mib=_count(item.get("memory_used_mib", 0), f"{where}: memory_used_mib"),
        utilization_pct=_percent(item.get("utilization_pct"), f"{where}: utilization_pct"),
        compute_capability=None if cc is None else str(cc),
        compute_mode=compute_mode,
        processes=tuple(_process(p, f"{where}: processes") for p in _list(item.get("processes"), where)),
        nvlink_peers=tuple(_count(p, f"{where}: nvlink_peers") for p in _list(item.get("nvlink_peers"), where)),
        multiprocessor_count=_opt_count(item.get("multiprocessor_count"), f"{where}: multiprocessor_count"),
        max_sm_clock_mhz=_opt_count(item.get("max_sm_clock_mhz"), f"{where}: max_sm_clock_mhz"),
        mig_devices=tuple(_mig(m, f"{where}: mig_devices") for m in _list(item.get("mig_devices"), where)),
        extra={k: v for k, v in item.items() if k not in _KNOWN},
    )
    _check_memory(device, f"inventory ({source}): {device.vendor} device {device.index} ({shown(device.name)})")
    return device


def _check_memory(device: Device, where: str) -> None:
    """What no machine reports: more memory used than the device has (the whole, one process, all its processes
    together), MIG slices holding more than their GPU, or any on a device that is not NVIDIA's. A total of 0 is
    one not reported (the key left out, or NVML could not say), against which nothing is checked."""
    if device.mig_devices and device.vendor != "nvidia":
        raise InventoryError(f"{where}: mig_devices are NVIDIA's MIG slices, which this {device.vendor} device "
                             f"cannot have (leave mig_devices out)")
    _check_use(where, "memory_total_mib", device.memory_total_mib, device.memory_used_mib, device.processes)
    for m in device.mig_devices:
        _check_use(f"{where}: MIG slice {shown(m.uuid)}", "memory_total_mib", m.memory_total_mib,
                   m.memory_used_mib, m.processes)
    sliced = sum(m.memory_total_mib for m in device.mig_devices)
    if device.memory_total_mib and sliced > device.memory_total_mib:
        raise InventoryError(f"{where}: its MIG slices hold {sliced} MiB together, more than memory_total_mib "
                             f"{device.memory_total_mib}; a GPU is cut into slices of its own memory")


def _check_use(where: str, total_key: str, total: int, used: int, processes: tuple[Process, ...]) -> None:
    if not total:
        return
    if used > total:
        raise InventoryError(f"{where}: memory_used_mib {used} is more than {total_key} {total}; no device uses "
                             f"more memory than it has (write the file with 'convoy devices --json')")
    for process in processes:
        if (process.used_memory_mib or 0) > total:
            raise InventoryError(f"{where}: process {process.pid} uses {process.used_memory_mib} MiB, more than "
                                 f"{total_key} {total}")
    together = sum(p.used_memory_mib or 0 for p in processes)
    if together > total:
        raise InventoryError(f"{where}: its {len(processes)} processes use {together} MiB together, more than "
                             f"{total_key} {total}")


def _vendor(value: Any, where: str) -> str:
    """One of ``DEVICE_VENDORS``, any case: an unknown one ('nvidai', 5, 'cpu') was kept and failed later (no
    visibility variables for it) or silently (a 'cpu' device hid every GPU with CUDA_VISIBLE_DEVICES='')."""
    if isinstance(value, str) and value.lower() in DEVICE_VENDORS:
        return value.lower()
    import difflib

    close = difflib.get_close_matches(value.lower(), DEVICE_VENDORS, n=1) if isinstance(value, str) else []
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    if isinstance(value, str) and value.lower() == "cpu":
        hint = " (a CPU-only machine is an empty list: {\"devices\": []})"
    raise InventoryError(f"{where} {shown(value)} is not a vendor convoy knows{hint}; use one of "
                         f"{', '.join(DEVICE_VENDORS)}, or leave it out for nvidia")


def _mig(item: Any, where: str) -> MigDevice:
    if not isinstance(item, dict) or "uuid" not in item:
        raise InventoryError(f"{where}: each MIG slice needs at least 'uuid', 'profile', 'memory_total_mib'")
    return MigDevice(
        uuid=_str(item["uuid"], f"{where}: uuid"),
        profile=_str(item.get("profile", ""), f"{where}: profile"),
        memory_total_mib=_count(item.get("memory_total_mib", 0), f"{where}: memory_total_mib"),
        memory_used_mib=_count(item.get("memory_used_mib", 0), f"{where}: memory_used_mib"),
        gpu_instance_id=_opt_count(item.get("gpu_instance_id"), f"{where}: gpu_instance_id"),
        compute_instance_id=_opt_count(item.get("compute_instance_id"), f"{where}: compute_instance_id"),
        processes=tuple(_process(p, f"{where}: processes") for p in _list(item.get("processes"), where)),
    )


def _process(item: Any, where: str) -> Process:
    if not isinstance(item, dict) or "pid" not in item:
        raise InventoryError(f"{where}: each process needs 'pid' (and optionally 'used_memory_mib')")
    name = item.get("name")
    return Process(pid=_count(item["pid"], f"{where}: pid"),
                   used_memory_mib=_opt_count(item.get("used_memory_mib"), f"{where}: used_memory_mib"),
                   name=None if name is None else str(name))


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InventoryError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _count(value: Any, where: str, *, most: int = 2**40) -> int:
    """An integer >= 0 (indices, pids, MiB, clocks): what the drivers report; negative ones are corrupt, and so
    is one past ``most`` (2^40 MiB is an exbibyte; an index of 10^23 became CUDA_VISIBLE_DEVICES=10^23)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InventoryError(f"{where} must be an integer >= 0, got {shown(value)}")
    if value > most:
        raise InventoryError(f"{where} {shown(value)} is larger than any machine reports (at most {most})")
    return value


def _opt_count(value: Any, where: str) -> int | None:
    return None if value is None else _count(value, where)


def _percent(value: Any, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
        raise InventoryError(f"{where} must be a percentage from 0 to 100 or null, got {shown(value)}")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise InventoryError(f"{where} must be a string, got {shown(value)}")
    return value

