"""What each vendor's devices are called in PyTorch, how they are joined, and which collective backend they
use: one table, a source per row, read by pure functions. Facts only; nothing here probes the machine.

    from convoy.devices.vendors import process_group_backend, vendor_facts
    vendor_facts("amd").device_type        # "cuda": ROCm builds of PyTorch keep the cuda device type
    vendor_facts("nvidia").link            # "NVLink", the links discovery reads into Device.nvlink_peers
    vendor_facts("habana").process_group_backend   # "hccl"
    process_group_backend("cuda")          # "nccl": the backend for a torch device type

The device layer names devices with it ("GPU 2 -> cuda:0"), the launcher says which process-group backend
the ranks will use, ``convoy devices`` heads its columns with it. Torch-free, and importing it loads no
discovery backend: it sits below the inventory (which checks a file's ``vendor`` against it) and ``backends/``
(which build the inventory's records).
"""

from __future__ import annotations

from dataclasses import dataclass

TYPE_CHECKING = False  # typing is not imported at run time: `convoy select` starts without it
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["Vendor", "VENDORS", "DEVICE_VENDORS", "vendor_facts", "process_group_backend"]


@dataclass(frozen=True, kw_only=True)
class Vendor:
    """One vendor's facts."""

    name: str
    """convoy's name for the vendor, as in ``Device.vendor`` and ``Backend.vendor``; ``"cpu"``: no accelerator."""
    device_type: str
    """PyTorch's device type for these devices: the ``cuda`` of ``cuda:0``."""
    process_group_backend: str
    """The ``torch.distributed`` backend ranks on these devices use."""
    link: str | None = None
    """The fast device-to-device link discovery reads into ``Device.nvlink_peers``, as people write it;
    ``None`` when convoy reads none for this vendor."""
    source: str
    """Where these facts are documented."""


VENDORS: Mapping[str, Vendor] = {row.name: row for row in (
    Vendor(name="nvidia", device_type="cuda", process_group_backend="nccl", link="NVLink",
           source="https://pytorch.org/docs/stable/distributed.html (NCCL for CUDA tensors)"),
    Vendor(name="amd", device_type="cuda", process_group_backend="nccl", link="xGMI",
           source="https://pytorch.org/docs/stable/notes/hip.html (HIP reuses torch.cuda; nccl is RCCL); "
                  "xGMI: the kernel's kfd_crat.h, see amd.py"),
    Vendor(name="intel", device_type="xpu", process_group_backend="xccl",
           source="https://pytorch.org/docs/stable/notes/get_start_xpu.html; XCCL in torch.distributed"),
    Vendor(name="habana", device_type="hpu", process_group_backend="hccl",
           source="https://docs.habana.ai (Gaudi PyTorch: device 'hpu', distributed backend 'hccl')"),
    Vendor(name="ascend", device_type="npu", process_group_backend="hccl",
           source="https://github.com/Ascend/pytorch (torch_npu: device 'npu', distributed backend 'hccl')"),
    Vendor(name="apple", device_type="mps", process_group_backend="gloo",
           source="https://pytorch.org/docs/stable/notes/mps.html (mps has no collective backend; gloo)"),
    Vendor(name="cpu", device_type="cpu", process_group_backend="gloo",
           source="https://pytorch.org/docs/stable/distributed.html (gloo for CPU tensors)"),
)}


#: the vendors a ``Device`` can be of: every row but ``cpu``, which stands for "no accelerator". An inventory
#: file's ``vendor`` must be one of them (``convoy.devices.inventory``).
DEVICE_VENDORS: tuple[str, ...] = tuple(name for name in VENDORS if name != "cpu")


def vendor_facts(vendor: str) -> Vendor:
    """The row of ``vendor``; for a vendor not in the table (a ``Device`` built in Python may name any; an
    inventory file may not), neutral answers: device type ``"device"``, gloo, no link."""
    row = VENDORS.get(vendor)
    if row is not None:
        return row
    return Vendor(name=vendor, device_type="device", process_group_backend="gloo", source="not in convoy's table")


def process_group_backend(device_type: str) -> str:
    """The process-group backend for a PyTorch device type (``"cuda"`` -> ``"nccl"``, ``"cpu"`` -> ``"gloo"``):
    that of the first vendor using the type; gloo for a type no vendor uses."""
    return next((row.process_group_backend for row in VENDORS.values() if row.device_type == device_type), "gloo")
