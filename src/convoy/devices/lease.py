"""Reservations: two jobs started at the same moment never get the same "free" device.

    convoy run --devices 1 --free --wait 5m -- python train.py    # leases, runs, releases

    from convoy.devices.lease import lease_devices, select_and_lease
    with lease_devices(selection.devices, wait=30) as lease:
        subprocess.run(cmd, env={**os.environ, **selection.env}, pass_fds=lease.fds)
    selection, lease = select_and_lease(1, free=True, wait=300)

A lease is an exclusive ``flock`` on ``<lock dir>/<device uuid>.lock`` (``$CONVOY_LEASE_DIR``, default
``/tmp/convoy-leases``). The operating system drops the lock when the last process holding the open file
dies, even by SIGKILL, so a crashed job never leaves a device reserved. A child given ``lease.fds`` keeps
the lease alive while it runs. The holder writes who it is (pid, user, command, time) into the file, so
a job that cannot get a device says who has it.
"""

from __future__ import annotations

import fcntl
import getpass
import json
import os
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from convoy.devices.inventory import Device
from convoy.devices.units import parse_duration
from convoy.errors import LeaseError, SelectionError

__all__ = ["Lease", "lease_devices", "lease_holders", "select_and_lease", "default_lock_dir",
           "LEASE_DIR_VARIABLE"]

LEASE_DIR_VARIABLE = "CONVOY_LEASE_DIR"
_POLL_S = 0.1


def default_lock_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$CONVOY_LEASE_DIR``, else ``/tmp/convoy-leases`` (shared by every user of the machine)."""
    env = os.environ if env is None else env
    return Path(env.get(LEASE_DIR_VARIABLE) or "/tmp/convoy-leases")


def _lock_path(lock_dir: Path, device: Device) -> Path:
    return lock_dir / (re.sub(r"[^A-Za-z0-9._-]", "_", device.uuid) + ".lock")


def _ensure_dir(lock_dir: Path) -> None:
    if lock_dir.is_dir():
        return
    try:
        lock_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(lock_dir, 0o1777)  # every user's jobs lease here; sticky, like /tmp
    except PermissionError:
        pass
    except OSError as err:
        raise LeaseError(f"cannot create lease directory {str(lock_dir)!r}: {err.strerror}; set "
                         f"{LEASE_DIR_VARIABLE} to a writable directory") from None


@dataclass
class Lease:
    """Exclusive locks on some devices; a context manager. ``release()`` may be called any number of times."""

    devices: tuple[Device, ...]
    lock_dir: Path
    _fds: list[int] = field(default_factory=list, repr=False)

    @property
    def fds(self) -> tuple[int, ...]:
        """The lock files' descriptors: pass them to a child (``pass_fds``) so the lease lives as long as it."""
        return tuple(self._fds)

    @property
    def held(self) -> bool:
        return bool(self._fds)

    def release(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:  # a forgotten lease still ends with its owner
        try:
            self.release()
        except Exception:
            pass


def _open(path: Path) -> int:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:
        fd = os.open(path, os.O_RDONLY)  # flock works on a read-only descriptor too
    try:
        os.fchmod(fd, 0o666)
    except OSError:
        pass
    return fd


def _try_lock(path: Path) -> int | None:
    fd = _open(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _write_holder(fd: int) -> None:
    info = {"pid": os.getpid(), "user": _user(), "command": " ".join(sys.argv)[:200], "since": time.time()}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
    except OSError:
        pass  # read-only lock file (another user's): the lock itself still holds


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:
        return str(os.getuid())


def _describe_holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        info = {}
    if not info.get("pid"):
        return "another job"
    since = time.strftime("%H:%M:%S", time.localtime(info.get("since", 0)))
    return f"pid {info['pid']} ({info.get('user', '?')}: {info.get('command', '?')!r}, since {since})"


def lease_holders(devices: Sequence[Device], *, lock_dir: str | Path | None = None) -> dict[str, str]:
    """UUID -> who holds it, for the devices some other job has leased right now (a snapshot)."""
    lock_dir = default_lock_dir() if lock_dir is None else Path(lock_dir)
    held: dict[str, str] = {}
    if not lock_dir.is_dir():
        return held
    for device in devices:
        path = _lock_path(lock_dir, device)
        if not path.exists():
            continue
        fd = _open(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            held[device.uuid] = _describe_holder(path)
        finally:
            os.close(fd)
    return held


def lease_devices(devices: Sequence[Device], *, wait: float | str | None = None,
                  lock_dir: str | Path | None = None) -> Lease:
    """Lease every device of ``devices`` (all or none), waiting up to ``wait`` (seconds, or a duration such as
    ``"5m"``; ``None``: not at all).

    Raises:
        LeaseError: some device is still held by another job when the wait ends; names the holders.
    """
    wait = None if wait is None else parse_duration(wait)  # seconds, or '30s', '5m', '1h', 'inf'
    lock_dir = default_lock_dir() if lock_dir is None else Path(lock_dir)
    _ensure_dir(lock_dir)
    deadline = time.monotonic() + (wait or 0)
    while True:
        lease, busy = _attempt(devices, lock_dir)
        if lease is not None:
            return lease
        if time.monotonic() >= deadline:
            break
        time.sleep(_POLL_S)
    holders = "; ".join(f"{d.label} is leased by {_describe_holder(_lock_path(lock_dir, d))}" for d in busy)
    waited = f" after waiting {wait:g}s" if wait else ""
    raise LeaseError(f"cannot lease {len(busy)} of the requested devices{waited}: {holders}; "
                     f"wait longer (--wait 10m) or ask for other devices")


def _attempt(devices: Sequence[Device], lock_dir: Path) -> tuple[Lease | None, list[Device]]:
    fds: list[int] = []
    busy: list[Device] = []
    for device in devices:
        fd = _try_lock(_lock_path(lock_dir, device))
        if fd is None:
            busy.append(device)
        else:
            fds.append(fd)
    if busy:
        for fd in fds:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        return None, busy
    for fd in fds:
        _write_holder(fd)
    return Lease(tuple(devices), lock_dir, fds), []


def select_and_lease(spec: Any = "auto", *, wait: float | str | None = None, lock_dir: str | Path | None = None,
                     **select_kwargs: Any):
    """Select devices that no other job holds, and lease them, retrying until ``wait`` runs out.

    Returns ``(Selection, Lease)``. For a count with ``free=True`` any unleased device will do, so losing a
    race to another job just means trying the next one; an index list waits for exactly those devices.

    Raises:
        LeaseError: not enough devices came free in time; names who holds them.
        SelectionError, DeviceSpecError: as ``select_devices``, for reasons other than leases.
    """
    from convoy.devices.discovery import discover
    from convoy.devices.inventory import as_inventory
    from convoy.devices.selection import select_devices
    from convoy.devices.visibility import visible_devices

    wait = None if wait is None else parse_duration(wait)  # seconds, or '30s', '5m', '1h', 'inf'
    env = select_kwargs.pop("env", None)
    env = os.environ if env is None else env
    inventory = as_inventory(select_kwargs.pop("inventory", None)) or discover(env)
    lock_dir = default_lock_dir(env) if lock_dir is None else Path(lock_dir)
    _ensure_dir(lock_dir)
    candidates = visible_devices(inventory, env).devices
    deadline = time.monotonic() + (wait or 0)
    while True:
        held = lease_holders(candidates, lock_dir=lock_dir)
        try:
            selection = select_devices(spec, inventory=inventory, env=env, held=held, **select_kwargs)
        except SelectionError as err:
            if not held:
                raise
            if time.monotonic() >= deadline:
                waited = f" after waiting {wait:g}s" if wait else ""
                raise LeaseError(f"{err}{waited}; wait longer (--wait 10m) or ask for fewer devices") from None
            time.sleep(_POLL_S)
            continue
        lease, _ = _attempt(selection.devices, lock_dir)
        if lease is not None:
            return selection, lease
        # Another job took one of them between the snapshot and the lock: look again (the next snapshot
        # shows it held, so a count moves on to other devices and a list waits or fails naming it).
        time.sleep(_POLL_S / 10)
