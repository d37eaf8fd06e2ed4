"""A run started with Hugging Face Accelerate continues under convoy from Accelerate's save_state directory with
the parameters, optimizer and scheduler state and RNG an uninterrupted Accelerate run has (scripts/
accelerate_resume.py trains; Accelerate 1.15 is a test dependency)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from convoy.errors import CheckpointError
from convoy.train.checkpoint.accelerate import is_accelerate_checkpoint, latest_accelerate_checkpoint
from convoy.train.checkpoint.files import load_file as safe_load
from tests.distributed import cpu_env, run_script
from tests.processes import side_by_side

SCRIPT = Path(__file__).parents[1] / "scripts" / "accelerate_resume.py"
K, M = 3, 2  # steps before the checkpoint, steps after it


def _run(args: list[str], nproc: int = 1) -> None:
    """Outside convoy: one plain process, or torchrun's ``nproc``. On the CPU, as convoy's runs compared with it
    (torchrun would put rank 1 on cuda:1, and one process would train on cuda:0: other numbers)."""
    env = {k: v for k, v in cpu_env().items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    launcher = [] if nproc == 1 else ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    proc = subprocess.run([sys.executable, *launcher, str(SCRIPT), *args], capture_output=True, text=True,
                          env=env, timeout=180)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]


def _convoy(args: list[str], nproc: int) -> None:
    result = run_script(SCRIPT, nproc=nproc, args=args, timeout=180)
    assert result.returncode == 0, result.output[-4000:]


def _accelerate_run(tmp_path: Path, nproc: int) -> tuple[Path, dict]:
    """Accelerate trains K + M steps, saving its state after K (safetensors, and pytorch_model.bin in _bin)."""
    pytest.importorskip("accelerate")
    ckpt = tmp_path / "accelerate_checkpoint"
    _run(["--lib", "accelerate", "--steps", str(K + M), "--save-at", str(K), "--save", str(ckpt),
          "--out", str(tmp_path / "ref.json")], nproc)
    return ckpt, json.loads((tmp_path / "ref.json").read_text())


def _resumed(tmp_path: Path, ckpt: Path, nproc: int, strategy: str | None = None) -> dict:
    out = tmp_path / f"convoy-{ckpt.name}-{strategy}.json"
    args = ["--lib", "convoy", "--load", str(ckpt), "--resume-step", str(K), "--steps", str(M), "--out", str(out)]
    args += ["--strategy", strategy] if strategy else []
    if nproc == 1:
        _run(args)
    else:
        _convoy(args, nproc)
    return json.loads(out.read_text())


@pytest.mark.slow
def test_one_process_run_continues_with_identical_parameters(tmp_path):
    ckpt, reference = _accelerate_run(tmp_path, 1)
    assert {p.name for p in ckpt.iterdir()} >= {"model.safetensors", "model_1.safetensors", "optimizer.bin",
                                                  "optimizer_1.bin", "scheduler.bin", "random_states_0.pkl",
                                                  "custom_checkpoint_0.pkl"}
    pickled = ckpt.with_name(ckpt.name + "_bin")
    assert (pickled / "pytorch_model.bin").exists() and (pickled / "pytorch_model_1.bin").exists()
    # parameters, scheduler lr, and the RNG's next draws; from safetensors and from pytorch_model.bin
    assert side_by_side(lambda: _resumed(tmp_path, ckpt, 1), lambda: _resumed(tmp_path, pickled, 1)) == [
        reference, reference]


@pytest.mark.slow
def test_two_process_run_continues_sharded_with_identical_parameters(tmp_path):
    # Accelerate's DDP run, continued by FSDP2 (zero3): full tensors sharded on load, each rank's RNG restored
    ckpt, reference = _accelerate_run(tmp_path, 2)
    assert (ckpt / "random_states_1.pkl").exists()
    assert _resumed(tmp_path, ckpt, 2, "zero3") == reference


def test_files_are_read_without_unpickling_objects(tmp_path):
    import random

    import numpy as np

    rng = tmp_path / "random_states_0.pkl"
    torch.save({"step": 4, "random_state": random.getstate(), "numpy_random_seed": np.random.get_state(),
                "torch_manual_seed": torch.get_rng_state()}, rng)
    assert safe_load(rng)["numpy_random_seed"][0] == "MT19937"
    evil = tmp_path / "sampler.bin"
    torch.save(Path("/"), evil)  # any object: loading it would mean running pickled code
    with pytest.raises(CheckpointError, match="holds objects other than tensors"):
        safe_load(evil)


def test_accelerate_directories_are_told_apart_and_found(tmp_path):
    root = tmp_path / "checkpoints"
    for n in (0, 2, 10):
        (root / f"checkpoint_{n}").mkdir(parents=True)
        torch.save({}, root / f"checkpoint_{n}" / "optimizer.bin")
    (root / "checkpoint_11").mkdir()  # empty: not a checkpoint
    assert is_accelerate_checkpoint(root / "checkpoint_2") and not is_accelerate_checkpoint(root / "checkpoint_11")
    assert latest_accelerate_checkpoint(root) == root / "checkpoint_10"
    (root / "checkpoint_10" / "convoy_checkpoint.json").write_text("{}")  # convoy's own
    assert not is_accelerate_checkpoint(root / "checkpoint_10")
    assert latest_accelerate_checkpoint(root) == root / "checkpoint_2"
    (root / "checkpoint_2" / "distributed").mkdir()  # an incomplete convoy checkpoint is not Accelerate's
    assert latest_accelerate_checkpoint(root) == root / "checkpoint_0"


def test_sharded_accelerate_checkpoints_are_named_as_not_supported(tmp_path):
    from convoy import Accelerator
    from convoy.errors import NotSupportedYetError

    (tmp_path / "pytorch_model_fsdp_0").mkdir()
    torch.save({}, tmp_path / "random_states_0.pkl")
    acc = Accelerator()
    acc.prepare(torch.nn.Linear(2, 2))
    with pytest.raises(NotSupportedYetError, match="pytorch_model_fsdp_0"):
        acc.load_state(tmp_path)


def _accelerate_layout(directory: Path) -> dict[str, torch.Tensor]:
    """The files Accelerate's save_state writes for one model and its optimizer on one process (the layout the
    slow tests above get from Accelerate itself); returns the model's state."""
    import random

    import numpy as np
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    directory.mkdir()
    save_file(model.state_dict(), directory / "model.safetensors", metadata={"format": "pt"})
    torch.save(optimizer.state_dict(), directory / "optimizer.bin")
    torch.save({"step": 4, "random_state": random.getstate(), "numpy_random_seed": np.random.get_state(),
                "torch_manual_seed": torch.get_rng_state()}, directory / "random_states_0.pkl")
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _load_into_fresh(directory: Path) -> torch.nn.Module:
    from convoy import Accelerator

    accelerator = Accelerator()
    model = torch.nn.Linear(2, 2)
    model, _ = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    accelerator.load_state(directory)
    return model


def _cut(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


@pytest.mark.parametrize("name, damage", [
    # safetensors' own SafetensorError came through raw; a dict or a list where a state dict belongs was a
    # KeyError or TypeError from deep inside the optimizer's or the RNG's restore
    ("model.safetensors", lambda f: _cut(f, 40)),
    ("model.safetensors", lambda f: f.write_bytes(b"")),
    ("optimizer.bin", lambda f: _cut(f, 50)),
    ("optimizer.bin", lambda f: f.write_bytes(b"garbage" * 10)),
    ("optimizer.bin", lambda f: torch.save({"not": "an optimizer"}, f)),
    ("optimizer.bin", lambda f: torch.save([1, 2], f)),
    ("optimizer.bin", lambda f: torch.save({"state": {7: {}}, "param_groups": [{"params": [0, 1]}]}, f)),
    ("random_states_0.pkl", lambda f: f.write_bytes(b"garbage")),
    ("random_states_0.pkl", lambda f: torch.save({"step": 1}, f)),
    ("random_states_0.pkl", lambda f: torch.save({"random_state": 5, "numpy_random_seed": 1,
                                                  "torch_manual_seed": 2}, f)),
])
def test_a_damaged_accelerate_file_is_one_error_naming_it(tmp_path, name, damage):
    directory = tmp_path / "checkpoint_0"
    _accelerate_layout(directory)
    damage(directory / name)
    with pytest.raises(CheckpointError, match=re.escape(f"checkpoint file {directory / name} is damaged")) as err:
        _load_into_fresh(directory)
    assert "\n" not in str(err.value) and "load an earlier one" in str(err.value)
    if name.startswith("random_states"):  # and how to go on as Accelerate would (the missing file loads, below)
        assert "or move random_states_0.pkl away to resume without its random state" in str(err.value)


def test_a_damaged_accelerate_pytorch_model_bin_is_named_as_damaged(tmp_path):
    directory = tmp_path / "checkpoint_0"
    _accelerate_layout(directory)
    (directory / "model.safetensors").unlink()
    torch.save([1], directory / "pytorch_model.bin")  # was: "the checkpoint has no 'weight'"
    with pytest.raises(CheckpointError, match="pytorch_model.bin is damaged .it holds a list that is not a model's "
                                              "state_dict"):
        _load_into_fresh(directory)


def test_an_accelerate_checkpoint_without_this_ranks_random_states_still_loads(tmp_path):
    # Accelerate logs that it could not load the random states and goes on (a checkpoint of fewer processes)
    directory = tmp_path / "checkpoint_0"
    saved = _accelerate_layout(directory)
    (directory / "random_states_0.pkl").unlink()
    model = _load_into_fresh(directory)  # on accelerator.device: compared on the CPU, where the file was written
    assert all(torch.equal(model.state_dict()[k].cpu(), v) for k, v in saved.items())
