"""Every file convoy reads, read one bounded way: regular files only, a size limit per kind, nesting depth bounded,
no YAML aliases. Torch-free and light (``devices/`` reads inventories through it; PyYAML loads only for YAML).

    from convoy.reading import INVENTORY, read_text, parse_json
    text = read_text("box.json", INVENTORY)         # InventoryError: a FIFO, /dev/zero, a directory, 50 MiB, not UTF-8
    data = parse_json(text, "box.json", INVENTORY)  # InventoryError: not JSON, NaN, nested deeper than MAX_DEPTH

A file is opened with ``O_NONBLOCK`` and ``fstat``-ed before a byte is read, so a FIFO (which would wait for a
writer forever), a device (``/dev/zero`` never ends), a directory or a socket is one line naming the path and what
it is. At most the kind's ``limit`` bytes are read ("is 50.0 MiB; a settings file may be at most 1 MiB"). JSON,
YAML and TOML are parsed with their nesting bounded by ``MAX_DEPTH`` (a ``RecursionError`` is never a traceback),
and YAML with a safe loader that refuses aliases (``*name``): an alias is how a 370-byte file expands to a billion
nodes, and no file convoy reads needs one (``accelerate config`` writes none: ``yaml.safe_dump`` of fresh values).
A value shown in a message is cut (``convoy.errors.shown``). A missing file is ``FileNotFoundError``, left to the
caller, whose message says how to make one. ``docs/security.md`` lists the bounds.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from dataclasses import dataclass

from convoy.errors import (
    CheckpointError,
    ConfigError,
    ConvoyError,
    InventoryError,
    PlanError,
    shown,
)

TYPE_CHECKING = False  # typing is not imported at run time: `convoy select` starts without it
if TYPE_CHECKING:
    from typing import Any

__all__ = ["FileKind", "KINDS", "SETTINGS", "ACCELERATE", "DEEPSPEED", "INVENTORY", "MODEL_CONFIG",
           "CALIBRATION_CACHE", "CHECKPOINT_RECORD", "MAX_DEPTH", "read_bytes", "read_text", "read_fd", "parse_json",
           "parse_yaml", "parse_toml", "load_json", "depth_problem", "shown_path", "path_and_name",
           "is_pathlib_path"]

MAX_DEPTH = 64
"""Deepest nesting of lists and mappings any file convoy reads may hold (an Accelerate file nests 3 deep, an
inventory 4, a Hugging Face config.json 5): far above what they hold, far below Python's recursion limit."""
MiB = 1024 * 1024


def path_and_name(path: str | os.PathLike[str]) -> tuple[str, str]:
    """``str(Path(path))`` and ``Path(path).name`` (empty and ``.`` parts dropped, a trailing slash too) without
    importing pathlib, which imports urllib.parse and ipaddress on the start of every command that reads a file."""
    text = os.fspath(path)
    if not isinstance(text, str):
        raise TypeError(f"argument should be a str or an os.PathLike object where __fspath__ returns a str, not "
                        f"{type(text).__name__!r}")
    root = "//" if text.startswith("//") and not text.startswith("///") else "/" if text.startswith("/") else ""
    parts = [part for part in text.split("/") if part not in ("", ".")]
    return root + "/".join(parts) or ".", parts[-1] if parts else ""


def is_pathlib_path(value: Any) -> bool:
    """``isinstance(value, pathlib.Path)``, asked without importing pathlib: no object is a ``Path`` before it is
    imported."""
    pathlib = sys.modules.get("pathlib")
    return pathlib is not None and isinstance(value, pathlib.Path)


@dataclass(frozen=True)
class FileKind:
    """One kind of file convoy reads."""

    name: str
    """What the file is, in a message: ``"settings file"``."""
    limit: int
    """Most bytes read: a larger file is refused with this limit in the message."""
    error: type[ConvoyError]
    """What a bad file of this kind raises."""


SETTINGS = FileKind("settings file", 1 * MiB, ConfigError)
ACCELERATE = FileKind("Accelerate config file", 1 * MiB, ConfigError)
DEEPSPEED = FileKind("DeepSpeed config file", 1 * MiB, ConfigError)
INVENTORY = FileKind("inventory file", 16 * MiB, InventoryError)
MODEL_CONFIG = FileKind("model config", 16 * MiB, PlanError)
CALIBRATION_CACHE = FileKind("calibration cache", 64 * MiB, PlanError)
CHECKPOINT_RECORD = FileKind("checkpoint record", 16 * MiB, CheckpointError)
KINDS = (SETTINGS, ACCELERATE, DEEPSPEED, INVENTORY, MODEL_CONFIG, CALIBRATION_CACHE, CHECKPOINT_RECORD)


def shown_path(path: str | os.PathLike[str]) -> str:
    """A path for a one-line message: as it is, or quoted when it holds a newline or another control character;
    a path longer than 200 characters is cut."""
    text = os.fsdecode(path)
    return (text if text.isprintable() else repr(text)) if len(text) <= 200 else shown(text, limit=200)


def _cut(text: str, limit: int = 160) -> str:
    """A parser's message for one line: at most ``limit`` characters, cut ones ending in ``...``."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _a(name: str) -> str:
    return f"an {name}" if name[0] in "AEIOUaeiou" else f"a {name}"


def _size(n: int) -> str:
    return f"{n / MiB:.1f} MiB" if n >= MiB else f"{n:,} bytes"


def _limit(n: int) -> str:
    return f"{n // MiB} MiB" if n % MiB == 0 else f"{n:,} bytes"


def _what_it_is(mode: int) -> str | None:
    """What a file that is not a regular one is, or None for a regular file."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return None if stat.S_ISREG(mode) else "not a regular file"


def read_fd(fd: int, path: str | os.PathLike[str], kind: FileKind) -> bytes:
    """The bytes of the open file ``fd`` (``path`` names it in messages), after ``fstat`` says it is a regular file
    within ``kind.limit``; at most ``kind.limit`` bytes are read whatever its size claims."""
    where = f"{kind.name} {shown_path(path)}"
    info = os.fstat(fd)
    other = _what_it_is(info.st_mode)
    if other is not None:
        raise kind.error(f"{where} is {other}, not a file; give the path of a regular file")
    if info.st_size > kind.limit:
        raise kind.error(f"{where} is {_size(info.st_size)}; {_a(kind.name)} may be at most {_limit(kind.limit)}")
    chunks, left = [], kind.limit + 1
    while left > 0:
        chunk = os.read(fd, min(left, MiB))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    data = b"".join(chunks)
    if len(data) > kind.limit:  # grew while read (or a size fstat does not report)
        raise kind.error(f"{where} is more than {_limit(kind.limit)}; {_a(kind.name)} may be at most "
                         f"{_limit(kind.limit)}")
    return data


def read_bytes(path: str | os.PathLike[str], kind: FileKind) -> bytes:
    """The bytes of the file at ``path`` (see ``read_fd``): ``kind.error`` for one that cannot be read, is not a
    regular file, or is larger than ``kind.limit``; ``FileNotFoundError`` when there is none."""
    where = f"{kind.name} {shown_path(path)}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as err:  # a socket cannot be opened (ENXIO): say what it is
        try:
            other = _what_it_is(os.stat(path).st_mode)
        except OSError:
            other = None
        if other is not None:
            raise kind.error(f"{where} is {other}, not a file; give the path of a regular file") from None
        raise kind.error(f"{where} cannot be read ({err.strerror or err})") from None
    except ValueError:  # a NUL character in the path (possible from Python, never from a shell)
        raise kind.error(f"{where}: a path cannot hold a NUL character") from None
    try:
        return read_fd(fd, path, kind)
    except OSError as err:  # e.g. EISDIR, EIO on read
        raise kind.error(f"{where} cannot be read ({err.strerror or err})") from None
    finally:
        os.close(fd)


def decode(raw: bytes, path: str | os.PathLike[str], kind: FileKind) -> str:
    """``raw`` as UTF-8 text, or ``kind.error`` naming the first bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise kind.error(f"{kind.name} {shown_path(path)} is not UTF-8 text (byte {raw[err.start]:#04x} at offset "
                         f"{err.start})") from None


def read_text(path: str | os.PathLike[str], kind: FileKind) -> str:
    """``read_bytes`` decoded as UTF-8."""
    return decode(read_bytes(path, kind), path, kind)


def depth_problem(data: Any, kind: FileKind, *, most: int = MAX_DEPTH, what: str = "lists or mappings") -> str | None:
    """Why ``data`` (parsed) nests too deeply for ``kind``, or None; walked without recursion."""
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            children = list(value.values())
        elif isinstance(value, list):
            children = value
        else:
            continue
        if depth > most:
            return _too_deep(kind, most, what)
        stack.extend((child, depth + 1) for child in children)
    return None


def _too_deep(kind: FileKind, most: int = MAX_DEPTH, what: str = "lists or mappings") -> str:
    """The one wording of a file nested past ``most``, whichever reader noticed (the parser's recursion limit, which
    other code may have raised, or the walk after it)."""
    return f"nests {what} too deeply (more than {most} deep) to be {_a(kind.name)}"


def _checked_depth(data: Any, path: str | os.PathLike[str], kind: FileKind, what: str = "lists or mappings") -> Any:
    problem = depth_problem(data, kind, what=what)
    if problem is not None:
        raise kind.error(f"{kind.name} {shown_path(path)} {problem}")
    return data


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(text: str, path: str | os.PathLike[str], kind: FileKind) -> Any:
    """``text`` as JSON: ``kind.error`` for invalid JSON, NaN or Infinity, an integer past 4300 digits, or nesting
    deeper than ``MAX_DEPTH``."""
    where = f"{kind.name} {shown_path(path)}"
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as err:
        raise kind.error(f"{where} is not valid JSON (line {err.lineno} column {err.colno}: {err.msg})") from None
    except RecursionError:
        raise kind.error(f"{where} {_too_deep(kind)}") from None
    except ValueError as err:  # an integer past 4300 digits; NaN/Infinity (_no_constant)
        raise kind.error(f"{where} is not valid JSON ({str(err).split(';')[0]})") from None
    return _checked_depth(data, path, kind)


def load_json(path: str | os.PathLike[str], kind: FileKind) -> Any:
    """``read_text`` then ``parse_json``."""
    return parse_json(read_text(path, kind), path, kind)


def parse_toml(text: str, path: str | os.PathLike[str], kind: FileKind) -> dict[str, Any]:
    """``text`` as TOML: ``kind.error`` naming the line and column of invalid TOML, or nesting deeper than
    ``MAX_DEPTH``."""
    import re
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        data = tomllib.loads(text)
    except RecursionError:
        raise kind.error(f"{kind.name} {shown_path(path)} {_too_deep(kind, what='arrays or tables')}") from None
    except ValueError as err:  # TOMLDecodeError is one; int() of a literal past 4300 digits is another
        message = str(err) if isinstance(err, tomllib.TOMLDecodeError) else str(err).split(";")[0]
        found = re.search(r"\(at line (\d+), column (\d+)\)", message)
        reason = message[: found.start()].strip() if found else message
        at = f"line {found.group(1)}, column {found.group(2)}: " if found else ""
        raise kind.error(f"{kind.name} {shown_path(path)}, {at}not valid TOML: {_cut(reason)}") from None
    return _checked_depth(data, path, kind, "arrays or tables")


def parse_yaml(text: str, path: str | os.PathLike[str], kind: FileKind) -> Any:
    """``text`` as YAML with PyYAML's safe loader, refusing aliases and nesting deeper than ``MAX_DEPTH`` before
    they are built: ``kind.error`` (one line, the value cut) for these and for invalid YAML."""
    import yaml  # a declared dependency, imported only here: `convoy --help` stays fast

    where = f"{kind.name} {shown_path(path)}"

    class Refused(Exception):
        pass

    class BoundedLoader(yaml.SafeLoader):
        depth = 0

        def fetch_flow_collection_start(self, token_class: Any) -> None:  # the scanner, before the parser sees it
            if self.flow_level >= MAX_DEPTH:  # each open '[' slows the scanner's every later token: stop early
                raise Refused(f"line {self.line + 1}: {_too_deep(kind)}")
            super().fetch_flow_collection_start(token_class)

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise Refused(f"line {event.start_mark.line + 1}: alias {shown(event.anchor, limit=30)} refused "
                              f"({_a(kind.name)} has no aliases; write the value out)")
            self.depth += 1
            try:
                if self.depth > MAX_DEPTH:
                    mark = self.peek_event().start_mark
                    raise Refused(f"line {mark.line + 1}: {_too_deep(kind)}")
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    loader = None
    try:
        loader = BoundedLoader(text)  # the reader checks every character here (a NUL is a ReaderError)
        return loader.get_single_data()
    except Refused as err:
        raise kind.error(f"{where}, {err}") from None
    except RecursionError:
        raise kind.error(f"{where} {_too_deep(kind)}") from None
    except yaml.YAMLError as err:
        raise kind.error(f"{where} is not valid YAML ({_cut(' '.join(str(err).split()))})") from None
    except ValueError as err:  # e.g. an integer past 4300 digits
        raise kind.error(f"{where} is not valid YAML ({_cut(str(err).split(';')[0])})") from None
    finally:
        if loader is not None:
            loader.dispose()
