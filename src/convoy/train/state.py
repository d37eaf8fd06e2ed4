"""The Accelerator's checkpoints: ``save_state``/``load_state``/``save_model`` bodies, over the loop's objects.

    path = save_state(accelerator, None)        # project_dir/checkpoints/checkpoint_<n>, written atomically
    load_state(accelerator, None)               # the newest complete one under project_dir/checkpoints

``convoy.Accelerator`` delegates its methods here; the file layout is ``convoy.train.checkpoint``'s (staging
directory, ``convoy_checkpoint.json`` last), the tensor state ``torch.distributed.checkpoint``'s.
"""

from __future__ import annotations

import functools
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from convoy.errors import CheckpointError
from convoy.train import checkpoint as ckpt
from convoy.train import accelerate_checkpoint, collectives
from convoy.train.checkpoint.files import dcp_load
from convoy.train.checkpoint.rng import rng_state, set_rng_state
from convoy.train.checkpoint.weights import write_model

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from convoy.train.accelerator import Accelerator
    from convoy.train.strategies.base import Strategy

__all__ = ["checkpoint_root", "save_state", "load_state", "save_model"]


def checkpoint_root(acc: "Accelerator") -> Path:
    """``project_dir/checkpoints``; a ``CheckpointError`` when the Accelerator has no project_dir."""
    if acc.project_dir is None:
        raise CheckpointError("save_state()/load_state() without a directory needs "
                              "Accelerator(project_dir=...); or pass a directory")
    return Path(acc.project_dir) / "checkpoints"


def _group_running() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _optimizer_pairs(acc: "Accelerator") -> list[tuple[Any, Any]]:
    return list(zip([o.optimizer for o in acc._optimizers], acc._optimizer_models))


def save_model(acc: "Accelerator", model: "torch.nn.Module", save_directory: str | os.PathLike[str], *,
               max_shard_size: int | str, safe_serialization: bool) -> None:
    """Unwrapped, consolidated weights in safetensors (transformers' file layout). Collective."""
    state = acc.strategy.full_model_state_dict(model)
    if acc.is_main_process:
        write_model(state, save_directory, max_shard_size=max_shard_size, safe_serialization=safe_serialization)
    acc.wait_for_everyone()


def save_state(acc: "Accelerator", output_dir: str | os.PathLike[str] | None) -> str:
    """Write a complete checkpoint atomically; returns its directory (and advances ``save_iteration``)."""
    import torch.distributed.checkpoint as dcp

    automatic = output_dir is None or acc.project_configuration.automatic_checkpoint_naming
    if automatic:
        root = checkpoint_root(acc)
        final = root / f"checkpoint_{acc.save_iteration}"
        if acc.is_main_process:
            final = max(final, ckpt.next_checkpoint_dir(root), key=lambda p: int(p.name.split("_")[1]))
    else:
        final = Path(output_dir)  # type: ignore[arg-type]
    staging = collectives.broadcast_object(str(ckpt.begin_checkpoint(final)) if acc.is_main_process else None)
    final = Path(collectives.broadcast_object(str(final)))
    strategy = acc.strategy
    # the hooks write next to the rest, into staging: whatever they put there is renamed into place with it
    # (given ``final``, their files would be moved aside and deleted by the commit)
    acc._state_hooks.run_save([strategy.unwrap(m) for m in acc._models], staging)
    state = collect_checkpoint(strategy, acc._models, _optimizer_pairs(acc))
    with warnings.catch_warnings():  # DCP warns that one process without a group means one process
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(state, checkpoint_id=os.path.join(staging, "distributed"), no_dist=not _group_running())
    ckpt.save_file(rng_state(), os.path.join(staging, f"random_states_{acc.process_index}.pkl"),
                   "the random state")
    if acc.is_main_process:
        extra = {"schedulers": [s.state_dict() for s in acc._schedulers],
                 "scaler": acc.scaler.state_dict() if acc.scaler is not None else None,
                 "dataloaders": [d.state_dict() for d in acc._dataloaders],
                 "custom": [o.state_dict() for o in acc._custom], "step": acc.step,
                 "trackers": acc._trackers.state_dict()}
        ckpt.save_file(extra, os.path.join(staging, "state.pt"),
                       "a scheduler's, data loader's or registered object's state_dict()")
    acc.wait_for_everyone()
    if acc.is_main_process:
        ckpt.commit_checkpoint(staging, final, {"world_size": acc.num_processes, "strategy": strategy.name,
                                                "iteration": acc.save_iteration})
        if automatic:
            ckpt.prune_checkpoints(final.parent, acc.project_configuration.total_limit)
    acc.wait_for_everyone()
    if automatic:
        acc.save_iteration = int(final.name.split("_")[1]) + 1
    return str(final)


def load_state(acc: "Accelerator", input_dir: str | os.PathLike[str] | None) -> str:
    """Restore the newest complete checkpoint under ``project_dir`` (or ``input_dir``); returns it."""
    if input_dir is None:
        found = ckpt.latest_checkpoint(checkpoint_root(acc))
        found = found or accelerate_checkpoint.latest_accelerate_checkpoint(checkpoint_root(acc))
        if found is None:
            raise CheckpointError(f"no complete checkpoint under {checkpoint_root(acc)}; "
                                  "save_state() first, or pass input_dir")
        path = found
    else:
        # rank 0's directory, as save_state writes there (ranks may name different ones, e.g. their own tempdirs)
        path = Path(collectives.broadcast_object(str(Path(input_dir))))
        ckpt.recover_checkpoint(path)
    acc._state_hooks.run_load([acc.strategy.unwrap(m) for m in acc._models], str(path))
    if accelerate_checkpoint.is_accelerate_checkpoint(path):  # written by Accelerate's save_state
        return accelerate_checkpoint.load_accelerate_state(acc, path)
    meta = ckpt.read_meta(path)
    load_checkpoint(acc.strategy, acc._models, _optimizer_pairs(acc), str(path / "distributed"),
                    no_dist=not _group_running())
    extra = ckpt.load_file(path / "state.pt")
    for scheduler, sd in zip(acc._schedulers, extra["schedulers"]):
        scheduler.load_state_dict(sd)
    if acc.scaler is not None and extra["scaler"] is not None:
        acc.scaler.load_state_dict(extra["scaler"])
    for loader, sd in zip(acc._dataloaders, extra["dataloaders"]):
        loader.load_state_dict(sd)
    for obj, sd in zip(acc._custom, extra["custom"]):
        obj.load_state_dict(sd)
    if "trackers" in extra:  # the next log() step
        acc._trackers.load_state_dict(extra["trackers"])
    rng = path / f"random_states_{acc.process_index}.pkl"
    if rng.exists():  # a checkpoint from fewer processes has no RNG state for the extra ranks
        set_rng_state(ckpt.load_file(rng))
    if acc.project_dir is not None and path.parent == checkpoint_root(acc):
        acc.save_iteration = int(meta.get("iteration", 0)) + 1
    acc.wait_for_everyone()
    return str(path)


def collect_checkpoint(strategy: "Strategy", models: Sequence[Any], optimizers: Sequence[tuple[Any, Any]]
                       ) -> dict[str, Any]:
    """The DCP state dict: ``model_<i>`` and ``optimizer_<j>``; ``optimizers`` pairs (optimizer, its model)."""
    state: dict[str, Any] = {}
    for i, model in enumerate(models):
        state[f"model_{i}"] = strategy.checkpoint_state(model, None)[0]
    for j, (optimizer, model) in enumerate(optimizers):
        if model is None:
            raise CheckpointError(f"optimizer {j} holds no parameter of a prepared model; prepare its model "
                                  "together with it so that save_state can name its state")
        state[f"optimizer_{j}"] = strategy.checkpoint_state(model, optimizer)[1]
    return state


def load_checkpoint(strategy: "Strategy", models: Sequence[Any], optimizers: Sequence[tuple[Any, Any]],
                    checkpoint_id: str, *, no_dist: bool) -> None:
    """Read ``model_<i>``/``optimizer_<j>`` from a DCP checkpoint into the prepared objects, each model with its
    optimizers. A model the strategy builds later (a pipeline is split on its first call) is read then: every
    rank reaches that first call together, so the collective read stays in step."""
    for j, (_, model) in enumerate(optimizers):
        if model is None:
            raise CheckpointError(f"optimizer {j} holds no parameter of a prepared model; prepare its model "
                                  "together with it so that load_state can name its state")
    for i, model in enumerate(models):
        own = {j: optimizer for j, (optimizer, m) in enumerate(optimizers) if m is model}
        strategy.after_build(model, functools.partial(_load_model, strategy, i, model, own, checkpoint_id, no_dist))


def _load_model(strategy: "Strategy", i: int, model: Any, optimizers: dict[int, Any], checkpoint_id: str,
                no_dist: bool) -> None:
    state = {f"model_{i}": strategy.checkpoint_state(model, None)[0]}
    state.update({f"optimizer_{j}": strategy.checkpoint_state(model, opt)[1] for j, opt in optimizers.items()})
    with warnings.catch_warnings():  # DCP warns that one process without a group means one process
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp_load(state, checkpoint_id, no_dist=no_dist)  # no code unpickled; a damaged file is named
    strategy.load_checkpoint_state(model, None, state[f"model_{i}"], {})
    for j, optimizer in optimizers.items():
        strategy.load_checkpoint_state(model, optimizer, {}, state[f"optimizer_{j}"])
