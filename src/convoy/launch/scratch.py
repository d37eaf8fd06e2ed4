"""A launch's temporary directory: made where no other user can swap it, swept once its launcher is gone.

    scratch = Scratch.create("convoy-launch-")    # <temp dir>/convoy-launch-XXXX, 0700, its owner lock held
    ... scratch.path / "rank0_error.json" ...
    scratch.remove()                              # at the launch's end

The direct engine keeps its ranks' error files in ``convoy-launch-*``, the elastic engine with restarts its
ranks' hold files in ``convoy-store-*`` (``convoy.launch.loopback``). Each holds ``owner.lock``, which its
launcher keeps locked (``flock``) for its whole life; the lock is taken before the file gets that name, so it is
never found unlocked while its launcher lives. A launcher killed by SIGKILL leaves its directory behind: the next
launch (direct, or elastic whether or not it makes one) removes every such directory of this user whose lock is
free (``sweep_stale``), and leaves alone those of live launchers, other users', links, and directories without a
lock file (an older convoy's). The lock
follows the open file, not a pid, so a reused pid or another pid namespace sharing ``/tmp`` cannot fool it.

The temporary directory (``$TMPDIR``, else ``/tmp``) must not let other users rename what is in it: one that is
writable by every user without the sticky bit is refused with one line (``LaunchError``), as the lease
directory is (``convoy.devices.lease``).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from convoy.errors import LaunchError

__all__ = ["PREFIXES", "OWNER_LOCK", "Scratch", "check_temp_dir", "sweep_stale"]

PREFIXES = ("convoy-launch-", "convoy-store-")
"""The launches' temporary directories that ``sweep_stale`` looks at."""
OWNER_LOCK = "owner.lock"
_OPEN = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # NONBLOCK: a planted FIFO cannot stall a sweep


def check_temp_dir(directory: str | None = None) -> Path:
    """``directory`` (default: ``tempfile.gettempdir()``) when no other user can replace what is in it; else
    ``LaunchError``: writable by every user but not sticky, anyone could rename a launch's directory and put one
    of their own, or a link, in its place."""
    path = Path(directory or tempfile.gettempdir())
    try:
        info = os.stat(path)
    except OSError as err:
        raise LaunchError(f"the temporary directory {str(path)!r} cannot be used ({err.strerror}); set TMPDIR to a "
                          "directory of your own") from None
    if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
        raise LaunchError(f"the temporary directory {str(path)!r} is writable by every user but not sticky, so "
                          "another user could replace a launch's files in it; chmod +t it (as /tmp is, mode 1777) "
                          "or set TMPDIR to a directory of your own")
    return path


@dataclass
class Scratch:
    """One launch's temporary directory and the descriptor of its held owner lock."""

    path: Path
    _lock: int = -1

    @classmethod
    def create(cls, prefix: str, directory: str | Path | None = None) -> Scratch:
        """A new ``<directory>/<prefix>XXXX`` (0700; default: in the temporary directory), its owner lock held,
        after sweeping stale ones there."""
        base = check_temp_dir(None if directory is None else str(directory))
        sweep_stale(base)
        try:
            path = Path(tempfile.mkdtemp(prefix=prefix, dir=base))
        except OSError as err:
            raise LaunchError(f"cannot create a temporary directory in {str(base)!r} ({err.strerror}); set TMPDIR "
                              "to a writable directory") from None
        fd = os.open(path / (OWNER_LOCK + ".new"), os.O_RDWR | os.O_CREAT | os.O_EXCL | _OPEN, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.replace(path / (OWNER_LOCK + ".new"), path / OWNER_LOCK)  # locked before it has its name
        return cls(path, fd)

    def remove(self) -> None:
        """Remove the directory, then let go of its lock (any number of times)."""
        if self._lock >= 0:
            shutil.rmtree(self.path, ignore_errors=True)
            os.close(self._lock)
            self._lock = -1


def sweep_stale(directory: str | Path | None = None, prefixes: tuple[str, ...] = PREFIXES) -> list[Path]:
    """Remove this user's launch directories in ``directory`` (default: the temporary directory) whose launcher
    is gone (their owner lock is free); returns them. Best effort: what cannot be read is left alone."""
    base = Path(directory or tempfile.gettempdir())
    removed: list[Path] = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return removed
    me = os.geteuid()
    for entry in entries:
        if not entry.name.startswith(prefixes):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != me:
            continue
        if _owner_gone(Path(entry.path)):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed


def _owner_gone(path: Path) -> bool:
    try:
        fd = os.open(path / OWNER_LOCK, os.O_RDONLY | _OPEN)
    except OSError:  # no lock file (being made, or an older convoy's directory), or a link
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: its launcher lives
        return False
    finally:
        os.close(fd)
    return True
