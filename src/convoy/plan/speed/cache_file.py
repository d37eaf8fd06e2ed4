"""The calibration cache on disk: read only where nobody else can steer it, written only there.

    data = read_cache(path)            # {} with one warning when it cannot be trusted or read; {} when absent
    write_cache(path, data)            # PlanError (one line) where it may not be written

What other users can change must not change this user's plans, nor receive this user's files. The rules are the
lease directory's (``convoy.devices.lease``): the cache's directory (``$XDG_CACHE_HOME/convoy``,
``~/.cache/convoy``) and the file belong to this user, neither is writable by anyone else, every symbolic link on
the way to them belongs to this user or to root, and the directory and the file are opened without following a
link (``O_NOFOLLOW``, the file relative to the directory's descriptor, so nothing can be swapped in between). A
file that breaks a rule, is not valid UTF-8 or JSON, is nested too deep, is larger than ``MAX_BYTES``, or does
not hold a JSON object, is one ``ConvoyWarning`` naming the file; the plan goes on without it. Torch-free.
"""

from __future__ import annotations

import json
import os
import pwd
import stat
import warnings

from convoy.errors import ConvoyWarning, PlanError
from convoy.reading import CALIBRATION_CACHE, depth_problem, path_and_name, read_fd

TYPE_CHECKING = False  # typing is not imported at run time: a plan starts without it
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

__all__ = ["MAX_BYTES", "read_cache", "write_cache", "parse_json_object"]

MAX_BYTES = CALIBRATION_CACHE.limit
"""A cache larger than this is not convoy's (one entry is a few kilobytes)."""
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # NONBLOCK: a planted FIFO cannot stall


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return f"uid {uid}"


def _resolved(directory: str | Path) -> tuple[str, str | None]:
    """(where ``directory`` leads, why a link on the way could be another user's or None)."""
    reason = _links_unsafe(directory)
    return os.path.realpath(directory), reason


def _named(directory: str | Path, real: str | Path) -> str:
    return repr(str(directory)) if os.fspath(real) == os.path.abspath(directory) else \
        f"{str(real)!r} (where {str(directory)!r} leads)"


def _parent_and_name(path: str | Path) -> tuple[str, str, str]:
    """``str(path)``, ``str(path.parent)`` and ``path.name`` as ``pathlib`` reads ``path``, without importing it
    (``convoy.reading.path_and_name``)."""
    text, name = path_and_name(path)
    head, sep, tail = text.rpartition("/")
    if not sep:
        return text, ".", name
    return text, head if head.strip("/") else text[:len(text) - len(tail)], name


def _links_unsafe(directory: str | Path) -> str | None:
    """Why a symbolic link on the way to ``directory`` (which may not exist yet) could be another user's, or None."""
    me = os.geteuid()
    current = "/"
    for part in [part for part in os.path.abspath(directory).split("/") if part]:
        step = os.path.join(current, part)
        try:
            info = os.lstat(step)
        except FileNotFoundError:
            return None  # the rest does not exist yet: it will be made by this user
        except OSError as err:
            return f"{str(step)!r} cannot be read ({err.strerror})"
        if stat.S_ISLNK(info.st_mode):
            if info.st_uid not in (me, 0):
                return f"{str(step)!r} is a link owned by {_owner(info.st_uid)}"
            current = os.path.realpath(step)
        else:
            current = step
    return None


def _stat_unsafe(what: str, named: str, info: os.stat_result) -> str | None:
    if info.st_uid != os.geteuid():
        return f"{what} {named} belongs to {_owner(info.st_uid)}"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{what} {named} is writable by other users (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def _refusal(reason: str) -> str:
    return (f"{reason}, so another user could steer your plans: not read; make it yours and writable by you alone "
            "(chmod go-w), or set XDG_CACHE_HOME to a directory of your own")


def _warn(text: str) -> None:
    warnings.warn(text, ConvoyWarning, stacklevel=3)


def read_cache(path: str | Path) -> dict[str, Any]:
    """The cache's JSON object; ``{}`` when there is none, and ``{}`` with one warning when it may not be trusted
    (see the module) or cannot be read."""
    path, parent, name = _parent_and_name(path)
    real, reason = _resolved(parent)
    if reason is not None:
        _warn(f"calibration cache {str(path)!r}: {_refusal(reason)}")
        return {}
    try:
        dir_fd = os.open(real, _DIR_FLAGS)
    except FileNotFoundError:
        return {}
    except OSError as err:
        _warn(f"calibration cache {str(path)!r}: its directory cannot be opened ({err.strerror}): not read")
        return {}
    try:
        reason = _stat_unsafe("the directory", _named(parent, real), os.fstat(dir_fd))
        if reason is not None:
            _warn(f"calibration cache {str(path)!r}: {_refusal(reason)}")
            return {}
        return _read_file(path, name, dir_fd)
    finally:
        os.close(dir_fd)


def _read_file(path: str, name: str, dir_fd: int) -> dict[str, Any]:
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return {}
    except OSError as err:
        _warn(f"calibration cache {str(path)!r} cannot be opened ({err.strerror}; a link is not followed): not read")
        return {}
    try:
        info = os.fstat(fd)
        reason = _stat_unsafe("the file", repr(str(path)), info)
        if reason is not None and stat.S_ISREG(info.st_mode):
            _warn(f"calibration cache {str(path)!r}: {_refusal(reason)}")
            return {}
        try:
            raw = read_fd(fd, path, CALIBRATION_CACHE)  # a regular file of at most MAX_BYTES (convoy.reading)
        except (PlanError, OSError) as err:
            _warn(f"{err if isinstance(err, PlanError) else f'calibration cache {str(path)!r} cannot be read'}: "
                  "not read; remove it (it is measured again)")
            return {}
    finally:
        os.close(fd)
    return parse_json_object(raw, f"calibration cache {str(path)!r}", fix="remove it (it is measured again)")


def parse_json_object(raw: bytes, what: str, *, fix: str) -> dict[str, Any]:
    """``raw`` as a JSON object, or ``{}`` with one warning saying what is wrong with ``what`` and ``fix``."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        _warn(f"{what} is not valid UTF-8 (byte {raw[err.start]:#04x} at offset {err.start}): not read; {fix}")
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        _warn(f"{what} is not JSON ({err.msg} at line {err.lineno} column {err.colno}): not read; {fix}")
        return {}
    except RecursionError:
        _warn(f"{what} is nested too deep to be read: not read; {fix}")
        return {}
    except ValueError as err:  # an integer past 4300 digits
        _warn(f"{what} is not JSON ({str(err).split(';')[0]}): not read; {fix}")
        return {}
    if depth_problem(data, CALIBRATION_CACHE) is not None:
        _warn(f"{what} is nested too deep to be read: not read; {fix}")
        return {}
    if not isinstance(data, dict):
        _warn(f"{what} holds a JSON {type(data).__name__}, not an object: not read; {fix}")
        return {}
    return data


def write_cache(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (a temporary file of this writer's own, then a rename, both relative
    to the directory's descriptor), making the directory (0700) if needed. ``PlanError`` where it may not."""
    from pathlib import Path  # only a write needs it (a plan's start reads the cache without it)

    path = Path(path)
    where = f"the calibration cache {str(path)!r}"
    real, reason = _resolved(path.parent)
    try:
        if reason is None and not os.path.lexists(path.parent):
            path.parent.mkdir(mode=0o700, parents=True)
            real = os.path.realpath(path.parent)
        dir_fd = os.open(real, _DIR_FLAGS) if reason is None else -1
    except OSError as err:
        raise PlanError(f"cannot write {where} ({err.strerror}); set XDG_CACHE_HOME to a writable directory") from None
    try:
        if reason is None:
            reason = _stat_unsafe("the directory", _named(path.parent, real), os.fstat(dir_fd))
        if reason is not None:
            raise PlanError(f"not writing {where}: {reason}, where another user could read or replace it; make it "
                            "yours and writable by you alone (chmod go-w), or set XDG_CACHE_HOME to a directory of "
                            "your own")
        import uuid  # only a write needs it

        tmp = f"{path.name}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=dir_fd)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(json.dumps(data, indent=1, sort_keys=True))
            os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except OSError:
                pass
            raise
    except OSError as err:
        raise PlanError(f"cannot write {where} ({err.strerror or err}); set XDG_CACHE_HOME to a writable "
                        "directory") from None
    finally:
        if dir_fd >= 0:
            os.close(dir_fd)
