"""Discovery and visibility on a real NVIDIA GPU: NVML makes no CUDA context; a fresh torch.cuda process sees
exactly the selected GPU, in nvidia-smi's (PCI bus) order."""

from __future__ import annotations

import json
import sys

import pytest

from tests.gpu.gpu_run import python, returned, run_json, run_ok

pytestmark = pytest.mark.gpu

PROBE = """
import inspect, json, os, sys
import pynvml

def libcuda_mapped():
    with open("/proc/self/maps") as maps:
        return "libcuda.so" in maps.read()

mapped_by = []  # the NVML function during which libcuda.so first appeared in this process

def watched(name, fn):
    def call(*args, **kwargs):
        before = libcuda_mapped()
        try:
            return fn(*args, **kwargs)
        finally:
            if not before and not mapped_by and libcuda_mapped():
                mapped_by.append(name)
    return call

for name, fn in list(vars(pynvml).items()):  # convoy calls pynvml.nvml...(): every call is watched
    if name.startswith("nvml") and inspect.isfunction(fn):
        setattr(pynvml, name, watched(name, fn))

def listed():
    pynvml.nvmlInit()
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        return os.getpid() in [p.pid for h in handles for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
    finally:
        pynvml.nvmlShutdown()

from convoy.devices.discovery import discover
inventory = discover(os.environ)
seen = {"vendor": inventory.vendor, "uuids": [d.uuid for d in inventory.devices], "torch": "torch" in sys.modules,
        "libcuda": libcuda_mapped(), "mapped_by": list(mapped_by), "pid": os.getpid(), "listed": listed()}
import torch
torch.zeros(1, device="cuda")  # the control: a context now exists in this process
seen["listed_with_context"] = listed()
print(json.dumps(seen))
"""


def test_nvml_discovery_creates_no_cuda_context():
    """What a user relies on: discovery makes no CUDA context (one would take GPU memory on every GPU and fix
    the device numbering before CUDA_VISIBLE_DEVICES is set). NVML's compute-process list shows a context: the
    probe is not in it after discovery, and is once it has made a CUDA tensor (the control, in the same
    process). libcuda.so being mapped is not a context: on the H100 (driver 580.159.04) it was mapped after
    discovery with no context, so NVML loads it itself. The probe watches every NVML call and names the one
    during which it appeared; a mapping made outside NVML's calls (by convoy's own code) still fails."""
    seen = json.loads(returned(python(PROBE)))
    print(f"libcuda.so mapped after discovery: {seen['libcuda']} (during {seen['mapped_by'] or 'no NVML call'})")
    assert seen["vendor"] == "nvidia" and seen["uuids"], seen
    assert not seen["torch"], "discovery imported torch"
    assert seen["listed_with_context"], (f"control failed: NVML does not list pid {seen['pid']} after it made a "
                                         f"CUDA context, so it cannot show one made by discovery: {seen}")
    assert not seen["listed"], "NVML lists the process as a compute process after discovery: it made a CUDA context"
    assert not seen["libcuda"] or seen["mapped_by"], "libcuda.so was mapped outside NVML's calls, by convoy itself"


def test_a_fresh_torch_process_sees_the_selected_gpu_in_pci_order():
    code, inventory, err = run_json(["convoy", "devices", "--json"])
    assert code == 0, err
    first = min(inventory["devices"], key=lambda d: d["index"])
    code = ("import json, os, torch; p = torch.cuda.get_device_properties(0); "
            "print(json.dumps({'count': torch.cuda.device_count(), 'uuid': 'GPU-' + str(p.uuid), 'name': p.name, "
            "'order': os.environ.get('CUDA_DEVICE_ORDER'), 'visible': os.environ.get('CUDA_VISIBLE_DEVICES')}))")
    code, seen, output = run_json(["convoy", "run", "--devices", "1", "--", sys.executable, "-c", code])
    assert code == 0 and seen is not None, output
    assert seen["count"] == 1 and seen["order"] == "PCI_BUS_ID", seen
    assert seen["uuid"] == first["uuid"] and seen["name"] == first["name"], (seen, first)
    assert seen["visible"] == str(first["index"]), seen
    code, hidden, output = run_json(["convoy", "run", "--devices", "0", "--", sys.executable, "-c",
                                     "import json, torch; print(json.dumps([torch.cuda.device_count(), "
                                     "torch.cuda.is_available()]))"])
    assert code == 0 and hidden == [0, False], output  # "0" is Lightning's "no accelerator"


def test_plan_for_the_live_machine(tmp_path):
    code, data, err = run_json(["convoy", "devices", "--json"])
    assert code == 0 and data["devices"], err
    inventory = tmp_path / "this_machine.json"
    inventory.write_text(json.dumps(data))
    devices = data["devices"]
    out = run_ok(["convoy", "plan", "--params", "1e9", "--inventory", str(inventory)])
    hardware = next(line for line in out.splitlines() if line.startswith("hardware"))
    assert hardware.split()[1].startswith(f"{len(devices)}x"), out
    assert "recommended:" in out
