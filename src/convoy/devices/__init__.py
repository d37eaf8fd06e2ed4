"""convoy.devices: which accelerators a job uses. Torch-free; importing it is cheap.

    from convoy.devices import parse_devices, discover, select_devices
    parse_devices("1,3", 4)                      # [1, 3]
    sel = select_devices(2, free=True)           # Selection: devices, vendor, env, explanation
    subprocess.run(cmd, env={**os.environ, **sel.env})

Modules: ``spec`` (request grammar), ``inventory`` (Device/Inventory and the JSON format), ``discovery``
(+ ``backends/`` per vendor), ``selection`` (filters, order, topology, MIG), ``visibility`` (the vendors'
environment variables), ``lease`` (reservations), ``units`` ("20GiB", "80%", "5m").
"""

from __future__ import annotations

from convoy.devices.discovery import discover
from convoy.devices.inventory import Device, Inventory, load_inventory
from convoy.devices.lease import Lease, lease_devices, select_and_lease
from convoy.devices.selection import Selection, select_devices
from convoy.devices.spec import parse_devices
from convoy.devices.visibility import ensure_runtime_not_started, visibility_env

__all__ = [
    "parse_devices",
    "Device",
    "Inventory",
    "load_inventory",
    "discover",
    "select_devices",
    "Selection",
    "visibility_env",
    "ensure_runtime_not_started",
    "Lease",
    "lease_devices",
    "select_and_lease",
]
