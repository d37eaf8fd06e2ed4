"""Leases: OS file locks per device UUID, all-or-nothing, named holders, waiting, and release on SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from convoy.devices.inventory import load_inventory
from convoy.devices.lease import lease_devices, lease_holders, select_and_lease
from convoy.errors import LeaseError, SelectionError

HOLDER = textwrap.dedent("""
    import sys, time
    from convoy.devices.inventory import load_inventory
    from convoy.devices.lease import lease_devices
    inv = load_inventory(sys.argv[1])
    lease = lease_devices([inv.devices[int(sys.argv[3])]], lock_dir=sys.argv[2])
    print("held", flush=True)
    time.sleep(float(sys.argv[4]))
""")


@pytest.fixture
def inv(inventory_path):
    return load_inventory(inventory_path("8xh100_nvswitch"))


def _holder(inventory_path, lock_dir, index, seconds):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(inventory_path("8xh100_nvswitch")), str(lock_dir),
                             str(index), str(seconds)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_lease_is_exclusive_all_or_nothing_and_release_is_idempotent(inv, tmp_path):
    with lease_devices(inv.devices[:2], lock_dir=tmp_path) as lease:
        assert lease.held and len(lease.fds) == 2
        with pytest.raises(LeaseError) as info:
            lease_devices(inv.devices[1:3], lock_dir=tmp_path)
        assert f"GPU 1 (NVIDIA H100 80GB HBM3) is leased by pid {os.getpid()}" in str(info.value)
        assert "GPU 2" not in str(info.value).split(":", 1)[1].split(";")[0]
        # all or nothing: GPU 2 was not kept by the failed attempt
        lease_devices([inv.devices[2]], lock_dir=tmp_path).release()
        assert set(lease_holders(inv.devices, lock_dir=tmp_path)) == {inv.devices[0].uuid, inv.devices[1].uuid}
        lease.release()
        lease.release()
        assert not lease.held
    assert lease_holders(inv.devices, lock_dir=tmp_path) == {}


def test_wait_gets_the_device_when_its_holder_ends(inv, tmp_path, inventory_path):
    proc = _holder(inventory_path, tmp_path, 3, 0.6)
    try:
        with pytest.raises(LeaseError, match=r"after waiting 0.1s: GPU 3 .* is leased by pid \d+"):
            lease_devices([inv.devices[3]], wait=0.1, lock_dir=tmp_path)
        start = time.monotonic()
        with lease_devices([inv.devices[3]], wait=60, lock_dir=tmp_path):  # not a LeaseError after 60 s
            assert time.monotonic() - start < 50
    finally:
        proc.wait(timeout=10)


def test_sigkill_frees_the_device_at_once(inv, tmp_path, inventory_path):
    proc = _holder(inventory_path, tmp_path, 5, 60)
    assert inv.devices[5].uuid in lease_holders(inv.devices, lock_dir=tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    lease_devices([inv.devices[5]], lock_dir=tmp_path).release()  # no wait needed


def test_select_and_lease_hands_out_distinct_devices(inv, tmp_path):
    leases = []
    try:
        for _ in range(8):
            selection, lease = select_and_lease(1, free=True, inventory=inv, env={}, lock_dir=tmp_path)
            leases.append(lease)
        assert sorted(lease.devices[0].index for lease in leases) == list(range(8))
        with pytest.raises(LeaseError, match=r"only 0 of 8 visible pass the filters \(GPU 0: leased by pid"):
            select_and_lease(1, free=True, inventory=inv, env={}, lock_dir=tmp_path)
    finally:
        for lease in leases:
            lease.release()


def test_select_and_lease_reports_non_lease_shortage_as_selection_error(inventory_path, tmp_path):
    busy = load_inventory(inventory_path("2_busy_exclusive"))
    with pytest.raises(SelectionError):
        select_and_lease(1, free=True, inventory=busy, env={}, lock_dir=tmp_path)


def test_a_wait_for_free_devices_says_what_it_waits_for_and_when_it_has_them(inv, inventory_path, tmp_path):
    """`--free --wait 1h` printed nothing while it waited: it looked hung."""
    import threading

    said: list[str] = []
    holders = [_holder(inventory_path, tmp_path, i, 60) for i in range(8)]
    ends = threading.Timer(1.0, holders[3].kill)  # GPU 3 comes free a second into the wait
    ends.start()
    try:
        selection, lease = select_and_lease(1, free=True, wait=60, inventory=inv, lock_dir=tmp_path,
                                            say=said.append)
        lease.release()
    finally:
        ends.join()
        for proc in holders:
            proc.kill()
            proc.wait()
    assert len(said) == 2, said
    assert said[0].startswith("convoy: waiting up to 1m for devices=1 that no other job holds; now GPU 0 (")
    assert said[0].count("leased by pid") == 8, said[0]  # one holder each here
    assert selection.indices == [3] and said[1].startswith(f"convoy: got {selection.devices[0].label} after "
                                                           "waiting "), said
    quiet: list[str] = []
    _, lease = select_and_lease(1, free=True, wait=60, inventory=inv, lock_dir=tmp_path, say=quiet.append)
    lease.release()
    assert quiet == []  # no wait, nothing to say
