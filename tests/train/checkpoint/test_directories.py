"""Atomic checkpoint directories: marker written last, newest complete wins, total_limit."""

from __future__ import annotations

import pytest

from convoy.errors import CheckpointError
from convoy.train import checkpoint as ckpt


def test_commit_then_latest_and_prune(tmp_path):
    for n in range(3):
        staging = ckpt.begin_checkpoint(ckpt.next_checkpoint_dir(tmp_path))
        (staging / "data").write_text(str(n))
        ckpt.commit_checkpoint(staging, tmp_path / f"checkpoint_{n}", {"iteration": n})
    (tmp_path / "checkpoint_3").mkdir()  # no marker: not convoy's (an Accelerate checkpoint, say)
    (tmp_path / "checkpoint_3" / "model.safetensors").write_text("not convoy's")
    ckpt.begin_checkpoint(tmp_path / "checkpoint_4")  # a crashed save's staging directory
    assert ckpt.latest_checkpoint(tmp_path).name == "checkpoint_2"
    assert ckpt.read_meta(tmp_path / "checkpoint_1")["iteration"] == 1
    ckpt.prune_checkpoints(tmp_path, total_limit=2)
    # the oldest of convoy's beyond the limit and the staging leftover go; what convoy did not write stays
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_1", "checkpoint_2", "checkpoint_3"]
    assert (tmp_path / "checkpoint_3" / "model.safetensors").read_text() == "not convoy's"


def test_incomplete_directory_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="not a complete convoy checkpoint"):
        ckpt.read_meta(tmp_path)


def test_saving_twice_to_one_directory_replaces_it(tmp_path):
    for n in range(2):
        staging = ckpt.begin_checkpoint(tmp_path / "ck")
        (staging / "data").write_text(str(n))
        ckpt.commit_checkpoint(staging, tmp_path / "ck", {})
    assert (tmp_path / "ck" / "data").read_text() == "1"
    assert [p.name for p in tmp_path.iterdir()] == ["ck"]


_KILLED_WHILE_PRUNING = """
import os, shutil, sys
from convoy.train import checkpoint as ckpt

def killed_half_way(path, *args, **kwargs):  # deletes its first file (the marker, say), then the process is killed
    os.remove(os.path.join(path, ckpt.MARKER))
    os.kill(os.getpid(), 9)

shutil.rmtree = killed_half_way
ckpt.prune_checkpoints(sys.argv[1], total_limit=3)
"""


def _save(root, n):
    staging = ckpt.begin_checkpoint(ckpt.next_checkpoint_dir(root))
    (staging / "data").write_text(str(n))
    ckpt.commit_checkpoint(staging, root / f"checkpoint_{n}", {"iteration": n})


def test_a_prune_killed_half_way_is_finished_by_the_next_save(tmp_path):
    """A kill while pruning left checkpoint_0 half deleted without its marker: no longer counted as convoy's, it was
    never pruned again, and total_limit=3 kept 4 directories. A checkpoint is now renamed out of the way before it
    is deleted, and the next prune removes what a killed one left."""
    import subprocess
    import sys

    for n in range(4):
        _save(tmp_path, n)
    killed = subprocess.run([sys.executable, "-c", _KILLED_WHILE_PRUNING, str(tmp_path)], capture_output=True,
                            text=True, timeout=60)
    assert killed.returncode == -9, killed.stderr
    assert sorted(p.name for p in tmp_path.glob("checkpoint_*")) == ["checkpoint_1", "checkpoint_2", "checkpoint_3"]
    assert ckpt.latest_checkpoint(tmp_path).name == "checkpoint_3"  # resume is unaffected
    _save(tmp_path, 4)
    ckpt.prune_checkpoints(tmp_path, total_limit=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_2", "checkpoint_3", "checkpoint_4"]
