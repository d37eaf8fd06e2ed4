"""Run commands for the GPU tests: in a fresh process (the test runner never initialises CUDA), in a session
of their own, stopped with everything they started when they time out."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.processes import finish, start, stop_tree

__all__ = ["run", "run_json", "python", "checks", "returned", "run_ok", "SCRIPTS", "REPO", "Done"]

HERE = Path(__file__).parent
SCRIPTS = HERE / "scripts"
REPO = HERE.parent.parent


@dataclass(frozen=True)
class Done:
    returncode: int
    output: str


def _pythonpath() -> str:
    """The checkout first, then what the shell's PYTHONPATH holds (wheels installed with ``pip --target``)."""
    return os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


def run(argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 300) -> Done:
    """``argv`` (``convoy ...`` means ``python -m convoy ...``) with this environment plus ``env``."""
    argv = list(argv)
    if argv[0] == "convoy":
        argv = [sys.executable, "-m", "convoy", *argv[1:]]
    full = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": _pythonpath(), **(env or {})}
    proc = start(argv, env=full, cwd=str(REPO))
    out = finish(proc, timeout=timeout)
    return Done(proc.returncode, out)


def run_json(argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 300):
    """(exit code, the JSON ``argv`` printed on stdout, stderr) for a ``convoy ... --json`` command."""
    import json
    import subprocess

    argv = [sys.executable, "-m", "convoy", *argv[1:]] if argv[0] == "convoy" else list(argv)
    proc = start(argv, env={**os.environ, "PYTHONPATH": _pythonpath(), **(env or {})}, cwd=str(REPO),
                 stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop_tree(proc.pid)
        proc.communicate()
        raise
    try:
        data = json.loads(out)
    except ValueError:
        data = None
    return proc.returncode, data, f"{out}\n{err}"


def python(code: str, **kwargs) -> Done:
    return run([sys.executable, "-c", code], **kwargs)


def checks(output: str) -> list[str]:
    return [line[len("CHECK "):-len(" ok")] for line in output.splitlines()
            if line.startswith("CHECK ") and line.endswith(" ok")]


def returned(done: Done) -> str:
    """The last line a ``python -c`` printed (its result), with the whole output on failure."""
    assert done.returncode == 0, done.output
    return done.output.strip().splitlines()[-1]


def run_ok(argv: Sequence[str], **kwargs) -> str:
    done = run(argv, **kwargs)
    assert done.returncode == 0, done.output[-6000:]
    return done.output


