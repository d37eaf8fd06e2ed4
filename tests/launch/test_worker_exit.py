"""A launched Python worker ends with its program's status, after its threads, exit handlers and the finalizers of
its objects, with its files written, and without the interpreter's C-level teardown, where gloo aborted finished
ranks (pytorch/pytorch#179291).

One process through ``convoy.launch.record`` (what ``convoy launch`` runs each rank's program with) for the
endings; two-rank jobs for the finalizers (under ``convoy launch`` as under torchrun) and the abort itself.
"""

from __future__ import annotations

import gzip
import json
import signal
import sys
import zipfile
from pathlib import Path

import pytest

from convoy.launch.worker_exit import exit_status
from tests.distributed import cpu_env, run_script
from tests.processes import finish, start

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.mark.parametrize(("code", "status"), [(None, 0), (0, 0), (3, 3), (True, 1), ("a message", 1), (2**40, None)])
def test_the_status_is_the_one_python_exits_with_for_a_system_exit(code, status):
    assert exit_status(code) == status


def run_worker(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    """``ends_plainly.py`` as one worker: its exit status, its output, and what its never-closed file holds."""
    out_file = tmp_path / "written.txt"
    proc = start([sys.executable, "-u", "-m", "convoy.launch.record", str(SCRIPTS / "ends_plainly.py"),
                  str(out_file), *args], env=cpu_env())
    output = finish(proc, timeout=60)
    return proc.returncode, output, out_file.read_text() if out_file.exists() else ""


@pytest.mark.parametrize(("then", "status", "printed"), [
    ("return", 0, None),
    ("exit3", 3, None),
    ("message", 1, "stopped with a message"),
    ("raise", 1, "RuntimeError: failed after the work"),
])
def test_a_program_using_torch_distributed_ends_with_its_status_after_its_threads_handlers_and_finalizers(
        tmp_path, then, status, printed):
    code, output, written = run_worker(tmp_path, "--then", then)
    assert code == status, output
    assert written == "written, never flushed\n", output  # the teardown would have flushed it
    assert "the program's thread finished" in output, output  # joined, as Python joins it
    assert "the program's exit handler ran" in output, output
    assert printed is None or output.count(printed) == 1, output
    assert output.count("TEARDOWN") == 1, output  # what only the program's module held was finalized
    assert output.index("the program's exit handler ran") < output.index("TEARDOWN"), output


def test_a_program_without_torch_distributed_keeps_the_interpreters_teardown(tmp_path):
    code, output, written = run_worker(tmp_path, "--no-torch")
    assert code == 0, output
    assert written == "written, never flushed\n"
    assert "TEARDOWN" in output, output


@pytest.mark.slow
def test_ranks_that_end_while_gloo_still_runs_their_collectives_do_not_abort():
    """Through the interpreter's teardown this job aborted in 6 of 6 runs (SIGABRT in a finished rank)."""
    result = run_script(SCRIPTS / "busy_at_exit.py", nproc=2, timeout=120)
    assert result.returncode == 0, result.output
    assert result.output.count("TEARDOWN") == 2, result.output  # the program's objects finalized first
    assert "terminate called" not in result.output, result.output
    assert result.output.count("the program's exit handler ran") == 2, result.output


def test_a_rank_stopped_while_its_failure_is_reported_leaves_its_whole_report_and_error_file(tmp_path):
    """torch's agent SIGTERMs the other ranks once one failed; a rank failing at that moment (its peer gone) died
    with an empty error file, which the agent could not parse: the whole job stopped with 'Expecting value', its
    restarts unused. The SIGTERM now takes effect once the report (one line for a lost peer) and the error file are
    whole."""
    error_file = tmp_path / "0" / "error.json"
    error_file.parent.mkdir()
    proc = start([sys.executable, "-u", "-m", "convoy.launch.record", str(SCRIPTS / "stopped_while_failing.py")],
                 env={**cpu_env(), "TORCHELASTIC_ERROR_FILE": str(error_file)})
    output = finish(proc, timeout=60)
    assert proc.returncode == -signal.SIGTERM, output  # stopped, as the agent asked
    # a lost peer is one line on the console (the launcher names the rank that ended); the error file keeps the stack
    assert output.count("PeerGone: Connection closed by peer") == 1 and 'File "' not in output, output
    written = json.loads(error_file.read_text())["message"]
    assert written["message"] == "PeerGone: Connection closed by peer", written
    assert "in collective" in written["extraInfo"]["py_callstack"], written
    assert sorted(path.name for path in error_file.parent.iterdir()) == ["error.json"]  # nothing left aside


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["convoy", "torchrun"])
def test_every_finalizer_a_program_leaves_to_the_interpreter_runs_as_under_torchrun(tmp_path, monkeypatch, launcher):
    """gzip, zip, a temporary file, a tqdm bar, ``__del__`` (in the script and in a module of its own),
    ``weakref.finalize``, an exit handler and a late thread: complete under ``convoy launch`` as under torchrun.
    Before, convoy's workers skipped the finalizers: the gzip file was cut short, the zip unreadable, the
    temporary file left behind, the bar at 0/3000."""
    monkeypatch.setenv("CONVOY_TEST_LAUNCHER", launcher)
    result = run_script(SCRIPTS / "leaves_finalizers.py", nproc=2, args=[str(tmp_path)], timeout=120)
    assert result.returncode == 0, result.output
    for rank in ("rank0", "rank1"):
        out = tmp_path / rank
        assert gzip.open(out / "data.gz", "rt").read() == "complete\n" * 1000, rank
        assert zipfile.ZipFile(out / "data.zip").read("member.txt") == b"complete\n", rank
        assert not Path((out / "tempfile.txt").read_text()).exists(), rank
        assert f"{rank} bar: 100%" in result.output, result.output
        for name in ("del", "module_del", "finalize", "atexit", "thread"):
            assert (out / f"{name}.txt").read_text() == "complete\n", (rank, name)
