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
