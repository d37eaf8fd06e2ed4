"""``save_state``/``load_state``/``save_model``: the Accelerator's checkpoints, over a ``CheckpointItems``.

    result = save_state(items, None)     # project_dir/checkpoints/checkpoint_<n>, written atomically
    result = load_state(items, None)     # the newest complete one under project_dir/checkpoints

``convoy.Accelerator`` builds the record (``_checkpoint_items()``) and takes back the ``CheckpointResult``.
A ``save_state`` directory::

    checkpoint_3/
      distributed/                 torch.distributed.checkpoint: model_<i>, optimizer_<j> (sharded or not;
                                   loadable by any strategy on any number of processes)
      state.pt                     schedulers, gradient scaler, dataloader positions, registered objects,
                                   the loop's step, the trackers' next step
      random_states_<rank>.pkl     python / numpy / torch (and CUDA) RNG of each rank (rng.py)
      convoy_checkpoint.json       written last: the checkpoint is complete (directories.py)

``load_state`` also reads a directory written by Accelerate's ``save_state`` (``accelerate.py``).
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from convoy.errors import CheckpointError, ConvoyError
from convoy.train import collectives
from convoy.train.checkpoint import accelerate, directories
from convoy.train.checkpoint.files import dcp_load, load_file, save_file
from convoy.train.checkpoint.items import CheckpointItems, CheckpointResult
from convoy.train.checkpoint.rng import rng_state, set_rng_state
from convoy.train.checkpoint.weights import model_keys, parse_size, write_model

if TYPE_CHECKING:  # pragma: no cover
    from convoy.train.strategies.base import Strategy

__all__ = ["checkpoint_root", "save_state", "load_state", "save_model"]


def checkpoint_root(project_dir: str | None) -> Path:
    """``project_dir/checkpoints``; a ``CheckpointError`` when there is no project_dir."""
    if project_dir is None:
        raise CheckpointError("save_state()/load_state() without a directory needs "
                              "Accelerator(project_dir=...); or pass a directory")
    return Path(project_dir) / "checkpoints"


def _group_running() -> bool:
    return dist.is_available() and dist.is_initialized()


def save_model(items: CheckpointItems, model: torch.nn.Module, save_directory: str | os.PathLike[str], *,
               max_shard_size: int | str, safe_serialization: bool) -> None:
    """Unwrapped, consolidated weights in safetensors (transformers' file layout). Collective."""
    parse_size(max_shard_size)  # on every rank: a bad size is every rank's error, before any collective
    strategy = items.get_strategy()
    state = model_keys(strategy.full_model_state_dict(model), strategy.unwrap(model).state_dict().keys())

    def write() -> None:
        try:
            write_model(state, save_directory, max_shard_size=max_shard_size, safe_serialization=safe_serialization)
        except OSError as err:
            raise CheckpointError(f"cannot write the model to {save_directory}: {err.strerror or err}; give a "
                                  "directory this process can create and write") from None

    _on_main(items, write)  # every rank returns (or raises) once rank 0 has written


def _on_main(items: CheckpointItems, fn: Callable[[], Any]) -> Any:
    """``fn()`` on the main process, its value on every rank; an error there raised on every rank (not only on
    rank 0, with the others waiting in the next collective until the timeout): convoy's own errors as they
    are, anything else as a ``CheckpointError`` naming it."""
    outcome: tuple[Any, ...] | None = None
    if items.is_main_process:
        try:
            outcome = ("ok", fn())
        except ConvoyError as err:
            outcome = ("error", type(err), str(err))
        except Exception as err:  # noqa: BLE001 -- a file system or serialisation error, told to every rank
            outcome = ("error", CheckpointError, f"{type(err).__name__}: {err}")
    outcome = collectives.broadcast_object(outcome)
    if outcome[0] == "error":
        raise outcome[1](outcome[2])
    return outcome[1]


def save_state(items: CheckpointItems, output_dir: str | os.PathLike[str] | None) -> CheckpointResult:
    """Write a complete checkpoint atomically; returns its directory (and the next automatic number)."""
    automatic = output_dir is None or items.automatic_naming
    if automatic:
        root = checkpoint_root(items.project_dir)
        final = root / f"checkpoint_{items.save_iteration}"
        if items.is_main_process:
            final = max(final, directories.next_checkpoint_dir(root), key=lambda p: int(p.name.split("_")[1]))
    else:
        final = Path(output_dir)  # type: ignore[arg-type]
    items.require_owned_optimizers("save_state")  # refused before anything is written
    staging = _on_main(items, lambda: str(directories.begin_checkpoint(final)))
    final = Path(collectives.broadcast_object(str(final)))
    try:
        _write_checkpoint(items, staging)
    except BaseException:
        if items.is_main_process:  # a failed save leaves nothing behind (the previous checkpoint stays)
            directories.abandon_checkpoint(staging)
        raise
    strategy = items.get_strategy()
    if items.is_main_process:
        directories.commit_checkpoint(staging, final, {"world_size": items.num_processes, "strategy": strategy.name,
                                                       "iteration": items.save_iteration})
        if automatic:
            directories.prune_checkpoints(final.parent, items.total_limit)
    items.barrier()
    return CheckpointResult(path=final, save_iteration=int(final.name.split("_")[1]) + 1 if automatic else None)


def _write_checkpoint(items: CheckpointItems, staging: str) -> None:
    """Every rank writes its part into ``staging``; an error of rank 0's own files is raised on every rank."""
    import torch.distributed.checkpoint as dcp

    strategy = items.get_strategy()
    # the hooks write next to the rest, into staging: whatever they put there is renamed into place with it
    # (given ``final``, their files would be moved aside and deleted by the commit)
    items.hooks.run_save([strategy.unwrap(m) for m in items.models], staging)
    state = _collect_checkpoint(strategy, items.models, items.optimizers)
    with warnings.catch_warnings():  # DCP warns that one process without a group means one process
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(state, checkpoint_id=os.path.join(staging, "distributed"), no_dist=not _group_running())
    save_file(rng_state(), os.path.join(staging, f"random_states_{items.process_index}.pkl"), "the random state")

    def write_extra() -> None:
        extra = {"schedulers": [s.state_dict() for s in items.schedulers],
                 "scaler": items.scaler.state_dict() if items.scaler is not None else None,
                 "dataloaders": [d.state_dict() for d in items.dataloaders],
                 "custom": [o.state_dict() for o in items.custom], "step": items.step,
                 "trackers": items.trackers.state_dict()}
        save_file(extra, os.path.join(staging, "state.pt"),
                  "a scheduler's, data loader's or registered object's state_dict()")

    _on_main(items, write_extra)
    items.barrier()


def _read_extra(items: CheckpointItems, path: Path) -> dict[str, Any]:
    """``state.pt``: checked against what is prepared and registered now, before anything is loaded (a count
    that differs would restore some objects and silently leave the others as they are)."""
    extra = load_file(path / "state.pt")
    lists = ("schedulers", "dataloaders", "custom")
    if not isinstance(extra, dict) or not all(isinstance(extra.get(key), list) for key in lists):
        raise CheckpointError(f"{path / 'state.pt'} is damaged (not the record save_state() writes); resume from "
                              "another checkpoint")
    for key, now, what, where in (("schedulers", items.schedulers, "learning-rate scheduler(s)", "prepared"),
                                  ("custom", items.custom, "object(s) registered with register_for_checkpointing()",
                                   "registered")):
        if len(extra[key]) != len(now):
            raise CheckpointError(f"{path} holds the state of {len(extra[key])} {what}, and {len(now)} "
                                  f"{'are' if len(now) != 1 else 'is'} {where} now; load a checkpoint saved with "
                                  "the same ones, in the same order")
    return extra


def load_state(items: CheckpointItems, input_dir: str | os.PathLike[str] | None) -> CheckpointResult:
    """Restore the newest complete checkpoint under ``project_dir`` (or ``input_dir``): convoy's, or one
    written by Accelerate's ``save_state``; returns it (and the next automatic number when it is one)."""
    if input_dir is None:
        root = checkpoint_root(items.project_dir)
        path = directories.latest_checkpoint(root) or accelerate.latest_accelerate_checkpoint(root)
        if path is None:
            raise CheckpointError(f"no complete checkpoint under {root}; save_state() first, or pass input_dir")
    else:
        # rank 0's directory, as save_state writes there (ranks may name different ones, e.g. their own tempdirs)
        path = Path(collectives.broadcast_object(str(Path(input_dir))))
        directories.recover_checkpoint(path)
    strategy = items.get_strategy()
    items.hooks.run_load([strategy.unwrap(m) for m in items.models], str(path))
    if accelerate.is_accelerate_checkpoint(path):  # written by Accelerate's save_state
        return accelerate.load_accelerate_state(items, path)
    meta = directories.read_meta(path)
    items.require_owned_optimizers("load_state")
    extra = _read_extra(items, path)
    _load_checkpoint(strategy, items.models, items.optimizers, str(path / "distributed"), no_dist=not _group_running())
    for scheduler, sd in zip(items.schedulers, extra["schedulers"]):
        scheduler.load_state_dict(sd)
    if items.scaler is not None and extra["scaler"] is not None:
        items.scaler.load_state_dict(extra["scaler"])
    for loader, sd in zip(items.dataloaders, extra["dataloaders"]):
        loader.load_state_dict(sd)
    for obj, sd in zip(items.custom, extra["custom"]):
        obj.load_state_dict(sd)
    if "trackers" in extra:  # the next log() step
        items.trackers.load_state_dict(extra["trackers"])
    rng = path / f"random_states_{items.process_index}.pkl"
    if rng.exists():  # a checkpoint from fewer processes has no RNG state for the extra ranks
        set_rng_state(load_file(rng))
    numbered = items.project_dir is not None and path.parent == checkpoint_root(items.project_dir)
    items.barrier()
    return CheckpointResult(path=path, save_iteration=int(meta.get("iteration", 0)) + 1 if numbered else None)


def _collect_checkpoint(strategy: Strategy, models: Sequence[Any], optimizers: Sequence[tuple[Any, Any]]
                       ) -> dict[str, Any]:
    """The DCP state dict: ``model_<i>`` and ``optimizer_<j>``; ``optimizers`` pairs (optimizer, its model),
    each model a prepared one (``CheckpointItems.require_owned_optimizers``)."""
    state: dict[str, Any] = {}
    for i, model in enumerate(models):
        state[f"model_{i}"] = strategy.checkpoint_state(model, None)[0]
    for j, (optimizer, model) in enumerate(optimizers):
        state[f"optimizer_{j}"] = strategy.checkpoint_state(model, optimizer)[1]
    return state


def _load_checkpoint(strategy: Strategy, models: Sequence[Any], optimizers: Sequence[tuple[Any, Any]],
                    checkpoint_id: str, *, no_dist: bool) -> None:
    """Read ``model_<i>``/``optimizer_<j>`` from a DCP checkpoint into the prepared objects, each model with its
    optimizers. A model the strategy builds later (a pipeline is split on its first call) is read then: every
    rank reaches that first call together, so the collective read stays in step."""
    for i, model in enumerate(models):
        own = {j: optimizer for j, (optimizer, m) in enumerate(optimizers) if m is model}
        strategy.after_build(model, functools.partial(_load_model, strategy, i, model, own, checkpoint_id, no_dist))


def _load_model(strategy: Strategy, i: int, model: Any, optimizers: dict[int, Any], checkpoint_id: str,
                no_dist: bool) -> None:
    state = {f"model_{i}": strategy.checkpoint_state(model, None)[0]}
    state.update({f"optimizer_{j}": strategy.checkpoint_state(model, opt)[1] for j, opt in optimizers.items()})
    with warnings.catch_warnings():  # DCP warns that one process without a group means one process
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp_load(state, checkpoint_id, no_dist=no_dist)  # no code unpickled; a damaged file is named
    strategy.load_checkpoint_state(model, None, state[f"model_{i}"], {})
    for j, optimizer in optimizers.items():
        strategy.load_checkpoint_state(model, optimizer, {}, state[f"optimizer_{j}"])
