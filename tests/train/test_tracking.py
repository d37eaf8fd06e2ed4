"""Trackers (log_with=): TensorBoard event files and JSONL read back, main process only, steps after load_state."""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

import pytest
import torch

from convoy import Accelerator
from convoy.errors import ConfigError
from tests.distributed import run_script

SCRIPT = Path(__file__).parent / "scripts" / "trackers.py"


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def test_tensorboard_and_jsonl_record_what_was_logged(tmp_path):
    acc = Accelerator(log_with=["tensorboard", "jsonl"], project_dir=tmp_path)
    acc.init_trackers("proj", config={"lr": 0.1, "layers": 2}, init_kwargs={"tensorboard": {"flush_secs": 1}})
    assert [t.name for t in acc.trackers] == ["tensorboard", "jsonl"]
    acc.log({"loss": 1.0})
    acc.log({"loss": torch.tensor(0.5)})
    acc.log({"loss": 0.375, "note": "ten"}, step=10)
    acc.log({"loss": 0.25})  # after an explicit step: the next one
    from torch.utils.tensorboard import SummaryWriter

    assert isinstance(acc.get_tracker("tensorboard", unwrap=True), SummaryWriter)
    acc.get_tracker("tensorboard").log_images({"samples": torch.rand(2, 3, 4, 4)}, step=3)
    with pytest.raises(ConfigError, match="no such tracker"):
        acc.get_tracker("wandb")
    acc.end_training()
    assert _scalars(tmp_path / "proj", "loss") == [(0, 1.0), (1, 0.5), (10, 0.375), (11, 0.25)]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "proj"))
    events.Reload()
    assert [e.step for e in events.Images("samples")] == [3]
    lines = _jsonl(tmp_path / "proj" / "log.jsonl")
    assert [(r["step"], r["values"]) for r in lines] == [
        (0, {"loss": 1.0}), (1, {"loss": 0.5}), (10, {"loss": 0.375, "note": "ten"}), (11, {"loss": 0.25})]
    assert json.loads((tmp_path / "proj" / "config.json").read_text()) == {"layers": 2, "lr": 0.1}


def test_step_numbers_go_on_after_load_state(tmp_path):
    def run():
        acc = Accelerator(log_with="jsonl", project_config=_project(tmp_path))
        acc.prepare(torch.nn.Linear(2, 2))
        acc.init_trackers("proj")
        return acc

    first = run()
    for loss in (3.0, 2.0, 1.0):
        first.log({"loss": loss})
    first.save_state()
    first.log({"loss": 0.5})  # after the checkpoint: lost with the run
    first.end_training()
    resumed = run()
    resumed.load_state()
    resumed.log({"loss": 0.75})
    resumed.end_training()
    assert [r["step"] for r in _jsonl(tmp_path / "logs" / "proj" / "log.jsonl")] == [0, 1, 2, 3, 3]


def _project(root: Path):
    from convoy.train import ProjectConfiguration

    return ProjectConfiguration(project_dir=str(root), logging_dir=str(root / "logs"))


def test_log_with_refuses_what_cannot_work(tmp_path, caplog):
    with pytest.raises(ConfigError, match="needs a directory"):
        Accelerator(log_with="jsonl")
    with pytest.raises(ConfigError, match="not a tracker"):
        Accelerator(log_with="tensorbored", project_dir=tmp_path)
    missing = [n for n, pkg in [("wandb", "wandb"), ("mlflow", "mlflow"), ("comet_ml", "comet-ml")]
               if importlib.util.find_spec(n) is None]
    for name in missing:  # as Accelerate: the run goes on without that tracker, with a warning saying so
        with caplog.at_level(logging.WARNING, logger="convoy.train.tracking"):
            acc = Accelerator(log_with=[name, "jsonl"], project_dir=tmp_path)
        assert f"log_with={name!r} needs the" in caplog.text and "the run goes on without" in caplog.text
        acc.init_trackers("without")
        assert [t.name for t in acc.trackers] == ["jsonl"]
        acc.end_training()
    acc = Accelerator(log_with="all", project_dir=tmp_path)
    acc.init_trackers("everything")
    names = [t.name for t in acc.trackers]
    assert "tensorboard" in names and "jsonl" in names and not set(missing) & set(names)
    acc.end_training()


@pytest.mark.slow
def test_only_the_main_process_writes(tmp_path):
    result = run_script(SCRIPT, nproc=2, args=[str(tmp_path)])
    assert result.returncode == 0, result.output[-4000:]
    assert result.output.count("TRACKERS ok") == 2, result.output[-4000:]
    assert [r["values"] for r in _jsonl(tmp_path / "run" / "log.jsonl")] == [{"rank": 0, "i": i} for i in range(3)]
    assert _scalars(tmp_path / "run", "rank") == [(0, 0.0), (1, 0.0), (2, 0.0)]
    writers = {f.name.split(".")[-2] for f in (tmp_path / "run").glob("events.out.tfevents.*")}  # their pids
    assert len(writers) == 1, writers
