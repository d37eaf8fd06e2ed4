"""Find this machine's accelerators, or read them from a file.

    convoy devices                                   # what discovery finds
    CONVOY_INVENTORY=box.json convoy devices         # what box.json says instead

    from convoy.devices.discovery import discover
    inv = discover()                                 # Inventory; empty (CPU only) when there is nothing

``CONVOY_INVENTORY=<file>`` in ``env`` wins over the hardware. Otherwise each vendor backend
(``backends/``) that looks available is asked in turn; a backend that fails leaves its vendor out rather
than breaking discovery. Nothing here starts an accelerator runtime or imports torch.
"""

from __future__ import annotations

import os

from convoy.devices.inventory import Device, Inventory, load_inventory

TYPE_CHECKING = False  # typing is not imported at run time: `convoy select` starts without it
if TYPE_CHECKING:  # the backends (subprocess, shutil, ...) load only when the hardware is asked
    from collections.abc import Mapping, Sequence

    from convoy.devices.backends.base import Backend

__all__ = ["discover", "INVENTORY_VARIABLE"]

NO_SOURCE = "none"
"""An inventory's ``source`` when no backend found an accelerator."""

INVENTORY_VARIABLE = "CONVOY_INVENTORY"


def discover(env: Mapping[str, str] | None = None, *, backends: Sequence[Backend] | None = None) -> Inventory:
    """The accelerators this machine has (``env[CONVOY_INVENTORY]``'s file when set), in index order."""
    env = os.environ if env is None else env
    path = env.get(INVENTORY_VARIABLE)
    if path:
        return load_inventory(path)
    if backends is None:
        from convoy.devices.backends import BACKENDS

        backends = BACKENDS
    devices: list[Device] = []
    sources: list[str] = []  # the backends that found devices (or failed); none: NO_SOURCE
    for backend in backends:
        if not backend.available():
            continue
        try:
            found = backend.discover()
        except Exception as err:  # a broken vendor tool must not hide the other vendors
            sources.append(f"{backend.source} failed: {type(err).__name__}")
            continue
        if found:
            devices.extend(found)
            sources.append(backend.source)
    if not devices:
        return Inventory((), source=NO_SOURCE if not sources else ", ".join(sources))
    # One index space per vendor (each runtime counts its own devices from 0); keep vendors apart in order.
    return Inventory(tuple(devices), source=", ".join(sources))
