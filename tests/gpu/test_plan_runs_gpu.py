"""The plan's launch arguments on GPUs (NCCL): CPU offload as the planner turns it, on one GPU; and on a box of
4 or more, ddp and zero1 beside tp (DTensor weights kept by FSDP2's replicate / fully_shard) and hsdp, each
trained from its row's launch_args to one process's parameters (tests/plan/test_plan_runs.py does the same on
CPU processes)."""

from __future__ import annotations

import json

import pytest

from tests.gpu.gpu_run import REPO, run, run_json

pytestmark = pytest.mark.gpu
SCRIPT = str(REPO / "tests" / "plan" / "scripts" / "train_as_planned.py")


def _gpus() -> int:
    code, inventory, err = run_json(["convoy", "devices", "--json"])
    assert code == 0, err
    return len(inventory["devices"])


def _trained(nproc: int, layouts: list[list]) -> str:
    done = run(["convoy", "launch", "--devices", str(nproc), "--nproc-per-node", str(nproc), SCRIPT,
                json.dumps(layouts)], timeout=400)
    assert done.returncode == 0, done.output[-6000:]
    for label, _ in layouts:
        assert sum(f" {label} (" in line and line.endswith(" OK") for line in done.output.splitlines()) == nproc, \
            done.output[-6000:]
    return done.output


def test_cpu_offload_as_planned_on_one_gpu():
    """zero3 with CPUOffloadPolicy(pin_memory=True), as --cpu-offload (the planner's offload knob) runs it."""
    _trained(1, [["zero3+offload", {"CONVOY_STRATEGY": "zero3", "CONVOY_CPU_OFFLOAD": "1"}]])


def test_ddp_and_zero1_beside_tp_and_hsdp_on_four_gpus(monkeypatch):
    if _gpus() < 4:
        pytest.skip("needs 4 GPUs")
    from tests.plan.test_plan_runs import _rank_settings, _row_args

    layouts = []
    for hardware, nodes, name in (("4xH100-80GB", 1, "ddp+tp2"), ("4xH100-80GB", 1, "zero1+tp2"),
                                  ("2xH100-80GB", 2, "hsdp")):
        args = _row_args(hardware, nodes, name)
        layouts.append([name, {k: v for k, v in _rank_settings(args, monkeypatch).items() if k.startswith("CONVOY_")}])
    _trained(4, layouts)
