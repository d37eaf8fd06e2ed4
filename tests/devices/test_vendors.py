"""The vendors' facts: one row per discovery backend, looked up by pure functions, cheap to import."""

from __future__ import annotations

import subprocess
import sys

from convoy.devices.backends import BACKENDS
from convoy.devices.vendors import DEVICE_VENDORS, VENDORS, process_group_backend, vendor_facts


def test_every_discovery_backend_has_a_row_with_a_source():
    assert {backend.vendor for backend in BACKENDS} | {"cpu"} == set(VENDORS)
    assert set(DEVICE_VENDORS) == {backend.vendor for backend in BACKENDS}  # what an inventory file may name
    assert all(row.source for row in VENDORS.values())


def test_lookups():
    assert (vendor_facts("amd").device_type, vendor_facts("amd").link) == ("cuda", "xGMI")
    assert [vendor_facts(v).process_group_backend for v in ("nvidia", "intel", "ascend", "apple", "cpu")] == \
        ["nccl", "xccl", "hccl", "gloo", "gloo"]
    unknown = vendor_facts("acme")
    assert (unknown.device_type, unknown.process_group_backend, unknown.link) == ("device", "gloo", None)
    assert (process_group_backend("cuda"), process_group_backend("cpu"), process_group_backend("xyz")) == \
        ("nccl", "gloo", "gloo")


def test_reading_the_table_loads_no_discovery_backend():
    code = ("import sys, convoy.devices.vendors, convoy.devices.selection; "
            "print(sorted(m for m in sys.modules if m.startswith('convoy.devices.backends') or m == 'subprocess'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
