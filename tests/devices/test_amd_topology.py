"""AMD xGMI links from a fake KFD topology in sysfs, and topology selection over them."""

from __future__ import annotations

from pathlib import Path

from convoy.devices.backends.amd import AmdBackend, devices_from_sysfs, xgmi_peers
from convoy.devices.inventory import Inventory
from convoy.devices.selection import select_devices

PCIE, XGMI = 2, 11  # CRAT_IOLINK_TYPE_PCIEXPRESS, CRAT_IOLINK_TYPE_XGMI

# MI300X platform bus ids (PCI order). KFD numbers its nodes in its own order, which need not be PCI order.
MI300X_BUSES = ["0000:05:00.0", "0000:26:00.0", "0000:46:00.0", "0000:65:00.0",
                "0000:85:00.0", "0000:a6:00.0", "0000:c6:00.0", "0000:e5:00.0"]


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _props(**values: int) -> str:
    return "".join(f"{key} {value}\n" for key, value in values.items())


def _location(bus_id: str) -> tuple[int, int]:
    """(domain, location_id) the way KFD writes them: location_id = bus << 8 | slot << 3 | function."""
    domain, bus, rest = bus_id.split(":")
    slot, function = rest.split(".")
    return int(domain, 16), int(bus, 16) << 8 | int(slot, 16) << 3 | int(function, 16)


def _fake_sysfs(tmp_path: Path, buses: list[str], kfd_order: list[int], xgmi: list[tuple[int, int]],
                *, device: str = "0x74a1") -> tuple[Path, Path]:
    """PCI devices for ``buses`` and a KFD topology: node 0 is the CPU, node k+1 is GPU ``kfd_order[k]``
    (an index into ``buses``); every GPU has a PCIe link to the CPU and an xGMI link per pair in ``xgmi``."""
    pci, kfd = tmp_path / "pci", tmp_path / "kfd"
    for i, bus in enumerate(buses):
        for name, value in (("vendor", "0x1002"), ("class", "0x120000"), ("device", device),
                            ("mem_info_vram_total", str(192 * 2**30)), ("mem_info_vram_used", str(2**30)),
                            ("gpu_busy_percent", "0"), ("unique_id", f"{0x51a0 + i:016x}")):
            _write(pci / bus / name, value + "\n")
    _write(kfd / "nodes" / "0" / "gpu_id", "0\n")
    _write(kfd / "nodes" / "0" / "properties", _props(cpu_cores_count=96, simd_count=0, location_id=0, domain=0))
    node_of = {gpu: k + 1 for k, gpu in enumerate(kfd_order)}
    for gpu, node in node_of.items():
        where = kfd / "nodes" / str(node)
        domain, location = _location(buses[gpu])
        _write(where / "gpu_id", f"{1000 + 17 * node}\n")
        _write(where / "properties", _props(cpu_cores_count=0, simd_count=1216, location_id=location,
                                            domain=domain, unique_id=0x51a0 + gpu))
        targets = [(PCIE, 0, 20)] + [(XGMI, node_of[b if a == gpu else a], 15)
                                     for a, b in xgmi if gpu in (a, b)]
        for k, (kind, to, weight) in enumerate(targets):
            _write(where / "io_links" / str(k) / "properties",
                   _props(type=kind, version_major=0, version_minor=0, node_from=node, node_to=to, weight=weight,
                          min_latency=0, max_latency=0, min_bandwidth=312 if kind == XGMI else 0,
                          max_bandwidth=64000 if kind == XGMI else 0, recommended_transfer_size=0, flags=1))
    return pci, kfd


def _mi300x(tmp_path: Path) -> tuple[Path, Path]:
    every_pair = [(a, b) for a in range(8) for b in range(a + 1, 8)]
    return _fake_sysfs(tmp_path, MI300X_BUSES, kfd_order=[3, 0, 7, 1, 6, 2, 5, 4], xgmi=every_pair)


def _two_pairs(tmp_path: Path) -> tuple[Path, Path]:
    """4 GPUs on xGMI bridges in two pairs, 0-2 and 1-3 (not neighbours in PCI order)."""
    buses = ["0000:23:00.0", "0000:43:00.0", "0000:83:00.0", "0000:c3:00.0"]
    return _fake_sysfs(tmp_path, buses, kfd_order=[2, 3, 0, 1], xgmi=[(0, 2), (1, 3)], device="0x738c")


def test_mi300x_every_gpu_reaches_the_other_seven(tmp_path):
    pci, kfd = _mi300x(tmp_path)
    devices = AmdBackend(pci_root=pci, kfd_root=kfd).discover()
    assert [d.pci_bus_id for d in devices] == MI300X_BUSES
    for d in devices:
        assert d.nvlink_peers == tuple(i for i in range(8) if i != d.index)
    sel = select_devices(2, inventory=Inventory(tuple(devices), source="sysfs"), env={}, order="topology")
    assert sel.indices == [0, 1] and sel.vendor == "amd"
    assert "topology: 2 device(s) inside one xGMI island (GPUs 0,1,2,3,4,5,6,7)" in sel.explanation


def test_two_xgmi_pairs_map_through_kfd_node_order(tmp_path):
    pci, kfd = _two_pairs(tmp_path)
    devices = devices_from_sysfs(pci, kfd_root=kfd)
    assert {d.index: d.nvlink_peers for d in devices} == {0: (2,), 1: (3,), 2: (0,), 3: (1,)}
    inv = Inventory(tuple(devices), source="sysfs")
    assert select_devices(2, inventory=inv, env={}, order="topology").indices == [0, 2]
    # With GPU 0 out, index order would take 1 and 2 (no link); topology takes the other pair.
    sel = select_devices(2, inventory=inv, env={}, order="topology", exclude=[0])
    assert sel.indices == [1, 3]
    assert "topology: 2 device(s) inside one xGMI island (GPUs 1,3)" in sel.explanation
    assert select_devices(2, inventory=inv, env={}, exclude=[0]).indices == [1, 2]


def test_topology_without_links_says_so_once_and_keeps_index_order(tmp_path):
    pci, _ = _two_pairs(tmp_path)
    devices = devices_from_sysfs(pci, kfd_root=tmp_path / "no-such-kfd")
    assert all(d.nvlink_peers == () for d in devices)
    inv = Inventory(tuple(devices), source="sysfs")
    sel = select_devices(2, inventory=inv, env={}, order="topology")
    assert sel.indices == [0, 1]
    notes = [line for line in sel.explanation if "xGMI" in line]
    assert notes == ["topology: no xGMI links between the eligible devices were found (none discovered, or none "
                     "to a device that passes); took index order"]
    # Nobody asked for linked devices: no word about links.
    assert not any("xGMI" in line for line in select_devices(2, inventory=inv, env={}).explanation)


def test_odd_topology_files_give_no_links_and_never_raise(tmp_path):
    pci, kfd = _two_pairs(tmp_path)
    nodes = kfd / "nodes"
    # node 1 (GPU 2): properties unreadable as numbers; node 2 (GPU 3): io_links is a file, not a folder;
    # node 3 (GPU 0): its links point at a node that does not exist, and one lacks node_to.
    _write(nodes / "1" / "properties", "location_id zero\ngarbage\n\n")
    (nodes / "2" / "io_links").rename(nodes / "2" / "io_links.bak")
    _write(nodes / "2" / "io_links", "not a folder\n")
    for link in (nodes / "3" / "io_links").iterdir():
        _write(link / "properties", _props(type=XGMI, node_from=3, node_to=42))
    _write(nodes / "3" / "io_links" / "9" / "properties", _props(type=XGMI, node_from=3))
    _write(nodes / "README", "a stray file\n")
    devices = devices_from_sysfs(pci, kfd_root=kfd)
    # Only GPU 1 (node 4) still lists a readable link, to GPU 3 (node 2, matched by location): the pair
    # 1-3 survives from one side; everything else has no link.
    assert {d.index: d.nvlink_peers for d in devices} == {0: (), 1: (3,), 2: (), 3: (1,)}
    (nodes / "4" / "properties").write_bytes(b"\xff\xfe location_id 17152\n")  # not text at all
    assert all(d.nvlink_peers == () for d in devices_from_sysfs(pci, kfd_root=kfd))
    assert xgmi_peers(tmp_path / "pci" / "0000:23:00.0" / "vendor", devices) == {}  # a file as the root


def test_partitioned_gpu_and_unique_id_fallback(tmp_path):
    pci, kfd = _two_pairs(tmp_path)
    nodes = kfd / "nodes"
    # GPU 1 (node 4) as partition 1 of a multi-partition GPU (partition id ORed into location_id), and
    # GPU 3 (node 2) with no location_id at all: it is found by unique_id (decimal in KFD, hex in PCI sysfs).
    domain, location = _location("0000:43:00.0")
    _write(nodes / "4" / "properties", _props(location_id=location | 1, domain=domain, unique_id=0x51a0 + 1))
    _write(nodes / "2" / "properties", _props(unique_id=0x51a0 + 3))
    devices = devices_from_sysfs(pci, kfd_root=kfd)
    assert {d.index: d.nvlink_peers for d in devices} == {0: (2,), 1: (3,), 2: (0,), 3: (1,)}
    # Two partitions of one GPU linked to each other are not a link between two devices.
    _write(nodes / "5" / "gpu_id", "2000\n")
    _write(nodes / "5" / "properties", _props(location_id=location | (2 << 28), domain=domain))
    _write(nodes / "5" / "io_links" / "0" / "properties", _props(type=XGMI, node_from=5, node_to=4))
    devices = devices_from_sysfs(pci, kfd_root=kfd)
    assert devices[1].nvlink_peers == (3,)


def test_pcie_links_are_not_fast_links(tmp_path):
    pci, kfd = _two_pairs(tmp_path)
    for props in kfd.glob("nodes/*/io_links/*/properties"):
        props.write_text(props.read_text().replace(f"type {XGMI}\n", f"type {PCIE}\n"))
    assert all(d.nvlink_peers == () for d in devices_from_sysfs(pci, kfd_root=kfd))


def test_cli_free_topology_on_the_xgmi_pairs_inventory(inventory_path, capsys):
    from convoy.cli.main import main

    path = str(inventory_path("amd_4gpu_xgmi_pairs"))  # GPU 0 busy; pairs 0-2 and 1-3
    assert main(["select", "2", "--free", "--order", "topology", "--inventory", path, "--format", "index"]) == 0
    assert capsys.readouterr().out.strip() == "1,3"
    assert main(["select", "2", "--free", "--inventory", path, "--format", "env"]) == 0
    assert capsys.readouterr().out.strip() == "export HIP_VISIBLE_DEVICES=1,2"


def test_discovered_links_are_written_to_the_inventory_format(tmp_path):
    pci, kfd = _two_pairs(tmp_path)
    data = Inventory(tuple(devices_from_sysfs(pci, kfd_root=kfd)), source="sysfs").to_dict()
    assert [d["nvlink_peers"] for d in data["devices"]] == [[2], [3], [0], [1]]
