"""Settings files: where they live, how they are read (with line numbers for errors) and written.

    from convoy.config.files import user_config_path, read_settings_file, write_settings_file
    path = user_config_path()                         # $CONVOY_CONFIG, else $XDG_CONFIG_HOME/convoy/config.toml
    values = read_settings_file(path)                 # {"strategy": FileValue("ddp", line=2), ...}
    write_settings_file(path, {"strategy": "ddp"})    # merges with what the file already holds

Files are TOML with top-level keys from ``convoy.config.schema``. A malformed file, an unknown key or a
wrong value raises ``ConfigError`` naming the file, the line and the key. Torch-free.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from convoy.config.schema import KEYS, SCHEMA, closest_key
from convoy.errors import ConfigError, shown
from convoy.reading import SETTINGS, parse_toml, read_text

__all__ = [
    "PROJECT_FILE",
    "FileValue",
    "user_config_path",
    "project_config_path",
    "read_settings_file",
    "write_settings_file",
]

PROJECT_FILE = "convoy.toml"


@dataclass(frozen=True)
class FileValue:
    """A checked value read from a file, and the line it is on (1-based; 0 when not found)."""

    value: Any
    line: int


def user_config_path(env: Mapping[str, str] | None = None) -> Path:
    """The user's settings file: ``$CONVOY_CONFIG``, else ``$XDG_CONFIG_HOME/convoy/config.toml``,
    else ``~/.config/convoy/config.toml``."""
    env = os.environ if env is None else env
    if env.get("CONVOY_CONFIG"):
        if "\0" in env["CONVOY_CONFIG"]:
            raise ConfigError(f"CONVOY_CONFIG={shown_path(env['CONVOY_CONFIG'])}: a path cannot hold a NUL character")
        return Path(env["CONVOY_CONFIG"]).expanduser()
    base = env.get("XDG_CONFIG_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".config")
    return Path(base).expanduser() / "convoy" / "config.toml"


def project_config_path(cwd: str | os.PathLike[str] | None = None) -> Path:
    """The project's settings file: ``./convoy.toml`` in ``cwd`` (default: the current directory)."""
    return Path(os.getcwd() if cwd is None else cwd) / PROJECT_FILE


def _line_of(lines: list[str], key: str) -> int:
    """Line (1-based) where ``key`` is assigned or opens a table; 0 if it cannot be found."""
    quoted = re.escape(key)
    pattern = re.compile(rf"""^\s*(\[\s*)?(?:{quoted}|"{quoted}"|'{quoted}')\s*(=|\]|\.)""")
    for number, line in enumerate(lines, 1):
        if pattern.match(line):
            return number
    return 0


def _where(path: Path, line: int, key: str) -> str:
    return f"{shown_path(path)}, line {line}, key {shown(key)}" if line else f"{shown_path(path)}, key {shown(key)}"


def shown_path(path: str | os.PathLike[str]) -> str:
    """A path for a one-line message: as it is, or quoted when it holds a newline or another control character."""
    text = str(path)
    return text if text.isprintable() else repr(text)


def read_settings_file(path: str | os.PathLike[str]) -> dict[str, FileValue]:
    """Read and check a settings file; ``ConfigError`` (file, line, key) for anything wrong in it."""
    path = Path(path)
    try:
        text = read_text(path, SETTINGS)  # bounded: a FIFO, a device, a directory or 50 MiB is one line
    except FileNotFoundError:
        raise ConfigError(f"{shown_path(path)}: settings file not found; create it with "
                          f"'convoy config --path {shown_path(path)}'") from None
    return _settings_from_text(text, path)


def _settings_from_text(text: str, path: Path) -> dict[str, FileValue]:
    """A settings file's text, checked as ``read_settings_file`` checks it (``write_settings_file`` checks what
    it is about to write the same way)."""
    data = parse_toml(text, path, SETTINGS)  # bounded, and placed by line (convoy.reading)
    lines = text.splitlines()
    values: dict[str, FileValue] = {}
    for name, raw in data.items():
        line = _line_of(lines, name)
        if name not in KEYS:
            close = closest_key(name)
            hint = f" (did you mean '{close}'?)" if close else f"; known keys: {', '.join(KEYS)}"
            kind = "table" if isinstance(raw, dict) else "key"
            raise ConfigError(f"{_where(path, line, name)}: unknown {kind}{hint}")
        if isinstance(raw, dict):
            raise ConfigError(f"{_where(path, line, name)}: expected a value, found a table "
                              f"(write '{name} = ...' at the top level)")
        values[name] = FileValue(KEYS[name].parse(raw, where=_where(path, line, name), typed=True), line)
    return values


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def write_settings_file(path: str | os.PathLike[str], values: Mapping[str, Any]) -> Path:
    """Check ``values``, merge them into the file at ``path`` (created if missing) and return the path.

    Keys already in the file and not in ``values`` are kept; a value of ``None`` removes the key. The
    file is rewritten in schema order with each key's meaning as a comment, atomically.
    """
    path = Path(path).expanduser()
    merged: dict[str, Any] = {}
    if path.exists():
        merged = {name: fv.value for name, fv in read_settings_file(path).items()}
    for name, raw in values.items():
        if name not in KEYS:
            close = closest_key(name)
            hint = f" (did you mean '{close}'?)" if close else f"; known keys: {', '.join(KEYS)}"
            raise ConfigError(f"setting '{name}': unknown key{hint}")
        if raw is None:
            merged.pop(name, None)
            continue
        value = KEYS[name].parse(raw, where=f"setting '{name}'")
        if isinstance(value, str) and not _is_utf8(value):  # e.g. a byte 0xff from the shell ('\udcff')
            raise ConfigError(f"setting '{name}': {shown(raw)} is not UTF-8 text, which a settings file (TOML) "
                              f"holds; give the value in UTF-8")
        merged[name] = value
    body = ["# convoy settings (see 'convoy config keys'); precedence:",
            "# flag > CONVOY_<KEY> environment variable > ./convoy.toml > user file > default", ""]
    for key in SCHEMA:
        if key.name in merged:
            value = merged[key.name]
            if key.name == "nproc_per_node" and str(value).isdigit():  # a number unquoted: a quoted one is refused
                value = int(value)
            body += [f"# {key.doc}", f"{key.name} = {_toml_value(value)}", ""]
    text = "\n".join(body)
    # what is written must read back as it is: the reader's own checks, before the file is replaced
    back = {name: fv.value for name, fv in _settings_from_text(text, path).items()}
    if back != merged:
        changed = next(name for name in merged if back.get(name) != merged[name])
        raise ConfigError(f"setting '{changed}': {shown(merged[changed])} would read back from {shown_path(path)} "
                          f"as {shown(back.get(changed))}; give it as 'convoy config keys' describes")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise ConfigError(f"{shown_path(path)}: cannot write the settings file ({err.strerror or err}); choose a "
                          f"writable path with --path, e.g. ./convoy.toml") from None
    return path
