"""The suite's own guarantees: a hermetic environment whatever the shell exports or the working directory holds,
launched processes that never outlive their test (tests/conftest.py, tests/processes.py), and tests that give
the same result on a GPU box: every one that starts ranks states its devices (tests/launch_sites.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests import processes
from tests.conftest import SCRUBBED, TESTS, held_leases, scrub_environment


def test_the_session_runs_without_the_shells_device_rank_and_convoy_variables():
    for name in SCRUBBED:
        assert name not in os.environ or name in ("XDG_CONFIG_HOME",), name
    assert not [k for k in os.environ if k.startswith(("CONVOY_", "TORCHELASTIC_", "SLURM_", "ACCELERATE_"))
                and k not in ("CONVOY_LEASE_DIR", "CONVOY_INVENTORY") and not k.startswith("CONVOY_TEST_")]
    lease_dir, home = Path(os.environ["CONVOY_LEASE_DIR"]), Path(os.environ["HOME"])
    assert lease_dir.is_dir() and lease_dir.parent == home.parent  # one scratch directory for the session
    assert os.environ["XDG_CONFIG_HOME"] == str(home / ".config")  # the user's settings file is not read


def test_scrub_removes_what_changes_behaviour_and_keeps_the_rest():
    hostile = {"CUDA_VISIBLE_DEVICES": "0,1", "CONVOY_INVENTORY": "/x.json", "CONVOY_NPROC_PER_NODE": "3",
               "CONVOY_STRATEGY": "fsdp", "RANK": "3", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "r",
               "SLURM_JOB_ID": "7", "OMP_NUM_THREADS": "8", "ZE_AFFINITY_MASK": "0", "HOME": "/home/someone",
               "CONVOY_TEST_LAUNCHER": "torchrun", "PATH": "/usr/bin", "LANG": "C.UTF-8"}
    environ = dict(hostile)
    removed = scrub_environment(environ, simulate_inventory="tests/inventories/8xh100_nvswitch.json")
    assert set(environ) == {"CONVOY_TEST_LAUNCHER", "PATH", "LANG", "HOME", "XDG_CONFIG_HOME", "CONVOY_LEASE_DIR",
                            "CONVOY_INVENTORY"}
    assert environ["HOME"] != "/home/someone" and environ["CONVOY_INVENTORY"].endswith("8xh100_nvswitch.json")
    assert removed["CUDA_VISIBLE_DEVICES"] == "0,1" and removed["HOME"] == "/home/someone"


def test_a_timed_out_launcher_is_stopped_with_everything_below_it(tmp_path):
    # a "launcher" that starts a worker in a session of its own (as torch's agent does) and ignores SIGTERM
    pid_file = tmp_path / "worker.pid"
    code = ("import pathlib, signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "w = subprocess.Popen(['sleep', '60'], start_new_session=True); "
            f"pathlib.Path({str(pid_file)!r}).write_text(str(w.pid)); print('waiting', flush=True); time.sleep(60)")
    proc = processes.start([sys.executable, "-c", code])
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as info:
        processes.finish(proc, timeout=3)
    assert "waiting" in info.value.output and time.monotonic() - started < 50  # its output is kept; not its 60 s
    assert proc.returncode is not None
    worker = int(pid_file.read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{worker}").exists() or Path(f"/proc/{worker}/stat").read_text().split()[2] == "Z"


def test_held_leases_tells_a_held_lock_from_a_released_one(tmp_path, inventory_path):
    from convoy.devices.discovery import discover
    from convoy.devices.lease import lease_devices

    gpus = discover({"CONVOY_INVENTORY": str(inventory_path("1xh100"))}).devices
    with lease_devices(gpus, lock_dir=tmp_path):
        assert [line.split(":")[0] for line in held_leases(tmp_path)] == [f"{gpus[0].uuid}.lock"]
    assert held_leases(tmp_path) == [] and list(tmp_path.glob("*.lock"))  # the file stays, unlocked


def test_a_child_left_running_is_seen_and_a_started_one_is_stopped():
    stray = subprocess.Popen(["sleep", "30"])  # not through tests.processes: only the /proc walk sees it
    started = processes.start(["sleep", "30"])
    try:
        assert {stray.pid, started.pid} <= set(processes.live_children(grace=0.1))
        assert processes.stop_started() == [started.pid] and started.poll() is not None
    finally:
        stray.kill()
        stray.wait()
    assert stray.pid not in processes.live_children(grace=0.1)


def test_every_test_that_starts_ranks_states_its_devices_and_every_reference_run_hides_the_accelerators():
    """On a one-GPU box "2 ranks" means 2 GPUs and a plain torchrun sees the GPU: the H100 run failed 11 tests so
    (tests/launch_sites.py says what each kind of site must state)."""
    from tests.launch_sites import sites

    found = sites()
    missing = [str(site) for site in found if site.states is None]
    assert not missing, ("these start ranks without stating their devices (--devices 0 / devices=0 for CPU "
                         "processes, or tests/distributed.py's run_script), or run a reference outside convoy that "
                         "sees the GPUs (env=cpu_env(...)):\n" + "\n".join(missing))
    kinds = {site.kind for site in found}
    assert kinds == {"convoy launch", "convoy test", "main(launch)", "main(test)", "convoy.launch(fn)",
                     "run_selfcheck()", "torchrun", "python script"}, kinds


def test_the_site_scan_flags_what_fails_on_a_gpu_box_and_passes_what_states_it(tmp_path):
    from tests.launch_sites import launching_tests, sites

    (tmp_path / "test_example.py").write_text(textwrap.dedent('''
        import os, subprocess, sys
        import convoy
        from convoy.cli.main import main
        from tests.distributed import cpu_env
        ENV = cpu_env()

        def test_bad():
            subprocess.run([sys.executable, "-m", "convoy", "launch", "--nproc-per-node", "2", "x.py"])
            convoy.launch(print, nproc_per_node=2)
            main(["launch", "--nproc-per-node", "2", "x.py"])
            subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "x.py"])
            subprocess.run([sys.executable, "script.py"], env=dict(os.environ))
            code = "from convoy.cli.main import main; main(['launch', '--nproc-per-node', '2', 'x.py'])"

        def helper(*argv):
            return subprocess.run([sys.executable, "-m", "convoy", "launch", *argv])

        def test_good():
            subprocess.run([sys.executable, "-m", "convoy", "launch", "--devices", "0", "--nproc-per-node", "2", "x"])
            convoy.launch(print, devices=0, nproc_per_node=2)
            assert main(["launch", "--nproc-per-node", "two", "x.py"]) == 2
            main(["launch", "--dry-run", "--nproc-per-node", "2", "x.py"])
            env = {**cpu_env(), "OMP_NUM_THREADS": "1"}
            subprocess.run([sys.executable, "-m", "torch.distributed.run", "x.py"], env=env)
            subprocess.run([sys.executable, "script.py"], env=ENV)
            subprocess.run([sys.executable, "-c", "print(1)"])

        def cpu_helper(*argv):
            cpu = () if "--devices" in argv else ("--devices", "0")
            return subprocess.run([sys.executable, "-m", "convoy", "launch", *cpu, *argv])

        def test_refused():
            with pytest.raises(ConfigError):
                convoy.launch(print, nproc_per_node=0)

        def test_through_the_helper():
            side_by_side(lambda: cpu_helper("x.py"))

        def test_through_run_script():
            run_script("x.py", nproc=2)
        '''))
    found = sites([tmp_path / "test_example.py"])
    assert [node.split("::")[1] for node in launching_tests([tmp_path / "test_example.py"])] == [
        "test_bad", "test_good", "test_refused", "test_through_the_helper"]  # run_script states its devices
    by_function = {}
    for site in found:
        by_function.setdefault(site.function, []).append(site.states)
    assert by_function["test_bad"] == [None] * 6, found
    assert by_function["helper"] == [None]  # its callers' arguments are not read: a helper states devices itself
    assert len(by_function["test_good"]) == 6 and None not in by_function["test_good"], found
    assert by_function["cpu_helper"] == ["--devices unless given (*cpu)"]
    assert by_function["test_refused"] == ["refused as bad input before anything starts"]


def test_the_session_works_where_no_project_settings_file_is_read(hermetic_environment):
    from convoy.config.settings import effective_settings

    assert Path.cwd() == hermetic_environment / "work"  # whatever the directory pytest started in holds
    assert effective_settings().files == ()


@pytest.mark.slow
def test_a_project_file_an_ignored_sigint_or_no_terminal_where_the_suite_starts_change_nothing(tmp_path):
    """A convoy.toml where pytest starts (it was read by every test that resolves settings), SIGINT ignored (a
    background job, nohup) and no standard input: the tests that depended on them pass."""
    (tmp_path / "convoy.toml").write_text('nproc_per_node = 3\nstrategy = "fsdp"\nmax_restarts = 2\n')
    nodes = [str(TESTS / "launch" / "test_cli.py") + "::test_accelerate_aliases_map_to_torchrun_meanings",
             str(TESTS / "launch" / "test_function.py") + "::test_a_raising_rank_or_an_interrupt_releases_the_lease"]
    done = processes.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *nodes],
                         capture_output=True, text=True, cwd=tmp_path, stdin=subprocess.DEVNULL, timeout=240,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]
