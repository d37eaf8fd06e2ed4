"""End-to-end scripts: Accelerate's quick tour with only the import changed; a kill during save_state."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import processes
from tests.distributed import cpu_env, run_script

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.mark.slow
def test_accelerate_quick_tour_runs_on_two_cpu_processes():
    result = run_script(SCRIPTS / "quick_tour.py", nproc=2)
    assert result.returncode == 0, result.output[-4000:]
    assert "QUICK TOUR OK" in result.output


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in cpu_env().items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}  # CPU, as the ranks
    return processes.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=120)


def test_kill_during_save_state_leaves_last_checkpoint_loadable(tmp_path):
    killed = _python(str(SCRIPTS / "kill_save.py"), str(tmp_path))
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert "NOT REACHED" not in killed.stdout
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert "checkpoint_0" in names and "checkpoint_1" not in names, names  # only a staging dir is left
    loaded = _python(str(SCRIPTS / "kill_save.py"), str(tmp_path), "--load")
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert "LOADED checkpoint_0 8.0 False" in loaded.stdout, loaded.stdout  # weights of 1.0 (4x2), not 2.0


@pytest.mark.slow
def test_ddp_communication_hooks_match_plain_ddp():
    """Accelerate's DDP communication hooks (fp16 compression, PowerSGD, batched PowerSGD, an fp16 wrapper, a
    PowerSGDState option) are registered on the model, and its gradients match plain DDP's to 1e-2 on 2 CPU
    processes; a bf16 hook, which a CPU build of PyTorch refuses, is one line with PyTorch's reason; and PowerSGD
    really compresses once its start iteration is reached."""
    result = run_script(SCRIPTS / "ddp_comm_hooks.py", nproc=2, timeout=120)
    assert result.returncode == 0, result.output
    for label in ("no+no", "fp16+no", "power_sgd+no", "power_sgd+fp16", "power_sgd+no+rank2",
                  "batched_power_sgd+no", "batched_power_sgd+fp16"):
        hooks = 0 if label == "no+no" else 1
        for rank in (0, 1):
            assert f"HOOK {label} rank={rank} hooks={hooks} close=True" in result.output, result.output
    # bf16: a CPU build of PyTorch refuses the hook (its reason, in one line); a CUDA build lets gloo run it
    refused = "HOOK bf16+no refused: DDP refused the communication hook: BF16 all reduce communication hook " \
        "required CUDA 11+ and NCCL 2.10+" in result.output
    trained = all(f"HOOK bf16+no rank={rank} hooks=1 close=True" in result.output for rank in (0, 1))
    assert refused or trained, result.output
    # from start_powerSGD_iter=2 on, the gradient is PowerSGD's rank-1 approximation: compression ran
    assert all(f"POWERSGD rank={rank} gradient ranks=[20, 20, 1]" in result.output for rank in (0, 1)), result.output
