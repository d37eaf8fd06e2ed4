"""convoy.devices: which accelerators a job uses. Torch-free; importing it is cheap (names load on use).

    from convoy.devices import parse_devices, discover, select_devices
    parse_devices("1,3", 4)                      # [1, 3]
    sel = select_devices(2, free=True)           # Selection: devices, vendor, env, explanation
    subprocess.run(cmd, env={**os.environ, **sel.env})

Modules: ``spec`` (request grammar), ``vendors`` (each vendor's device type, link and collective backend),
``inventory`` (Device/Inventory and the JSON format), ``discovery`` (+ ``backends/`` per vendor), ``selection``
(filters, order, topology, MIG), ``visibility`` (the vendors' environment variables), ``lease`` (reservations),
``amounts`` ("20GiB", "80%", "5m").
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing is not imported at run time: `convoy select` starts without it
if TYPE_CHECKING:
    from typing import Any

_LAZY: dict[str, str] = {
    "parse_devices": "convoy.devices.spec",
    "Device": "convoy.devices.inventory",
    "Inventory": "convoy.devices.inventory",
    "load_inventory": "convoy.devices.inventory",
    "discover": "convoy.devices.discovery",
    "select_devices": "convoy.devices.selection",
    "Selection": "convoy.devices.selection",
    "visibility_env": "convoy.devices.visibility",
    "ensure_runtime_not_started": "convoy.devices.visibility",
    "Lease": "convoy.devices.lease",
    "lease_devices": "convoy.devices.lease",
    "select_and_lease": "convoy.devices.lease",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'convoy.devices' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
