"""Launching on a real GPU: NCCL through `convoy launch`, convoy.launch(fn) after CUDA was used, an elastic
restart that comes back and releases its lease, a hung NCCL collective named in time, and `convoy test`."""

from __future__ import annotations

import sys

import pytest

from tests.conftest import held_leases
from tests.gpu.gpu_run import SCRIPTS, python, returned, run, run_json, run_ok

pytestmark = pytest.mark.gpu


def test_convoy_launch_runs_one_rank_per_gpu_on_nccl(tmp_path):
    out = run_ok(["convoy", "launch", "--devices", "1", str(SCRIPTS / "nccl_job.py")],
                 env={"CONVOY_LEASE_DIR": str(tmp_path)})
    line = next(line for line in out.splitlines() if "NCCL OK" in line)
    assert "backend=nccl device=cuda:0 sum=4 restart=0 world=1" in line, out
    assert not held_leases(tmp_path)


def test_a_cuda_torch_on_the_gpus_gets_no_not_used_note(tmp_path):
    """The note a CPU-only torch gets (convoy.launch.torch_build) is never said where the GPUs are used: the dry
    run plans nccl on cuda:0 and the run uses the GPU, both without the note."""
    dry = run_ok(["convoy", "launch", "--dry-run", "--devices", "1", str(SCRIPTS / "nccl_job.py")])
    assert "backend nccl" in dry and " as cuda:0" in dry and "this Python's torch (" not in dry, dry
    out = run_ok(["convoy", "launch", "--devices", "1", str(SCRIPTS / "nccl_job.py")],
                 env={"CONVOY_LEASE_DIR": str(tmp_path)})
    assert "this Python's torch (" not in out and "backend=nccl device=cuda:0" in out, out


def test_more_ranks_than_gpus_are_refused_at_once():
    code, inventory, err = run_json(["convoy", "devices", "--json"])
    n = len(inventory["devices"])
    done = run(["convoy", "launch", "--nproc-per-node", str(n + 1), str(SCRIPTS / "nccl_job.py")], timeout=60)
    assert done.returncode == 2 and f"--nproc-per-node {n + 1} needs {n + 1} devices" in done.output, done.output


LAUNCH_AFTER_CUDA = """
import torch, convoy
torch.zeros(1, device="cuda")                      # the notebook has used CUDA
assert torch.cuda.is_initialized()
from tests.gpu.targets import nccl_all_reduce
print(convoy.launch(nccl_all_reduce, devices=1))   # the default start method must just work
"""


def test_launch_fn_after_cuda_was_used_here():
    assert returned(python(LAUNCH_AFTER_CUDA)) == "('cuda:0', 2.0, '0', 'nccl')"


NOTEBOOK_FUNCTION = """
import torch, convoy
torch.zeros(1, device="cuda")
def train(scale):                                  # defined in the notebook: spawned ranks cannot import it
    import os, torch
    return torch.ones(2, device="cuda").sum().item() * scale, os.environ["CUDA_VISIBLE_DEVICES"]
try:
    import cloudpickle
except ImportError:
    cloudpickle = None
try:
    print(convoy.launch(train, args=(3,), devices=1))
except convoy.errors.LaunchError as err:
    print("ERROR" if cloudpickle is None else "UNEXPECTED", err)
"""


def test_a_notebook_function_after_cuda_runs_or_says_what_to_install():
    last = returned(python("import convoy.errors\n" + NOTEBOOK_FUNCTION))
    assert last == "(6.0, '0')" or (last.startswith("ERROR") and "install cloudpickle" in last), last


def test_elastic_restart_after_a_failing_rank_comes_back_and_releases_the_lease(tmp_path):
    done = run(["convoy", "launch", "--devices", "1", "--max-restarts", "1", str(SCRIPTS / "nccl_job.py"),
                "--fail-first"], env={"CONVOY_LEASE_DIR": str(tmp_path)}, timeout=240)
    assert done.returncode == 0, done.output[-6000:]
    assert "ValueError: boom on attempt 0 of rank 0" in done.output
    assert "backend=nccl device=cuda:0 sum=4 restart=1 world=1" in done.output, done.output[-6000:]
    assert not held_leases(tmp_path), "the lease outlived the job"


@pytest.mark.slow
def test_a_hung_nccl_collective_is_named_within_the_timeout():
    done = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                str(SCRIPTS / "hang_nccl.py"), "5"], env={"CUDA_VISIBLE_DEVICES": "0"}, timeout=120)
    line = next((line for line in done.output.splitlines() if "NAMED after" in line), None)
    assert line is not None, done.output[-6000:]
    assert "on cuda:0" in line and "rank 1 of 2 did not arrive" in line, line
    assert float(line.split("NAMED after ")[1].split("s")[0]) < 15, line
    assert done.returncode != 0  # the job ends (rank 1 is stopped), it does not hang


def test_convoy_test_passes_on_nccl():
    code, report, output = run_json(["convoy", "test", "--devices", "1", "--json", "--timeout", "60"], timeout=240)
    assert code == 0 and report is not None and report["ok"] is True, output[-6000:]
    assert report["backend"] == "nccl" and report["world_size"] == 1
    assert all(check["status"] in ("pass", "skip") for check in report["checks"]), report
