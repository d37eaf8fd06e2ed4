"""Discovery and visibility on a real NVIDIA GPU: NVML makes no CUDA context; a fresh torch.cuda process sees
exactly the selected GPU, in nvidia-smi's (PCI bus) order."""

from __future__ import annotations

import json
import sys

import pytest

from tests.gpu.gpu_run import python, returned, run_json, run_ok

pytestmark = pytest.mark.gpu

PROBE = """
import json, os, sys
from convoy.devices.discovery import discover
inventory = discover(os.environ)
maps = open("/proc/self/maps").read()
import pynvml
pynvml.nvmlInit()
pids = []
for i in range(pynvml.nvmlDeviceGetCount()):
    handle = pynvml.nvmlDeviceGetHandleByIndex(i)
    pids += [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
print(json.dumps({"vendor": inventory.vendor, "uuids": [d.uuid for d in inventory.devices],
                  "torch": "torch" in sys.modules, "libcuda": "libcuda.so" in maps, "pid": os.getpid(),
                  "nvml_pids": pids}))
"""


def test_nvml_discovery_creates_no_cuda_context():
    seen = json.loads(returned(python(PROBE)))
    assert seen["vendor"] == "nvidia" and seen["uuids"], seen
    assert not seen["torch"], "discovery imported torch"
    assert not seen["libcuda"], "discovery loaded the CUDA driver (libcuda.so): a context could follow"
    assert seen["pid"] not in seen["nvml_pids"], "NVML lists this process as a compute process on a GPU"
    # the probe would see a context: a process that made one has libcuda mapped
    control = returned(python("import torch; torch.zeros(1, device='cuda'); "
                              "print('libcuda.so' in open('/proc/self/maps').read())"))
    assert control == "True"


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
