"""``convoy config``: write convoy's settings file, or show the effective settings and their sources.

    convoy config                                   # answer a few questions (on a terminal)
    convoy config --strategy ddp --mixed-precision bf16          # or give the values as flags
    convoy config --path ./convoy.toml --devices 0,1             # a project file instead of the user file
    convoy config show [--json]                     # every value and where it came from
    convoy config keys                              # every key, its type, default and meaning

Library: ``convoy.config.write_settings_file`` and ``convoy.config.effective_settings``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any, TextIO

from convoy.config import SCHEMA, effective_settings, read_settings_file, user_config_path, write_settings_file
from convoy.config.schema import Key
from convoy.errors import ConfigError, ConvoyWarning

DESCRIPTION = "Write convoy's settings file (questions or flags), or show the effective settings and their sources."
EPILOG = """examples:
  convoy config                                      answer a few questions; writes the user file
  convoy config --strategy ddp --mixed-precision bf16   set values from a script (no questions)
  convoy config --path ./convoy.toml --devices 0,1   write a project file instead
  convoy config --max-restarts ''                    remove a key from the file
  convoy config show                                 effective values and where each came from
  CONVOY_STRATEGY=fsdp convoy config show --json     the same as JSON, with the variable in force
  convoy config keys                                 every key with its type, default and meaning

precedence: flag > CONVOY_<KEY> environment variable > ./convoy.toml > user file > default.
user file: $CONVOY_CONFIG, else $XDG_CONFIG_HOME/convoy/config.toml, else ~/.config/convoy/config.toml."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=("show", "keys"), metavar="show|keys",
                        help="'show': effective settings and their sources; 'keys': every key and its meaning; "
                             "omitted: write the settings file")
    parser.add_argument("--path", metavar="FILE",
                        help="the settings file to write (or, with 'show', to read as the user file); "
                             "default: the user file")
    parser.add_argument("--json", action="store_true", help="with 'show' or 'keys': print JSON")
    parser.add_argument("--interactive", action="store_true",
                        help="ask the questions even when standard input is not a terminal")
    group = parser.add_argument_group("settings (each also reads CONVOY_<KEY>; '' removes it from the file)")
    for key in SCHEMA:
        choices = f" ({'|'.join(key.choices)})" if key.choices else ""
        group.add_argument(key.flag, dest=key.name, metavar="VALUE",
                           help=f"{key.doc} [{key.type}{choices}; default {key.default!r}]")


def _given(args: argparse.Namespace) -> dict[str, Any]:
    return {key.name: getattr(args, key.name) for key in SCHEMA if getattr(args, key.name) is not None}


def run(args: argparse.Namespace) -> int:
    if args.action == "keys":
        return _print_keys(as_json=args.json)
    if args.action == "show":
        env = dict(os.environ)
        if args.path:
            env["CONVOY_CONFIG"] = args.path
        flags = {name: value for name, value in _given(args).items() if value != ""}
        settings = effective_settings(flags=flags, env=env)
        for line in settings.launch_refuses():  # shown, with a warning: the other values stay in view
            warnings.warn(line, ConvoyWarning, stacklevel=1)
        if args.json:
            print(json.dumps({"files": [str(p) for p in settings.files], "settings": settings.as_dict()}, indent=2))
            return 0
        width = max(len(k.name) for k in SCHEMA)
        for name in settings:
            print(f"{name:<{width}}  {json.dumps(settings.get(name)):<14}  {settings.source(name)}")
        return 0
    if args.json:
        raise ConfigError("--json goes with 'convoy config show' or 'convoy config keys'")
    path = args.path or str(user_config_path())
    given = {name: (None if value == "" else value) for name, value in _given(args).items()}
    if not given:
        if not (args.interactive or sys.stdin.isatty()):
            raise ConfigError("nothing to write: give settings as flags (e.g. 'convoy config --strategy ddp') or "
                              "run 'convoy config' on a terminal (or with --interactive) to answer questions")
        current = {n: fv.value for n, fv in read_settings_file(path).items()} if os.path.exists(path) else {}
        given = ask(current, read=input, out=sys.stdout)
    written = write_settings_file(path, given)
    print(f"wrote {written}")
    return 0


def ask(current: dict[str, Any], *, read: Callable[[str], str], out: TextIO, tries: int = 3) -> dict[str, Any]:
    """Ask for each key marked ``ask`` (Enter keeps the shown value); return the answers, checked.

    A wrong answer is explained and asked again, ``tries`` times at most; end of input stops the questions
    and keeps what was answered so far.
    """
    answers: dict[str, Any] = {}
    for key in (k for k in SCHEMA if k.ask):
        shown = current.get(key.name, key.default)
        for attempt in range(tries):
            try:
                text = read(_question(key, shown)).strip()
            except EOFError:
                print(file=out)
                return answers
            try:
                answers[key.name] = shown if text == "" else key.parse(text, where=key.name)
                break
            except ConfigError as err:
                if attempt == tries - 1:
                    raise
                print(f"  {err}", file=out)
    return answers


def _question(key: Key, shown: Any) -> str:
    options = f" ({'/'.join(key.choices)})" if key.choices else ""
    value = json.dumps(shown) if isinstance(shown, bool) else str(shown)
    return f"{key.doc}\n  {key.name}{options} [{value}]: "


def _print_keys(*, as_json: bool) -> int:
    if as_json:
        rows = [{"key": k.name, "type": k.type, "default": k.default, "flag": k.flag, "env": k.env_var,
                 "doc": k.doc} for k in SCHEMA]
        print(json.dumps(rows, indent=2))
        return 0
    for key in SCHEMA:
        print(f"{key.name}  ({key.type}; default {key.default!r}; {key.flag}, {key.env_var})\n    {key.doc}")
    return 0
