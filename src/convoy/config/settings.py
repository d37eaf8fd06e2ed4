"""The effective settings of a run, and where each value came from.

    from convoy.config.settings import effective_settings
    settings = effective_settings(flags={"strategy": "ddp"})      # flags as parsed from a command line
    settings.get("mixed_precision")                                # "bf16"
    settings.source("mixed_precision")                             # "environment CONVOY_MIXED_PRECISION"

Precedence, highest first: flag > environment (``CONVOY_<KEY>``) > project file (``./convoy.toml``) >
user file (``$CONVOY_CONFIG`` or ``$XDG_CONFIG_HOME/convoy/config.toml``) > default. Resolution is a pure
function of its arguments (``env`` and ``cwd`` default to the process's) and the two files; nothing is
cached and nothing is written. Torch-free.

    $ convoy config show          # the same table on the command line
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from convoy.config.files import project_config_path, read_settings_file, user_config_path
from convoy.config.schema import KEYS, SCHEMA, key_for

__all__ = ["Source", "Settings", "effective_settings", "file_settings_env", "fill_unset", "fill_unset_with_origins",
           "said", "SOURCE_KINDS"]

#: the places a value can come from, highest precedence first.
SOURCE_KINDS = ("flag", "environment", "project file", "user file", "default")


@dataclass(frozen=True)
class Source:
    """Where a value came from: ``kind`` is one of ``SOURCE_KINDS``; ``location`` is the flag, variable or
    file (empty for a default); ``line`` is the file line (0 when not a file)."""

    kind: str
    location: str = ""
    line: int = 0

    def __str__(self) -> str:
        if self.line:
            return f"{self.kind} {self.location}:{self.line}"
        return f"{self.kind} {self.location}".strip()

    def said(self, key: str, value: Any) -> str:
        """``key`` holding ``value`` as the user wrote it here, for a message about it: ``--nproc-per-node 99``,
        ``CONVOY_NPROC_PER_NODE=99``, ``nproc_per_node = 99 (/repo/convoy.toml, line 3)``."""
        if self.kind == "flag":
            return f"{self.location} {value}"
        if self.kind == "environment":
            return f"{self.location}={value}"
        if self.kind == "default":
            return f"{key} {value} (the default)"
        return f"{key} = {value} ({self.location}" + (f", line {self.line})" if self.line else ")")


def said(origins: Mapping[str, Source], key: str, value: Any) -> str:
    """Setting ``key`` holding ``value`` as the user gave it: from ``origins`` (key -> ``Source``, as
    ``fill_unset_with_origins`` returns them), else as its flag (``--nproc-per-node 99``)."""
    return (origins.get(key) or Source("flag", KEYS[key].flag)).said(key, value)


@dataclass(frozen=True)
class Settings:
    """Every key's effective value and its source. Read with ``get`` and ``source``."""

    values: Mapping[str, Any]
    sources: Mapping[str, Source]
    files: tuple[Path, ...] = field(default=())
    """The settings files that were read (existing ones only), highest precedence first."""

    def get(self, key: str, default: Any = None) -> Any:
        """The effective value of ``key``; ``default`` when it is unset (its schema default is ``None``).

        An unknown key raises ``ConfigError`` with the closest known key, so a typo cannot read as unset.
        """
        key_for(key, where="Settings.get")
        value = self.values.get(key)
        return default if value is None else value

    def source(self, key: str) -> str:
        """Where ``key``'s value came from, for people: ``"flag --strategy"``, ``"default"``, ..."""
        return str(self.origin(key))

    def origin(self, key: str) -> Source:
        """Where ``key``'s value came from, as data."""
        key_for(key, where="Settings.source")
        return self.sources[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """``{key: {"value": ..., "source": "...", "doc": "..."}}`` in schema order (for ``--json``)."""
        return {k: {"value": self.values[k], "source": self.source(k), "doc": KEYS[k].doc} for k in self.values}


def effective_settings(
    *,
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> Settings:
    """Resolve every setting: flag > ``CONVOY_<KEY>`` > ``./convoy.toml`` > user file > default.

    ``flags`` maps key names to values (``None`` means "not given" and is skipped, so an argparse
    namespace's ``vars()`` restricted to setting names can be passed as is). An empty environment
    variable counts as unset. ``ConfigError`` names the flag, variable or file/line/key of a bad value.
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = {key.name: key.default for key in SCHEMA}
    sources: dict[str, Source] = {key.name: Source("default") for key in SCHEMA}
    files: list[Path] = []
    user = user_config_path(env)
    if env.get("CONVOY_CONFIG") or user.is_file():
        files.append(user)
        for name, fv in read_settings_file(user).items():
            values[name], sources[name] = fv.value, Source("user file", str(user), fv.line)
    project = project_config_path(cwd)
    if project.is_file() and project.resolve() != user.resolve():
        files.append(project)
        for name, fv in read_settings_file(project).items():
            values[name], sources[name] = fv.value, Source("project file", str(project), fv.line)
    for key in SCHEMA:
        raw = env.get(key.env_var)
        if raw is not None and raw.strip() != "":
            values[key.name] = key.parse(raw, where=f"environment {key.env_var}")
            sources[key.name] = Source("environment", key.env_var)
    for name, raw in (flags or {}).items():
        if raw is None:
            continue
        key = key_for(name, where="flag")
        values[name] = key.parse(raw, where=f"flag {key.flag}")
        sources[name] = Source("flag", key.flag)
    return Settings(values=values, sources=sources, files=tuple(reversed(files)))


def file_settings_env(env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None
                      ) -> dict[str, str]:
    """The settings files' values as ``CONVOY_<KEY>`` variables, for a layer *below* the environment.

    ``{**file_settings_env(env), **env}`` is the environment a component reads when it understands
    ``CONVOY_*`` variables (the Accelerator): the variables win, the files fill in, defaults stay the
    component's own. Only keys set in a file appear.
    """
    settings = effective_settings(env={k: v for k, v in (os.environ if env is None else env).items()
                                       if not k.startswith("CONVOY_") or k == "CONVOY_CONFIG"}, cwd=cwd)
    out: dict[str, str] = {}
    for name in settings:
        if settings.origin(name).kind in ("project file", "user file"):
            value = settings.get(name)
            out[KEYS[name].env_var] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


def fill_unset(flags: Mapping[str, Any], *, env: Mapping[str, str] | None = None,
               cwd: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """``fill_unset_with_origins(...)[0]``: the values only.

        fill_unset({"strategy": None, "max_restarts": 2})    # {"strategy": "fsdp", "max_restarts": 2}
                                                              # with CONVOY_STRATEGY=fsdp
    """
    return fill_unset_with_origins(flags, env=env, cwd=cwd)[0]


def fill_unset_with_origins(flags: Mapping[str, Any], *, env: Mapping[str, str] | None = None,
                            cwd: str | os.PathLike[str] | None = None) -> tuple[dict[str, Any], dict[str, Source]]:
    """A copy of ``flags`` (setting name -> the value a command was given, ``None`` where it was not) whose
    unset settings are filled from the environment and the settings files.

        fill_unset_with_origins({"strategy": None, "max_restarts": 2})    # with CONVOY_STRATEGY=fsdp:
        # ({"strategy": "fsdp", "max_restarts": 2}, {"strategy": Source("environment", "CONVOY_STRATEGY")})

    Given values are kept and schema defaults are not applied (the command keeps its own); names that are not
    settings are returned as given. Also returns where each filled value came from (setting name -> ``Source``),
    so that a later check names the variable or the file and key, not the flag that was not given
    (``Source.said``)."""
    values = dict(flags)
    origins: dict[str, Source] = {}
    settings = effective_settings(env=env, cwd=cwd)
    for name in settings:
        if name in values and values[name] is None and settings.origin(name).kind != "default":
            value = settings.get(name)
            if value is not None and value != "":
                values[name], origins[name] = value, settings.origin(name)
    return values, origins
