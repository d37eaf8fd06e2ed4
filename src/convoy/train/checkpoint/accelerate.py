"""Loading a checkpoint directory written by Hugging Face Accelerate's ``save_state``, so that a run started
with Accelerate goes on under convoy.

    accelerator.load_state("accelerate_run/checkpoints/checkpoint_3")   # detected; nothing else to change

The directory holds ``model.safetensors`` or ``pytorch_model.bin`` (``model_1...`` for further models),
``optimizer.bin``, ``scheduler.bin``, ``scaler.pt``, ``random_states_<rank>.pkl`` and
``custom_checkpoint_<i>.pkl``, each ``<name>_<i>`` for the i-th object past the first. Every file is read as
convoy reads its own (``files.load_file``: ``torch.load(weights_only=True)``, only numpy's RNG-state types allowed
besides tensors and plain data) or with safetensors; nothing is unpickled. A file that cannot be read, or does
not hold what Accelerate writes there (a state dict), is one ``CheckpointError`` naming it; a missing
``random_states_<rank>.pkl`` is not (a checkpoint of fewer processes: that rank's RNG is left as it is, as
Accelerate does). The state goes through the strategy like convoy's own checkpoints, so a checkpoint of one
process loads into a sharded strategy too.

Not supported yet: sharded FSDP/DeepSpeed checkpoints (sub-directories; NotSupportedYetError). Not read:
``sampler.bin`` (a pickled sampler object, which cannot be loaded without running pickled code) and
``dl_state_dict.bin`` (torchdata's loader state). Accelerate saves no loader position; resume mid-epoch with
``skip_first_batches`` as under Accelerate.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from convoy.errors import CheckpointError, NotSupportedYetError
from convoy.train.checkpoint import directories
from convoy.train.checkpoint.files import damaged_file, load_file, load_safetensors
from convoy.train.checkpoint.items import CheckpointItems, CheckpointResult
from convoy.train.checkpoint.rng import restore_rng
from convoy.train.optimizer_names import named_optimizer_state, param_names

if TYPE_CHECKING:  # pragma: no cover
    from convoy.train.strategies.base import Strategy

__all__ = ["is_accelerate_checkpoint", "latest_accelerate_checkpoint", "load_accelerate_state"]

_MARKERS = ("model.safetensors", "pytorch_model.bin", "optimizer.bin", "scheduler.bin", "random_states_0.pkl")


def is_accelerate_checkpoint(path: str | Path) -> bool:
    """True for a directory written by Accelerate's ``save_state`` (not by convoy's, complete or not)."""
    path = Path(path)
    convoy_files = ((path / directories.MARKER).exists() or (path / "state.pt").exists()
                    or (path / "distributed").is_dir())
    return path.is_dir() and not convoy_files and any((path / m).exists() for m in _MARKERS)


def latest_accelerate_checkpoint(root: str | Path) -> Path | None:
    """The Accelerate ``checkpoint_<n>`` directory under ``root`` with the largest ``n``, or None."""
    return directories.latest_checkpoint(root, accept=is_accelerate_checkpoint)


def _indexed(directory: Path, stem: str, ext: str, i: int) -> Path:
    return directory / (f"{stem}.{ext}" if i == 0 else f"{stem}_{i}.{ext}")


def _state_dict(path: Path, what: str, keys: tuple[str, ...] = (), tensors: bool = False) -> dict[str, Any]:
    """``path`` read (``load_file``) as ``what`` Accelerate's ``save_state`` writes: a dict holding ``keys``
    (``tensors``: of tensors only); anything else is damage, one ``CheckpointError`` naming the file."""
    state = load_file(path)
    if (not isinstance(state, dict) or any(key not in state for key in keys)
            or (tensors and not all(isinstance(v, torch.Tensor) for v in state.values()))):
        raise damaged_file(path, f"it holds a {type(state).__name__} that is not {what}")
    return state


def _model_state(directory: Path, i: int) -> dict[str, Any]:
    safe = _indexed(directory, "model", "safetensors", i)
    if safe.exists():
        return load_safetensors(safe)
    pickled = _indexed(directory, "pytorch_model", "bin", i)
    if pickled.exists():
        return _state_dict(pickled, "a model's state_dict", tensors=True)
    raise CheckpointError(f"{directory}: no weights for model {i} ({safe.name} or {pickled.name}); the checkpoint "
                          f"was saved with fewer models than were prepared")


def _fill(template: Any, full: Any, where: str) -> Any:
    """``full`` laid out like ``template``: each tensor placed like the template's (a DTensor's shards), the
    rest taken from ``full``."""
    if isinstance(template, dict) and isinstance(full, dict):
        return {k: _fill(template[k], v, f"{where}.{k}") if k in template else v for k, v in full.items()}
    if isinstance(template, torch.Tensor) and isinstance(full, torch.Tensor):
        if tuple(template.shape) != tuple(full.shape):
            raise CheckpointError(f"{where}: the checkpoint has shape {tuple(full.shape)}, the prepared model "
                                  f"{tuple(template.shape)}; prepare the model the checkpoint was saved from")
        from torch.distributed.tensor import DTensor, distribute_tensor

        if isinstance(template, DTensor):
            return distribute_tensor(full.to(template.device, template.dtype), template.device_mesh,
                                     template.placements)
        return full.to(template.device)
    return full


def _model_into(strategy: Strategy, i: int, model: Any, state: dict[str, Any]) -> None:
    template = strategy.checkpoint_state(model, None)[0]
    missing = [k for k in template if k not in state]
    for key in missing:  # tied weights are saved once: take the partner that shares the memory
        ptr = template[key].data_ptr()
        partner = next((k for k in state if k in template and template[k].data_ptr() == ptr), None)
        if partner is None:
            raise CheckpointError(f"model {i}: the Accelerate checkpoint has no {key!r}; prepare the model the "
                                  "checkpoint was saved from")
        state[key] = state[partner]
    unknown = [k for k in state if k not in template]
    if unknown:
        raise CheckpointError(f"model {i}: the Accelerate checkpoint has {unknown[0]!r}, which the prepared model "
                              "does not; prepare the model the checkpoint was saved from")
    strategy.load_checkpoint_state(model, None, _fill(template, state, f"model {i}"), {})


def _optimizer_state(path: Path) -> dict[str, Any]:
    """``optimizer.bin``: an ``optimizer.state_dict()`` (groups of numbered parameters, and their state)."""
    state = _state_dict(path, "an optimizer's state_dict", keys=("state", "param_groups"))
    groups = state["param_groups"]
    if not (isinstance(state["state"], dict) and isinstance(groups, list)
            and all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in groups)
            and set(state["state"]) <= {p for g in groups for p in g["params"]}):
        raise damaged_file(path, "its param_groups and state do not fit together, as an optimizer's state_dict's do")
    return state


def _optimizer_into(strategy: Strategy, j: int, optimizer: Any, model: Any, state: dict[str, Any]) -> None:
    """Accelerate's optimizer state is ``optimizer.state_dict()``: parameters numbered in the groups' order.
    convoy's strategies take it keyed by parameter name, which the prepared optimizer's groups give."""
    names = param_names(strategy.unwrap(model), optimizer)
    numbered = [p for group in state["param_groups"] for p in group["params"]]
    if len(numbered) != len(names):
        raise CheckpointError(f"optimizer {j}: the Accelerate checkpoint has {len(numbered)} parameters, the "
                              f"prepared optimizer {len(names)}; prepare the optimizer the checkpoint was saved from")
    by_name = named_optimizer_state(state, names)
    template = strategy.checkpoint_state(model, optimizer)[1]
    strategy.load_checkpoint_state(model, optimizer, {}, _fill(template, by_name, f"optimizer {j}"))


def _load_model(strategy: Strategy, i: int, model: Any, state: dict[str, Any],
                optimizers: list[tuple[int, Any, Path]]) -> None:
    _model_into(strategy, i, model, state)
    for j, optimizer, path in optimizers:
        _optimizer_into(strategy, j, optimizer, model, _optimizer_state(path))


def _rng_into(process_index: int, directory: Path) -> int | None:
    """Restore this rank's RNG; returns the loop's step the file holds (None: it holds none)."""
    path = directory / f"random_states_{process_index}.pkl"
    if not path.exists():  # a checkpoint from fewer processes has no RNG state for the extra ranks
        return None
    # Accelerate logs a file it cannot restore and goes on; a damaged file is refused here, as in convoy's own
    # checkpoints: the run would go on with another random stream than the one saved, and not say so. The
    # message says how to go on as Accelerate would.
    try:
        states = _state_dict(path, "Accelerate's random states",
                             keys=("random_state", "numpy_random_seed", "torch_manual_seed"))
        try:
            step = int(states["step"]) if "step" in states else None
            restore_rng(python=states["random_state"], numpy_state=states["numpy_random_seed"],
                        torch_state=states["torch_manual_seed"], cuda_states=states.get("torch_cuda_manual_seed"))
        except (TypeError, ValueError, RuntimeError) as err:  # what random, numpy and torch raise for a bad state
            raise damaged_file(path, f"a random state cannot be restored: {str(err).splitlines()[0][:160]}") from None
    except CheckpointError as err:
        raise CheckpointError(f"{err}; or move {path.name} away to resume without its random state (Accelerate "
                              "only logs such a file and goes on: the run then draws other random numbers)") from None
    return step


def load_accelerate_state(items: CheckpointItems, directory: str | Path) -> CheckpointResult:
    """Restore models, optimizers, schedulers, the gradient scaler, registered objects and this rank's RNG
    from Accelerate's ``save_state`` directory into ``items``; returns the directory and the step it holds."""
    directory = Path(directory)
    sharded = sorted(p.name for p in directory.iterdir() if p.is_dir())
    if sharded:  # FSDP's pytorch_model_fsdp_0/ and optimizer_0/, DeepSpeed's pytorch_model/
        raise NotSupportedYetError(f"{directory}: Accelerate's sharded FSDP/DeepSpeed checkpoints ({sharded[0]}/) "
                                   "are not supported yet; save with fsdp_state_dict_type='FULL_STATE_DICT'")
    optimizers = []
    for j, (optimizer, model) in enumerate(items.optimizers):
        path = _indexed(directory, "optimizer", "bin", j)
        if not path.exists():
            raise CheckpointError(f"{directory}: no {path.name}; the checkpoint was saved with fewer optimizers")
        optimizers.append((j, optimizer, model, path))
    strategy = items.get_strategy()
    for i, model in enumerate(items.models):
        state = _model_state(directory, i)
        own = [(j, opt, path) for j, opt, m, path in optimizers if m is model]
        # a model the strategy builds later (a pipeline) is read then, as convoy's own checkpoints are
        strategy.after_build(model, functools.partial(_load_model, strategy, i, model, state, own))
    items.require_owned_optimizers("load_state")
    for k, scheduler in enumerate(items.schedulers):
        path = _indexed(directory, "scheduler", "bin", k)
        if not path.exists():
            raise CheckpointError(f"{directory}: no {path.name}; the checkpoint was saved with fewer schedulers")
        scheduler.load_state_dict(_state_dict(path, "a scheduler's state_dict"))
    if items.scaler is not None and (directory / "scaler.pt").exists():
        items.scaler.load_state_dict(_state_dict(directory / "scaler.pt", "a GradScaler's state_dict"))
    for n, obj in enumerate(items.custom):
        path = directory / f"custom_checkpoint_{n}.pkl"
        if not path.exists():
            raise CheckpointError(f"{directory}: no {path.name} for registered object {n}")
        obj.load_state_dict(load_file(path))
    step = _rng_into(items.process_index, directory)
    items.barrier()
    return CheckpointResult(path=directory, step=step)
