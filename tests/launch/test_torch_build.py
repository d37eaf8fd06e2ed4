"""A GPU box with a CPU-only torch: the dry run, the run and `convoy test` say once that the GPUs are not used (the
dry run said "backend nccl ... as cuda:0", the run silently used CPU processes, `convoy test` passed on gloo)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from convoy.launch.torch_build import torch_build
from tests.conftest import INVENTORIES
from tests.distributed import cpu_env

SCRIPT = str(Path(__file__).parent / "scripts" / "show_env.py")
NOTE = "this Python's torch ("


def _cpu_only_torch() -> bool:
    build = torch_build()
    return build is not None and build.get("cuda") is None


cpu_torch = pytest.mark.skipif(not _cpu_only_torch(), reason="this torch has CUDA: the GPUs are used")


def test_the_build_is_read_without_importing_torch(tmp_path):
    code = ("import sys; from convoy.launch.torch_build import torch_build; b = torch_build(); "
            "print(b['__version__'], b.get('cuda'), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    import torch

    assert out.stdout.split() == [torch.__version__, str(torch.version.cuda), "False"], out.stderr
    fake = tmp_path / "torch"  # a CUDA build first on the path: nothing to say
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "version.py").write_text("__version__ = '2.13.0+cu130'\ncuda: Optional[str] = '13.0'\nhip = None\n")
    code = "from convoy.launch.torch_build import unusable_note as u; print(u('nvidia', count=2), u('amd', count=1))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    assert out.stdout.split("None", 1)[0] == "" and "was built without ROCm: it cannot use the GPU" in out.stdout


@cpu_torch
def test_a_gpu_plan_with_a_cpu_only_torch_says_so_once():
    env = cpu_env({"CONVOY_INVENTORY": str(INVENTORIES / "4_mixed_pcie.json")})
    env.pop("CUDA_VISIBLE_DEVICES", None)
    dry = subprocess.run([sys.executable, "-m", "convoy", "launch", "--dry-run", "--devices", "0,1", SCRIPT],
                         capture_output=True, text=True, env=env, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert "devices:    nvidia, not used by this Python's torch: CPU processes, backend gloo" in dry.stdout
    assert "backend nccl" not in dry.stdout and " as cuda:0\n" not in dry.stdout, dry.stdout
    assert "rank 1 (local 1): device 1 NVIDIA GeForce RTX 4090 uuid=" in dry.stdout  # the mapping, as it is set
    assert "visible as cuda:1, not used (a CPU process)" in dry.stdout
    assert dry.stdout.count(NOTE) == 1
    run = subprocess.run([sys.executable, "-m", "convoy", "launch", "--devices", "0,1", SCRIPT], capture_output=True,
                         text=True, env=env, timeout=120)
    assert run.returncode == 0 and run.stderr.count(NOTE) == 1, run.stderr
    assert f"convoy: {NOTE}" in run.stderr and "the 2 GPUs are not used or tested" in run.stderr
    no_python = subprocess.run([sys.executable, "-m", "convoy", "launch", "--dry-run", "--devices", "0,1",
                                "--no-python", "true"], capture_output=True, text=True, env=env, timeout=60)
    assert NOTE not in no_python.stdout  # another program (JAX, say) may use them: nothing is known


@cpu_torch
@pytest.mark.slow
def test_convoy_test_on_gpus_with_a_cpu_only_torch_says_they_were_not_tested():
    env = cpu_env({"CONVOY_INVENTORY": str(INVENTORIES / "4_mixed_pcie.json")})
    env.pop("CUDA_VISIBLE_DEVICES", None)
    done = subprocess.run([sys.executable, "-m", "convoy", "test", "--devices", "0,1", "--steps", "1",
                           "--size-mib", "1"], capture_output=True, text=True, env=env, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.count(NOTE) == 1 and "not used or tested" in done.stderr, done.stderr
