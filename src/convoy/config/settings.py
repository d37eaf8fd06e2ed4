"""The effective settings of a run, and where each value came from.

    from convoy.config.settings import effective_settings
    settings = effective_settings(flags={"strategy": "ddp"})      # flags as parsed from a command line
    settings.get("mixed_precision")                                # "bf16"
    settings.source("mixed_precision")                             # "environment CONVOY_MIXED_PRECISION"

Precedence, highest first: flag > torchrun's variable (``PET_<OPTION>``, for the settings that are torchrun
options: ``nnodes``, ``nproc_per_node``, ``rdzv_backend``, ``rdzv_endpoint``, ``rdzv_id``, ``max_restarts``) >
environment (``CONVOY_<KEY>``) > project file (``./convoy.toml``) > user file (``$CONVOY_CONFIG`` or
``$XDG_CONFIG_HOME/convoy/config.toml``) > default. Resolution is a pure function of its arguments (``env``
and ``cwd`` default to the process's) and the two files; nothing is cached and nothing is written. Torch-free.

    $ convoy config show          # the same table on the command line

torchrun reads each of its options also from ``PET_<OPTION>`` (``torch.distributed.argparse_util``: the
``env`` action makes the variable the flag's default, ``check_env`` reads a switch such as ``--standalone``
as a number, 0 off and anything else on); a flag wins. Schedulers configure a job that way (Kubeflow's
training operator sets ``PET_NNODES``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``, ... in every pod), so
``convoy launch`` reads them as torchrun does (``torchrun_env``). They sit above ``CONVOY_*`` and the files:
they are written for this one job on this one node by whatever started it, as a flag would be, while
``CONVOY_*`` and the files are standing preferences. A blank variable counts as unset, as for ``CONVOY_*``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from convoy.config.files import project_config_path, read_settings_file, user_config_path
from convoy.config.schema import BUILTIN_STRATEGIES, KEYS, SCHEMA, key_for
from convoy.errors import ConfigError, shown

__all__ = ["Source", "Settings", "effective_settings", "file_settings_env", "fill_unset", "fill_unset_with_origins",
           "said", "SOURCE_KINDS", "TORCHRUN_OPTIONS", "TORCHRUN_SWITCHES", "torchrun_variable", "torchrun_env",
           "read_switch"]

#: the places a value can come from, highest precedence first.
SOURCE_KINDS = ("flag", "environment", "project file", "user file", "default")

#: torchrun's options that it also reads from ``PET_<OPTION>`` (torch 2.13 ``torch.distributed.run``: every
#: option with the ``env`` or ``check_env`` action; ``--logs-specs`` and ``--numa-binding`` have none), each
#: named by its argparse ``dest``, which is also convoy launch's
TORCHRUN_OPTIONS = (
    "nnodes", "nproc_per_node", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf", "standalone",
    "max_restarts", "monitor_interval", "start_method", "event_log_handler", "role", "module", "no_python",
    "run_path", "log_dir", "redirects", "tee", "local_ranks_filter", "duplicate_stdout_filters",
    "duplicate_stderr_filters", "node_rank", "master_addr", "master_port", "local_addr", "signals_to_handle",
    "shutdown_timeout", "virtual_local_rank",
)
#: those read as a switch (torchrun's ``check_env``: ``PET_STANDALONE=1`` is ``--standalone``)
TORCHRUN_SWITCHES = ("standalone", "module", "no_python", "run_path", "virtual_local_rank")
_SWITCH = re.compile(r"\s*[0-9]{1,9}\s*")


def torchrun_variable(name: str) -> str:
    """``PET_NNODES`` for ``nnodes``: the variable torchrun reads option ``name`` from (``PET_`` + its dest)."""
    return "PET_" + name.upper()


def torchrun_env(env: Mapping[str, str] | None = None, *, skip: Iterable[str] = ()) -> dict[str, tuple[str, Source]]:
    """torchrun's options set in ``env`` as ``PET_<OPTION>``: option name -> (the variable's text, its
    ``Source``), for each variable set and not blank; ``skip``: options given otherwise (a flag wins).

        torchrun_env({"PET_NNODES": "2", "PET_NODE_RANK": "1"})
        # {"nnodes": ("2", Source("environment", "PET_NNODES")), "node_rank": ("1", Source(..., "PET_NODE_RANK"))}

    The text is not parsed here: each option's own parser reads it, as it reads the flag (``read_switch`` for
    a switch), naming the variable (``Source.said``) when it refuses it."""
    env = os.environ if env is None else env
    skipped = set(skip)
    found = {}
    for name in TORCHRUN_OPTIONS:
        variable = torchrun_variable(name)
        raw = env.get(variable)
        if name not in skipped and raw is not None and raw.strip():
            found[name] = (raw, Source("environment", variable))
    return found


def read_switch(raw: str, *, where: str) -> bool:
    """A switch's ``PET_<OPTION>`` as torchrun's ``check_env`` reads it: a whole number, 0 off and anything else
    on (``bool(int(text))``); ``ConfigError`` naming ``where`` otherwise (torchrun stops with a ValueError
    traceback on 'true')."""
    if not isinstance(raw, str) or not _SWITCH.fullmatch(raw):
        raise ConfigError(f"{where}: {shown(raw)} is not valid; expected 1 (on) or 0 (off), as torchrun reads it")
    return int(raw) != 0


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
            return self.location if value is True else f"{self.location} {value}"  # a switch: --standalone
        if self.kind == "environment":
            if isinstance(value, bool) and self.location.startswith("PET_"):
                value = int(value)  # torchrun's switches are numbers: PET_STANDALONE=1
            return f"{self.location}={value}"
        if self.kind == "default":
            return f"{key} {value} (the default)"
        return f"{key} = {value} ({self.location}" + (f", line {self.line})" if self.line else ")")


def said(origins: Mapping[str, Source], key: str, value: Any) -> str:
    """Setting or option ``key`` holding ``value`` as the user gave it: from ``origins`` (key -> ``Source``, as
    ``fill_unset_with_origins`` returns them, or torchrun's ``PET_<OPTION>``), else as its flag
    (``--nproc-per-node 99``; an option that is not a setting, such as ``node_rank``, as ``--node-rank``)."""
    flag = KEYS[key].flag if key in KEYS else "--" + key.replace("_", "-")
    return (origins.get(key) or Source("flag", flag)).said(key, value)


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

    def launch_refuses(self) -> list[str]:
        """What ``convoy launch`` would refuse in these values though each is well formed, one line each naming where
        it was set (``convoy config show`` warns with them): a strategy that is not one of convoy's own."""
        strategy = self.values.get("strategy")
        if strategy is None or strategy in BUILTIN_STRATEGIES:
            return []
        return [f"{self.sources['strategy'].said('strategy', shown(strategy))} is not one of convoy's strategies "
                f"({', '.join(BUILTIN_STRATEGIES)}): convoy launch refuses it (a strategy your script registers "
                f"itself is chosen in the script, Accelerator(strategy=...))"]

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """``{key: {"value": ..., "source": "...", "doc": "..."}}`` in schema order (for ``--json``)."""
        return {k: {"value": self.values[k], "source": self.source(k), "doc": KEYS[k].doc} for k in self.values}


def effective_settings(
    *,
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> Settings:
    """Resolve every setting: flag > ``PET_<KEY>`` (torchrun's options) > ``CONVOY_<KEY>`` > ``./convoy.toml`` >
    user file > default.

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
    for name, (raw, source) in torchrun_env(env).items():  # above CONVOY_*: see the module docstring
        if name in KEYS:
            values[name], sources[name] = KEYS[name].parse(raw, where=f"environment {source.location}"), source
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
                                       if not k.startswith(("CONVOY_", "PET_")) or k == "CONVOY_CONFIG"}, cwd=cwd)
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
    env = os.environ if env is None else env
    given = {torchrun_variable(name) for name, value in values.items() if value is not None}
    # a flag given is not read from its PET_ variable at all, as torchrun reads them (a bad one is not refused)
    settings = effective_settings(env={k: v for k, v in env.items() if k not in given}, cwd=cwd)
    for name in settings:
        if name in values and values[name] is None and settings.origin(name).kind != "default":
            value = settings.get(name)
            if value is not None and value != "":
                values[name], origins[name] = value, settings.origin(name)
    return values, origins
