"""convoy launch on one node, for real: gloo ranks train, fail loudly, leave nothing behind, never collide.

CPU processes on every machine (``--devices 0`` unless a test names devices of an inventory file)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import processes
from tests.distributed import cpu_env, run_script
from tests.processes import finish, start

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).parent / "scripts"
ENV = cpu_env()


def convoy_launch(*argv: str, env=None) -> subprocess.Popen:
    """``convoy launch`` in its own session; CPU processes unless ``argv`` names devices."""
    cpu = () if "--devices" in argv else ("--devices", "0")
    return start([sys.executable, "-m", "convoy", "launch", *cpu, *argv], env=env or ENV)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` now (Linux: ``SigCgt`` in /proc/PID/status)."""
    with open(f"/proc/{pid}/status") as status:
        mask = next(line.split()[1] for line in status if line.startswith("SigCgt:"))
    return bool(int(mask, 16) >> (sig - 1) & 1)


def test_unmodified_ddp_script_trains_with_prefixed_output_and_per_rank_logs(tmp_path):
    two = [convoy_launch("--log-dir", str(tmp_path / name), str(SCRIPTS / "ddp_train.py"), "--steps", "2")
           for name in ("a", "b")]  # two jobs at once on one machine
    outs = [finish(p, timeout=120) for p in two]
    assert [p.returncode for p in two] == [0, 0], outs
    ports = set()
    for out, name in zip(outs, ("a", "b")):
        lines = [line for line in out.splitlines() if "trained" in line]
        assert sorted(line.split(":")[0] for line in lines) == ["[rank0]", "[rank1]"]
        ports |= {re.search(r"port=(\d+)", line).group(1) for line in lines}
        assert "no accelerator asked for: running 2 CPU processes with the gloo backend" in out  # --devices 0
        logs = sorted(p.name for p in (tmp_path / name).iterdir())
        assert logs == ["rank0.log", "rank1.log"]
        assert "trained rank=1" in (tmp_path / name / "rank1.log").read_text()
    assert len(ports) == 2 and "29500" not in ports  # each job its own free port


def test_local_ranks_filter_and_redirects_choose_what_reaches_the_console(tmp_path):
    """torchrun's --local-ranks-filter (ranks shown) and --redirects (streams kept off the console), while
    --log-dir still gets every rank's output."""
    job = convoy_launch("--nproc-per-node", "3", "--local-ranks-filter", "1,2", "--redirects", "2:1",
                        "--log-dir", str(tmp_path), str(SCRIPTS / "ddp_train.py"), "--steps", "1")
    out = finish(job, timeout=120)
    assert job.returncode == 0, out
    shown = sorted(line.split(":")[0] for line in out.splitlines() if "trained rank=" in line)
    assert shown == ["[rank1]"], out  # rank 0 filtered out, rank 2's stdout redirected
    for rank in range(3):
        assert f"trained rank={rank}" in (tmp_path / f"rank{rank}.log").read_text()


@pytest.mark.parametrize("how, expect", [("raise", "exit code 1"), ("kill", "signal SIGKILL")])
def test_a_failing_rank_stops_the_group_with_its_traceback_once(how, expect):
    start = time.monotonic()
    result = run_script(SCRIPTS / "fail.py", nproc=2, args=["--how", how], timeout=60)
    took = time.monotonic() - start
    out = result.output
    assert result.returncode == 1, out
    assert took < 30, f"the survivor was not stopped ({took:.0f} s)"  # it would sleep 60 s
    assert "convoy: rank 1 (local rank 1) on host " in out and f"failed with {expect}" in out
    if how == "raise":
        assert out.count("ValueError: boom from rank 1") == 1, out
        assert "[rank1]: Traceback (most recent call last):" in out
    pids = [int(pid) for pid in re.findall(r"pid=(\d+)", out)]
    assert len(pids) == 2 and not any(alive(pid) for pid in pids), "orphan worker left"


def test_devices_are_leased_for_the_job(inventory_path, tmp_path):
    env = {**ENV, "CONVOY_INVENTORY": str(inventory_path("8xh100_nvswitch")), "CONVOY_LEASE_DIR": str(tmp_path)}
    env.pop("CUDA_VISIBLE_DEVICES")  # the inventory's GPUs are visible
    first = convoy_launch("--devices", "0,1", "--no-python", "sleep", "3", env=env)
    time.sleep(1.0)
    second = processes.run([sys.executable, "-m", "convoy", "launch", "--devices", "1", "--no-python", "true"],
                            capture_output=True, text=True, env=env, timeout=30)
    other = processes.run([sys.executable, "-m", "convoy", "launch", "--devices", "2,3", "--no-python", "true"],
                           capture_output=True, text=True, env=env, timeout=30)
    assert first.wait(timeout=30) == 0
    assert second.returncode == 1 and second.stderr.startswith("convoy: "), second.stderr
    assert "GPU" in second.stderr or "lease" in second.stderr.lower()
    assert other.returncode == 0, other.stderr
    again = processes.run([sys.executable, "-m", "convoy", "launch", "--devices", "1", "--no-python", "true"],
                           capture_output=True, text=True, env=env, timeout=30)
    assert again.returncode == 0, again.stderr  # released when the first job ended


def test_free_moves_a_count_past_devices_another_job_leased(inventory_path, tmp_path):
    """`--free` with a count takes devices no job holds (it took the leased GPUs 0,1 and was refused), the same
    in the dry run and in the job; an explicit list still waits for exactly its devices."""
    from convoy.devices.inventory import load_inventory
    from convoy.devices.lease import lease_devices

    inventory = inventory_path("8xh100_nvswitch")
    env = {**ENV, "CONVOY_INVENTORY": str(inventory), "CONVOY_LEASE_DIR": str(tmp_path)}
    env.pop("CUDA_VISIBLE_DEVICES")

    def launch(devices, *argv):  # GPUs of the inventory file
        return processes.run([sys.executable, "-m", "convoy", "launch", "--devices", devices, *argv],
                             capture_output=True, text=True, env=env, timeout=60)

    with lease_devices(load_inventory(inventory).devices[:2], lock_dir=tmp_path):
        plan = launch("2", "--free", "--dry-run", "--no-python", "true")
        job = launch("2", "--free", "--no-python", "sh", "-c", "echo visible=$CUDA_VISIBLE_DEVICES")
        listed = launch("1,2", "--free", "--wait", "0.5", "--no-python", "true")
        unleased = launch("2", "--free", "--no-lease", "--dry-run", "--no-python", "true")
    assert plan.returncode == 0 and "CUDA_VISIBLE_DEVICES=2,3" in plan.stdout, plan.stdout + plan.stderr
    assert "left GPU 0 (NVIDIA H100 80GB HBM3): leased by pid" in plan.stdout
    assert job.returncode == 0 and job.stdout.count("visible=2,3") == 2, job.stdout + job.stderr
    assert listed.returncode == 1 and "GPU 1 (NVIDIA H100 80GB HBM3) cannot be used: leased by pid" in listed.stderr
    assert "after waiting 0.5s" in listed.stderr
    assert "CUDA_VISIBLE_DEVICES=2,3" in unleased.stdout, unleased.stdout  # taking no lease, still not a leased one


@pytest.mark.parametrize("engine", ["direct", "elastic"])
def test_a_reader_that_leaves_does_not_stop_or_hang_the_job(engine, tmp_path):
    """`convoy launch train.py | head`: the direct engine's pumps died of BrokenPipeError, the ranks then blocked
    on full pipes and the job hung (the log files stopped too); torch's tailer logged a traceback per rank. The
    ranks go on, their output to --log-dir, with one line."""
    count = "for i in $(seq 1 100000); do echo line $i; done; echo finished >&2"
    job = start([sys.executable, "-m", "convoy", "launch", "--devices", "0", "--engine", engine, "--log-dir",
                 str(tmp_path), "--no-python", "sh", "-c", count], env=ENV, stderr=subprocess.PIPE)
    assert "line 1" in job.stdout.readline()
    job.stdout.close()  # the reader leaves, as head does
    try:
        err = job.communicate(timeout=60)[1]
    except subprocess.TimeoutExpired:
        processes.stop_tree(job.pid)
        pytest.fail("the job hung once its stdout was closed")
    assert job.returncode == 0, err
    assert err.count("nobody reads the job's stdout any more (a closed pipe); the ranks go on, their output "
                     "reaches --log-dir only") == 1, err
    assert "Traceback" not in err and "[rank0]: finished" in err and "[rank1]: finished" in err, err
    logs = sorted(tmp_path.glob("rank*.log")) if engine == "direct" else sorted(tmp_path.rglob("stdout.log"))
    assert len(logs) == 2, logs
    for log in logs:  # every line, to the end
        assert log.read_text().count("line ") == 100000 and "line 100000" in log.read_text()


@pytest.mark.parametrize("how, code, line", [(signal.SIGTERM, 143, "convoy: terminated (SIGTERM)"),
                                             (signal.SIGINT, 130, "convoy: interrupted"),
                                             (signal.SIGHUP, 129, "convoy: terminated (SIGHUP)")])
def test_stopping_convoy_stops_its_workers(how, code, line):
    """A scheduler's SIGTERM (preemption) is told from a Ctrl-C by the exit code, as Slurm and Kubernetes read it:
    128 + the signal's number, and a line that says so (SIGTERM was "interrupted", 130)."""
    job = convoy_launch("--no-python", "sh", "-c", "echo pid=$$; sleep 60")
    pids = []
    while len(pids) < 2:
        out = job.stdout.readline()
        assert out, "the job ended early"
        pids += [int(p) for p in re.findall(r"pid=(\d+)", out)]
    job.send_signal(how)
    out = finish(job, timeout=30)
    assert job.returncode == code and out.strip().splitlines()[-1] == line, out
    time.sleep(0.2)
    assert not any(alive(pid) for pid in pids), "orphan worker left"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/status")
def test_a_sigterm_before_the_job_starts_says_terminated_too(inventory_path, tmp_path):
    """A SIGTERM while the launcher waits for a leased device (before any rank runs) is the same 143 and line,
    not a silent death by the signal."""
    from convoy.devices.inventory import load_inventory
    from convoy.devices.lease import lease_devices

    inventory = inventory_path("1xh100")
    env = {**ENV, "CONVOY_INVENTORY": str(inventory), "CONVOY_LEASE_DIR": str(tmp_path)}
    env.pop("CUDA_VISIBLE_DEVICES")
    with lease_devices(load_inventory(inventory).devices, lock_dir=tmp_path):
        job = convoy_launch("--devices", "1", "--wait", "60", "--no-python", "true", env=env)
        deadline = time.monotonic() + 60
        while not catches(job.pid, signal.SIGTERM):  # convoy's handler is in place (Python's default kills)
            assert job.poll() is None and time.monotonic() < deadline, finish(job, timeout=5)
            time.sleep(0.05)
        time.sleep(0.5)  # planned by now, waiting for GPU 0
        assert job.poll() is None, finish(job, timeout=5)
        job.terminate()
        out = finish(job, timeout=30)
    lines = out.strip().splitlines()  # the wait said what it waits for, then the stop
    assert job.returncode == 143 and lines[-1] == "convoy: terminated (SIGTERM)", out
    assert len(lines) == 2 and lines[0].startswith("convoy: waiting up to 1m for GPU 0 (NVIDIA H100 80GB HBM3): "
                                                   "leased by pid "), out


def test_signals_to_handle_passes_slurms_warning_signal_on_to_every_rank():
    """torchrun's --signals-to-handle: a SIGUSR1 to the launcher (Slurm's warning before a preemption) reaches
    each rank as SIGUSR1, time to save, and then the job stops (it was accepted and ignored: SIGUSR1 killed the
    launcher and PDEATHSIG the ranks, with no chance to save)."""
    trap = 'trap "echo saved on USR1 $TORCHELASTIC_SIGNALS_TO_HANDLE; exit 0" USR1; echo ready; sleep 60 & wait'
    job = convoy_launch("--signals-to-handle", "SIGTERM,SIGINT,SIGUSR1", "--shutdown-timeout", "20",
                        "--no-python", "sh", "-c", trap)
    ready = 0
    while ready < 2:
        line = job.stdout.readline()
        assert line, "the job ended early"
        ready += "ready" in line
    job.send_signal(signal.SIGUSR1)
    out = finish(job, timeout=30)
    assert out.count("saved on USR1 SIGTERM,SIGINT,SIGUSR1") == 2, out
    assert job.returncode == 128 + signal.SIGUSR1 and "convoy: terminated (SIGUSR1)" in out, out


def test_a_stop_while_the_ranks_save_stops_them_without_waiting_out_the_save_time():
    """After a passed-on SIGUSR1 the ranks get 30 s to save; a Ctrl-C or SIGTERM to the launcher then stops them
    at once (SIGTERM, SIGKILL after the short grace), not after the 30 s."""
    rank = ('trap "echo saving" USR1; trap "echo stopped by TERM; exit 0" TERM; echo ready; '
            'while true; do sleep 0.1; done')
    job = convoy_launch("--signals-to-handle", "SIGTERM,SIGUSR1", "--no-python", "sh", "-c", rank)
    lines = []

    def wait_for(word):
        while sum(word in line for line in lines) < 2:
            line = job.stdout.readline()
            assert line, "the job ended early: " + "".join(lines)
            lines.append(line)

    wait_for("ready")
    job.send_signal(signal.SIGUSR1)
    wait_for("saving")
    job.send_signal(signal.SIGTERM)
    out = "".join(lines) + finish(job, timeout=20)  # within the 3 s grace, not the 30 s of the save
    assert out.count("stopped by TERM") == 2 and job.returncode == 143, out


def test_rank_0_keeps_serving_the_store_until_the_other_ranks_end():
    """Rank 0 serves the rendezvous store; a script whose rank 0 was done while rank 1 still reached the store
    (its process group made, nothing else to do) left rank 1 with 'Connection reset by peer'."""
    job = convoy_launch("--nproc-per-node", "2", str(SCRIPTS / "rank0_leaves_early.py"))
    out = finish(job, timeout=60)
    assert job.returncode == 0 and "rank 1 reached the store" in out, out
