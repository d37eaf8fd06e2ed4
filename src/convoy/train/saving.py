"""What ``save_state``/``load_state``/``save_model`` write, and how it is read back.

A ``save_state`` directory::

    checkpoint_3/
      distributed/                 torch.distributed.checkpoint: model_<i>, optimizer_<j> (sharded or not;
                                   loadable by any strategy on any number of processes)
      state.pt                     schedulers, gradient scaler, dataloader positions, registered objects
      random_states_<rank>.pkl     python / numpy / torch (and CUDA) RNG of each rank
      convoy_checkpoint.json       written last: the checkpoint is complete (see checkpoint.py)

``save_model`` writes the unwrapped, consolidated weights as ``model.safetensors`` (or shards plus
``model.safetensors.index.json`` past ``max_shard_size``), the layout transformers reads.
"""

from __future__ import annotations

import functools
import json
import random
import warnings
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from convoy.errors import CheckpointError, ConfigError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from convoy.train.strategies.base import Strategy

__all__ = ["collect_checkpoint", "load_checkpoint", "rng_state", "set_rng_state", "write_model", "parse_size"]


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
    from convoy.train.checkpoint import dcp_load

    state = {f"model_{i}": strategy.checkpoint_state(model, None)[0]}
    state.update({f"optimizer_{j}": strategy.checkpoint_state(model, opt)[1] for j, opt in optimizers.items()})
    with warnings.catch_warnings():  # DCP warns that one process without a group means one process
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp_load(state, checkpoint_id, no_dist=no_dist)  # no code unpickled; a damaged file is named
    strategy.load_checkpoint_state(model, None, state[f"model_{i}"], {})
    for j, optimizer in optimizers.items():
        strategy.load_checkpoint_state(model, optimizer, {}, state[f"optimizer_{j}"])


def rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    name, keys, pos, has_gauss, cached = np.random.get_state()
    # numpy's state as plain ints, so that torch.load(weights_only=True) reads it without numpy globals
    out: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state(),
                           "numpy": (str(name), [int(k) for k in keys], int(pos), int(has_gauss), float(cached))}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(size: int | str) -> int:
    """``"5GB"`` -> 5_000_000_000; ints pass through."""
    if isinstance(size, int) and not isinstance(size, bool):
        return size
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(size))
    if not match or match.group(2).upper() not in _UNITS:
        raise ConfigError(f"max_shard_size={size!r} is not a size; write e.g. '5GB', '500MB' or a byte count")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def _drop_shared(state: dict[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"]:
    """safetensors refuses tensors that share memory (tied weights): keep the first name of each."""
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    out = {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if tensor.numel() and key in seen:
            continue
        seen.add(key)
        out[name] = tensor.contiguous()
    return out


def _on_cpu(state: dict[str, "torch.Tensor"]) -> dict[str, "torch.Tensor"]:
    """CPU copies of accelerator tensors (weights files are read where that GPU is not), ties kept tied."""
    copies: dict[tuple, "torch.Tensor"] = {}
    out = {}
    for name, tensor in state.items():
        if tensor.device.type == "cpu":
            out[name] = tensor
            continue
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride())
        if key not in copies:
            copies[key] = tensor.detach().to("cpu")
        out[name] = copies[key]
    return out


def write_model(state: dict[str, "torch.Tensor"], directory: str | Path, *, max_shard_size: int | str,
                safe_serialization: bool) -> list[Path]:
    """Write weights as one file or several shards plus an index; returns the files written."""
    import torch

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    limit = parse_size(max_shard_size)
    state = _on_cpu(state)
    state = _drop_shared(state) if safe_serialization else state
    shards: list[dict[str, Any]] = [{}]
    size = 0
    for name, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    stem, ext = ("model", "safetensors") if safe_serialization else ("pytorch_model", "bin")
    names = ([f"{stem}.{ext}"] if len(shards) == 1 else
             [f"{stem}-{i + 1:05d}-of-{len(shards):05d}.{ext}" for i in range(len(shards))])
    written = []
    for filename, shard in zip(names, shards):
        path = directory / filename
        if safe_serialization:
            from safetensors.torch import save_file

            save_file(shard, str(path), metadata={"format": "pt"})
        else:
            torch.save(shard, path)
        written.append(path)
    if len(shards) > 1:
        index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
                 "weight_map": {n: f for f, s in zip(names, shards) for n in s}}
        path = directory / f"{stem}.{ext}.index.json"
        path.write_text(json.dumps(index, indent=2, sort_keys=True))
        written.append(path)
    return written
