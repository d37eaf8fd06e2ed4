"""The direct engine's launcher process: torch-free, every rank's output, one-line start failures."""

from __future__ import annotations

import sys

import pytest

from tests import processes
from tests.distributed import cpu_env

ENV = cpu_env()  # CPU processes on every machine: --devices 0 below


@pytest.mark.slow
def test_a_direct_launch_never_imports_torch_in_the_launcher():
    """The launcher starts the workers at once instead of first spending seconds on ``import torch``."""
    code = ("import sys; from convoy.cli.main import main; "
            "rc = main(['launch', '--devices', '0', '--nproc-per-node', '3', "
            "'--no-python', 'sh', '-c', 'echo rank=$RANK of $WORLD_SIZE']); "
            "print('torch loaded:', 'torch' in sys.modules, 'rc:', rc)")
    proc = processes.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=60)
    lines = proc.stdout.splitlines()
    assert lines[-1] == "torch loaded: False rc: 0", proc.stdout + proc.stderr
    assert sorted(lines[:-1]) == [f"[rank{r}]: rank={r} of 3" for r in range(3)]


@pytest.mark.slow
def test_every_line_of_a_quick_exit_reaches_the_console():
    """Workers that print and exit at once: the launcher ends only after their last line is out."""
    script = "for i in $(seq 1 200); do echo line-$i; done; echo err-last >&2"
    proc = processes.run([sys.executable, "-m", "convoy", "launch", "--devices", "0", "--nproc-per-node", "2",
                           "--no-python", "sh", "-c", script], capture_output=True, text=True, env=ENV, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):
        assert [line for line in proc.stdout.splitlines() if line.startswith(f"[rank{rank}]: ")] == \
            [f"[rank{rank}]: line-{i}" for i in range(1, 201)]
        assert f"[rank{rank}]: err-last" in proc.stderr.splitlines()


def test_a_program_that_cannot_start_is_a_one_line_error():
    proc = processes.run([sys.executable, "-m", "convoy", "launch", "--devices", "0", "--nproc-per-node", "2",
                           "--no-python", "/nonexistent/trainer"], capture_output=True, text=True, env=ENV, timeout=60)
    assert proc.returncode == 2  # found in the parent, before any rank or lease
    assert proc.stderr.splitlines()[-1] == ("convoy: --no-python: '/nonexistent/trainer' is neither a command on "
                                            "PATH nor an executable file"), proc.stderr
    assert "Traceback" not in proc.stderr
