"""Discovery backends, one small module per vendor, each with the same interface (``base.Backend``), and the
vendors' facts (``vendors``: device type, link, collective backend).

    from convoy.devices.backends import BACKENDS
    [b.vendor for b in BACKENDS if b.available()]

The backend modules (vendor tools, subprocess, sysfs readers) load on the first use of ``BACKENDS`` or
``Backend``, so reading ``vendors`` stays cheap.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time: `convoy select` starts without it

if TYPE_CHECKING:
    from typing import Any

    from convoy.devices.backends.base import Backend

__all__ = ["Backend", "BACKENDS"]


def _backends() -> tuple[Backend, ...]:
    from convoy.devices.backends.amd import AmdBackend
    from convoy.devices.backends.apple import AppleBackend
    from convoy.devices.backends.ascend import AscendBackend
    from convoy.devices.backends.habana import HabanaBackend
    from convoy.devices.backends.intel import IntelBackend
    from convoy.devices.backends.nvidia import NvidiaBackend

    # Probe order: the first backend that finds devices wins the "main vendor" tie (see Inventory.vendor).
    return (
        NvidiaBackend(),
        AmdBackend(),
        IntelBackend(),
        HabanaBackend(),
        AscendBackend(),
        AppleBackend(),
    )


def __getattr__(name: str) -> Any:
    if name == "Backend":
        from convoy.devices.backends.base import Backend

        value: Any = Backend
    elif name == "BACKENDS":
        value = _backends()
    else:
        raise AttributeError(f"module 'convoy.devices.backends' has no attribute {name!r}")
    globals()[name] = value  # built once: the next access is a plain attribute lookup
    return value
