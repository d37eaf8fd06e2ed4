"""Run a script on several CPU processes (gloo), the way users run it, and return what it printed.

CPU processes on every machine: a GPU box runs the same gloo job (``--devices 0`` and hidden accelerators),
so the default suite gives the same result there; GPU runs are the ``gpu``-marked tests (``tests/gpu``).

    from tests.distributed import run_script
    result = run_script(SCRIPTS / "ddp_parity.py", nproc=2, args=["--steps", "3"])
    assert result.returncode == 0, result.output

Every distributed test goes through here, so the launcher under test is chosen in one place: ``convoy
launch`` once it exists (``CONVOY_TEST_LAUNCHER=torchrun`` switches to torchrun for comparison).

``convoy launch`` ends each rank without the interpreter's teardown, where gloo can abort a finished process
(``convoy.launch.worker_exit``); torchrun does not, so the scripts end with ``exit_without_teardown()`` (they put
the repo root on ``sys.path`` first, as they do for every ``tests.*`` import; this module imports nothing but the
standard library and ``tests.processes``, so a rank may import it):

    if __name__ == "__main__":
        main()
        exit_without_teardown()
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from tests.processes import finish, start

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Result:
    returncode: int
    output: str  # stdout and stderr together, in order


def launcher_argv(nproc: int) -> list[str]:
    """The command prefix that starts ``nproc`` CPU processes on this machine, whatever accelerators it has.

    ``--devices 0`` is the launcher's "no accelerator" (Lightning's table): ``nproc`` gloo processes even on a
    GPU box, where "2 ranks" would otherwise mean 2 GPUs (and fail on a box with one).
    """
    if os.environ.get("CONVOY_TEST_LAUNCHER", "convoy") == "torchrun" or not _convoy_launch_exists():
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    return [sys.executable, "-m", "convoy", "launch", "--devices", "0", f"--nproc-per-node={nproc}"]


def cpu_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment for a job of CPU processes: accelerators hidden from the workers (torchrun
    does not hide them itself), one intra-op thread per rank, unbuffered output, then ``env`` on top."""
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}


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
    """Start ``script`` on ``nproc`` CPU processes and wait for it (``timeout`` seconds at most).

    The launcher runs in a session of its own; on timeout it is stopped with every process below it before
    ``subprocess.TimeoutExpired`` is raised (its output attached), so a hung job leaves nothing behind.
    """
    proc = start([*launcher_argv(nproc), str(script), *args], env=cpu_env(env), cwd=cwd)
    output = finish(proc, timeout=timeout)
    return Result(proc.returncode, output)


def exit_without_teardown(code: int = 0) -> NoReturn:
    """End a script's rank once its work is done: flush its output, then leave at once, skipping the
    interpreter's teardown, where gloo can abort a finished process (pytorch/pytorch#179291)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
