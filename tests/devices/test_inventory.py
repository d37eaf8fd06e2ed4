"""The inventory file format: every shipped machine shape loads, round-trips, and bad files fail clearly."""

from __future__ import annotations

import json
import re

import pytest

from convoy.devices.inventory import Device, Inventory, inventory_from_dict, load_inventory
from convoy.errors import InventoryError
from tests.conftest import INVENTORIES

SHAPES = sorted(p.stem for p in INVENTORIES.glob("*.json"))


def test_the_issue_shapes_are_shipped():
    for name in ("8xh100_nvswitch", "4_mixed_pcie", "2_busy_exclusive", "a100_mig", "8gpu_two_islands",
                 "amd_mi250x", "intel_max1550"):
        assert name in SHAPES


@pytest.mark.parametrize("name", SHAPES)
def test_shape_loads_and_round_trips(name, inventory_path):
    inv = load_inventory(inventory_path(name))
    assert inv.devices and inv.source.startswith("file:")
    assert [d.index for d in inv.devices] == sorted(d.index for d in inv.devices)
    again = inventory_from_dict(json.loads(inv.to_json()))
    assert again.devices == inv.devices
    assert [d.extra for d in again.devices] == [d.extra for d in inv.devices]


def test_h100_box_facts(inventory_path):
    inv = load_inventory(inventory_path("8xh100_nvswitch"))
    assert len(inv.devices) == 8 and inv.vendor == "nvidia"
    h = inv.devices[3]
    assert h.name == "NVIDIA H100 80GB HBM3" and h.memory_total_mib == 81559 and h.compute_capability == "9.0"
    assert h.memory_free_mib == 81558 and set(h.nvlink_peers) == {0, 1, 2, 4, 5, 6, 7}
    assert h.extra["numa_node"] == 0  # unknown keys are kept


def test_busy_reasons(inventory_path):
    inv = load_inventory(inventory_path("2_busy_exclusive"))
    assert "in use by 2 processes (pid 48121, 48122), 38200 MiB" == inv.devices[0].busy_reason
    assert "exclusive-process mode" in inv.devices[1].busy_reason


def test_defaults_for_missing_optional_keys():
    inv = inventory_from_dict({"devices": [{"index": 0, "uuid": "GPU-x", "name": "Some GPU"}]})
    d = inv.devices[0]
    assert (d.vendor, d.pci_bus_id, d.memory_used_mib, d.utilization_pct, d.compute_mode) == \
        ("nvidia", "", 0, None, "default")
    assert d.processes == () and d.nvlink_peers == () and d.mig_devices == () and d.busy_reason is None


def test_empty_inventory_is_cpu():
    assert Inventory().vendor == "cpu"
    assert json.loads(Inventory().to_json()) == {"devices": []}


def test_main_vendor_is_the_most_common():
    devices = (Device(0, "a", "x", vendor="intel"), Device(0, "b", "y", vendor="nvidia"),
               Device(1, "c", "z", vendor="nvidia"))
    assert Inventory(devices).vendor == "nvidia"


@pytest.mark.parametrize("data, fragment", [
    ([], "top level must be"),
    ({"devices": [{"uuid": "u", "name": "n"}]}, "has no 'index'"),
    ({"devices": [{"index": "0", "uuid": "u", "name": "n"}]}, "index must be an integer >= 0, got '0'"),
    ({"devices": [{"index": 0, "uuid": "u", "name": "n", "compute_mode": "weird"}]}, "compute_mode 'weird'"),
    ({"devices": [{"index": 0, "uuid": "u", "name": "n"}, {"index": 0, "uuid": "v", "name": "n"}]},
     "indices repeat"),
    ({"devices": [{"index": 0, "uuid": "u", "name": "n"}, {"index": 1, "uuid": "u", "name": "n"}]},
     "uuids repeat"),
    ({"devices": [{"index": 0, "uuid": "u", "name": "n", "processes": [{"used_memory_mib": 1}]}]}, "needs 'pid'"),
    ({"devices": [{"index": 0, "uuid": "u", "name": "n", "nvlink_peers": 3}]}, "expected a list"),
])
def test_malformed_data(data, fragment):
    with pytest.raises(InventoryError, match=fragment):
        inventory_from_dict(data)


@pytest.mark.parametrize("vendor, fragment", [
    ("nvidai", "vendor 'nvidai' is not a vendor convoy knows (did you mean 'nvidia'?)"),  # was kept: 'device:0'
    (5, "vendor 5 is not a vendor convoy knows"),
    ("", "vendor '' is not"),
    ("cpu", "a CPU-only machine is an empty list"),  # was kept: CUDA_VISIBLE_DEVICES='' hid every GPU
    (None, "vendor None is not"),
])
def test_an_unknown_vendor_is_refused_naming_the_file_the_field_and_the_known_ones(vendor, fragment, tmp_path):
    path = tmp_path / "box.json"
    path.write_text(json.dumps({"devices": [{"index": 0, "uuid": "u", "name": "n", "vendor": vendor}]}))
    with pytest.raises(InventoryError) as err:
        load_inventory(path)
    message = str(err.value)
    assert fragment in message and str(path) in message and "device #0: vendor" in message, message
    assert "use one of nvidia, amd, intel, habana, ascend, apple" in message


@pytest.mark.parametrize("field, value, fragment", [
    ("index", 10**23, "index 100000000000000000000000 is larger than any machine reports (at most 65535)"),
    ("memory_total_mib", 10**29, "memory_total_mib 100000000000000000000000000000 is larger than any machine"),
])
def test_numbers_no_machine_reports_are_refused(field, value, fragment):
    """An index of 10^23 became CUDA_VISIBLE_DEVICES=10^23 (exit 0); 10^29 MiB of memory was planned with."""
    with pytest.raises(InventoryError, match=re.escape(fragment)):
        inventory_from_dict({"devices": [{"index": 0, "uuid": "u", "name": "n", field: value}]})
    assert inventory_from_dict({"devices": [{"index": 65535, "uuid": "u", "name": "n"}]}).devices[0].index == 65535


_A100 = {"index": 3, "uuid": "GPU-a", "name": "A100", "memory_total_mib": 40960}


@pytest.mark.parametrize("patch, fragment", [
    # convoy devices showed 99999/40960 MiB and planned with it
    ({"memory_used_mib": 99999}, "nvidia device 3 ('A100'): memory_used_mib 99999 is more than memory_total_mib "
                                 "40960"),
    ({"processes": [{"pid": 7, "used_memory_mib": 50000}]}, "device 3 ('A100'): process 7 uses 50000 MiB, more than "
                                                            "memory_total_mib 40960"),
    ({"processes": [{"pid": 7, "used_memory_mib": 30000}, {"pid": 8, "used_memory_mib": 20000}]},
     "its 2 processes use 50000 MiB together, more than memory_total_mib 40960"),
    ({"mig_devices": [{"uuid": "MIG-x", "memory_total_mib": 30000}, {"uuid": "MIG-y", "memory_total_mib": 20000}]},
     "its MIG slices hold 50000 MiB together, more than memory_total_mib 40960"),
    ({"mig_devices": [{"uuid": "MIG-x", "memory_total_mib": 9728, "memory_used_mib": 9729}]},
     "MIG slice 'MIG-x': memory_used_mib 9729 is more than memory_total_mib 9728"),
    ({"mig_devices": [{"uuid": "MIG-x", "memory_total_mib": 9728, "processes": [{"pid": 5, "used_memory_mib": 9999}]}]},
     "MIG slice 'MIG-x': process 5 uses 9999 MiB"),
    ({"vendor": "amd", "mig_devices": [{"uuid": "MIG-x", "memory_total_mib": 9728}]},
     "amd device 3 ('A100'): mig_devices are NVIDIA's MIG slices"),
    ({"mig_devices": [{"uuid": "GPU-a", "memory_total_mib": 9728}]}, "uuids repeat"),
])
def test_what_no_machine_reports_is_refused_naming_the_device(patch, fragment, tmp_path):
    path = tmp_path / "box.json"
    path.write_text(json.dumps({"devices": [{"index": 0, "uuid": "GPU-z", "name": "z"}, {**_A100, **patch}]}))
    with pytest.raises(InventoryError) as err:
        load_inventory(path)
    assert fragment in str(err.value) and str(path) in str(err.value), str(err.value)


def test_memory_up_to_the_total_and_an_unreported_total_are_accepted():
    full = {**_A100, "memory_used_mib": 40960, "processes": [{"pid": 7, "used_memory_mib": 20480},
                                                             {"pid": 8, "used_memory_mib": 20480},
                                                             {"pid": 9, "used_memory_mib": None}]}
    assert inventory_from_dict({"devices": [full]}).devices[0].memory_free_mib == 0
    # a total of 0 is one not reported (the key left out; NVML without an answer for a MIG slice)
    unknown = {"index": 0, "uuid": "u", "name": "n", "memory_used_mib": 5,
               "mig_devices": [{"uuid": "MIG-u", "memory_total_mib": 0,
                                "processes": [{"pid": 1, "used_memory_mib": 9}]}]}
    assert inventory_from_dict({"devices": [unknown]}).devices[0].memory_used_mib == 5


def test_vendor_case_does_not_matter():
    inv = inventory_from_dict({"devices": [{"index": 0, "uuid": "u", "name": "n", "vendor": "AMD"}]})
    assert inv.devices[0].vendor == "amd"


def test_missing_and_invalid_files(tmp_path):
    with pytest.raises(InventoryError, match="does not exist; write one with 'convoy devices --json"):
        load_inventory(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InventoryError, match="is not valid JSON"):
        load_inventory(bad)


def test_package_names_resolve_lazily():
    import convoy.devices as devices

    assert devices.select_devices.__module__ == "convoy.devices.selection"
    assert set(dir(devices)) >= {"parse_devices", "lease_devices", "visibility_env", "Selection"}
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = devices.nope
