"""NVIDIA GPUs through NVML (``import pynvml`` from nvidia-ml-py): never a CUDA context.

    from convoy.devices.backends.nvidia import NvidiaBackend
    NvidiaBackend().discover()   # [] when there is no driver

NVML numbers devices in PCI-bus order, the order ``nvidia-smi`` shows. NVLink peers come from each active
link's remote PCI id; a remote that is not a GPU is an NVSwitch, and every GPU on a switch reaches every
other one on it.
"""

from __future__ import annotations

import os

from convoy.devices.backends.base import Backend
from convoy.devices.inventory import Device, MigDevice, Process

TYPE_CHECKING = False  # typing is not imported at run time: `convoy select` starts without it
if TYPE_CHECKING:
    from typing import Any

__all__ = ["NvidiaBackend"]

_MODES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
_MIB = 2**20


class NvidiaBackend(Backend):
    vendor = "nvidia"
    source = "nvml"

    def available(self) -> bool:
        return os.path.exists("/dev/nvidiactl") or os.path.exists("/dev/nvidia0") or _has_nvml_library()

    def discover(self) -> list[Device]:
        try:
            import pynvml
        except ImportError:
            return []
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError:
            return []
        try:
            return _devices(pynvml)
        finally:
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass


def _has_nvml_library() -> bool:
    return any(os.path.exists(os.path.join(d, "libnvidia-ml.so.1"))
               for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/aarch64-linux-gnu", "/usr/lib/wsl/lib"))


def _call(fn, *args, default=None):
    try:
        return fn(*args)
    except Exception:  # NVMLError_NotSupported and friends: the field stays unknown
        return default


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _devices(nv) -> list[Device]:
    count = nv.nvmlDeviceGetCount()
    handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    bus_ids = [_text(nv.nvmlDeviceGetPciInfo(h).busId).lower() for h in handles]
    peers, on_switch = _nvlink(nv, handles, bus_ids)
    switch_group = sorted(on_switch)
    devices = []
    for i, h in enumerate(handles):
        links = set(peers[i]) | (set(switch_group) - {i} if i in on_switch else set())
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        util = _call(nv.nvmlDeviceGetUtilizationRates, h)
        cc = _call(nv.nvmlDeviceGetCudaComputeCapability, h)
        attrs = _call(nv.nvmlDeviceGetAttributes, h)
        devices.append(Device(
            index=i,
            uuid=_text(nv.nvmlDeviceGetUUID(h)),
            name=_text(nv.nvmlDeviceGetName(h)),
            vendor="nvidia",
            pci_bus_id=bus_ids[i],
            memory_total_mib=int(mem.total // _MIB),
            memory_used_mib=int(mem.used // _MIB),
            utilization_pct=None if util is None else float(util.gpu),
            compute_capability=None if cc is None else f"{cc[0]}.{cc[1]}",
            compute_mode=_MODES.get(_call(nv.nvmlDeviceGetComputeMode, h, default=0), "default"),
            processes=_processes(nv, h),
            nvlink_peers=tuple(sorted(links)),
            multiprocessor_count=None if attrs is None else int(attrs.multiprocessorCount),
            max_sm_clock_mhz=_call(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM),
            mig_devices=_mig(nv, h),
        ))
    return devices


def _processes(nv, handle) -> tuple[Process, ...]:
    found: dict[int, Process] = {}
    for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        for p in _call(getattr(nv, getter, lambda h: []), handle, default=[]) or []:
            used = getattr(p, "usedGpuMemory", None)
            found.setdefault(p.pid, Process(pid=int(p.pid), used_memory_mib=None if used is None else int(used // _MIB),
                                            name=_comm(p.pid)))
    return tuple(found.values())


def _comm(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _nvlink(nv, handles, bus_ids) -> tuple[list[set[int]], set[int]]:
    index_of = {b: i for i, b in enumerate(bus_ids)}
    peers: list[set[int]] = [set() for _ in handles]
    on_switch: set[int] = set()
    max_links = getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)
    for i, h in enumerate(handles):
        for link in range(max_links):
            if _call(nv.nvmlDeviceGetNvLinkState, h, link, default=0) != 1:
                continue
            remote = _call(nv.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
            if remote is None:
                continue
            bus = _text(remote.busId).lower()
            if bus in index_of and index_of[bus] != i:
                peers[i].add(index_of[bus])
            elif bus not in index_of:
                on_switch.add(i)
    return peers, on_switch


def _mig(nv, handle) -> tuple[MigDevice, ...]:
    mode = _call(nv.nvmlDeviceGetMigMode, handle)
    if not mode or mode[0] != 1:
        return ()
    slices = []
    for k in range(_call(nv.nvmlDeviceGetMaxMigDeviceCount, handle, default=0) or 0):
        mig = _call(nv.nvmlDeviceGetMigDeviceHandleByIndex, handle, k)
        if mig is None:
            continue
        mem = _call(nv.nvmlDeviceGetMemoryInfo, mig)
        name = _text(_call(nv.nvmlDeviceGetName, mig, default=""))
        slices.append(MigDevice(
            uuid=_text(nv.nvmlDeviceGetUUID(mig)),
            profile=name.rsplit("MIG", 1)[-1].strip() if "MIG" in name else name,
            memory_total_mib=0 if mem is None else int(mem.total // _MIB),
            memory_used_mib=0 if mem is None else int(mem.used // _MIB),
            gpu_instance_id=_call(nv.nvmlDeviceGetGpuInstanceId, mig),
            compute_instance_id=_call(nv.nvmlDeviceGetComputeInstanceId, mig),
            processes=_processes(nv, mig),
        ))
    return tuple(slices)
