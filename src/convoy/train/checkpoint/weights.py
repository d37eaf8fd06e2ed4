"""``save_model``'s files: unwrapped, consolidated weights in the layout transformers reads.

    write_model(state, "out", max_shard_size="5GB", safe_serialization=True)
    # out/model.safetensors, or shards plus out/model.safetensors.index.json past max_shard_size
    # (safe_serialization=False: pytorch_model.bin, torch.save's format)

Every strategy writes the same names: those of the model's own state dict (``model_keys``), tied weights under each
of their names, so ``model.load_state_dict(load_file(...))`` and transformers' ``from_pretrained`` read the files.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from convoy.errors import ConfigError

__all__ = ["write_model", "parse_size", "model_keys"]


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_size(size: int | str) -> int:
    """``"5GB"`` -> 5_000_000_000; ints pass through."""
    if isinstance(size, int) and not isinstance(size, bool):
        value = size
    else:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(size))
        if not match or match.group(2).upper() not in _UNITS:
            raise ConfigError(f"max_shard_size={size!r} is not a size; write e.g. '5GB', '500MB' or a byte count")
        value = int(float(match.group(1)) * _UNITS[match.group(2).upper()])
    if value < 1:
        raise ConfigError(f"max_shard_size={size!r} is not a size above zero; write e.g. '5GB' or '500MB'")
    return value


def _unshared(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors that share memory (tied weights): each name after the first gets a copy, so
    every name of the model's state dict is in the file (a strict ``load_state_dict`` needs them all), under every
    strategy alike (sharded engines gather tied weights as separate tensors)."""
    seen: set[int] = set()
    out = {}
    for name, tensor in state.items():
        storage = tensor.untyped_storage().data_ptr()
        shared = tensor.numel() and storage in seen
        seen.add(storage)
        out[name] = tensor.clone() if shared else tensor.contiguous()
    return out


def model_keys(state: dict[str, torch.Tensor], keys: Iterable[str]) -> dict[str, torch.Tensor]:
    """``state``'s entries that the model's own state dict has (``keys``), in its order: no non-persistent
    buffer an engine kept (a traced pipeline stage's rotary tables), whatever the strategy gathered."""
    return {k: state[k] for k in keys if k in state}


def _on_cpu(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """CPU copies of accelerator tensors (weights files are read where that GPU is not), ties kept tied."""
    copies: dict[tuple, torch.Tensor] = {}
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


def _remove_earlier_save(directory: Path, stem: str, ext: str) -> None:
    """An earlier save of this format in ``directory`` (one file, or shards and their index): a loader would
    read its index or file next to the new one (transformers takes ``model.safetensors`` before an index)."""
    earlier = re.compile(rf"{re.escape(stem)}(-\d{{5}}-of-\d{{5}})?\.{ext}|{re.escape(stem)}\.{ext}\.index\.json")
    for path in directory.iterdir():
        if earlier.fullmatch(path.name) and path.is_file() and not path.is_symlink():
            path.unlink()


def write_model(state: dict[str, torch.Tensor], directory: str | os.PathLike[str], *, max_shard_size: int | str,
                safe_serialization: bool) -> list[Path]:
    """Write weights as one file or several shards plus an index; returns the files written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    limit = parse_size(max_shard_size)
    state = _on_cpu(state)
    state = _unshared(state) if safe_serialization else state
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
    _remove_earlier_save(directory, stem, ext)
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
