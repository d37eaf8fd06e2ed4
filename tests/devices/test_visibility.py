"""Each vendor's visibility variables, composition with a mask already set, and the started-runtime guard."""

from __future__ import annotations

import sys
import types

import pytest

from convoy.devices.inventory import load_inventory
from convoy.devices.selection import select_devices
from convoy.devices.visibility import ensure_runtime_not_started, fastest_order, visibility_env, visible_devices
from convoy.errors import DeviceSpecError, VisibilityError


@pytest.fixture
def load(inventory_path):
    return lambda name: load_inventory(inventory_path(name))


def test_nvidia_pci_order_and_requested_order(load):
    sel = select_devices("2,0", inventory=load("4_mixed_pcie"), env={})
    assert sel.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "2,0"}
    assert [d.name for d in sel.devices] == ["Tesla T4", "NVIDIA RTX A4000"]  # physical 2 is cuda:0


@pytest.mark.parametrize("name, spec, expected", [
    ("amd_mi250x", "3,1", {"HIP_VISIBLE_DEVICES": "3,1"}),
    ("intel_max1550", "1,2", {"ZE_ENABLE_PCI_ID_DEVICE_ORDER": "1", "ZE_AFFINITY_MASK": "1,2"}),
    ("gaudi2", "0,1", {"HABANA_VISIBLE_MODULES": "2,3"}),  # module ids, not PCI indices
])
def test_vendor_variables(load, name, spec, expected):
    assert select_devices(spec, inventory=load(name), env={}).env == expected


def test_ascend_and_apple_variables():
    from convoy.devices.inventory import Device

    npus = [Device(i, f"NPU-{i}-0", "Ascend910B", vendor="ascend") for i in range(4)]
    assert visibility_env(npus[2:], vendor="ascend", base_env={}) == {"ASCEND_RT_VISIBLE_DEVICES": "2,3"}
    mps = Device(0, "MPS-0", "Apple M2 GPU", vendor="apple")
    assert visibility_env([mps], vendor="apple", base_env={}) == {}
    with pytest.raises(VisibilityError, match="one GPU"):
        visibility_env([mps, mps], vendor="apple", base_env={})


def test_empty_selection_hides_every_accelerator(load):
    for spec in (0, "0", [], None, ""):
        sel = select_devices(spec, inventory=load("8xh100_nvswitch"), env={})
        assert sel.devices == () and sel.vendor == "cpu" and sel.env == {"CUDA_VISIBLE_DEVICES": ""}


def test_preset_mask_indices_are_relative_and_never_escaped(load):
    inv = load("8xh100_nvswitch")
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    sel = select_devices("1,0", inventory=inv, env=env)
    assert sel.indices == [5, 4] and sel.env["CUDA_VISIBLE_DEVICES"] == "5,4"
    assert select_devices("auto", inventory=inv, env=env).indices == [4, 5, 6, 7]
    with pytest.raises(DeviceSpecError) as info:
        select_devices("5", inventory=inv, env=env)
    assert "4 devices are available (0-3)" in str(info.value)
    assert "CUDA_VISIBLE_DEVICES='4,5,6,7' leaves 4 of the machine's 8 visible" in str(info.value)
    with pytest.raises(VisibilityError, match="outside the devices this environment allows"):
        visibility_env([inv.devices[0]], vendor="nvidia", base_env=env, inventory=inv)


def test_preset_mask_keeps_its_order_and_takes_uuids(load):
    inv = load("8xh100_nvswitch")
    u = [d.uuid for d in inv.devices]
    env = {"CUDA_VISIBLE_DEVICES": f"{u[6]},{u[2][:12]}"}  # a full UUID and a unique prefix, as CUDA allows
    sel = select_devices(1, inventory=inv, env=env)
    assert sel.indices == [6]
    assert select_devices("all", inventory=inv, env=env).indices == [6, 2]


def test_preset_indices_follow_cuda_device_order(load):
    # Without PCI_BUS_ID, CUDA numbers a mixed box fastest first: 4090 (1), 3090 (3), A4000 (0), T4 (2).
    inv = load("4_mixed_pcie")
    assert [d.index for d in fastest_order(inv.devices)] == [1, 3, 0, 2]
    view = visible_devices(inv, {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert [d.index for d in view.devices] == [1, 3]
    assert any("FASTEST_FIRST" in note for note in view.notes)
    pci = visible_devices(inv, {"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert [d.index for d in pci.devices] == [0, 1] and pci.notes == ()


@pytest.mark.parametrize("order", ["SOMETHING", "pci_bus_id", "PCI_BUS_ID ", "fastest"])
def test_an_unknown_cuda_device_order_is_refused_where_a_masks_indices_depend_on_it(load, order):
    """CUDA_VISIBLE_DEVICES=1,0 with CUDA_DEVICE_ORDER=SOMETHING was read silently (as FASTEST_FIRST): CUDA
    documents two values and a default, not what it does with a typo, so which GPUs the indices name is a
    guess: one line naming both variables. Where the order decides nothing, it is a note."""
    for box in ("8xh100_nvswitch", "4_mixed_pcie"):  # refused on a uniform box too: the typo is the same
        inv = load(box)
        env = {"CUDA_VISIBLE_DEVICES": "1,0", "CUDA_DEVICE_ORDER": order}
        with pytest.raises(DeviceSpecError) as info:
            select_devices(1, inventory=inv, env=env)
        message = str(info.value)
        assert f"CUDA_DEVICE_ORDER={order!r} is not one of CUDA's values (FASTEST_FIRST, PCI_BUS_ID)" in message
        assert "CUDA_VISIBLE_DEVICES='1,0'" in message and "set CUDA_DEVICE_ORDER=PCI_BUS_ID" in message
    inv = load("4_mixed_pcie")
    free = select_devices("1,0", inventory=inv, env={"CUDA_DEVICE_ORDER": order})  # no mask: nothing to read
    assert free.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1,0"}
    assert any(f"CUDA_DEVICE_ORDER={order!r} is not one of CUDA's values" in line for line in free.explanation)
    by_uuid = select_devices(1, inventory=inv, env={"CUDA_DEVICE_ORDER": order,
                                                    "CUDA_VISIBLE_DEVICES": inv.devices[2].uuid})
    assert by_uuid.indices == [2] and any("names devices by UUID" in line for line in by_uuid.explanation)


def test_the_documented_cuda_device_orders_and_an_empty_one_are_read_quietly(load):
    inv = load("4_mixed_pcie")
    reads = {order: select_devices("all", inventory=inv, env={"CUDA_VISIBLE_DEVICES": "0,1",
                                                             "CUDA_DEVICE_ORDER": order})
             for order in ("PCI_BUS_ID", "FASTEST_FIRST", "")}
    assert reads["PCI_BUS_ID"].indices == [0, 1]
    assert reads["FASTEST_FIRST"].indices == reads[""].indices == [1, 3]  # CUDA's default, as when unset
    assert not any("not one of CUDA's values" in line for sel in reads.values() for line in sel.explanation)


def test_invalid_mask_entry_stops_enumeration_like_cuda(load):
    env = {"CUDA_VISIBLE_DEVICES": "2,9,1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    view = visible_devices(load("8xh100_nvswitch"), env)
    assert [d.index for d in view.devices] == [2]
    assert "entry '9' matches no device" in view.notes[0]


def test_empty_preset_mask_means_no_gpu(load):
    inv = load("8xh100_nvswitch")
    assert select_devices("auto", inventory=inv, env={"CUDA_VISIBLE_DEVICES": ""}).vendor == "cpu"
    with pytest.raises(DeviceSpecError, match="no devices are available"):
        select_devices(1, inventory=inv, env={"CUDA_VISIBLE_DEVICES": ""})


def test_amd_masks_compose(load):
    inv = load("amd_mi250x")
    env = {"ROCR_VISIBLE_DEVICES": "4,5,6,7"}
    sel = select_devices("1", inventory=inv, env=env)
    assert sel.indices == [4] and sel.env == {"HIP_VISIBLE_DEVICES": "0"}  # relative to ROCR's list
    sel = select_devices("2,0", inventory=inv, env={"ROCR_VISIBLE_DEVICES": "4,5,6,7", "HIP_VISIBLE_DEVICES": "3,2,1"})
    assert sel.indices == [5, 7] and sel.env == {"HIP_VISIBLE_DEVICES": "1,3"}
    sel = select_devices([1], inventory=inv, env={"CUDA_VISIBLE_DEVICES": "6,7"})  # HIP reads it too
    assert sel.indices == [7] and sel.env == {"HIP_VISIBLE_DEVICES": "7", "CUDA_VISIBLE_DEVICES": "7"}


def test_intel_and_habana_masks(load):
    sel = select_devices("all", inventory=load("intel_max1550"), env={"ZE_AFFINITY_MASK": "2,3"})
    assert sel.indices == [2, 3]
    view = visible_devices(load("intel_max1550"), {"ZE_AFFINITY_MASK": "1.0,1.1,3"})
    assert [d.index for d in view.devices] == [1, 3] and "tiles" in view.notes[0]
    sel = select_devices("all", inventory=load("gaudi2"), env={"HABANA_VISIBLE_MODULES": "0,1"})
    assert sel.indices == [2, 3] and sel.env == {"HABANA_VISIBLE_MODULES": "0,1"}


def test_runtime_guard(monkeypatch):
    # Each state set explicitly: in this test runner CUDA may or may not have been started by earlier tests.
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    ensure_runtime_not_started()  # torch not loaded: no runtime can have started through it
    untouched = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: False))
    monkeypatch.setitem(sys.modules, "torch", untouched)
    ensure_runtime_not_started()  # torch loaded, CUDA not started: fine
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: True))
    monkeypatch.setitem(sys.modules, "torch", fake)
    with pytest.raises(VisibilityError, match="torch.cuda is already initialised"):
        ensure_runtime_not_started()
