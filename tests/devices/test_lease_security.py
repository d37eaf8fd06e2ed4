"""Leases in a directory every local user can write to: no link is followed, no foreign file is changed,
another user's lock still excludes, and a lock this user cannot use is one clear line (issue 14)."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from convoy.devices.inventory import load_inventory
from convoy.devices.lease import _lock_path, lease_devices, lease_holders
from convoy.errors import LeaseError

OTHER_UID = 65534  # nobody
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="acting as another user needs root")


@pytest.fixture
def inv(inventory_path):
    return load_inventory(inventory_path("8xh100_nvswitch"))


@pytest.fixture
def shared_dir():
    """A lease directory like /tmp/convoy-leases (1777), reachable by the other user."""
    path = Path(tempfile.mkdtemp(prefix="convoy-lease-test-", dir="/tmp"))
    os.chmod(path, 0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _as_other_user(body) -> tuple[int, str]:
    """Run ``body()`` in a forked child under OTHER_UID; (exit status, what it wrote)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 0
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(OTHER_UID)
            os.setuid(OTHER_UID)
            os.write(write, str(body()).encode())
        except BaseException as err:  # noqa: BLE001 - reported to the parent
            os.write(write, f"{type(err).__name__}: {err}".encode())
            code = 1
        os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        text = pipe.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), text


def test_a_planted_symlink_is_refused_and_its_target_untouched(inv, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("root only")
    os.chmod(secret, 0o600)
    lock_dir = tmp_path / "leases"
    lock_dir.mkdir()
    os.symlink(secret, _lock_path(lock_dir, inv.devices[0]))
    with pytest.raises(LeaseError) as info:
        lease_devices([inv.devices[0]], lock_dir=lock_dir)
    message = str(info.value)
    assert "\n" not in message and "is a symbolic link" in message
    assert str(_lock_path(lock_dir, inv.devices[0])) in message
    held = lease_holders(inv.devices, lock_dir=lock_dir)
    assert set(held) == {inv.devices[0].uuid} and "symbolic link" in held[inv.devices[0].uuid]
    assert secret.read_text() == "root only" and stat.S_IMODE(secret.stat().st_mode) == 0o600
    lease_devices([inv.devices[1]], lock_dir=lock_dir).release()  # the other devices are unaffected


def test_a_symlinked_lease_directory_is_refused(inv, tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises(LeaseError, match="is not a directory"):
        lease_devices([inv.devices[0]], lock_dir=tmp_path / "link")


def test_lock_files_are_created_0644_and_never_truncated_on_open(inv, tmp_path):
    with lease_devices([inv.devices[0]], lock_dir=tmp_path):
        path = _lock_path(tmp_path, inv.devices[0])
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        holder = path.read_text()
        assert lease_holders(inv.devices, lock_dir=tmp_path)  # looking does not change the file
        assert path.read_text() == holder


@needs_root
def test_another_users_lock_file_excludes_and_is_never_changed(inv, shared_dir):
    path = _lock_path(shared_dir, inv.devices[2])
    read, write = os.pipe()
    release_r, release_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child: nobody holds GPU 2 until told to stop
        os.close(read)
        os.setgroups([])
        os.setgid(OTHER_UID)
        os.setuid(OTHER_UID)
        lease = lease_devices([inv.devices[2]], lock_dir=shared_dir)
        os.write(write, b"held")
        os.read(release_r, 1)
        lease.release()
        os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 4) == b"held"
        before = path.read_bytes()
        with pytest.raises(LeaseError, match=rf"GPU 2 .* is leased by pid {pid} "):
            lease_devices([inv.devices[2]], lock_dir=shared_dir)
    finally:
        os.write(release_w, b"x")
        os.waitpid(pid, 0)
    with lease_devices([inv.devices[2]], lock_dir=shared_dir):  # root locks nobody's file (read-only fd)
        info = path.stat()
        assert info.st_uid == OTHER_UID and stat.S_IMODE(info.st_mode) == 0o644
        assert path.read_bytes() == before  # root wrote no holder line into a file it does not own
    # ... and nobody cannot rewrite root's holder line
    with lease_devices([inv.devices[3]], lock_dir=shared_dir):
        status, text = _as_other_user(lambda: open(_lock_path(shared_dir, inv.devices[3]), "w"))
        assert status == 1 and "PermissionError" in text


@needs_root
def test_an_unreadable_foreign_lock_file_is_one_clear_line(inv, shared_dir):
    path = _lock_path(shared_dir, inv.devices[4])
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)  # root's 0600 file, as another user sees it
    os.close(fd)

    def attempt():
        try:
            lease_devices([inv.devices[4]], lock_dir=shared_dir)
        except LeaseError as err:
            return f"LeaseError {err} | {lease_holders(inv.devices, lock_dir=shared_dir)[inv.devices[4].uuid]}"
        return "leased"

    status, text = _as_other_user(attempt)
    assert status == 0, text
    assert text.startswith("LeaseError ") and "cannot be opened (owned by root, mode 0600)" in text
    assert "\n" not in text and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_an_own_0666_lock_file_from_an_older_convoy_is_tightened(inv, tmp_path):
    path = _lock_path(tmp_path, inv.devices[0])
    fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
    os.fchmod(fd, 0o666)
    os.close(fd)
    with lease_devices([inv.devices[0]], lock_dir=tmp_path):
        assert stat.S_IMODE(path.stat().st_mode) == 0o644


@needs_root
def test_a_shared_lease_directory_owned_by_another_user_is_refused(inv, tmp_path):
    # the sticky bit stops other users, not the directory's owner: they could unlink a lock a job holds
    shared = tmp_path / "leases"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    os.chown(shared, OTHER_UID, OTHER_UID)
    with pytest.raises(LeaseError, match="belongs to .*have root create it") as err:
        lease_devices(inv.devices[:1], lock_dir=shared)
    assert "\n" not in str(err.value) and list(shared.iterdir()) == []
    os.chown(shared, 0, 0)  # root's (or the user's own) directory is used as before
    with lease_devices(inv.devices[:1], lock_dir=shared):
        assert inv.devices[0].uuid in lease_holders(inv.devices, lock_dir=shared)
