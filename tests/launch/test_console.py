"""A rank's progress bar under convoy launch reads as it would without convoy: redrawn in place on a terminal,
a few lines when the output is a pipe or a file; each rank's line keeps its one prefix."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest

from convoy.launch.console import RankLines
from tests.distributed import cpu_env
from tests.processes import finish, start

SCRIPT = str(Path(__file__).parent / "scripts" / "progress.py")


def _feed(lines: RankLines, pieces, clock=None) -> str:
    return "".join(lines.feed(piece) for piece in pieces) + lines.close()


def test_a_bar_redraws_in_place_on_a_terminal_and_is_sparse_elsewhere():
    redraws = ["\r", " 0%\r", " 5%\r", "10%\r", "100%\n", "next line\n"]
    assert _feed(RankLines("[rank0]: ", tty=True), redraws) == \
        "[rank0]:  0%\r[rank0]:  5%\r[rank0]: 10%\r[rank0]: 100%\x1b[K\n[rank0]: next line\n"
    now = [0.0]
    piped = RankLines("[rank0]: ", tty=False, every=6, clock=lambda: now[0])
    shown = []
    for i, piece in enumerate(redraws):
        now[0] = 4.0 * i  # a redraw every 4 s: the first, one 6 s or more later, and the last state
        shown.append(piped.feed(piece))
    assert "".join(shown) == "[rank0]:  0%\n[rank0]: 10%\n[rank0]: 100%\n[rank0]: next line\n"
    cut = RankLines("[rank1]: ", tty=False, every=10, clock=lambda: 0.0)
    assert _feed(cut, ["\r", "1%\r", "2%\r"]) == "[rank1]: 1%\n[rank1]: 2%\n"  # a rank killed mid-bar: its last state


def _launch(*argv: str, env=None):
    return start([sys.executable, "-m", "convoy", "launch", "--devices", "0", *argv], env=cpu_env(env))


@pytest.mark.parametrize("engine", [[], pytest.param(["--max-restarts", "1"], marks=pytest.mark.slow)],
                         ids=["direct", "elastic"])
def test_piped_a_bar_is_a_few_lines_not_one_per_redraw(engine):
    """`convoy launch train.py | tee log`: each refresh was a '[rank0]:  25%|...' line of its own."""
    job = _launch("--nproc-per-node", "2", *engine, SCRIPT, "30")
    out = finish(job, timeout=120)
    assert job.returncode == 0, out
    for rank in (0, 1):
        bars = [line for line in out.splitlines() if line.startswith(f"[rank{rank}]: train:")]
        assert 1 <= len(bars) <= 3 and bars[-1].startswith(f"[rank{rank}]: train: 100%"), out
        assert f"[rank{rank}]: done {rank}" in out.splitlines()
    assert "\r" not in out


def test_on_a_terminal_a_bar_redraws_in_place():
    import pty
    import select

    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            argv = [sys.executable, "-m", "convoy", "launch", "--devices", "0", "--nproc-per-node", "1", SCRIPT, "30"]
            os.execve(sys.executable, argv, cpu_env())
        finally:
            os._exit(127)
    out, deadline = b"", time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            if select.select([fd], [], [], 0.2)[0]:
                try:
                    data = os.read(fd, 4096)
                except OSError:
                    break
                if not data:
                    break
                out += data
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    text = out.decode(errors="replace")
    assert os.waitstatus_to_exitcode(status) == 0, text
    start = text.index("[rank0]: train:")
    end = text.find("\n", start)
    bar = text[start:end if end >= 0 else len(text)]  # the bar's line, up to its end (or the output's)
    redraws = re.findall(r"\[rank0\]: train: +\d+%", bar)
    assert len(redraws) >= 3, repr(bar)  # redrawn in place: carriage returns between its states, no line end
    assert bar.count("\r") >= len(redraws) - 1 and "[rank0]: train: 100%" in text, repr(text)


def test_a_line_printed_after_a_bar_comes_after_it():
    """`accelerator.print("done")` (stdout) right after a bar closed (stderr): with the launcher's stdout and stderr
    one file (a terminal, `2>&1`), each rank's output reaches it in the order the rank wrote it (two pipes read
    side by side put a "done" before its bar's last line in 8 runs of 10 of this script)."""
    rounds = 20
    job = _launch("--nproc-per-node", "2", str(Path(SCRIPT).with_name("bar_then_print.py")), str(rounds))
    out = finish(job, timeout=120)
    assert job.returncode == 0, out
    lines = out.splitlines()
    for rank in (0, 1):
        for k in range(rounds):
            done = lines.index(f"[rank{rank}]: done {rank} {k}")
            bar = [i for i, line in enumerate(lines) if line.startswith(f"[rank{rank}]: bar {k}: ")]
            assert bar and max(bar) < done, out  # the bar's last line (its 100 %), then the printed line
            assert lines[max(bar)].startswith(f"[rank{rank}]: bar {k}: 100%"), out


def test_apart_stdout_and_stderr_stay_apart(tmp_path):
    """`convoy launch train.py > out.txt 2> err.txt`: the bar in err.txt, the rank's printed line in out.txt."""
    with open(tmp_path / "out.txt", "w") as out, open(tmp_path / "err.txt", "w") as err:
        job = start([sys.executable, "-m", "convoy", "launch", "--devices", "0", "--nproc-per-node", "2", SCRIPT,
                     "3"], env=cpu_env(), stdout=out, stderr=err)
        finish(job, timeout=120)
    assert job.returncode == 0
    printed, errors = (tmp_path / "out.txt").read_text(), (tmp_path / "err.txt").read_text()
    for rank in (0, 1):
        assert f"[rank{rank}]: done {rank}" in printed.splitlines() and "train:" not in printed, printed
        assert f"[rank{rank}]: train: 100%" in errors and "done" not in errors, errors
