"""A launch's temporary directory: swept by the next launch once its launcher is gone, never another user's or a
live launcher's; a temporary directory other users could swap it in is refused; the elastic engine's hold files
are never truncated nor reached through a link. (kill -9 of real launchers: test_orphans.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from convoy.errors import LaunchError
from convoy.launch.loopback import HOLD_DIR_VARIABLE
from convoy.launch.scratch import OWNER_LOCK, Scratch, check_temp_dir, sweep_stale
from tests.conftest import INVENTORIES

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX permissions and flock")

_KILLED_OWNER = textwrap.dedent("""
    import os, sys
    from convoy.launch.scratch import Scratch
    made = [Scratch.create(prefix, sys.argv[1]) for prefix in sys.argv[2:]]
    print(*(scratch.path for scratch in made), flush=True)
    os.kill(os.getpid(), 9)
""")


def _killed_owner(where: Path, *prefixes: str) -> list[Path]:
    """The directories a launcher made before it was killed by SIGKILL."""
    out = subprocess.run([sys.executable, "-c", _KILLED_OWNER, str(where), *prefixes], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == -9, out.stderr
    return [Path(path) for path in out.stdout.split()]


def _private(tmp_path: Path) -> Path:
    where = tmp_path / "tmp"
    where.mkdir(mode=0o700)
    return where


def test_the_next_launch_sweeps_what_killed_launchers_left_and_nothing_else(tmp_path):
    where = _private(tmp_path)
    live = Scratch.create("convoy-store-", where)  # a launcher that lives
    stale = _killed_owner(where, "convoy-launch-", "convoy-store-")
    (stale[0] / "rank0_error.json").write_text("{}")
    older = where / "convoy-launch-old"  # an older convoy's directory: no owner lock, nothing says it is stale
    older.mkdir()
    link = where / "convoy-launch-link"  # never followed
    link.symlink_to(stale[1])
    other = where / "convoy-tests-x"  # not a launch's
    other.mkdir()
    try:
        assert all(path.is_dir() for path in stale)
        swept = sweep_stale(where)
        assert sorted(swept) == sorted(stale) and not any(path.exists() for path in stale)
        assert live.path.is_dir() and older.is_dir() and other.is_dir() and link.is_symlink()
    finally:
        live.remove()
    assert not live.path.exists()


def test_an_elastic_launch_that_makes_no_directory_sweeps_too(tmp_path):
    """A kill -9'd elastic launcher's convoy-store-* stayed until a launch that made one of its own (restarts on
    one node) came; a launch without restarts makes none, and swept nothing."""
    where = _private(tmp_path)
    (stale,) = _killed_owner(where, "convoy-store-")
    script = tmp_path / "ok.py"
    script.write_text("print('ran')\n")
    env = {**os.environ, "TMPDIR": str(where), "CONVOY_INVENTORY": str(INVENTORIES / "1xh100.json"),
           "CONVOY_LEASE_DIR": str(tmp_path / "leases")}
    done = subprocess.run([sys.executable, "-m", "convoy", "launch", "--engine", "elastic", "--devices", "0",
                           "--nproc-per-node", "1", "--max-restarts", "0", "--no-lease", str(script)],
                          capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and "ran" in done.stdout, done.stderr
    assert not stale.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a second user (chown): run as root")
def test_another_users_directory_is_never_swept(tmp_path):
    import pwd

    nobody = pwd.getpwnam("nobody").pw_uid
    where = _private(tmp_path)
    theirs, = _killed_owner(where, "convoy-launch-")
    for path in (theirs, theirs / OWNER_LOCK):
        os.chown(path, nobody, -1)
    assert sweep_stale(where) == [] and (theirs / OWNER_LOCK).exists()


def test_a_temporary_directory_others_could_swap_a_launch_in_is_refused(tmp_path):
    where = tmp_path / "shared"
    where.mkdir()
    where.chmod(0o777)  # world-writable, not sticky: anyone may rename what is in it
    with pytest.raises(LaunchError, match=r"is writable by every user but not sticky, so another user could replace "
                                          r"a launch's files in it; chmod \+t it .* or set TMPDIR"):
        Scratch.create("convoy-launch-", where)
    assert list(where.iterdir()) == []
    env = {**os.environ, "TMPDIR": str(where), "CONVOY_INVENTORY": str(INVENTORIES / "4_mixed_pcie.json"),
           "CONVOY_LEASE_DIR": str(tmp_path / "leases")}
    refused = subprocess.run([sys.executable, "-m", "convoy", "launch", "--devices", "0", "--no-python", "true"],
                             env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert refused.stderr.startswith(f"convoy: the temporary directory {str(where)!r} is writable by every user")
    where.chmod(0o1777)  # sticky, as /tmp: fine
    assert check_temp_dir(str(where)) == where


def test_a_hold_file_is_never_truncated_nor_opened_through_a_link(tmp_path, monkeypatch):
    """Under torch's agent with restarts, each rank but 0 holds a lock on ``<hold dir>/<attempt>.<rank>``. It was
    opened with O_CREAT|O_TRUNC, following links: whoever could put a link there had a rank truncate a file of
    the victim's to 0 bytes."""
    from convoy.launch import loopback

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    holds = _private(tmp_path)
    (holds / "0.1.new").symlink_to(victim)
    env = {HOLD_DIR_VARIABLE: str(holds), "RANK": "1", "TORCHELASTIC_RESTART_COUNT": "0"}
    assert loopback._done_fd(env) is None and victim.read_text() == "precious"
    (holds / "0.1.new").unlink()
    (holds / "0.1.new").write_text("planted")  # a file already there: locked, never truncated
    fd = loopback._done_fd(env)
    try:
        assert fd is not None and (holds / "0.1").read_text() == "planted"
    finally:
        os.close(fd)
    holds.chmod(0o777)  # a directory others may write to is not the launcher's: nothing is held in it
    assert loopback._done_fd({**env, "RANK": "2"}) is None and not (holds / "0.2").exists()
