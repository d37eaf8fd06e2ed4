"""Loading a checkpoint runs no code from it, names a damaged file, and survives a save killed mid-commit."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from convoy import Accelerator
from convoy.errors import CheckpointError
from convoy.train.checkpoint import directories as ckpt


class _Payload:
    """A pickle that creates a file when it is unpickled (as a planted checkpoint would run anything)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _setup(acc):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(8, 3), torch.randn(8, 1)), batch_size=2)
    return acc.prepare(model, opt, loader)


@pytest.fixture
def saved(tmp_path):
    acc = Accelerator()
    model, opt, loader = _setup(acc)
    path = tmp_path / "mine"
    acc.save_state(path)
    return acc, model, path


def _one_line(err) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("name", ["state.pt", "random_states_0.pkl"])
def test_a_planted_pickle_is_refused_and_never_runs(saved, tmp_path, name):
    acc, _, path = saved
    marker = tmp_path / "payload-ran"
    torch.save({"schedulers": [], "payload": _Payload(marker)}, path / name)
    with pytest.raises(CheckpointError) as info:
        acc.load_state(path)
    message = _one_line(info)
    assert str(path / name) in message and "not loaded" in message
    assert not marker.exists()


def test_planted_dcp_metadata_is_refused_and_never_runs(saved, tmp_path):
    import pickle

    acc, _, path = saved
    marker = tmp_path / "payload-ran"
    (path / "distributed" / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(CheckpointError) as info:
        acc.load_state(path)
    assert ".metadata" in _one_line(info) and not marker.exists()


@pytest.mark.parametrize("content", [[], {"state_dict_metadata": {}}, "text"])
def test_dcp_metadata_holding_plain_data_is_named_as_damaged(saved, content):
    """Plain data passes the restricted unpickler; it is still not DCP's Metadata: the file is named (not the
    rank-local __0.metadata DCP falls back to, which convoy never writes)."""
    import pickle

    acc, _, path = saved
    target = path / "distributed" / ".metadata"
    target.write_bytes(pickle.dumps(content))
    with pytest.raises(CheckpointError) as info:
        acc.load_state(path)
    message = _one_line(info)
    assert str(target) in message and "damaged" in message and "not DCP's Metadata" in message


@pytest.mark.parametrize("name", ["state.pt", "random_states_0.pkl", "distributed/__0_0.distcp",
                                  "distributed/.metadata"])
def test_a_truncated_file_is_named_as_damaged(saved, name):
    acc, _, path = saved
    target = path / name
    data = target.read_bytes()
    target.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError) as info:
        acc.load_state(path)
    message = _one_line(info)
    assert str(target) in message and "damaged" in message


def test_rng_state_round_trips_through_weights_only_files(saved):
    acc, _, path = saved
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    acc.save_state(path)
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    random.seed(2), np.random.seed(2), torch.manual_seed(2)
    acc.load_state(path)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
    torch.load(path / "random_states_0.pkl", weights_only=True)  # no numpy globals needed
    torch.load(path / "state.pt", weights_only=True)


def test_save_refuses_state_that_would_not_load_safely(tmp_path):
    acc = Accelerator()
    _setup(acc)

    class Odd:
        def state_dict(self):
            return {"when": _Payload(tmp_path / "x")}

        def load_state_dict(self, state):
            pass

    acc.register_for_checkpointing(Odd())
    with pytest.raises(CheckpointError, match="registered object's state_dict.*cannot load safely"):
        acc.save_state(tmp_path / "ck")

    class Unpicklable(Odd):
        def state_dict(self):
            return {"f": lambda: 1}

    acc = Accelerator()
    _setup(acc)
    acc.register_for_checkpointing(Unpicklable())
    for _ in range(2):  # each failed save left a hidden copy of the weights behind (.staging-ck-*)
        with pytest.raises(CheckpointError, match="state_dict.. cannot be saved .Can't pickle local object"):
            acc.save_state(tmp_path / "ck")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_load_refuses_a_checkpoint_of_other_registered_objects_or_schedulers(tmp_path):
    """zip() paired what was saved with what is registered: with one more registered object (or scheduler)
    than the checkpoint holds, load_state restored some and silently left the rest, as Accelerate refuses."""

    class Counter:
        def __init__(self, value):
            self.value = value

        def state_dict(self):
            return {"value": self.value}

        def load_state_dict(self, state):
            self.value = state["value"]

    acc = Accelerator()
    model, opt, _ = _setup(acc)
    acc.register_for_checkpointing(Counter(1))
    acc.save_state(tmp_path / "ck")
    later = Accelerator()
    _setup(later)
    first, second = Counter(5), Counter(6)
    later.register_for_checkpointing(first, second)
    with pytest.raises(CheckpointError, match=r"holds the state of 1 object\(s\) registered .* and 2 are registered"):
        later.load_state(tmp_path / "ck")
    assert (first.value, second.value) == (5, 6)  # nothing restored
    with_scheduler = Accelerator()
    _, opt, _ = _setup(with_scheduler)
    with_scheduler.register_for_checkpointing(Counter(0))
    with_scheduler.prepare(torch.optim.lr_scheduler.StepLR(opt, 1))
    with pytest.raises(CheckpointError, match=r"0 learning-rate scheduler\(s\), and 1 is prepared now"):
        with_scheduler.load_state(tmp_path / "ck")


class _Killed(BaseException):
    pass


@pytest.mark.parametrize("crash_at", [1, 2, 3])  # os.replace calls of a commit over an existing directory
def test_save_killed_mid_commit_is_recovered_by_load_and_next_save(saved, monkeypatch, crash_at):
    """Renames: 1 marker into staging, 2 old checkpoint aside, 3 new one into place."""
    acc, model, path = saved
    with torch.no_grad():
        model.weight.fill_(7.0)
    real_replace, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == crash_at:
            raise _Killed
        return real_replace(src, dst)

    monkeypatch.setattr(ckpt.os, "replace", replace)
    with pytest.raises(_Killed):
        acc.save_state(path)
    monkeypatch.setattr(ckpt.os, "replace", real_replace)
    new_is_complete = crash_at > 1
    if crash_at == 3:
        assert not path.exists()  # the state the issue describes: data only under staging names
    with torch.no_grad():
        model.weight.fill_(0.0)
    assert acc.load_state(path) == str(path)
    assert bool((model.weight == 7.0).all()) == (crash_at == 3 and new_is_complete)
    with torch.no_grad():
        model.weight.fill_(3.0)
    acc.save_state(path)  # the next save also works from what the crash left
    with torch.no_grad():
        model.weight.fill_(0.0)
    acc.load_state(path)
    assert bool((model.weight == 3.0).all())


def test_recovery_prefers_the_newest_complete_copy_and_ignores_other_names(tmp_path):
    for n in range(2):
        staging = ckpt.begin_checkpoint(tmp_path / "old-x")  # a checkpoint named "old-x" ...
        (staging / "data").write_text(str(n))
        ckpt.commit_checkpoint(staging, tmp_path / "old-x", {})
    staging = ckpt.begin_checkpoint(tmp_path / "x")
    ckpt.commit_checkpoint(staging, tmp_path / "x", {})
    os.replace(tmp_path / "old-x", tmp_path / ".staging-old-x-0000abcd")  # ... looks like x's old copy
    os.replace(tmp_path / "x", tmp_path / ".staging-x-0000abcd")
    assert ckpt.recover_checkpoint(tmp_path / "x")
    assert ckpt.is_complete(tmp_path / "x") and not (tmp_path / "x" / "data").exists()
    assert ckpt.recover_checkpoint(tmp_path / "old-x")
    assert (tmp_path / "old-x" / "data").read_text() == "1"


@pytest.mark.parametrize("name", ["state.pt", "random_states_0.pkl", "distributed/.metadata"])
def test_garbage_in_a_file_is_named_as_damaged_without_a_traceback(saved, name, capfd):
    """Bytes that are no pickle at all made the unpickler raise struct.error (not caught), and a damaged DCP
    record made torch log two tracebacks on the root logger before convoy's line."""
    acc, _, path = saved
    capfd.readouterr()
    (path / name).write_bytes(b"junk")
    with pytest.raises(CheckpointError) as info:
        acc.load_state(path)
    assert name.split("/")[-1] in _one_line(info) and "damaged" in _one_line(info)
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("marker", ["not json", "[1]"])
def test_a_damaged_marker_is_named(saved, marker):
    acc, _, path = saved
    (path / ckpt.MARKER).write_text(marker)
    with pytest.raises(CheckpointError, match="convoy_checkpoint.json"):
        acc.load_state(path)


def test_save_never_replaces_what_is_not_a_checkpoint(tmp_path):
    """save_state swaps the whole directory it is given: given a file or a folder of the user's (a project
    directory), it moved them aside and deleted them. Now it refuses, and an empty folder or an earlier
    checkpoint is still written over."""
    acc = Accelerator()
    _setup(acc)
    precious = tmp_path / "train.py"
    precious.write_text("print('mine')")
    with pytest.raises(CheckpointError, match="is a file, not a checkpoint directory"):
        acc.save_state(precious)
    with pytest.raises(CheckpointError, match="holds files that are not a convoy checkpoint") as info:
        acc.save_state(tmp_path)
    assert str(tmp_path / "state") in _one_line(info)
    assert precious.read_text() == "print('mine')" and sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(CheckpointError, match="is a link; save_state.. would replace the link"):
        acc.save_state(tmp_path / "link")
    (tmp_path / "link").unlink()
    (tmp_path / "empty").mkdir()
    assert acc.save_state(tmp_path / "empty") == str(tmp_path / "empty") and ckpt.is_complete(tmp_path / "empty")
    assert acc.save_state(tmp_path / "empty") == str(tmp_path / "empty")  # an earlier checkpoint: replaced
    with pytest.raises(CheckpointError, match="cannot write a checkpoint to /proc/ck"):
        acc.save_state("/proc/ck")
    with pytest.raises(CheckpointError, match="cannot write the model to /proc/model"):
        acc.save_model(acc._models[0], "/proc/model")


@pytest.mark.slow
def test_a_save_rank_0_refuses_is_refused_on_every_rank(tmp_path):
    """Rank 0 alone checks and writes: its refusal reaches the other ranks (which waited for its staging
    directory, or at the barrier after the model, until the collective timeout)."""
    from pathlib import Path

    from tests.distributed import run_script

    afile = tmp_path / "a_file"
    afile.write_text("mine")
    script = Path(__file__).resolve().parents[1] / "scripts" / "refused_save.py"
    result = run_script(script, args=[str(afile), "/proc/model", str(tmp_path / "model")],
                        env={"CONVOY_COLLECTIVE_TIMEOUT": "30"}, timeout=90)
    assert result.returncode == 0, result.output
    for rank in (0, 1):
        assert f"save_state refused on rank {rank}: {afile} is a file" in result.output, result.output
        assert f"save_model refused on rank {rank}: cannot write the model to /proc/model" in result.output
        assert f"max_shard_size refused on rank {rank}: max_shard_size='ten' is not a size" in result.output
        assert f"load_state refused on rank {rank}: checkpoint file " in result.output
        assert ".metadata is damaged" in result.output
        assert f"rank {rank} done" in result.output
    assert afile.read_text() == "mine" and "Traceback" not in result.output
