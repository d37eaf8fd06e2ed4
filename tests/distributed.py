"""Run a script on several CPU processes (gloo), the way users run it, and return what it printed.

    from tests.distributed import run_script
    result = run_script(SCRIPTS / "ddp_parity.py", nproc=2, args=["--steps", "3"])
    assert result.returncode == 0, result.output

Every distributed test goes through here, so the launcher under test is chosen in one place: ``convoy
launch`` once it exists (``CONVOY_TEST_LAUNCHER=torchrun`` switches to torchrun for comparison).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Result:
    returncode: int
    output: str  # stdout and stderr together, in order


def launcher_argv(nproc: int) -> list[str]:
    """The command prefix that starts ``nproc`` CPU processes on this machine."""
    if os.environ.get("CONVOY_TEST_LAUNCHER", "convoy") == "torchrun" or not _convoy_launch_exists():
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    return [sys.executable, "-m", "convoy", "launch", f"--nproc-per-node={nproc}"]


def _convoy_launch_exists() -> bool:
    return (REPO / "src" / "convoy" / "cli" / "launch.py").exists()


def run_script(
    script: str | Path,
    *,
    nproc: int = 2,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
    cwd: str | Path | None = None,
) -> Result:
    """Start ``script`` on ``nproc`` processes and wait for it (``timeout`` seconds at most)."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("CONVOY_INVENTORY", None) if env is None or "CONVOY_INVENTORY" not in env else None
    proc = subprocess.run(
        [*launcher_argv(nproc), str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=cwd,
    )
    return Result(proc.returncode, proc.stdout)
