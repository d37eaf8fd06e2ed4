"""Discovery: the inventory variable wins, backends are independent, and each vendor's parser reads its tool.

NVML is the one true I/O edge of the NVIDIA backend, so it is replaced by a small fake of the pynvml API.
"""

from __future__ import annotations

import sys
import types
from collections import namedtuple

import pytest

from convoy.devices.backends.amd import devices_from_sysfs
from convoy.devices.backends.ascend import devices_from_npu_smi
from convoy.devices.backends.base import Backend
from convoy.devices.backends.habana import devices_from_hl_smi
from convoy.devices.backends.intel import devices_from_xpu_smi
from convoy.devices.backends.nvidia import NvidiaBackend
from convoy.devices.discovery import discover
from convoy.devices.inventory import Device
from convoy.errors import InventoryError


class FakeBackend(Backend):
    def __init__(self, vendor, devices=(), error=None, available=True):
        self.vendor, self.source, self._devices = vendor, vendor, devices
        self._error, self._available = error, available

    def available(self):
        return self._available

    def discover(self):
        if self._error:
            raise self._error
        return list(self._devices)


def test_inventory_variable_wins(inventory_path):
    inv = discover({"CONVOY_INVENTORY": str(inventory_path("a100_mig"))},
                   backends=[FakeBackend("nvidia", [Device(0, "GPU-real", "real")])])
    assert inv.source.startswith("file:") and len(inv.devices) == 2
    with pytest.raises(InventoryError, match="does not exist"):
        discover({"CONVOY_INVENTORY": "/nonexistent/box.json"})


def test_backends_are_independent_and_nothing_means_empty():
    amd = FakeBackend("amd", [Device(0, "GPU-a", "MI300X", vendor="amd")])
    inv = discover({}, backends=[FakeBackend("nvidia", error=RuntimeError("driver mismatch")), amd,
                                 FakeBackend("intel", available=False, error=AssertionError("never asked"))])
    assert [d.uuid for d in inv.devices] == ["GPU-a"] and "nvml" not in inv.source
    assert "nvidia failed: RuntimeError" in inv.source
    empty = discover({}, backends=[FakeBackend("nvidia")])
    assert empty.devices == () and empty.vendor == "cpu"


def test_default_discovery_on_this_machine_does_not_raise():
    inv = discover({})
    assert isinstance(inv.devices, tuple)


def _fake_pynvml(n_gpus=4, switch=True, mig_on=(2,)):
    """A fake of the pynvml calls the backend makes: 4 GPUs, 0-2 on an NVSwitch, GPU 3 linked to GPU 2
    directly, GPU 2 in MIG mode with two slices, a process on GPU 1."""
    nv = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    Mem = namedtuple("Mem", "total used free")
    Pci = namedtuple("Pci", "busId")
    Util = namedtuple("Util", "gpu memory")
    Proc = namedtuple("Proc", "pid usedGpuMemory")
    buses = [f"00000000:{0x10 * (i + 1):02X}:00.0" for i in range(n_gpus)]
    calls = {"init": 0, "shutdown": 0}

    def not_supported(*_):
        raise NVMLError("Not Supported")

    nv.NVMLError = NVMLError
    nv.NVML_CLOCK_SM = 1
    nv.NVML_NVLINK_MAX_LINKS = 4
    nv.nvmlInit = lambda: calls.__setitem__("init", calls["init"] + 1)
    nv.nvmlShutdown = lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1)
    nv.nvmlDeviceGetCount = lambda: n_gpus
    nv.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)
    nv.nvmlDeviceGetPciInfo = lambda h: Pci(buses[h[1]].encode())
    nv.nvmlDeviceGetUUID = lambda h: f"GPU-{h[1]:04d}" if h[0] == "gpu" else f"MIG-{h[1]}-{h[2]}"
    nv.nvmlDeviceGetName = lambda h: "NVIDIA H100 80GB HBM3" if h[0] == "gpu" else "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    nv.nvmlDeviceGetMemoryInfo = lambda h: Mem(81559 * 2**20, (500 if h == ("gpu", 1) else 1) * 2**20, 0)
    nv.nvmlDeviceGetUtilizationRates = lambda h: Util(37 if h[1] == 1 else 0, 0)
    nv.nvmlDeviceGetCudaComputeCapability = lambda h: (9, 0)
    nv.nvmlDeviceGetComputeMode = lambda h: 3 if h[1] == 3 else 0
    nv.nvmlDeviceGetAttributes = not_supported
    nv.nvmlDeviceGetMaxClockInfo = lambda h, clock: 1980
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: [Proc(4242, 499 * 2**20)] if h == ("gpu", 1) else []
    nv.nvmlDeviceGetGraphicsRunningProcesses = not_supported

    def link_state(h, link):
        i = h[1]
        if i < 3 and switch:
            return 1  # all links of GPUs 0-2 go to NVSwitches
        return 1 if (i, link) in ((3, 0), (2, 3)) else 0

    def remote(h, link):
        i = h[1]
        if (i, link) == (3, 0):
            return Pci(buses[2])
        if (i, link) == (2, 3):
            return Pci(buses[3])
        return Pci(f"00000000:{0xA0 + link:02X}:00.0")  # an NVSwitch, not a GPU

    nv.nvmlDeviceGetNvLinkState = link_state
    nv.nvmlDeviceGetNvLinkRemotePciInfo = remote
    nv.nvmlDeviceGetMigMode = lambda h: (1, 1) if h[1] in mig_on else (0, 0)
    nv.nvmlDeviceGetMaxMigDeviceCount = lambda h: 7
    nv.nvmlDeviceGetMigDeviceHandleByIndex = lambda h, k: ("mig", h[1], k) if k < 2 else not_supported()
    nv.nvmlDeviceGetGpuInstanceId = lambda h: h[2] + 1
    nv.nvmlDeviceGetComputeInstanceId = lambda h: 0
    return nv, calls


def test_nvidia_backend_reads_nvml(monkeypatch):
    fake, calls = _fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    devices = NvidiaBackend().discover()
    assert calls == {"init": 1, "shutdown": 1}
    assert [d.uuid for d in devices] == ["GPU-0000", "GPU-0001", "GPU-0002", "GPU-0003"]
    d1 = devices[1]
    assert (d1.pci_bus_id, d1.memory_total_mib, d1.memory_used_mib, d1.utilization_pct) == \
        ("00000000:20:00.0", 81559, 500, 37.0)
    assert d1.compute_capability == "9.0" and d1.max_sm_clock_mhz == 1980 and d1.multiprocessor_count is None
    assert [(p.pid, p.used_memory_mib) for p in d1.processes] == [(4242, 499)]
    assert devices[3].compute_mode == "exclusive_process"
    # NVSwitch: 0, 1, 2 reach each other; 2 and 3 are linked directly.
    assert devices[0].nvlink_peers == (1, 2) and devices[2].nvlink_peers == (0, 1, 3)
    assert devices[3].nvlink_peers == (2,)
    assert [m.uuid for m in devices[2].mig_devices] == ["MIG-2-0", "MIG-2-1"]
    assert devices[2].mig_devices[0].profile == "3g.40gb" and devices[2].mig_devices[1].gpu_instance_id == 2


def test_nvidia_backend_without_driver(monkeypatch):
    fake, _ = _fake_pynvml()

    def fail():
        raise fake.NVMLError("NVML Shared Library Not Found")

    fake.nvmlInit = fail
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert NvidiaBackend().discover() == []


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_amd_sysfs(tmp_path):
    for bus, total, used, busy, uid in (("0000:c1:00.0", 192 * 2**30, 2**30, "12", "7a1c"),
                                        ("0000:29:00.0", 192 * 2**30, 0, "0", "3f00")):
        dev = tmp_path / bus
        for name, value in (("vendor", "0x1002"), ("class", "0x120000"), ("device", "0x74a1"),
                            ("mem_info_vram_total", str(total)), ("mem_info_vram_used", str(used)),
                            ("gpu_busy_percent", busy), ("unique_id", uid)):
            _write(dev / name, value + "\n")
    _write(tmp_path / "0000:00:02.0" / "vendor", "0x8086\n")
    devices = devices_from_sysfs(tmp_path)
    assert [(d.index, d.pci_bus_id, d.uuid) for d in devices] == [(0, "0000:29:00.0", "GPU-3f00"),
                                                                   (1, "0000:c1:00.0", "GPU-7a1c")]
    assert devices[1].memory_used_mib == 1024 and devices[1].utilization_pct == 12.0
    assert devices[0].name == "AMD GPU 0x74a1" and devices[0].vendor == "amd"


def test_habana_ascend_intel_parsers():
    hl = ("1, 3, 0000:1a:00.0, HL-225, 01P0-B, 98304, 672, 0\n"
          "0, 2, 0000:19:00.0, HL-225, 01P0-A, 98304, 0, 5\n")
    devices = devices_from_hl_smi(hl)
    assert [(d.index, d.uuid, d.extra["module_id"]) for d in devices] == [(0, "01P0-A", 2), (1, "01P0-B", 3)]
    npu = ("NPU ID  Chip ID  Chip Logic ID  Chip Name\n"
           "0       0        0              Ascend 910B3\n"
           "0       1        -              Mcu\n"
           "1       0        1              Ascend 910B3\n")
    assert [(d.index, d.name) for d in devices_from_npu_smi(npu)] == [(0, "Ascend 910B3"), (1, "Ascend 910B3")]
    xpu = {"device_list": [
        {"device_id": 1, "device_name": "Intel(R) Data Center GPU Max 1550", "uuid": "u1",
         "pci_bdf_address": "0000:42:00.0", "memory_physical_size_byte": 128 * 2**30},
        {"device_id": 0, "device_name": "Intel(R) Data Center GPU Max 1550", "uuid": "u0",
         "pci_bdf_address": "0000:18:00.0", "memory_physical_size_byte": 128 * 2**30}]}
    devices = devices_from_xpu_smi(xpu)
    assert [(d.index, d.uuid, d.memory_total_mib) for d in devices] == [(0, "u0", 131072), (1, "u1", 131072)]
