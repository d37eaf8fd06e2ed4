"""``convoy test`` on 2 CPU processes: every check passes; a rank that cannot join fails with a helpful line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from convoy.cli.main import main
from convoy.launch.selfcheck import CHECKS, Check, SelfCheckReport, format_selfcheck, run_selfcheck
from tests import processes


def _env():
    from tests.distributed import cpu_env

    return cpu_env()  # two CPU processes on every machine (the GPU run is tests/gpu)


@pytest.mark.slow
def test_selfcheck_passes_on_two_cpu_processes():
    proc = processes.run([sys.executable, "-m", "convoy", "test", "--devices", "0", "--json", "--size-mib", "4",
                          "--timeout", "20"],
                          capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] is True and report["world_size"] == 2 and report["backend"] == "gloo"
    assert [c["name"] for c in report["checks"]] == list(CHECKS)
    assert all(c["status"] == "pass" for c in report["checks"]), report
    assert report["bus_bandwidth_gbps"] > 0
    assert "3 steps match one process" in report["checks"][7]["detail"]


@pytest.mark.slow
def test_a_rank_that_cannot_join_is_named_with_what_to_do():
    report = run_selfcheck(devices="0", timeout=3, absent_ranks=(1,), env=_env(), echo=lambda line: None)
    assert not report.ok
    first = report.checks[0]
    assert (first.name, first.status) == ("rendezvous", "fail")
    assert first.detail.startswith("rank(s) 1 of 2 did not join 127.0.0.1:") and "within 3 s" in first.detail
    text = format_selfcheck(report)
    assert "FAIL  rendezvous" in text and "what to do: every node must reach MASTER_ADDR:MASTER_PORT" in text
    assert "----  all_reduce      not run" in text and text.endswith("(0 passed)")
    assert "rank 0" in report.launch_error


def test_report_verdicts():
    passed = tuple(Check(name, "pass", "ok") for name in CHECKS)
    assert SelfCheckReport(2, "gloo", passed).ok
    assert not SelfCheckReport(2, "gloo", passed[:-1]).ok  # a check that did not run is not a pass
    skipped = passed[:-1] + (Check("bus_bandwidth", "skip", "one process"),)
    assert SelfCheckReport(1, "gloo", skipped).ok
    failed = SelfCheckReport(2, "nccl", passed[:1] + (Check("all_reduce", "fail", "boom", "NCCL_P2P_DISABLE=1"),))
    text = format_selfcheck(failed)
    assert "FAIL  all_reduce      boom\n        what to do: NCCL_P2P_DISABLE=1" in text
    assert text.splitlines()[-1] == "result: 1 check(s) failed or did not run (1 passed)"


@pytest.mark.parametrize(("argv", "message"), [
    (["test", "--timeout", "0"], "argument --timeout: '0' must be > 0"),
    (["test", "--steps", "two"], "argument --steps: 'two' is not a number"),
    (["test", "--size-mib", "-4"], "argument --size-mib: '-4' must be > 0"),
    (["test", "--steps", "٣"], "argument --steps: '٣' is not a number"),
    (["test", "--timeout", "inf"], "argument --timeout: 'inf' is not a number"),
    (["test", "--frobnicate"], "unrecognized arguments: --frobnicate"),
])
def test_bad_arguments_exit_2_with_one_line(capsys, argv, message):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_bad_device_request_is_one_line(capsys):
    assert main(["test", "--devices", "1,1"]) == 2
    assert capsys.readouterr().err.startswith("convoy: ")


def test_help_has_examples():
    proc = subprocess.run([sys.executable, "-m", "convoy", "test", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "examples:" in proc.stdout and "convoy test --devices 0,1" in proc.stdout
