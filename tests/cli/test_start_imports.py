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
