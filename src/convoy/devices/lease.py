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

The directory is shared by every user (sticky, 1777, like ``/tmp``), so that two users cannot take the same
device. Nothing in it is trusted: a lock file is opened without following links (``O_NOFOLLOW``), never
truncated or re-moded unless this user created it, and created 0644 so only its creator can write the holder
line. Another user's lock file is still locked through a read-only descriptor (``flock`` needs no write
access), its holder line is believed only as far as its owner goes, and a link, a non-regular file or a lock
file this user cannot open counts as held, with one line that names the path and its owner.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import pwd
import re
import stat
import sys
import time
from dataclasses import dataclass, field

from convoy.devices.inventory import Device
from convoy.errors import LeaseError, SelectionError

TYPE_CHECKING = False  # typing is not imported at run time: `convoy select` starts without it
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from pathlib import Path
    from typing import Any

__all__ = ["Lease", "lease_devices", "lease_holders", "visible_holders", "select_and_lease", "default_lock_dir",
           "LEASE_DIR_VARIABLE"]

LEASE_DIR_VARIABLE = "CONVOY_LEASE_DIR"
_POLL_S = 0.1


def default_lock_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$CONVOY_LEASE_DIR``, else ``/tmp/convoy-leases`` (shared by every user of the machine)."""
    from pathlib import Path

    return Path(_lock_dir_name(env))


def _lock_dir_name(env: Mapping[str, str] | None = None) -> str:
    """``default_lock_dir`` as a string: what ``convoy select`` reads, without importing pathlib (which imports
    urllib.parse and ipaddress) when it starts."""
    env = os.environ if env is None else env
    return env.get(LEASE_DIR_VARIABLE) or "/tmp/convoy-leases"


def _lock_path(lock_dir: Path, device: Device) -> Path:
    return lock_dir / _lock_name(device)


def _lock_name(device: Device) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", device.uuid) + ".lock"


def _ensure_dir(lock_dir: Path) -> None:
    try:
        lock_dir.mkdir(parents=True)
    except FileExistsError:
        pass
    except OSError as err:
        raise LeaseError(f"cannot create lease directory {str(lock_dir)!r}: {err.strerror}; set "
                         f"{LEASE_DIR_VARIABLE} to a writable directory") from None
    else:
        os.chmod(lock_dir, 0o1777)  # ours, just made: every user's jobs lease here; sticky, like /tmp
    info = os.lstat(lock_dir)
    if not stat.S_ISDIR(info.st_mode):
        raise LeaseError(f"lease directory {str(lock_dir)!r} is not a directory (a link or a file, owned by "
                         f"{_owner(info.st_uid)}); remove it or set {LEASE_DIR_VARIABLE} to a directory")
    if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
        raise LeaseError(f"lease directory {str(lock_dir)!r} is writable by every user but not sticky, so "
                         f"anyone could replace its lock files; chmod 1777 it or set {LEASE_DIR_VARIABLE}")
    if info.st_uid not in (0, os.geteuid()):
        # the sticky bit stops other users, not the directory's owner: they could unlink a held lock file and
        # the next job would lock a new one, so two jobs would hold one GPU
        raise LeaseError(f"lease directory {str(lock_dir)!r} belongs to {_owner(info.st_uid)}, who could remove "
                         f"the lock files other users hold; have root create it (sudo install -d -m 1777 "
                         f"{str(lock_dir)!r}) or set {LEASE_DIR_VARIABLE} to a directory of your own")


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return f"uid {uid}"


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

    def close(self) -> None:
        """Close this process's descriptors without unlocking them: the lease then lasts while any process given
        ``fds`` still holds a copy (``release`` unlocks for every copy: a lock belongs to the open file, not to a
        descriptor). ``convoy run`` ends its hold this way, so a process of the command that outlived it keeps the
        devices leased until it ends."""
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)

    def release(self) -> None:
        fds, self._fds = self._fds, []
        for fd in fds:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __del__(self) -> None:  # a forgotten lease still ends with its owner
        try:
            self.release()
        except Exception:
            pass


class _Unusable(Exception):
    """A lock file that cannot be used safely: counts as held, ``reason`` says why (one line)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # NONBLOCK: a planted FIFO cannot stall us


def _open(path: str | Path) -> tuple[int, bool]:
    """(descriptor, ours): ``ours`` only for a regular file this user owns, the only kind convoy writes to.

    Never follows a link, never truncates, and changes the mode only of a file this call created.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
        os.fchmod(fd, 0o644)  # created just now by us (whatever the umask): others can open it to lock it too
        return fd, True
    except FileExistsError:
        pass
    except OSError as err:
        raise _Unusable(_describe_unopenable(path, err)) from None
    try:
        try:
            fd = os.open(path, os.O_RDWR | _NOFOLLOW)
        except PermissionError:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW)  # flock works on a read-only descriptor too
    except OSError as err:
        raise _Unusable(_describe_unopenable(path, err)) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        kind = "not a regular file" if not stat.S_ISREG(info.st_mode) else "a hard link to another file"
        raise _Unusable(f"an unusable lock file: {str(path)!r} is {kind} (owned by {_owner(info.st_uid)}); "
                        f"remove it")
    ours = info.st_uid == os.geteuid()  # another user's: lock it, never write to it
    if ours and stat.S_IMODE(info.st_mode) != 0o644:
        try:
            os.fchmod(fd, 0o644)  # ours, from an older convoy that made lock files 0666: nobody else may write
        except OSError:
            pass
    return fd, ours


def _describe_unopenable(path: str | Path, err: OSError) -> str:
    try:
        info = os.lstat(path)
    except OSError:
        return f"an unusable lock file: {str(path)!r} cannot be opened ({err.strerror})"
    owner = _owner(info.st_uid)
    if stat.S_ISLNK(info.st_mode) or err.errno == errno.ELOOP:
        return f"an unusable lock file: {str(path)!r} is a symbolic link (owned by {owner}); remove it"
    return (f"an unusable lock file: {str(path)!r} cannot be opened (owned by {owner}, mode "
            f"{stat.S_IMODE(info.st_mode):04o}); ask {owner} to remove it, or set {LEASE_DIR_VARIABLE}")


def _try_lock(path: str | Path) -> tuple[int, bool] | None:
    fd, writable = _open(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd, writable


def _write_holder(fd: int) -> None:
    info = {"pid": os.getpid(), "uid": os.geteuid(), "user": _user(), "command": " ".join(sys.argv)[:200],
            "since": time.time()}
    try:
        os.ftruncate(fd, 0)  # only ever a file this user owns (see _open)
        os.pwrite(fd, json.dumps(info).encode(), 0)
    except OSError:
        pass


def _user() -> str:
    try:
        import getpass

        return getpass.getuser()
    except Exception:
        return str(os.getuid())


def _describe_holder(path: str | Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    except OSError as err:
        return "another job" if err.errno == errno.ENOENT else _describe_unopenable(path, err)
    owner = -1
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            return f"an unusable lock file: {str(path)!r} is not a regular file (owned by {_owner(status.st_uid)})"
        owner = status.st_uid
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        info = info if isinstance(info, dict) else {}
    except (OSError, ValueError):
        info = {}
    finally:
        os.close(fd)
    if not info.get("pid"):
        return "another job"
    if info.get("uid", owner) != owner:  # written by someone other than the holder the file names
        return f"another job (lock file owned by {_owner(owner)})"
    since = time.strftime("%H:%M:%S", time.localtime(info.get("since", 0)))
    return f"pid {info['pid']} ({info.get('user', '?')}: {info.get('command', '?')!r}, since {since})"


def lease_holders(devices: Sequence[Device], *, lock_dir: str | Path | None = None) -> dict[str, str]:
    """UUID -> who holds it, for the devices some other job has leased right now (a snapshot)."""
    lock_dir = _lock_dir_name() if lock_dir is None else os.fspath(lock_dir)
    held: dict[str, str] = {}
    if not os.path.isdir(lock_dir):
        return held
    for device in devices:
        path = os.path.join(lock_dir, _lock_name(device))
        if not os.path.lexists(path):
            continue
        try:
            fd, _ = _open(path)
        except _Unusable as err:
            held[device.uuid] = err.reason
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            held[device.uuid] = _describe_holder(path)
        finally:
            os.close(fd)
    return held


def visible_holders(inventory: Any, env: Mapping[str, str]) -> dict[str, str]:
    """UUID -> holder for the devices of ``inventory`` that ``env`` leaves visible and another job has leased
    (in ``env``'s lease directory): ``select_devices``' ``held`` for a ``--free`` request."""
    from convoy.devices.visibility import visible_devices

    return lease_holders(visible_devices(inventory, env).devices, lock_dir=_lock_dir_name(env))


def lease_devices(devices: Sequence[Device], *, wait: float | str | None = None,
                  lock_dir: str | Path | None = None, spec: Any = None,
                  say: Callable[[str], None] | None = None) -> Lease:
    """Lease every device of ``devices`` (all or none), waiting up to ``wait`` (seconds, or a duration such as
    ``"5m"``; ``None``: not at all). ``spec``: the request they were chosen for; when it was a count, the
    refusal says that ``--free`` takes that many devices no other job holds. ``say``: where a wait is told,
    once when it starts (what it waits for, who holds it) and once when the devices are had (``convoy run
    --wait`` passes a stderr printer).

    Raises:
        LeaseError: some device is still held by another job when the wait ends; names the holders.
    """
    from pathlib import Path

    from convoy.devices.amounts import parse_duration

    wait = None if wait is None else parse_duration(wait)  # seconds, or '30s', '5m', '1h', 'inf'
    lock_dir = default_lock_dir() if lock_dir is None else Path(lock_dir)
    _ensure_dir(lock_dir)
    started = time.monotonic()
    deadline = started + (wait or 0)
    told = False
    while True:
        lease, busy = _attempt(devices, lock_dir)
        if lease is not None:
            if told and say is not None:
                say(f"convoy: got {_labels(devices)} after waiting {_waited(time.monotonic() - started)}")
            return lease
        if time.monotonic() >= deadline:
            break
        if not told and say is not None:
            told = True
            holders = {d: _describe_holder(_lock_path(lock_dir, d)) for d in busy}
            say(f"convoy: waiting up to {_waited(wait)} for {_held_by(holders)}")
        time.sleep(_POLL_S)
    leased_by = "; ".join(f"{d.label} is leased by {_describe_holder(_lock_path(lock_dir, d))}" for d in busy)
    waited = f" after waiting {wait:g}s" if wait else ""
    free = _free_hint(spec, len(devices))
    raise LeaseError(f"cannot lease {len(busy)} of the requested devices{waited}: {leased_by}; {free}"
                     f"{'wait longer' if wait else 'wait for them'} (--wait 10m), ask for other devices, or share "
                     f"them (--no-lease)")


def _labels(devices: Sequence[Device]) -> str:
    return ", ".join(d.label for d in devices)


def _held_by(holders: Mapping[Device, str]) -> str:
    """``GPU 0 (A100), GPU 1 (A100): leased by pid 42 (...)``, devices of one holder together."""
    by: dict[str, list[Device]] = {}
    for device, holder in holders.items():
        by.setdefault(holder, []).append(device)
    return "; ".join(f"{_labels(devices)}: leased by {holder}" for holder, devices in by.items())


def _waited(seconds: float | None) -> str:
    """``"1h"``, ``"5m"``, ``"12.3 s"``, ``"ever"`` (for ``inf``)."""
    if seconds is None or seconds == float("inf"):
        return "ever" if seconds else "0 s"
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    if seconds == int(seconds):
        return f"{int(seconds)} s"
    return f"{seconds:.1f} s" if seconds < 60 else f"{seconds / 60:.1f} min"


def _free_hint(spec: Any, wanted: int) -> str:
    """For a count (``--devices 2``): ``--free`` would have moved past the leased devices."""
    from convoy.devices.spec import is_count

    if not is_count(spec):
        return ""
    many = str(spec).strip().lower() in ("-1", "all", "auto")
    what = "every device that no other job holds" if many else \
        f"{wanted} device{'s' if wanted > 1 else ''} that no other job holds"
    return f"--free takes {what} (--devices {str(spec).strip()} --free); or "


def _attempt(devices: Sequence[Device], lock_dir: Path) -> tuple[Lease | None, list[Device]]:
    locked: list[tuple[int, bool]] = []
    busy: list[Device] = []
    for device in devices:
        try:
            got = _try_lock(_lock_path(lock_dir, device))
        except _Unusable:
            got = None  # counts as held; _describe_holder names the path and its owner
        if got is None:
            busy.append(device)
        else:
            locked.append(got)
    if busy:
        for fd, _ in locked:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        return None, busy
    for fd, writable in locked:
        if writable:
            _write_holder(fd)
    return Lease(tuple(devices), lock_dir, [fd for fd, _ in locked]), []


def select_and_lease(spec: Any = "auto", *, wait: float | str | None = None, lock_dir: str | Path | None = None,
                     say: Callable[[str], None] | None = None, **select_kwargs: Any):
    """Select devices that no other job holds, and lease them, retrying until ``wait`` runs out.

    Returns ``(Selection, Lease)``. For a count with ``free=True`` any unleased device will do, so losing a
    race to another job just means trying the next one; an index list waits for exactly those devices.
    ``say``: where a wait is told, when it starts and when the devices are had (as ``lease_devices``).

    Raises:
        LeaseError: not enough devices came free in time; names who holds them.
        SelectionError, DeviceSpecError: as ``select_devices``, for reasons other than leases.
    """
    from pathlib import Path

    from convoy.devices.amounts import parse_duration
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
    started = time.monotonic()
    deadline = started + (wait or 0)
    told = False
    while True:
        held = lease_holders(candidates, lock_dir=lock_dir)
        try:
            selection = select_devices(spec, inventory=inventory, env=env, held=held, **select_kwargs)
        except SelectionError as err:
            if not held:
                raise
            if time.monotonic() >= deadline:
                waited = f" after waiting {wait:g}s" if wait else ""
                raise LeaseError(f"{err}{waited}; {'wait longer' if wait else 'wait for them'} (--wait 10m) or ask "
                                 f"for fewer devices") from None
            if not told and say is not None:
                told = True
                busy = {d: held[d.uuid] for d in candidates if d.uuid in held}
                say(f"convoy: waiting up to {_waited(wait)} for devices={spec!s} that no other job holds; now "
                    f"{_held_by(busy)}")
            time.sleep(_POLL_S)
            continue
        lease, _ = _attempt(selection.devices, lock_dir)
        if lease is not None:
            if told and say is not None:
                say(f"convoy: got {_labels(selection.devices)} after waiting {_waited(time.monotonic() - started)}")
            return selection, lease
        # Another job took one of them between the snapshot and the lock: look again (the next snapshot
        # shows it held, so a count moves on to other devices and a list waits or fails naming it).
        time.sleep(_POLL_S / 10)
