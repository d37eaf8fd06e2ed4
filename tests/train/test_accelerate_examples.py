"""Scripts in the shape of Accelerate's ``examples/by_feature`` (``scripts/example_features.py``, written here: a
tiny classifier on synthetic token ids), with only the import lines differing between the libraries: one
process under ``convoy`` gives the numbers the installed ``accelerate`` gives (losses, batch sizes, printouts), and
2 CPU processes under ``convoy launch`` do what each feature promises.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.distributed import cpu_env, run_script
from tests.processes import finish, start

SCRIPT = Path(__file__).parent / "scripts" / "example_features.py"
FEATURES = ["memory", "profiler", "local_sgd", "logging"]


def _results(output: str) -> dict[str, dict]:
    rows = [json.loads(line.partition("RESULT ")[2]) for line in output.splitlines() if "RESULT {" in line]
    assert [row["feature"] for row in rows] == FEATURES, output[-3000:]  # printed by the main process only
    return {row.pop("feature"): row for row in rows}


def _one_process(library: str, out: Path) -> tuple[dict[str, dict], str]:
    proc = start([sys.executable, str(SCRIPT), library, ",".join(FEATURES), str(out)], env=cpu_env())
    output = finish(proc, timeout=180)
    assert proc.returncode == 0, output[-3000:]
    return _results(output), output


def test_one_process_gives_accelerates_numbers(tmp_path):
    pytest.importorskip("accelerate")
    ours, output = _one_process("convoy", tmp_path / "convoy")
    theirs, _ = _one_process("accelerate", tmp_path / "accelerate")
    for feature in FEATURES:  # losses to 7 digits, str(distributed_type), str(device), str(state), the feature's own
        assert ours[feature] == theirs[feature], feature
    # x0.9 after each out-of-memory error: the CPU allocator's above 40, CUDA's above 16
    assert ours["memory"]["tried"][:3] == [128, 115, 103] and ours["memory"]["tried"][-1] == 15
    assert len(ours["memory"]["losses"]) == 10  # 2 epochs of ceil(64 / 15) steps
    assert ours["profiler"]["recorded_linear"] and (tmp_path / "convoy" / "profile_0.json").is_file()
    assert json.loads((tmp_path / "convoy" / "profile_0.json").read_text())["traceEvents"]
    # Accelerate prints nothing until logging is configured; convoy prints at the logger's INFO level
    assert "MAIN ONLY 1" in output and "IN ORDER" in output


@pytest.mark.slow
def test_two_cpu_processes_run_each_feature(tmp_path):
    run = run_script(SCRIPT, nproc=2, args=["convoy", ",".join(FEATURES), str(tmp_path)], timeout=180)
    assert run.returncode == 0, run.output[-4000:]
    results = _results(run.output)
    for result in results.values():
        assert result["distributed_type"] == "DistributedType.MULTI_CPU" and result["device"] == "cpu:0"
        assert result["state"].startswith("Distributed environment: DistributedType.MULTI_CPU  Backend: gloo\n"
                                          "Num processes: 2\n")
    # every process tried the same sizes and trained at 15: 64 samples / (2 x 15) -> 3 steps, 2 epochs
    assert results["memory"]["tried"][-1] == 15 and len(results["memory"]["losses"]) == 6
    # one trace per process, where Accelerate writes them
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profile_0.json", "profile_1.json"]
    # local steps (the replicas apart after each odd step), then averaged: the replicas agree at the end
    assert results["local_sgd"]["replicas_equal"] and results["local_sgd"]["local_steps"] == 8
    assert results["local_sgd"]["apart_between"] == [True] * 4
    assert run.output.count("MAIN ONLY 1") == 1
    assert run.output.count("EVERY PROCESS") == 2 and run.output.count("IN ORDER") == 2
