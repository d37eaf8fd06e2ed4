"""An Accelerate setup on a GPU: an FSDP config file (FSDP2, parameters offloaded to pinned CPU memory) and
``Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))`` train on cuda to the parameters of
``convoy launch --strategy zero3`` (CPU runs: tests/train/test_accelerate_config.py)."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.gpu_run import REPO, run

pytestmark = pytest.mark.gpu

SCRIPT = REPO / "tests" / "train" / "scripts" / "accelerate_config_run.py"
FILES = REPO / "tests" / "config" / "accelerate"


def launch(tmp_path, name, *flags, plugin=None):
    out = tmp_path / f"{name}.pt"
    done = run(["convoy", "launch", "--devices", "1", "--num_processes", "1", *flags, str(SCRIPT), "--out", str(out),
                *(["--plugin", plugin] if plugin else [])], env={"CONVOY_LEASE_DIR": str(tmp_path)}, timeout=300)
    assert done.returncode == 0, done.output[-4000:]
    return torch.load(out, weights_only=True)


def close(run_, reference):
    assert run_["params"].keys() == reference["params"].keys()
    for key, value in reference["params"].items():  # the offloaded optimizer steps on the CPU: not bit for bit
        torch.testing.assert_close(run_["params"][key], value, rtol=1e-4, atol=1e-5)


def test_an_fsdp_file_and_plugin_train_on_cuda_as_the_flags(tmp_path):
    reference = launch(tmp_path, "flags", "--strategy", "zero3")
    assert (reference["device"], reference["strategy"]) == ("cuda", "zero3")
    from_file = launch(tmp_path, "file", "--config_file", str(FILES / "fsdp2_offload.yaml"))
    assert (from_file["device"], from_file["strategy"], from_file["options"]) == (
        "cuda", "zero3", {"cpu_offload": True, "auto_wrap": ["Block"]})
    close(from_file, reference)
    from_plugin = launch(tmp_path, "plugin", plugin="fsdp2")
    assert (from_plugin["device"], from_plugin["strategy"]) == ("cuda", "zero3")
    close(from_plugin, reference)
