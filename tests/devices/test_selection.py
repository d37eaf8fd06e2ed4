"""Selection against real machine shapes: filters, orders, topology, MIG, explanations, errors."""

from __future__ import annotations

import pytest

import convoy
from convoy.devices.inventory import Inventory, load_inventory
from convoy.devices.selection import Selection, select_devices
from convoy.errors import DeviceSpecError, SelectionError


@pytest.fixture
def load(inventory_path):
    return lambda name: load_inventory(inventory_path(name))


def test_auto_takes_every_device_and_no_accelerator_means_cpu(load):
    sel = select_devices(inventory=load("8xh100_nvswitch"), env={})
    assert isinstance(sel, Selection) and sel.indices == list(range(8)) and sel.vendor == "nvidia"
    cpu = select_devices("auto", inventory=Inventory(), env={})
    assert cpu.devices == () and cpu.vendor == "cpu" and cpu.env == {"CUDA_VISIBLE_DEVICES": ""}
    assert any("CPU" in line for line in cpu.explanation)
    assert convoy.select_devices is select_devices


def test_inventory_comes_from_convoy_inventory_in_env(inventory_path):
    sel = select_devices(2, env={"CONVOY_INVENTORY": str(inventory_path("4_mixed_pcie"))})
    assert [d.name for d in sel.devices] == ["NVIDIA RTX A4000", "NVIDIA GeForce RTX 4090"]


def test_free_skips_busy_and_exclusive_taken(load):
    inv = load("2_busy_exclusive")
    assert select_devices(2, inventory=inv, env={}).indices == [0, 1]  # without --free anything goes
    with pytest.raises(SelectionError) as info:
        select_devices(1, inventory=inv, env={}, free=True)
    message = str(info.value)
    assert "needs 1 device(s) but only 0 of 2 visible pass the filters" in message
    assert "GPU 0: busy: in use by 2 processes (pid 48121, 48122)" in message
    assert "GPU 1: busy: exclusive-process mode and taken by 1 process (pid 51007)" in message
    with pytest.raises(SelectionError, match="GPU 1 .* cannot be used: busy: exclusive-process"):
        select_devices("1,", inventory=inv, env={}, free=True)
    with pytest.raises(SelectionError, match="only 0 of 2 visible pass"):
        select_devices("auto", inventory=inv, env={}, free=True)


def test_memory_and_utilisation_filters(load):
    inv = load("amd_mi250x")  # GCD 2 holds 30 GiB at 88%
    assert 2 not in select_devices("all", inventory=inv, env={}, min_free_memory="40GiB").indices
    assert 2 not in select_devices("all", inventory=inv, env={}, min_free_memory="80%").indices
    assert 2 in select_devices("all", inventory=inv, env={}, min_free_memory="30GiB").indices
    assert select_devices("all", inventory=inv, env={}, max_utilization="50%").indices == [0, 1, 3, 4, 5, 6, 7]
    sel = select_devices(7, inventory=inv, env={}, free=True)
    assert sel.indices == [0, 1, 3, 4, 5, 6, 7]
    assert any(line.startswith("left GPU 2 (AMD Instinct MI250X): busy") for line in sel.explanation)
    with pytest.raises(SelectionError, match=r"only 35\d\d\d MiB free, needs 40960 MiB \(40GiB\)"):
        select_devices("2,", inventory=inv, env={}, min_free_memory="40GiB")


def test_exclude_by_index_and_uuid(load):
    inv = load("8xh100_nvswitch")
    assert select_devices(3, inventory=inv, env={}, exclude=[0, 2]).indices == [1, 3, 4]
    assert select_devices(2, inventory=inv, env={}, exclude=[inv.devices[0].uuid[:10]]).indices == [1, 2]
    with pytest.raises(DeviceSpecError, match="exclude: index 8 is out of range"):
        select_devices(1, inventory=inv, env={}, exclude=[8])
    with pytest.raises(DeviceSpecError, match="exclude: 'GPU-zzz' matches no visible device"):
        select_devices(1, inventory=inv, env={}, exclude=["GPU-zzz"])


def test_orders(load):
    inv = load("4_mixed_pcie")
    assert select_devices(2, inventory=inv, env={}).indices == [0, 1]
    assert select_devices(2, inventory=inv, env={}, order="fastest").indices == [1, 3]
    assert select_devices(3, inventory=inv, env={}, order="free-memory").indices == [3, 1, 0]
    assert select_devices("3,1,0", inventory=inv, env={}).indices == [3, 1, 0]  # a list's order is sacred
    assert select_devices("3,1,0", inventory=inv, env={}, order="index").indices == [0, 1, 3]
    with pytest.raises(DeviceSpecError, match="order 'random' is not one of index, free-memory"):
        select_devices(1, inventory=inv, env={}, order="random")


def test_topology_keeps_a_count_inside_one_nvlink_island(load):
    inv = load("8gpu_two_islands")
    sel = select_devices(4, inventory=inv, env={}, order="topology")
    assert sel.indices == [0, 1, 2, 3]
    # GPU 1 is excluded: island 0-3 has only 3 left, so 4 come from the other island, not 3+1.
    sel = select_devices(4, inventory=inv, env={}, order="topology", exclude=[1])
    assert sel.indices == [4, 5, 6, 7]
    assert "inside one NVLink island (GPUs 4,5,6,7)" in " ".join(sel.explanation)
    # Index order would have split the job 3+1 across the islands.
    assert select_devices(4, inventory=inv, env={}, exclude=[1]).indices == [0, 2, 3, 4]
    # Best fit: 2 GPUs go into the island with 3 free, leaving the whole island of 4 for a bigger job.
    assert select_devices(2, inventory=inv, env={}, order="topology", exclude=[1]).indices == [0, 2]
    # 6 cannot fit one island: fill the largest first.
    sel = select_devices(6, inventory=inv, env={}, order="topology", exclude=[1])
    assert sel.indices[:4] == [4, 5, 6, 7] and len(sel.indices) == 6
    assert "no NVLink island has 6" in " ".join(sel.explanation)


def test_topology_on_nvswitch_is_any_set(load):
    assert select_devices(4, inventory=load("8xh100_nvswitch"), env={}, order="topology").indices == [0, 1, 2, 3]


def test_mig_one_slice_per_process(load):
    inv = load("a100_mig")
    sel = select_devices(1, inventory=inv, env={}, free=True)  # slice 0 (3g.40gb) is busy
    assert len(sel.devices) == 1 and sel.devices[0].is_mig_slice and "2g.20gb" in sel.devices[0].name
    assert sel.env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": sel.devices[0].uuid}
    assert sel.devices[0].mig_parent_uuid == inv.devices[0].uuid
    with pytest.raises(SelectionError, match="CUDA lets a process use a single MIG slice; ask for 1 device") as err:
        select_devices(2, inventory=inv, env={})
    # what it suggests is one device in convoy's grammar ('0' alone means no accelerator)
    for suggested in ("1", "0,"):
        assert f"'{suggested}'" in str(err.value) or f"devices={suggested}" in str(err.value)
        assert len(select_devices(suggested, inventory=inv, env={}).devices) == 1
    assert "devices='0' means no accelerator" in str(err.value)
    mig_uuid = inv.devices[1].mig_devices[3].uuid
    sel = select_devices("auto", inventory=inv, env={"CUDA_VISIBLE_DEVICES": mig_uuid})
    assert sel.uuids == [mig_uuid]


def test_explanation_covers_every_device(load):
    sel = select_devices("3,1", inventory=load("4_mixed_pcie"), env={})
    lines = sel.explanation
    assert lines[0] == "inventory: 4 nvidia device(s) from file:" + str(load("4_mixed_pcie").source)[5:]
    assert "took GPU 3 (NVIDIA GeForce RTX 3090) -> cuda:0 (request '3,1', order kept)" in lines
    assert "took GPU 1 (NVIDIA GeForce RTX 4090) -> cuda:1 (request '3,1', order kept)" in lines
    assert "left GPU 0 (NVIDIA RTX A4000): not needed" in lines
    assert "left GPU 2 (Tesla T4): not needed" in lines


def test_held_devices_are_not_taken(load):
    inv = load("8xh100_nvswitch")
    held = {inv.devices[0].uuid: "pid 1 (alice)", inv.devices[1].uuid: "pid 2 (bob)"}
    assert select_devices(2, inventory=inv, env={}, held=held).indices == [2, 3]
    with pytest.raises(SelectionError, match=r"GPU 0 .* cannot be used: leased by pid 1 \(alice\)"):
        select_devices("0,2", inventory=inv, env={}, held=held)


def test_count_larger_than_the_machine_is_a_spec_error(load):
    with pytest.raises(DeviceSpecError, match="asks for 9 devices but 8 devices are available"):
        select_devices(9, inventory=load("8xh100_nvswitch"), env={})


@pytest.mark.parametrize("kwargs, word", [
    ({"free": "no"}, "free='no' is a str; give True or False"),  # was truthy: every busy device skipped
    ({"free": None}, "give True or False"),
    ({"env": {"CUDA_VISIBLE_DEVICES": 5}}, "the value is a int"),  # was AttributeError: 'int' has no 'strip'
    ({"env": {1: "x"}}, "the name is a int"),
    ({"max_utilization": b"5"}, "is a bytes"),  # was read as 5 %
])
def test_wrong_python_types_are_one_clear_error(inventory_path, kwargs, word):
    kwargs = {"inventory": str(inventory_path("2_busy_exclusive")), "env": {}, **kwargs}
    with pytest.raises(DeviceSpecError, match=word.replace("(", r"\(")):
        select_devices("auto", **kwargs)


def test_free_false_still_takes_busy_devices(inventory_path):
    sel = select_devices("auto", inventory=str(inventory_path("2_busy_exclusive")), env={}, free=False)
    assert sel.indices == [0, 1]
