"""What the fast commands import when they start (issue 38, item 4): a module they do not need, imported again by
some change, would slow every start without any test failing, so the modules are checked here (the timings are
measurements, ``benchmarks/cli_latency.py``, never asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from convoy.reading import path_and_name

#: run a command in-process in a fresh interpreter, then print the modules it imported
_IMPORTED = textwrap.dedent("""
    import contextlib, io, json, sys
    from convoy.cli.main import main
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(sys.argv[1:])
    print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
""")


def _imported(argv, env):
    proc = subprocess.run([sys.executable, "-c", _IMPORTED, *argv], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["code"] == 0, proc.stderr
    return set(out["modules"])


#: what `convoy select` and `convoy devices` never need: torch and the planner; pathlib (it imports urllib.parse and
#: ipaddress), shutil (bz2, lzma: argparse's help width), typing, signal (only a stopped command reports one), the
#: memory-amount parser (only --min-free-memory / --max-utilization)
_NOT_FOR_DEVICES = {"torch", "convoy.plan", "pathlib", "urllib.parse", "shutil", "typing", "signal",
                    "convoy.devices.amounts"}


@pytest.mark.parametrize("argv", [["select", "2", "--free", "--format", "env"], ["devices", "--json"]],
                         ids=["select", "devices"])
def test_device_commands_import_only_what_they_use(argv, inventory_path, tmp_path):
    env = {"CONVOY_INVENTORY": str(inventory_path("8xh100_nvswitch")), "CONVOY_LEASE_DIR": str(tmp_path)}
    assert not _imported(argv, env) & _NOT_FOR_DEVICES


def test_a_plan_by_numbers_imports_neither_torch_nor_typing_nor_pathlib():
    modules = _imported(["plan", "--params", "70e9", "--hardware", "8xH100-80GB"], {})
    assert "convoy.plan.api" in modules  # the check reads the plan's own process
    assert not modules & {"torch", "shutil", "typing", "signal", "pathlib", "convoy.plan.plot",
                          "convoy.plan.speed.measure"}


@pytest.mark.parametrize("text", ["box.json", "./box.json", "a//b/./c/", "/abs/x.json", "//net/x", "///x", ".", "",
                                  "a/../b", "/"])
def test_a_path_reads_as_pathlib_reads_it(text):
    from pathlib import Path

    assert path_and_name(text) == (str(Path(text)), Path(text).name)


def test_the_command_starts_without_inspect_and_ast(inventory_path, tmp_path):
    # the console script's process (entry_point, as `python -m convoy`): dataclasses' import of inspect is deferred
    env = {**os.environ, "CONVOY_INVENTORY": str(inventory_path("8xh100_nvswitch")), "CONVOY_LEASE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "convoy", "select", "2", "--free", "--format",
                           "env"], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0 and "CUDA_VISIBLE_DEVICES=0,1" in proc.stdout, proc.stderr
    imported = {line.rpartition("|")[2].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "dataclasses" in imported  # the check reads the command's own imports
    assert not imported & {"inspect", "ast", "dis", "tokenize"}


_DEFERRED = textwrap.dedent("""
    import sys
    from convoy.cli.main import _inspect_when_used
    _inspect_when_used()
    import dataclasses
    assert "ast" not in sys.modules and type(sys.modules["inspect"]).__name__ == "_ImportedWhenUsed"

    @dataclasses.dataclass
    class Undocumented:  # dataclasses writes its docstring with inspect.signature: the first use imports it
        a: int
        b: str = "x"

    import inspect
    from inspect import signature
    assert Undocumented.__doc__ == "Undocumented(a: int, b: str = 'x')", Undocumented.__doc__
    assert str(signature(lambda a, b=1: 0)) == "(a, b=1)" and inspect.isfunction(signature)
    assert sys.modules["inspect"] is inspect and "ast" in sys.modules
    print("ok")
""")


def test_inspect_deferred_is_inspect_when_used():
    proc = subprocess.run([sys.executable, "-c", _DEFERRED], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
