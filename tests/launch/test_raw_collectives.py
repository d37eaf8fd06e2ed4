"""A raw torch all_reduce that one rank never joins ends the job within the timeout, naming that rank.

CPU processes on every machine (``--devices 0``): on a one-GPU box two ranks would be refused by the plan."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from convoy.launch.hang_report import SUFFIX, missing_note

SCRIPT = str(Path(__file__).parent / "scripts" / "skip_collective.py")


@pytest.mark.slow
@pytest.mark.parametrize("engine", [[], ["--max-restarts", "0", "--engine", "elastic"]], ids=["direct", "elastic"])
def test_a_skipped_raw_all_reduce_ends_the_job_naming_the_missing_rank(engine):
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "convoy", "launch", "--devices", "0", "--nproc-per-node", "2", *engine,
                           "--collective-timeout", "3", SCRIPT], capture_output=True, text=True, timeout=110)
    elapsed = time.monotonic() - start
    assert proc.returncode == 1, proc.stderr
    report = [line for line in proc.stderr.splitlines() if line.startswith("convoy: rank ")]
    assert len(report) == 1 and report[0].startswith("convoy: rank 0 "), proc.stderr  # the traceback may follow
    assert "rank 1 never joined collective #2" in report[0], proc.stderr
    assert elapsed < 60  # rank 1 sleeps for 120 s: the job did not wait for it


def test_raw_process_groups_get_convoys_default_timeout():
    proc = subprocess.run([sys.executable, "-m", "convoy", "launch", "--devices", "0", "--nproc-per-node", "1", SCRIPT,
                           "report"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "default timeout 300.0" in proc.stdout  # torch's own default for gloo is 1800 s


def test_missing_note_names_the_ranks_that_issued_fewer_collectives(tmp_path):
    files = {}
    for rank, count in enumerate([3, 2, 3, 1]):
        files[rank] = str(tmp_path / f"rank{rank}.json")
        Path(files[rank] + SUFFIX).write_text(str(count))
    files[4] = str(tmp_path / "never-started.json")
    assert missing_note(files, failed_rank=0).startswith("ranks 1, 3 never joined collective #3 that rank 0 waited")
    assert missing_note(files, failed_rank=2).startswith("ranks 1, 3 never joined")
    assert missing_note(files, failed_rank=3) is None  # nobody is behind the failing rank
    assert missing_note(files, failed_rank=4) is None  # the failing rank never counted
