"""convoy.launch(fn): rank 0's value back, the real failing rank's exception raised here, nothing left over."""

from __future__ import annotations

import os
import re
import signal
import sys

import pytest

import convoy
from convoy.errors import ConfigError, RankFailedError
from tests.launch import fn_targets

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def test_returns_rank_zeros_value_with_fork_and_spawn():
    assert convoy.launch(fn_targets.all_reduce_rank, args=(10,), devices=0, nproc_per_node=2) == (0, 2, 21, "0")
    assert convoy.launch(fn_targets.all_reduce_rank, args=(1,), devices=0, nproc_per_node=2, start_method="spawn") == \
        (0, 2, 3, "0")
    assert "RANK" not in os.environ and "MASTER_PORT" not in os.environ  # the caller's environment is untouched


def test_convoy_launch_is_callable_even_after_the_package_is_imported():
    import convoy.launch.resolve  # noqa: F401 - binds the package to the name convoy.launch

    assert convoy.launch(fn_targets.env_value, args=("LOCAL_WORLD_SIZE",), devices=0, nproc_per_node=1) == "1"


def test_reraises_the_failing_ranks_exception_and_reports_a_dead_rank():
    with pytest.raises(fn_targets.RankOneError, match="rank one broke") as info:
        convoy.launch(fn_targets.rank_one_raises, devices=0, nproc_per_node=2)
    note = "\n".join(info.value.__notes__)
    assert note.startswith("rank 1 on host") and "in rank_one_raises" in note
    with pytest.raises(RankFailedError, match="rank 0 on host .* died with exit code 7") as info:
        convoy.launch(fn_targets.rank_zero_dies, devices=0, nproc_per_node=2)
    assert info.value.rank == 0 and info.value.exitcode == 7


@pytest.fixture
def gpu_inventory(inventory_path, tmp_path, monkeypatch):
    """An 8-GPU inventory and a private lease directory; returns a function that leases GPU ``index`` here."""
    from convoy.devices.discovery import discover
    from convoy.devices.lease import lease_devices

    monkeypatch.setenv("CONVOY_INVENTORY", str(inventory_path("8xh100_nvswitch")))
    monkeypatch.setenv("CONVOY_LEASE_DIR", str(tmp_path))
    gpus = discover().devices
    return lambda index: lease_devices([gpus[index]])


def test_the_selected_gpus_are_leased_for_the_call_and_released_after(gpu_inventory):
    # "0," is the index list [0]; "0" alone would mean no accelerator (Lightning's devices= table)
    code, err = convoy.launch(fn_targets.second_job, args=("0,",), devices="0,")
    assert code == 1 and err.startswith("convoy: ") and err.count("\n") == 1, err
    assert "GPU 0" in err and f"is leased by pid {os.getpid()} " in err, err  # names this caller as the holder
    assert convoy.launch(fn_targets.second_job, args=("1,",), devices="0,") == (0, "")  # other GPUs stay free
    assert convoy.launch(fn_targets.second_job, args=("0,",), devices="0,", lease=False) == (0, "")
    gpu_inventory(0).release()  # the call returned: GPU 0 is free again


def test_a_leased_gpu_stops_the_call_before_any_rank_starts(gpu_inventory):
    from convoy.errors import LeaseError

    with gpu_inventory(0):
        with pytest.raises(LeaseError, match=rf"GPU 0 .*is leased by pid {os.getpid()} "):
            convoy.launch(fn_targets.raises_value_error, devices="0,1")
        with pytest.raises(LeaseError, match=r"after waiting 0\.2s"):
            convoy.launch(fn_targets.raises_value_error, devices="0,", wait=0.2)
        gpu_inventory(1).release()  # all or none: GPU 1 was not kept by the failed call


@pytest.fixture
def ctrl_c_interrupts():
    """Ctrl-C raises KeyboardInterrupt here, as in a notebook: Python's default SIGINT handler, which it installs
    only when SIGINT was not ignored at start (a background job of a non-interactive shell, nohup and some CI
    runners start the suite with SIGINT ignored)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_a_raising_rank_or_an_interrupt_releases_the_lease(gpu_inventory, ctrl_c_interrupts):
    with pytest.raises(ValueError, match="rank failed on purpose"):
        convoy.launch(fn_targets.raises_value_error, devices="0,1")
    gpu_inventory(0).release()
    gpu_inventory(1).release()
    with pytest.raises(KeyboardInterrupt):
        convoy.launch(fn_targets.interrupts_the_caller, devices="0,")
    gpu_inventory(0).release()


def test_cpu_runs_take_no_lease(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVOY_LEASE_DIR", str(tmp_path / "leases"))
    assert convoy.launch(fn_targets.env_value, args=("WORLD_SIZE",), devices=0, nproc_per_node=2) == "2"
    assert not (tmp_path / "leases").exists()


def test_a_list_names_devices_as_lightning_reads_it():
    from convoy.launch.function import _device_request

    assert _device_request([0]) == "0,"  # GPU 0, not "no accelerator"
    assert _device_request([2, 0]) == "2,0"
    assert _device_request(()) == "0"
    assert _device_request(0) == "0" and _device_request("auto") is None and _device_request(None) is None


def test_a_one_gpu_list_leases_that_gpu(gpu_inventory):
    code, err = convoy.launch(fn_targets.second_job, args=("0,",), devices=[0])
    assert code == 1 and "GPU 0" in err and f"is leased by pid {os.getpid()} " in err, err


def test_the_start_method_is_fork_until_cuda_is_initialised_here():
    from convoy.errors import LaunchError
    from convoy.launch.function import start_method_for

    assert start_method_for(None, cuda_initialized=False, platform="linux") == "fork"
    assert start_method_for(None, cuda_initialized=True, platform="linux") == "spawn"  # a notebook that used CUDA
    assert start_method_for(None, cuda_initialized=False, platform="darwin") == "spawn"
    assert start_method_for("forkserver", cuda_initialized=True, platform="linux") == "forkserver"
    with pytest.raises(LaunchError, match="CUDA is already initialised .* leave start_method unset"):
        start_method_for("fork", cuda_initialized=True, platform="linux")
    with pytest.raises(LaunchError, match="'threads': use 'fork', 'spawn' or 'forkserver'"):
        start_method_for("threads", cuda_initialized=False, platform="linux")


@pytest.fixture
def cuda_touched(monkeypatch):
    """This process as a notebook that has used CUDA looks to convoy (``torch.cuda.is_initialized()``)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)


def test_after_cuda_the_default_spawns_and_just_works(cuda_touched):
    assert convoy.launch(fn_targets.started_by, devices=0, nproc_per_node=1) == "spawn"
    assert convoy.launch(fn_targets.all_reduce_rank, args=(5,), devices=0, nproc_per_node=2) == (0, 2, 11, "0")
    from convoy.errors import LaunchError

    with pytest.raises(LaunchError, match="forked ranks cannot use it"):
        convoy.launch(fn_targets.started_by, devices=0, nproc_per_node=1, start_method="fork")


def test_without_cuda_the_default_forks(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)  # as on a CPU box, also on a GPU one
    assert convoy.launch(fn_targets.started_by, devices=0, nproc_per_node=1) == "fork"


def test_a_notebook_function_is_sent_by_value_when_ranks_are_spawned(cuda_touched):
    from convoy.launch.function import importable

    scale = 3

    def train(x):  # defined in a cell: a spawned rank cannot import it by name
        import os

        return x * scale, os.environ["WORLD_SIZE"]

    assert not importable(train) and importable(fn_targets.started_by)
    assert convoy.launch(train, args=(7,), devices=0, nproc_per_node=2) == (21, "2")


def test_a_notebook_function_without_cloudpickle_is_a_clear_error(cuda_touched, monkeypatch):
    from convoy.errors import LaunchError

    monkeypatch.setitem(sys.modules, "cloudpickle", None)  # import cloudpickle -> ImportError
    with pytest.raises(LaunchError, match="cannot import .*train.* move it to a module, or install cloudpickle"):
        convoy.launch(_local_train(), devices=0, nproc_per_node=1)


def _local_train():
    def train():
        return 1

    return train


@pytest.mark.parametrize("call, why", [
    (lambda: convoy.launch(5), "convoy.launch(5): give the function each process runs"),
    (lambda: convoy.launch(fn_targets.env_value, args="RANK"), "args='RANK'): give a tuple"),  # would be 4 args
    (lambda: convoy.launch(fn_targets.env_value, args=5), "args=5): give a tuple"),
    (lambda: convoy.launch(fn_targets.env_value, args=("RANK",), kwargs=[1]), "kwargs=[1]): give a dict"),
    # its keywords named as such (they were named as convoy launch's flags, --nproc-per-node, ...)
    (lambda: convoy.launch(fn_targets.env_value, nproc_per_node=0), "convoy.launch(nproc_per_node=...): 0 is not"),
    (lambda: convoy.launch(fn_targets.env_value, mixed_precision="fp9"), "convoy.launch(mixed_precision=...): 'fp9'"),
    (lambda: convoy.launch(fn_targets.env_value, collective_timeout=-1), "convoy.launch(collective_timeout=...)"),
    # env values reached os.environ in each rank (a TypeError traceback per rank); lease/wait were not read
    (lambda: convoy.launch(fn_targets.env_value, env={"NCCL_DEBUG": 1}), "env={'NCCL_DEBUG': 1}): give a mapping"),
    (lambda: convoy.launch(fn_targets.env_value, lease="no"), "convoy.launch(lease='no'): give True"),
    (lambda: convoy.launch(fn_targets.env_value, wait=-1), "convoy.launch(wait=...): duration -1 is not"),
    (lambda: convoy.launch(fn_targets.env_value, lease=False, wait=5), "wait=5, lease=False): wait is for devices"),
])
def test_a_call_that_cannot_be_made_is_refused_before_a_lease_or_a_process(call, why, gpu_inventory):
    with gpu_inventory(0):  # GPU 0 leased here: a call that got as far as selecting devices would say so instead
        with pytest.raises(ConfigError, match=re.escape(why)):
            call()


def test_rank_0_keeps_serving_the_store_until_every_rank_is_done():
    """A function whose rank 0 returns while the others still reach the store (Accelerate's notebook test:
    PartialState() and return) failed with 'Connection reset by peer' on rank 1, now and then."""
    assert convoy.launch(fn_targets.store_after_rank0_returned, devices=0, nproc_per_node=2) == "rank 0 returned"


def test_max_restarts_starts_every_rank_again_after_a_failure(tmp_path, capfd):
    """Accelerate's notebook_launcher(max_restarts=...): a function failing on its first two starts succeeds on
    the third; each restart is one line; past max_restarts the failure is raised."""
    counter = tmp_path / "starts"
    assert convoy.launch(fn_targets.fail_first_starts, args=(str(counter), 2), devices=0, nproc_per_node=2,
                         max_restarts=2) == "started 3 times"
    assert capfd.readouterr().err.count("starting every rank again (restart") == 2
    counter.unlink()
    with pytest.raises(RuntimeError, match="start 1 fails"):
        convoy.launch(fn_targets.fail_first_starts, args=(str(counter), 5), devices=0, nproc_per_node=2,
                      max_restarts=0)
    with pytest.raises(ConfigError, match="max_restarts=-1"):
        convoy.launch(fn_targets.fail_first_starts, args=(str(counter), 5), devices=0, max_restarts=-1)


def test_a_rank_leaving_without_a_result_is_its_failure_and_bad_settings_are_not_retried(capfd):
    """os._exit(0) in a rank made the caller wait for ever; a rank's sys.exit(3) ended the caller (a notebook's
    kernel) with SystemExit; a ConfigError, which every start repeats, was retried."""
    with pytest.raises(RankFailedError, match="rank 1 on host .* exited without returning from the function"):
        convoy.launch(fn_targets.rank_one_leaves, args=("quietly",), devices=0, nproc_per_node=2)
    with pytest.raises(RankFailedError, match=re.escape("rank 1 on host")) as info:
        convoy.launch(fn_targets.rank_one_leaves, args=("sys.exit",), devices=0, nproc_per_node=2, max_restarts=1)
    assert info.value.exitcode == 3 and "called sys.exit(3)" in str(info.value)
    assert "restart 1 of 1" in capfd.readouterr().err  # a rank's exit is a failure another start may not repeat
    with pytest.raises(ConfigError, match="a wrong setting"):
        convoy.launch(fn_targets.rank_one_leaves, args=("config",), devices=0, nproc_per_node=2, max_restarts=3)
    assert "starting every rank again" not in capfd.readouterr().err
