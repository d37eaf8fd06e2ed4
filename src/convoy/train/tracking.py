"""Experiment trackers: Accelerate's ``log_with=`` API on the real libraries.

    accelerator = Accelerator(log_with=["tensorboard", "jsonl"], project_dir="runs")
    accelerator.init_trackers("my_project", config={"lr": 1e-3})
    accelerator.log({"loss": 0.5})                 # main process only; step 0, then 1, 2, ...
    accelerator.get_tracker("tensorboard", unwrap=True).add_histogram(...)   # the SummaryWriter itself
    accelerator.end_training()                     # closes the runs

Backends: ``"tensorboard"`` (``torch.utils.tensorboard.SummaryWriter``, needs the ``tensorboard`` package),
``"wandb"``, ``"mlflow"``, ``"aim"``, ``"comet_ml"`` when installed, and ``"jsonl"`` (no dependency: one JSON
object per ``log`` call in ``<logging_dir>/<project_name>/log.jsonl``). ``"all"`` picks the installed ones.
A ``log`` without ``step`` gets the next number after the last one logged; the number is saved by
``save_state`` and restored by ``load_state``, so a resumed run goes on where it stopped.
"""

from __future__ import annotations

import enum
import importlib.util
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

from convoy.errors import ConfigError

__all__ = ["LoggerType", "GeneralTracker", "TensorBoardTracker", "JSONLTracker", "WandBTracker", "MLflowTracker",
           "AimTracker", "CometMLTracker", "TRACKERS", "resolve_log_with", "TrackerHub"]


class LoggerType(str, enum.Enum):
    """Accelerate's tracker names for ``log_with=`` (``LoggerType.TENSORBOARD`` == ``"tensorboard"``). Those convoy
    has no tracker for (clearml, dvclive, swanlab, trackio) are refused by ``log_with`` with the ones it has."""

    ALL = "all"
    AIM = "aim"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    TRACKIO = "trackio"
    COMETML = "comet_ml"
    MLFLOW = "mlflow"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"

    def __str__(self) -> str:  # Accelerate's BaseEnum prints the value
        return self.value

    @classmethod
    def list(cls) -> list[str]:
        return [member.value for member in cls]


class GeneralTracker:
    """Accelerate's tracker interface; subclass it (or pass any object with ``name`` and ``log``) for your own."""

    name = "general"
    requires_logging_directory = False
    main_process_only = True

    def __init__(self, _blank: bool = False) -> None:
        self._blank = _blank

    def start(self) -> None:
        """Open the run (called by ``init_trackers``)."""

    @property
    def tracker(self) -> Any:
        """The library's own object (``get_tracker(name, unwrap=True)``)."""
        return None

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Record the run's hyperparameters."""

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Record ``values`` at ``step``."""

    def finish(self) -> None:
        """Close the run (called by ``end_training``)."""


def _plain(value: Any) -> Any:
    """Tensors and numpy scalars as Python numbers or lists, dicts recursively."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if hasattr(value, "tolist") and callable(value.tolist):
        return value.tolist()
    return value


class TensorBoardTracker(GeneralTracker):
    """``torch.utils.tensorboard.SummaryWriter`` in ``<logging_dir>/<run_name>``; kwargs go to the writer."""

    name = "tensorboard"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str], **kwargs: Any) -> None:
        super().__init__()
        self.run_name, self.logging_dir, self.init_kwargs = run_name, os.path.join(logging_dir, run_name), kwargs
        self.writer: Any = None

    def start(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(self.logging_dir, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        return self.writer

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        hparams = {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in _plain(values).items()}
        self.writer.add_hparams(hparams, metric_dict={}, run_name=".")
        self.writer.flush()

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        for key, value in _plain(values).items():
            if isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, global_step=step, **kwargs)
            elif isinstance(value, str):
                self.writer.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, dict):
                self.writer.add_scalars(key, value, global_step=step, **kwargs)
        self.writer.flush()

    def log_images(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Images (``add_images``: a batch, NCHW unless ``dataformats=`` says otherwise) at ``step``."""
        for key, images in values.items():
            self.writer.add_images(key, images, global_step=step, **kwargs)
        self.writer.flush()

    def finish(self) -> None:
        self.writer.close()


class JSONLTracker(GeneralTracker):
    """No dependency: ``<logging_dir>/<run_name>/log.jsonl``, one ``{"step", "time", "values"}`` object a line,
    and ``config.json`` with the run's hyperparameters."""

    name = "jsonl"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str], **kwargs: Any) -> None:
        super().__init__()
        self.run_name, self.logging_dir = run_name, os.path.join(logging_dir, run_name)
        self.path = os.path.join(self.logging_dir, "log.jsonl")
        self.file: Any = None

    def start(self) -> None:
        os.makedirs(self.logging_dir, exist_ok=True)
        self.file = open(self.path, "a", encoding="utf-8")  # a resumed run appends

    @property
    def tracker(self) -> Any:
        return self.file

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        with open(os.path.join(self.logging_dir, "config.json"), "w", encoding="utf-8") as f:
            json.dump(_plain(values), f, indent=2, sort_keys=True, default=str)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        record = {"step": step, "time": time.time(), "values": _plain(values)}
        self.file.write(json.dumps(record, default=str) + "\n")
        self.file.flush()

    def finish(self) -> None:
        self.file.close()


class WandBTracker(GeneralTracker):
    """Weights & Biases: ``wandb.init(project=run_name, **kwargs)``."""

    name = "wandb"
    run: Any  # the wandb run, once started

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name, self.init_kwargs, self.run = run_name, kwargs, None

    def start(self) -> None:
        import wandb

        self.run = wandb.init(project=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        return self.run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.run.config.update(_plain(values), allow_val_change=True)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.run.log(_plain(values), step=step, **kwargs)

    def finish(self) -> None:
        self.run.finish()


class MLflowTracker(GeneralTracker):
    """MLflow: an experiment named ``run_name`` (tracking URI: ``logging_dir`` unless MLflow's own is set)."""

    name = "mlflow"
    requires_logging_directory = False
    active_run: Any  # the MLflow run, once started

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> None:
        super().__init__()
        self.run_name, self.logging_dir, self.init_kwargs, self.active_run = run_name, logging_dir, kwargs, None

    def start(self) -> None:
        import mlflow

        if self.logging_dir is not None and not os.environ.get("MLFLOW_TRACKING_URI"):
            mlflow.set_tracking_uri(str(self.logging_dir))
        mlflow.set_experiment(self.run_name)
        self.active_run = mlflow.start_run(**self.init_kwargs)

    @property
    def tracker(self) -> Any:
        return self.active_run

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        import mlflow

        mlflow.log_params({k: str(v)[:500] for k, v in _plain(values).items()})

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        import mlflow

        mlflow.log_metrics({k: v for k, v in _plain(values).items() if isinstance(v, (int, float))}, step=step,
                           **kwargs)

    def finish(self) -> None:
        import mlflow

        mlflow.end_run()


class AimTracker(GeneralTracker):
    """Aim: a run in the repository at ``logging_dir``."""

    name = "aim"
    requires_logging_directory = True
    writer: Any  # the aim Run, once started

    def __init__(self, run_name: str, logging_dir: str | os.PathLike[str] = ".", **kwargs: Any) -> None:
        super().__init__()
        self.run_name, self.logging_dir, self.init_kwargs, self.writer = run_name, logging_dir, kwargs, None

    def start(self) -> None:
        from aim import Run

        self.writer = Run(repo=str(self.logging_dir), **self.init_kwargs)
        self.writer.name = self.run_name

    @property
    def tracker(self) -> Any:
        return self.writer

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.writer["hparams"] = _plain(values)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        for key, value in _plain(values).items():
            self.writer.track(value, name=key, step=step, **kwargs)

    def finish(self) -> None:
        self.writer.close()


class CometMLTracker(GeneralTracker):
    """Comet: ``comet_ml.start(project_name=run_name, **kwargs)``."""

    name = "comet_ml"
    writer: Any  # the Comet experiment, once started

    def __init__(self, run_name: str, **kwargs: Any) -> None:
        super().__init__()
        self.run_name, self.init_kwargs, self.writer = run_name, kwargs, None

    def start(self) -> None:
        import comet_ml

        self.writer = comet_ml.start(project_name=self.run_name, **self.init_kwargs)

    @property
    def tracker(self) -> Any:
        return self.writer

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.writer.log_parameters(_plain(values))

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.writer.log_metrics(_plain(values), step=step, **kwargs)

    def finish(self) -> None:
        self.writer.end()


# name -> (class, the import that must work, the pip package that provides it)
TRACKERS: dict[str, tuple[type[GeneralTracker], str | None, str | None]] = {
    "tensorboard": (TensorBoardTracker, "tensorboard", "tensorboard"),
    "wandb": (WandBTracker, "wandb", "wandb"),
    "mlflow": (MLflowTracker, "mlflow", "mlflow"),
    "aim": (AimTracker, "aim", "aim"),
    "comet_ml": (CometMLTracker, "comet_ml", "comet-ml"),
    "jsonl": (JSONLTracker, None, None),
}


def _installed(module: str | None) -> bool:
    return module is None or importlib.util.find_spec(module) is not None


def resolve_log_with(log_with: Any, logging_dir: str | None) -> list[Any]:
    """``log_with`` (a name, ``"all"``, a tracker object, or a list of those; Accelerate's ``LoggerType`` values
    too) as a list of tracker names and objects; a ``ConfigError`` for an unknown name or one that needs
    ``logging_dir`` without it. A tracker whose package is missing is left out with a warning, as Accelerate
    leaves it out."""
    if log_with is None:
        return []
    items: Sequence[Any] = log_with if isinstance(log_with, (list, tuple)) else [log_with]
    out: list[Any] = []
    for item in items:
        if not isinstance(item, str) and hasattr(item, "log") and hasattr(item, "name"):
            out.append(item)  # a tracker object, made by the user
            continue
        name = str(getattr(item, "value", item)).lower()  # an enum member's value, or the string
        if name == "all":
            out += [n for n, (_, module, _) in TRACKERS.items() if _installed(module) and n not in out]
            continue
        if name not in TRACKERS:
            raise ConfigError(f"log_with={name!r} is not a tracker convoy knows; use one of "
                              f"{', '.join(sorted(TRACKERS))}, 'all', or a GeneralTracker object")
        _, module, package = TRACKERS[name]
        if not _installed(module):  # as Accelerate: the run goes on without it (Accelerate says so at debug level)
            from convoy.train.logging import get_logger

            get_logger(__name__).warning(f"log_with={name!r} needs the {package} package, which is not installed; "
                                         f"the run goes on without that tracker (pip install {package}, or log "
                                         "with 'jsonl')")
            continue
        if name not in out:
            out.append(name)
    for name in out:
        if isinstance(name, str) and TRACKERS[name][0].requires_logging_directory and logging_dir is None:
            raise ConfigError(f"log_with={name!r} writes files and needs a directory; pass "
                              "Accelerator(project_dir=...) or ProjectConfiguration(logging_dir=...)")
    return out


class TrackerHub:
    """The Accelerator's trackers and the next step number (one per Accelerator)."""

    def __init__(self, requested: Iterable[Any], logging_dir: str | None) -> None:
        self.requested, self.logging_dir = list(requested), logging_dir
        self.trackers: list[Any] = []
        self.step = 0

    def init(self, project_name: str, config: dict[str, Any] | None, init_kwargs: dict[str, dict[str, Any]],
             is_main_process: bool) -> None:
        for item in self.requested:
            if not isinstance(item, str):
                tracker = item
            else:
                cls = TRACKERS[item][0]
                if cls.main_process_only and not is_main_process:
                    continue
                kwargs = init_kwargs.get(item, {})
                make = cast(Callable[..., GeneralTracker], cls)  # the backends take (run_name[, logging_dir])
                tracker = make(project_name, self.logging_dir, **kwargs) if cls.requires_logging_directory \
                    else make(project_name, **kwargs)
            if getattr(tracker, "main_process_only", True) and not is_main_process:
                continue
            if hasattr(tracker, "start"):
                tracker.start()
            self.trackers.append(tracker)
        if config is not None:
            for tracker in self.trackers:
                tracker.store_init_configuration(config)

    def log(self, values: dict[str, Any], step: int | None, log_kwargs: dict[str, dict[str, Any]]) -> None:
        step = self.step if step is None else int(step)
        self.step = step + 1
        for tracker in self.trackers:
            tracker.log(values, step=step, **log_kwargs.get(tracker.name, {}))

    def get(self, name: str, unwrap: bool) -> Any:
        if not self.trackers:
            return GeneralTracker(_blank=True)  # the other processes: a tracker that records nothing
        for tracker in self.trackers:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        raise ConfigError(f"get_tracker({name!r}): no such tracker; this Accelerator logs with "
                          f"{', '.join(t.name for t in self.trackers)}")

    def finish(self) -> None:
        for tracker in self.trackers:
            tracker.finish()
        self.trackers = []

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = int(state["step"])
