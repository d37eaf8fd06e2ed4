"""Training from an Accelerate setup on 2 CPU processes: an FSDP config file, a DeepSpeed config file with a
ZeRO-3 JSON, and a script passing ``FullyShardedDataParallelPlugin(fsdp_version=2)`` each reach the very
parameters that convoy's own flags (``--strategy zero3 --gradient-accumulation-steps 2``) reach."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from tests.distributed import cpu_env
from tests.processes import finish, start

FILES = Path(__file__).resolve().parents[1] / "config" / "accelerate"
SCRIPT = Path(__file__).parent / "scripts" / "accelerate_config_run.py"
FLAGS = ("--strategy", "zero3", "--gradient-accumulation-steps", "2")

pytestmark = pytest.mark.slow


def launch(tmp_path: Path, name: str, *flags: str, plugin: str | None = None) -> dict:
    """``convoy launch --devices 0 FLAGS script --out ... [--plugin PLUGIN]``: what rank 0 saved."""
    out = tmp_path / f"{name}.pt"
    script_args = ["--out", str(out), *(["--plugin", plugin] if plugin else [])]
    proc = start([sys.executable, "-m", "convoy", "launch", "--devices", "0", *flags, str(SCRIPT), *script_args],
                 env=cpu_env(), cwd=tmp_path)
    output = finish(proc, timeout=240)
    assert proc.returncode == 0, output[-4000:]
    return torch.load(out, weights_only=True)


@pytest.fixture(scope="module")
def by_flags(tmp_path_factory):
    return launch(tmp_path_factory.mktemp("flags"), "flags", "--nproc-per-node", "2", *FLAGS)


def assert_same_parameters(run: dict, reference: dict) -> None:
    assert run["params"].keys() == reference["params"].keys()
    for key, value in reference["params"].items():
        assert torch.equal(run["params"][key], value), (key, (run["params"][key] - value).abs().max())


def test_an_fsdp_config_file_trains_as_the_flags(tmp_path, by_flags):
    """fsdp2_offload.yaml: FSDP2 resharding after forward, parameters offloaded, Block units (the default's too)."""
    run = launch(tmp_path, "fsdp", "--config_file", str(FILES / "fsdp2_offload.yaml"), "--gradient-accumulation-steps",
                 "2")
    assert (run["strategy"], run["options"], run["processes"]) == ("zero3", {"cpu_offload": True,
                                                                           "auto_wrap": ["Block"]}, 2)
    assert (by_flags["strategy"], by_flags["options"], by_flags["accumulation"]) == ("zero3", {}, 2)
    assert_same_parameters(run, by_flags)


def test_a_deepspeed_file_with_a_zero3_json_trains_as_the_flags(tmp_path, by_flags):
    run = launch(tmp_path, "deepspeed", "--config_file", str(FILES / "deepspeed_zero3_file.yaml"))
    assert (run["strategy"], run["accumulation"], run["processes"]) == ("zero3", 2, 2)  # from zero3.json
    assert_same_parameters(run, by_flags)


def test_a_deepspeed_files_gradient_clipping_reaches_the_ranks(tmp_path):
    """deepspeed_clipping.yaml's gradient_clipping 0.05 (ZeRO-1), carried as CONVOY_GRADIENT_CLIPPING: the parameters
    of DeepSpeedPlugin(zero_stage=1, gradient_clipping=0.05) in the script, not those of plain ZeRO-1."""
    run = launch(tmp_path, "clip-file", "--config_file", str(FILES / "deepspeed_clipping.yaml"))
    by_plugin = launch(tmp_path, "clip-plugin", "--nproc-per-node", "2", plugin="zero1-clip")
    plain = launch(tmp_path, "plain", "--nproc-per-node", "2", "--strategy", "zero1")
    assert run["strategy"] == by_plugin["strategy"] == plain["strategy"] == "zero1"
    assert_same_parameters(run, by_plugin)
    assert not all(torch.equal(plain["params"][k], v) for k, v in run["params"].items())  # clipping changed them


@pytest.mark.parametrize("plugin", ["fsdp2", "fsdp2-recompute"])
def test_an_fsdp_plugin_trains_as_the_flags(tmp_path, by_flags, plugin):
    run = launch(tmp_path, plugin, "--nproc-per-node", "2", "--gradient-accumulation-steps", "2", plugin=plugin)
    assert (run["strategy"], run["accumulation"]) == ("zero3", 2)
    assert_same_parameters(run, by_flags)


def test_a_deepspeed_files_optimizer_and_scheduler_sections_build_the_scripts_placeholders(tmp_path):
    """Accelerate's deepspeed_with_config_support.py flow under `convoy launch --config_file`: the script sees the
    JSON's sections on accelerator.state.deepspeed_plugin, and DummyOptim / DummyScheduler are built from them (the
    JSON's lr and warmup, not the script's), the lr after each step DeepSpeed's WarmupLR (log warmup)."""
    lr, warmup = 0.01, 3
    (tmp_path / "ds.json").write_text(json.dumps({
        "zero_optimization": {"stage": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "betas": [0.9, 0.95], "weight_decay": 0.1}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": lr,
                                                     "warmup_num_steps": warmup}}}))
    (tmp_path / "ds.yaml").write_text("distributed_type: DEEPSPEED\ndeepspeed_config:\n"
                                      "  deepspeed_config_file: ds.json\nnum_processes: 2\n")
    out = tmp_path / "run.json"
    proc = start([sys.executable, "-m", "convoy", "launch", "--devices", "0", "--config_file", "ds.yaml",
                  str(Path(__file__).parent / "scripts" / "deepspeed_config_file.py"), "--out", str(out)],
                 env=cpu_env(), cwd=tmp_path)
    output = finish(proc, timeout=240)
    assert proc.returncode == 0, output[-4000:]
    run = json.loads(out.read_text())
    assert (run["plugin"], run["zero_stage"], run["processes"], run["strategy"]) == (True, 1, 2, "zero1"), run
    assert (run["optimizer"], run["initial_lr"], run["betas"], run["weight_decay"]) == ("AdamW", lr, [0.9, 0.95], 0.1)
    # DeepSpeed's WarmupLR after step n (its last_batch_iteration n - 1): lr * log(n) / log(warmup) while
    # n - 1 < warmup, then lr; 24 samples in batches of 2 on 2 processes: 6 steps
    expected = [lr * (math.log(n) / math.log(warmup) if n - 1 < warmup else 1.0) for n in range(1, 7)]
    assert run["lrs"] == pytest.approx(expected, rel=1e-12), run["lrs"]
