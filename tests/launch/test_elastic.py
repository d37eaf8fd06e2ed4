"""The elastic engine (torch's agent) for restarts and several nodes, for real on loopback.

Every job here runs CPU processes (``--devices 0``), also on a GPU box: two loopback "nodes" or two restarting
ranks on one GPU would mean two ranks per GPU. What a user gets on one GPU is tested with an inventory file.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from convoy.launch.elastic import _first_cause
from convoy.launch.ports import free_port
from tests.conftest import INVENTORIES, held_leases
from tests.distributed import cpu_env
from tests.launch.listening import listening
from tests.processes import finish, start, stop_tree

pytestmark = pytest.mark.slow
SCRIPTS = Path(__file__).parent / "scripts"


def launch(*argv: str, env=None):
    """``convoy launch`` in its own session; CPU processes unless ``argv`` names devices."""
    cpu = () if "--devices" in argv else ("--devices", "0")
    return start([sys.executable, "-m", "convoy", "launch", *cpu, *argv], env=env or cpu_env())


def test_max_restarts_recovers_from_one_failure():
    ok = launch("--max-restarts", "1", str(SCRIPTS / "fail.py"), "--until-restart", "1")
    out = finish(ok, timeout=120)
    assert ok.returncode == 0, out
    assert "[rank0]: recovered rank=0 restart=1" in out and "[rank1]: recovered rank=1 restart=1" in out
    assert "[rank1]: ValueError: boom from rank 1" in out  # the first attempt's failure was shown


def test_a_restart_says_which_rank_died_and_the_knock_on_failure_is_not_blamed():
    """Rank 1 killed by SIGKILL while rank 0 waits in a collective (which then fails, "Connection closed by peer"):
    no convoy line said a rank died and the group restarted, torch's W/E lines did, and the report blamed rank 1
    "(its traceback is above)" when the traceback above was rank 0's."""
    job = launch("--nproc-per-node", "2", "--max-restarts", "1", str(SCRIPTS / "fail.py"), "--how", "kill",
                 "--others", "collective")
    out = finish(job, timeout=180)
    assert job.returncode == 1, out
    lines = out.splitlines()
    assert "convoy: rank 1 died (SIGKILL) (1 other rank failed after it); restarting, attempt 1 of 1" in lines, out
    assert lines[-1].startswith("convoy: rank 1 (local rank 1) on host ") and lines[-1].endswith(
        "failed with signal SIGKILL after " + lines[-1].split(" after ")[1].split(" s;")[0] + " s; stopped the other "
        "1 rank(s) (it printed no traceback)"), lines[-1]
    # rank 0's own error is still shown, as rank 0's, in one line: not gloo's dozen-line traceback
    lost = [line for line in lines if line.startswith("[rank0]: RuntimeError: ") and "by peer" in line]
    assert lost and lost[0].endswith("(another rank ended; the launcher names it)"), out
    assert "Traceback" not in out and "GLHF" not in out, out
    assert not any(re.match(r"[WEI]\d{4} ", line) for line in lines), out  # torch's agent's log lines


def test_an_error_file_cut_short_is_one_line_that_says_so():
    """A rank stopped while torch's own ``@record`` wrote its error file leaves it empty; torch's agent cannot parse
    it and gives up the job. That was 'the elastic agent failed before the workers ran: Expecting value ...'."""
    job = launch("--engine", "elastic", "--nproc-per-node", "1", "--no-python", sys.executable, "-c",
                 "import os; open(os.environ['TORCHELASTIC_ERROR_FILE'], 'w').close(); os._exit(1)")
    out = finish(job, timeout=120)
    assert job.returncode == 1, out
    lines = out.splitlines()
    assert lines[1:] == ["convoy: torch's agent stopped the job: a failed rank's error file (TORCHELASTIC_ERROR_FILE) "
                     "is not JSON (Expecting value: line 1 column 1 (char 0)), as torch's @record leaves it when "
                     "the rank is stopped while writing it"], out



def _failure(exitcode: int, timestamp: int, traceback: str | None = None) -> SimpleNamespace:
    """What ``_first_cause`` reads of torch's ``ProcessFailure``: an error file's dict, else a sentence."""
    message = {"message": traceback, "extraInfo": {"py_callstack": traceback}} if traceback else "Signal 9 (SIGKILL)"
    return SimpleNamespace(exitcode=exitcode, timestamp=timestamp, message=message)


@pytest.mark.parametrize("killed_at", [100, 101], ids=["same second", "next second"])
def test_the_killed_rank_is_the_cause_even_when_the_agent_saw_it_a_second_after_its_peer_failed(killed_at):
    """The killed rank's timestamp is when the agent saw it; the rank it took down wrote its error file at once, and
    once that file came a second earlier, the knock-on failure was blamed."""
    lost = "Traceback ...\nRuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer"
    failures = {0: _failure(1, 100, lost), 1: _failure(-9, killed_at), 2: _failure(-15, 99)}
    assert _first_cause(failures)[0] == 1


def test_of_two_real_failures_the_earlier_is_the_cause_and_sigterm_is_never_the_cause():
    failures = {0: _failure(1, 101, "ValueError: b"), 1: _failure(1, 100, "ValueError: a"), 2: _failure(-15, 99)}
    assert _first_cause(failures)[0] == 1
    assert _first_cause({3: _failure(-15, 100), 2: _failure(-15, 100)})[0] == 2


def test_elastic_engine_reports_the_real_failing_rank():
    bad = launch("--engine", "elastic", str(SCRIPTS / "fail.py"), "--bad", "1")
    out = finish(bad, timeout=120)
    assert bad.returncode == 1, out
    assert "convoy: rank 1 (local rank 1) on host" in out and "failed with exit code 1" in out
    assert out.count("ValueError: boom from rank 1") == 1, out
    assert 'File "' in out and "runpy" not in out  # the user's frames, not the record wrapper's


@pytest.mark.parametrize("how, code, line", [(signal.SIGTERM, 143, "convoy: terminated (SIGTERM)"),
                                             (signal.SIGINT, 130, "convoy: interrupted")])
@pytest.mark.parametrize("engine", [("--max-restarts", "1"), ("--engine", "elastic")], ids=["c10d", "static"])
def test_a_stop_signal_stops_the_agents_workers_with_its_own_code_and_line(how, code, line, engine):
    """torch's agent raised its SignalException out of convoy launch: a traceback and exit 1 for a scheduler's
    SIGTERM. Now 143 and "terminated" (a Ctrl-C: 130, "interrupted"), the workers stopped; with restarts (c10d
    rendezvous) and without (one node: torch's static rendezvous)."""
    # (torch's agent reads "$$" in a command's arguments as its own escape of "$": no shell's pid here)
    job = launch(*engine, "--no-python", sys.executable, "-c",
                 "import os, time; print(f'pid={os.getpid()}', flush=True); time.sleep(60)")
    pids = []
    while len(pids) < 2:
        out = job.stdout.readline()
        assert out, "the job ended early"
        pids += [int(p) for p in re.findall(r"pid=(\d+)", out)]
    job.send_signal(how)
    out = finish(job, timeout=60)
    assert job.returncode == code and out.strip().splitlines()[-1] == line, out
    # the launcher's own traceback is gone (a worker's KeyboardInterrupt on the SIGINT torch passes on may show)
    assert "SignalException" not in out and "elastic/agent/server/api.py\", line" not in out, out
    time.sleep(0.2)
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids), "a worker outlived the job"


def test_duplicate_stdout_filters_copy_the_matching_lines(tmp_path):
    """torchrun's --duplicate-stdout-filters, run by torch's agent (it was accepted and ignored)."""
    job = launch("--nproc-per-node", "2", "--log-dir", str(tmp_path), "--duplicate-stdout-filters", "apple",
                 "--no-python", "sh", "-c", "echo apple pie; echo pear")
    out = finish(job, timeout=120)
    assert job.returncode == 0 and out.count("pear") == 2, out
    copies = list(tmp_path.rglob("filtered_stdout.log"))
    assert len(copies) == 1, copies
    assert sorted(copies[0].read_text().splitlines()) == ["[rank0]: apple pie", "[rank1]: apple pie"]


def test_two_nodes_on_loopback_train():
    port = str(free_port())
    nodes = [launch("--nnodes", "2", "--node-rank", str(rank), "--master-addr", "127.0.0.1", "--master-port", port,
                    "--nproc-per-node", "1", str(SCRIPTS / "ddp_train.py"), "--steps", "2") for rank in (1, 0)]
    outs = [finish(node, timeout=120) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outs
    assert "[rank1]: trained rank=1 world=2 local=0" in outs[0]  # --node-rank is respected
    assert "[rank0]: trained rank=0 world=2 local=0" in outs[1]


def test_two_nodes_on_a_one_gpu_host_refuse_the_second_at_once(tmp_path):
    """Both loopback "nodes" want GPU 0: the second is refused with a line that says what to do, not a hang."""
    env = cpu_env({"CONVOY_INVENTORY": str(INVENTORIES / "1xh100.json"), "CONVOY_LEASE_DIR": str(tmp_path)})
    env.pop("CUDA_VISIBLE_DEVICES")  # the inventory's GPU is visible: the user's one-GPU host
    port = str(free_port())
    argv = ("--devices", "auto", "--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", port,
            "--no-python", "true")
    first = launch("--node-rank", "1", *argv, env=env)
    try:
        deadline = time.monotonic() + 30
        while not held_leases(tmp_path) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert held_leases(tmp_path), "the first node did not lease GPU 0"
        began = time.monotonic()
        second = launch("--node-rank", "0", *argv, env=env)
        out = finish(second, timeout=120)
        assert time.monotonic() - began < 120  # at once, not after torch's 600 s wait for the other node
        assert second.returncode == 1, out
        line = out.strip().splitlines()[-1]
        assert line.startswith("convoy: cannot lease") and "GPU 0" in line and f"pid {first.pid}" in line, out
        assert "several nodes on one host" in line and "--devices 0" in line, line
    finally:
        stop_tree(first.pid)
        first.communicate()
    assert not held_leases(tmp_path)


@pytest.mark.parametrize("node, how, code, line", [
    (0, "group", 130, "convoy: interrupted"),
    (0, "launcher", 143, "convoy: terminated (SIGTERM)"),
    (1, "launcher", 143, "convoy: terminated (SIGTERM)"),
], ids=["node 0, ctrl-c", "node 0, sigterm", "node 1, sigterm"])
def test_a_stop_while_torch_waits_for_the_other_nodes_ends_the_launch_at_once(tmp_path, node, how, code, line):
    """torch meets the other nodes in TCPStore's constructor (C++): node 0 waits until every node has connected,
    another node for node 0's answer, up to 600 s, and no Python handler runs meanwhile: Ctrl-C and SIGTERM did
    nothing (pytorch/pytorch#63802). Now the launch ends within seconds with the line and code of that stop, no
    C++ stack from the interrupted call, and its GPU lease released."""
    env = cpu_env({"CONVOY_INVENTORY": str(INVENTORIES / "1xh100.json"), "CONVOY_LEASE_DIR": str(tmp_path)})
    env.pop("CUDA_VISIBLE_DEVICES")
    port = free_port()  # node 1: node 0 never listens there, and torch's constructor retries (sleeps) until it does
    job = launch("--devices", "auto", "--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1",
                 "--master-port", str(port), "--no-python", "true", env=env)
    try:
        deadline = time.monotonic() + 60
        while not _waiting(job.pid, node, port) and time.monotonic() < deadline:
            assert job.poll() is None, job.communicate()[0]
            time.sleep(0.05)
        assert job.poll() is None and held_leases(tmp_path), f"node {node} is not waiting with GPU 0 leased"
        time.sleep(1 if node == 0 else 3)  # in the constructor (a stop before it gets the same line and code)
        began = time.monotonic()
        if how == "group":  # a terminal's Ctrl-C reaches the whole foreground group
            os.killpg(job.pid, signal.SIGINT)
        else:
            job.send_signal(signal.SIGTERM)
        out = finish(job, timeout=120)
    finally:
        stop_tree(job.pid)
    assert time.monotonic() - began < 120, out  # not torch's 600 s (node 0) or 900 s (node 1) wait
    assert job.returncode == code, out
    assert out.strip().splitlines()[-1] == line, out
    assert "Exception raised from" not in out and "frame #" not in out, out
    deadline = time.monotonic() + 60  # the job's guard releases the lease once no process of the job is left
    while held_leases(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not held_leases(tmp_path)


def _waiting(pid: int, node: int, port: int) -> bool:
    """Node 0 listens on the port once inside torch's constructor; node 1 sleeps there between its tries (the
    launcher's main thread sleeps nowhere else once torch is loaded), as /proc says where the kernel shows it."""
    if node == 0:
        return port in [listens for _, _, listens in listening([pid])]
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/wchan") as wchan:
        return "libtorch_cpu" in maps.read() and wchan.read() in ("hrtimer_nanosleep", "0", "")


def test_importing_the_agent_pauses_the_collector_and_leaves_it_as_it_was():
    """The collector is paused while torch's agent is imported, then back on, freezing nothing: a program that
    calls run_elastic keeps collecting its own garbage (the ``convoy`` command alone freezes as it exits)."""
    import gc
    import weakref

    from convoy.launch.elastic import _gc_paused

    class Node:
        pass

    frozen = gc.get_freeze_count()
    with _gc_paused():
        assert not gc.isenabled()
        import torch.distributed.launcher.api  # noqa: F401
    assert gc.isenabled() and gc.get_freeze_count() == frozen
    node = Node()
    node.itself = node
    gone = weakref.ref(node)
    del node
    gc.collect()
    assert gone() is None


def test_the_convoy_command_freezes_its_objects_as_it_leaves(monkeypatch):
    """What the command imported is not walked again by the interpreter's last collections (its exit cost)."""
    import gc

    from convoy.cli import main as cli

    monkeypatch.setattr(cli, "main", lambda argv=None: 0)
    frozen = gc.get_freeze_count()
    try:
        with pytest.raises(SystemExit) as done:
            cli.entry_point()
        assert done.value.code == 0 and gc.get_freeze_count() > frozen
    finally:
        gc.unfreeze()
