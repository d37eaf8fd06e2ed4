"""Discovery backends, one small module per vendor, each with the same interface (``base.Backend``).

    from convoy.devices.backends import BACKENDS
    [b.vendor for b in BACKENDS if b.available()]
"""

from __future__ import annotations

from convoy.devices.backends.amd import AmdBackend
from convoy.devices.backends.apple import AppleBackend
from convoy.devices.backends.ascend import AscendBackend
from convoy.devices.backends.base import Backend
from convoy.devices.backends.habana import HabanaBackend
from convoy.devices.backends.intel import IntelBackend
from convoy.devices.backends.nvidia import NvidiaBackend

__all__ = ["Backend", "BACKENDS"]

# Probe order: the first backend that finds devices wins the "main vendor" tie (see Inventory.vendor).
BACKENDS: tuple[Backend, ...] = (
    NvidiaBackend(),
    AmdBackend(),
    IntelBackend(),
    HabanaBackend(),
    AscendBackend(),
    AppleBackend(),
)
