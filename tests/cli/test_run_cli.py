"""``convoy run`` leases the devices it runs a command on, as ``convoy launch`` does: two jobs never get the same
GPU, ``--free`` moves past a leased one, ``--no-lease`` shares, the lease ends with the command (killed too), and
a scheduler's SIGTERM reaches the command. Inventory files stand in for the GPUs; leases go to a temporary
``CONVOY_LEASE_DIR``."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import INVENTORIES, held_leases
from tests.processes import finish, start

#: a command that says it runs, with the GPUs it sees, then waits until its stop file exists
HOLD = 'echo "running gpus=$CUDA_VISIBLE_DEVICES pid=$$"; while [ ! -e "$STOP" ]; do sleep 0.05; done'


@pytest.fixture
def box(tmp_path):
    """The environment of a 4-GPU box (an inventory file) with a lease directory of its own."""
    env = {**os.environ, "CONVOY_INVENTORY": str(INVENTORIES / "4_mixed_pcie.json"),
           "CONVOY_LEASE_DIR": str(tmp_path / "leases"), "STOP": str(tmp_path / "stop")}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def convoy(*argv: str, env: dict, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "convoy", *argv], capture_output=True, text=True, env=env,
                          timeout=timeout)


def hold(*argv: str, env: dict) -> tuple[subprocess.Popen, str]:
    """``convoy run ARGV -- HOLD`` started, once its command runs (its first line)."""
    job = start([sys.executable, "-m", "convoy", "run", *argv, "--", "sh", "-c", HOLD], env=env)
    line = job.stdout.readline()
    assert line.startswith("running"), line + finish(job, timeout=10)
    return job, line.strip()


def release(job: subprocess.Popen, env: dict) -> str:
    open(env["STOP"], "w").close()
    out = finish(job, timeout=30)
    os.unlink(env["STOP"])
    return out


def leases(env: dict) -> list[str]:
    return held_leases(Path(env["CONVOY_LEASE_DIR"]))


def test_two_runs_never_share_a_device_unless_one_says_so(box):
    first, line = hold("--devices", "1,3", env=box)
    try:
        assert line.startswith("running gpus=1,3") and len(leases(box)) == 2
        table = convoy("devices", env=box).stdout.splitlines()
        assert [row.split()[0] for row in table if " leased " in row] == ["1", "3"], table  # was "free"
        refused = convoy("run", "--devices", "1,", "--", "true", env=box)
        assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
        assert refused.stderr.startswith("convoy: cannot lease 1 of the requested devices: GPU 1 (NVIDIA GeForce "
                                         f"RTX 4090) is leased by pid {first.pid}"), refused.stderr
        assert "wait for them (--wait 10m), ask for other devices, or share them (--no-lease)" in refused.stderr
        waited = convoy("run", "--devices", "3,", "--wait", "0.5", "--", "true", env=box)
        assert waited.returncode == 1 and "after waiting 0.5s" in waited.stderr, waited.stderr
        shared = convoy("run", "--devices", "1,", "--no-lease", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES",
                        env=box)
        assert (shared.returncode, shared.stdout) == (0, "1\n"), shared.stderr
        other = convoy("run", "--devices", "0,2", "--", "true", env=box)
        assert other.returncode == 0, other.stderr
    finally:
        release(first, box)
    assert first.returncode == 0 and leases(box) == []
    assert convoy("run", "--devices", "1,", "--", "true", env=box).returncode == 0  # free again


def test_a_run_waits_for_a_device_until_its_holder_ends(box):
    first, _ = hold("--devices", "2,", env=box)
    waiting = start([sys.executable, "-m", "convoy", "run", "--devices", "2,", "--wait", "60", "--", "sh", "-c",
                     "echo got $CUDA_VISIBLE_DEVICES"], env=box)
    time.sleep(1.0)
    assert waiting.poll() is None  # still waiting for GPU 2
    release(first, box)
    out = finish(waiting, timeout=30).splitlines()
    # said once what it waits for and who holds it (it looked hung with --wait 1h), and when it has the device
    assert waiting.returncode == 0 and len(out) == 3 and "got 2" in out, out
    assert out[0].startswith(f"convoy: waiting up to 1m for GPU 2 (Tesla T4): leased by pid {first.pid} "), out
    assert re.fullmatch(r"convoy: got GPU 2 \(Tesla T4\) after waiting [\d.]+ s", out[1]), out


def test_run_and_launch_keep_off_each_others_devices(box):
    job, _ = hold("--devices", "1,", env=box)
    try:
        launch = convoy("launch", "--devices", "1,", "--no-python", "true", env=box, timeout=60)
        assert launch.returncode == 1 and launch.stderr.startswith("convoy: cannot lease 1 of the requested devices: "
                                                                   f"GPU 1 (NVIDIA GeForce RTX 4090) is leased by pid "
                                                                   f"{job.pid}"), launch.stderr
    finally:
        release(job, box)
    launcher = start([sys.executable, "-m", "convoy", "launch", "--devices", "2,", "--no-python", "sh", "-c", HOLD],
                     env=box)
    try:
        assert "running gpus=2" in launcher.stdout.readline()
        run = convoy("run", "--devices", "2,", "--", "true", env=box)
        assert run.returncode == 1 and "GPU 2 (Tesla T4) is leased by pid" in run.stderr, run.stderr
    finally:
        release(launcher, box)
    assert launcher.returncode == 0 and leases(box) == []


def test_free_moves_a_count_past_a_leased_device(box):
    """`convoy run --devices 2 --free` was handed a GPU that a running `convoy run --devices 1,3` held."""
    job, _ = hold("--devices", "1,3", env=box)
    try:
        one = convoy("run", "--devices", "1", "--free", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES", env=box)
        two = convoy("run", "--devices", "2", "--free", "--no-lease", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES",
                     env=box)
        assert (one.returncode, one.stdout, two.returncode, two.stdout) == (0, "0\n", 0, "0,2\n"), one.stderr
        listed = convoy("run", "--devices", "0,1", "--free", "--", "true", env=box)
        assert listed.returncode == 1 and "GPU 1 (NVIDIA GeForce RTX 4090) cannot be used: leased by pid" in \
            listed.stderr and "wait for them (--wait 10m)" in listed.stderr, listed.stderr
    finally:
        release(job, box)


def test_a_count_refused_for_a_leased_device_says_that_free_picks_free_ones(box):
    """`convoy run --devices 2` while GPU 1 was leased was refused with three GPUs free, and the line did not say
    that `--free` moves a count past leased devices."""
    job, _ = hold("--devices", "1,", env=box)
    try:
        for argv in (["run", "--devices", "2", "--", "true"], ["launch", "--devices", "2", "--no-python", "true"]):
            refused = convoy(*argv, env=box, timeout=60)
            assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
            assert "is leased by pid" in refused.stderr and "; --free takes 2 devices that no other job holds " \
                "(--devices 2 --free); or wait for them (--wait 10m)" in refused.stderr, refused.stderr
        listed = convoy("run", "--devices", "0,1", "--", "true", env=box)  # exact devices: --free would not help
        assert listed.returncode == 1 and "--free" not in listed.stderr, listed.stderr
        taken = convoy("run", "--devices", "2", "--free", "--", "sh", "-c", "echo $CUDA_VISIBLE_DEVICES", env=box)
        assert (taken.returncode, taken.stdout) == (0, "0,2\n"), taken.stderr
    finally:
        release(job, box)


def test_the_lease_ends_with_the_command_killed_or_not(box):
    assert convoy("run", "--devices", "0,", "--", "sh", "-c", "kill -9 $$", env=box).returncode == 128 + 9
    assert leases(box) == []
    # convoy run killed outright: the command holds the lease (it inherited the lock) until it ends
    job, line = hold("--devices", "0,", env=box)
    command = int(line.rpartition("pid=")[2])
    try:
        os.kill(job.pid, signal.SIGKILL)
        job.wait(timeout=10)
        assert len(leases(box)) == 1 and os.path.exists(f"/proc/{command}")
    finally:
        release(job, box)  # the command ends (it held the job's stdout open until now)
    deadline = time.monotonic() + 60
    while leases(box) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leases(box) == []


def test_a_sigterm_to_run_reaches_the_command_and_gives_143(box):
    """A scheduler's SIGTERM to `convoy run` is passed to the command; the command's end by it is 143."""
    job, line = hold("--devices", "0,", env=box)
    command = int(line.rpartition("pid=")[2])
    job.send_signal(signal.SIGTERM)
    out = finish(job, timeout=30)
    assert job.returncode == 143 and out == "", out
    assert not os.path.exists(f"/proc/{command}") and leases(box) == []


def test_run_takes_no_lease_for_the_cpu_and_stays_torch_free(box):
    assert convoy("run", "--devices", "0", "--", "true", env=box).returncode == 0
    assert not os.path.exists(box["CONVOY_LEASE_DIR"])  # no device, no lease (not even its directory)
    code = ("import sys; from convoy.cli.main import main; rc = main(['run', '--devices', '1,3', '--', 'true']); "
            "print('torch' in sys.modules, rc)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=box, timeout=60)
    assert out.stdout.strip() == "False 0", out.stderr
    assert len(os.listdir(box["CONVOY_LEASE_DIR"])) == 2 and leases(box) == []  # leased, then released


def test_a_signal_while_the_command_starts_reaches_the_command(monkeypatch):
    """A SIGTERM that arrives as CMD is being started (before, convoy's handlers went in after the start: the
    signal ended convoy and left CMD running, holding its devices) is passed to CMD once it exists."""
    import subprocess as sp

    from convoy.cli import run as run_cli
    from convoy.launch import group

    real_popen = sp.Popen

    def popen_then_sigterm(*args, **kwargs):
        child = real_popen(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # delivered here, inside the start
        return child

    monkeypatch.setattr(group.subprocess, "Popen", popen_then_sigterm)
    caught: list[int] = []

    def ours(signum, _frame):  # what was installed before: it must not be the one that gets the signal
        caught.append(signum)

    before = signal.signal(signal.SIGTERM, ours)
    try:
        ended = run_cli._run_child(["sh", "-c", "sleep 5"], dict(os.environ), ())
        assert signal.getsignal(signal.SIGTERM) is ours  # put back afterwards
    finally:
        signal.signal(signal.SIGTERM, before)
    assert ended.code == 128 + signal.SIGTERM and not caught  # CMD ended by the signal, not left behind


#: a command whose shell starts two processes without exec, one of which ignores SIGTERM; prints their pids
FAMILY = ('sleep 300 & a=$!; (trap "" TERM; echo ignoring; exec sleep 300) & b=$!; echo "running pid=$$ kids=$a,$b"; '
          'while [ ! -e "$STOP" ]; do sleep 0.05; done; wait')


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_a_sigterm_stops_every_process_of_the_command_before_the_lease_ends(box):
    """`convoy run -- ./wrapper.sh` whose script starts children without exec: a SIGTERM to convoy reached only
    the script, convoy released the lease at once, and the children kept running on GPUs the next job was given.
    Now the signal reaches the command's whole process group, SIGKILL follows after the shutdown timeout, and the
    devices stay leased until the last process is gone."""
    job = start([sys.executable, "-m", "convoy", "run", "--devices", "1,3", "--shutdown-timeout", "10", "--",
                 "sh", "-c", FAMILY], env=box)
    lines = [job.stdout.readline(), job.stdout.readline()]  # once the second one ignores SIGTERM
    line = next((line for line in lines if line.startswith("running")), "")
    assert line and "ignoring\n" in lines, "".join(lines) + finish(job, timeout=10)
    kids = [int(pid) for pid in line.strip().rpartition("kids=")[2].split(",")]
    job.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 8  # before the SIGKILL at 10 s
    while _alive(kids[0]) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(kids[0]), "the script's child did not get the SIGTERM"
    assert _alive(kids[1]) and job.poll() is None  # it ignores SIGTERM: convoy waits for it, holding the lease
    taken = convoy("run", "--devices", "3,", "--", "true", env=box)
    assert taken.returncode == 1 and "GPU 3 (NVIDIA GeForce RTX 3090) is leased by pid" in taken.stderr, taken.stderr
    out = finish(job, timeout=60)  # SIGKILL to the group after 10 s
    assert job.returncode == 143 and out == "", out  # the script's own end, by the SIGTERM
    assert not _alive(kids[1]) and leases(box) == []


def test_processes_the_command_leaves_running_are_stopped_before_the_lease_ends(box):
    done = convoy("run", "--devices", "1,", "--", "sh", "-c", "sleep 300 & echo started $!", env=box)
    kid = int(done.stdout.split()[1])
    assert done.returncode == 0 and not _alive(kid) and leases(box) == []
    assert done.stderr.startswith(f"convoy: the command has ended, but 1 process it started (pid {kid}) still runs; "
                                  "stopping them (SIGTERM, SIGKILL after 30s) before the devices are released"), \
        done.stderr


def test_a_process_that_leaves_the_commands_group_is_stopped_before_the_lease_ends(box):
    """A process of the command that escaped its group (setsid) was left running with the devices, held only by
    its copy of the lease: it is the command's still (a descendant) and is stopped like the rest."""
    done = convoy("run", "--devices", "2,", "--shutdown-timeout", "5", "--", "sh", "-c",
                  "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!", env=box)
    escaped = int(done.stdout)
    assert done.returncode == 0 and not _alive(escaped) and leases(box) == [], done.stderr
    assert "but 1 process it started" in done.stderr, done.stderr


#: processes that leave the command's group, session and descriptors: a grandchild in a session of its own that
#: ignores SIGTERM, its descriptors closed (as torchrun starts its workers), and a double-forked daemon
ESCAPES = """
import os, signal, subprocess, sys, time
hold = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('ready', flush=True); time.sleep(300)"]
worker = subprocess.Popen(hold, start_new_session=True, close_fds=True, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
worker.stdout.readline()  # SIGTERM is ignored from here on
read, write = os.pipe()
if os.fork() == 0:  # the daemon: fork, new session, fork again, the middle one leaves
    os.setsid()
    if os.fork() == 0:
        os.write(write, str(os.getpid()).encode())
        os.closerange(0, 1024)
        time.sleep(300)
    os._exit(0)
daemon = int(os.read(read, 32))
print(f"running worker={worker.pid} daemon={daemon}", flush=True)
time.sleep(300)
"""


def test_a_sigterm_reaches_every_descendant_and_the_lease_waits_for_the_last(box):
    job = start([sys.executable, "-m", "convoy", "run", "--devices", "1,", "--shutdown-timeout", "12", "--",
                 sys.executable, "-c", ESCAPES], env=box)
    line = job.stdout.readline()
    assert line.startswith("running"), line + finish(job, timeout=10)
    worker, daemon = (int(part.partition("=")[2]) for part in line.split()[1:])
    job.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while _alive(daemon) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive(daemon), "the daemon did not get the SIGTERM"
    assert _alive(worker) and job.poll() is None and len(leases(box)) == 1  # it ignores SIGTERM: held
    out = finish(job, timeout=60)  # SIGKILL to every descendant after 12 s
    assert job.returncode == 143, out
    assert not _alive(worker) and leases(box) == []


WORKER_SLOW_TO_STOP = """
import signal, sys, time
import torch.distributed as dist
signal.signal(signal.SIGTERM, lambda *_: None)  # a worker slow to stop: it carries on after SIGTERM
print("worker running", flush=True)
time.sleep(300)
"""


@pytest.mark.slow
def test_torchrun_as_the_command_keeps_the_lease_until_its_worker_is_gone(box, tmp_path):
    """torchrun starts its workers through subprocess (descriptors closed, so no copy of the lock) and they can
    sit outside the command's group: convoy exited at the shutdown timeout and freed GPU 0 while the worker still
    ran on it. Now the worker is stopped with the rest and the lease ends after it."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER_SLOW_TO_STOP)
    job = start([sys.executable, "-m", "convoy", "run", "--devices", "0,", "--shutdown-timeout", "3", "--",
                 sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
                 str(script)], env={**box, "OMP_NUM_THREADS": "1"})
    output = ""
    deadline = time.monotonic() + 120
    while "worker running" not in output and time.monotonic() < deadline:
        output += job.stdout.readline()
    assert "worker running" in output, output + finish(job, timeout=10)
    workers = [int(pid) for pid in subprocess.run(["pgrep", "-f", str(script)], capture_output=True,
                                                   text=True).stdout.split() if int(pid) != job.pid]
    job.send_signal(signal.SIGTERM)
    finish(job, timeout=60)
    assert job.returncode in (143, 137), job.returncode
    assert workers and not any(_alive(pid) for pid in workers) and leases(box) == []


def _on_a_terminal(argv: list[str], env: dict, *, send: bytes, after: bytes, timeout: float = 30) -> tuple[str, int]:
    """Run ``argv`` on a new pseudo-terminal (its controlling one), type ``send`` once ``after`` was printed;
    (what the terminal showed, the wait status)."""
    import pty
    import select

    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    out, sent, deadline = b"", False, time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not sent and after in out:
                os.write(fd, send)
                sent = True
            if select.select([fd], [], [], 0.1)[0]:
                try:
                    data = os.read(fd, 4096)
                except OSError:  # the terminal's other side is gone
                    break
                if not data:
                    break
                out += data
        else:
            os.kill(pid, signal.SIGKILL)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return out.decode(errors="replace"), status


def test_on_a_terminal_the_command_reads_the_keyboard_and_ctrl_c_stops_it(box):
    """CMD's process group has the terminal: it reads the keyboard (a background group would be stopped), and a
    Ctrl-C reaches it; convoy then ends by SIGINT itself, so a shell loop around it stops too."""
    argv = [sys.executable, "-m", "convoy", "run", "--devices", "1,", "--"]
    shown, status = _on_a_terminal([*argv, "sh", "-c", 'echo ready; read x; echo "got $x"'], box, send=b"hello\n",
                                   after=b"ready")
    assert "got hello" in shown and os.waitstatus_to_exitcode(status) == 0, shown
    # CMD takes Ctrl-C's default action from the moment it says ready: `sh -c "echo ready; sleep 300"` did not (a
    # ^C typed between its echo and its fork of sleep reached only sh, which then waited for sleep, 300 s)
    stays = ("import signal, time; signal.signal(signal.SIGINT, signal.SIG_DFL); print('ready', flush=True); "
             "time.sleep(300)")
    shown, status = _on_a_terminal([*argv, sys.executable, "-c", stays], box, send=b"\x03", after=b"ready")
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGINT, shown
    assert leases(box) == []
