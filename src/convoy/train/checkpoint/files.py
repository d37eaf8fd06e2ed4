"""The files a checkpoint holds, read without unpickling code and written only when they will read back.

    save_file({"schedulers": [...]}, staging / "state.pt", "a scheduler's state_dict()")  # refused if unsafe
    state = load_file(path / "state.pt")          # torch.load(weights_only=True), on the CPU
    dcp_load(state, str(path / "distributed"), no_dist=True)   # DCP, .metadata restricted to DCP's classes

A planted pickle is refused and never runs; a missing, truncated or corrupt file is a ``CheckpointError``
naming it. Used for convoy's checkpoints and for Accelerate's (``accelerate.py``) alike.
"""

from __future__ import annotations

import importlib
import io
import pickle
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from convoy.errors import CheckpointError

__all__ = ["load_file", "load_safetensors", "save_file", "dcp_load", "numpy_rng_globals", "damaged_file"]

def damaged_file(path: str | Path, reason: str) -> CheckpointError:
    """The one line for a checkpoint file that cannot be read as what it should hold."""
    return CheckpointError(f"checkpoint file {path} is damaged ({reason}); the checkpoint cannot be loaded: "
                           "load an earlier one, or save again")


def _refused(path: str | Path, err: BaseException) -> CheckpointError:
    detail = str(err).split("\n")[0] if "GLOBAL" not in str(err) else \
        next((line.strip() for line in str(err).splitlines() if "GLOBAL" in line), str(err).split("\n")[0])
    return CheckpointError(f"checkpoint file {path} holds objects other than tensors and plain data, so it is "
                           f"not loaded ({detail[:160]}); save_state() never writes such a file: was it replaced?")


def numpy_rng_globals() -> list[Any]:
    """The exact numpy globals a numpy RNG state (``np.random.get_state()``: an array of uint32) is pickled
    with, under numpy 1's and numpy 2's names: older convoy checkpoints and Accelerate's ``random_states``."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover
        return []
    core = getattr(np, "_core", None) or np.core
    reconstruct = core.multiarray._reconstruct
    dtype_class = type(np.dtype(np.uint32))
    out: list[Any] = [np.ndarray, np.dtype, dtype_class,
                      (reconstruct, "numpy.core.multiarray._reconstruct"),
                      (reconstruct, "numpy._core.multiarray._reconstruct")]
    if dtype_class is not np.dtype:
        out.append((dtype_class, f"numpy.dtypes.{dtype_class.__name__}"))
    return out


def load_file(path: str | Path) -> Any:
    """``torch.load(path, weights_only=True)``: tensors and plain data only, never code.

    Raises:
        CheckpointError: the file is missing, truncated or corrupt (one line naming it), or it holds
            anything else (a planted pickle): it is refused and nothing in it runs.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} is missing; the checkpoint is incomplete: load an "
                              "earlier one, or save again")
    try:
        with torch.serialization.safe_globals(numpy_rng_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)  # tensors saved on a GPU too
    except pickle.UnpicklingError as err:
        operand = next((line.strip() for line in str(err).splitlines() if "Unsupported operand" in line), None)
        if operand is not None and "GLOBAL" not in str(err):  # bytes that are no pickle torch.save writes: garbage
            raise damaged_file(path, f"not a file torch.save wrote: {operand}") from None
        if "weights_only" in str(err) or "Unsupported" in str(err) or "GLOBAL" in str(err):
            raise _refused(path, err) from None
        raise damaged_file(path, _first_line(err)) from None
    except Exception as err:  # noqa: BLE001 -- garbage makes the unpickler raise anything (struct.error, ...)
        raise damaged_file(path, _first_line(err)) from None


def load_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors, on the CPU (nothing in it is code).

    Raises:
        CheckpointError: the file is missing, truncated or corrupt (one line naming it).
    """
    from safetensors.torch import load_file as read_safetensors

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} is missing; the checkpoint is incomplete: load an "
                              "earlier one, or save again")
    try:
        return read_safetensors(str(path), device="cpu")
    except Exception as err:  # noqa: BLE001 -- safetensors' SafetensorError for a bad header, OSError, ...
        raise damaged_file(path, _first_line(err)) from None


def save_file(obj: Any, path: str | Path, what: str) -> None:
    """``torch.save``, refusing (``CheckpointError``) what ``load_file`` could not read back safely."""
    buffer = io.BytesIO()
    try:
        torch.save(obj, buffer)
    except (pickle.PicklingError, AttributeError, TypeError) as err:  # a lambda, a local class, an open file
        raise CheckpointError(f"{what} cannot be saved ({_first_line(err)}); keep state_dict() to tensors, "
                              "numbers, strings, lists and dicts") from None
    buffer.seek(0)
    try:
        torch.load(buffer, weights_only=True)
    except pickle.UnpicklingError as err:
        detail = next((line.strip() for line in str(err).splitlines() if "GLOBAL" in line), _first_line(err))
        raise CheckpointError(f"{what} holds an object a checkpoint cannot load safely ({detail[:160]}); "
                              "keep state_dict() to tensors, numbers, strings, lists and dicts") from None
    Path(path).write_bytes(buffer.getvalue())


def _first_line(err: BaseException) -> str:
    text = str(err).strip().split("\n")[0] or type(err).__name__
    return text[:200]


_DCP_METADATA_MODULES = ("torch.distributed.checkpoint.metadata",)
_DCP_METADATA_NAMES = {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
                       ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "Path"),
                       ("pathlib", "PurePosixPath"), ("collections", "OrderedDict")}


def _metadata_unpickler():
    """A ``pickle.Unpickler`` that resolves only DCP's metadata classes, ``torch.Size``, dtypes and paths
    (the Python docs' "restricting globals"); DCP itself reads ``.metadata`` with plain ``pickle.load``."""

    class MetadataUnpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if (module, name) in _DCP_METADATA_NAMES:
                return super().find_class(module, name)
            if module in _DCP_METADATA_MODULES:
                obj = getattr(importlib.import_module(module), name, None)
                if isinstance(obj, type) and obj.__module__ == module:
                    return obj
            if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
                return getattr(torch, name)
            raise pickle.UnpicklingError(f"global '{module}.{name}' is not allowed in checkpoint metadata")

    return MetadataUnpickler


def _dcp_reader(checkpoint_id: str):
    """DCP's ``FileSystemReader`` with metadata read through ``_metadata_unpickler`` and every shard file
    checked against the byte ranges the metadata gives it (a truncated shard is named before reading)."""
    from torch.distributed.checkpoint import FileSystemReader

    class SafeFileSystemReader(FileSystemReader):
        refusal: CheckpointError | None = None
        """Why the checkpoint's ``.metadata`` was refused. DCP then tries a rank-local ``__<rank>.metadata``
        (which convoy never writes), and torch 2.11 reports only "metadata is None": this is what is said."""

        def read_metadata(self, *args: Any, **kwargs: Any):
            rank = kwargs.get("rank")
            try:
                metadata = self._read_metadata(rank)
            except CheckpointError as err:
                if rank is None:
                    self.refusal = err
                raise
            if rank is None:
                self.refusal = None
            return metadata

        def _read_metadata(self, rank: int | None):
            from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

            path = Path(checkpoint_id) / (".metadata" if rank is None else f"__{rank}.metadata")
            if not path.is_file():
                raise CheckpointError(f"checkpoint file {path} is missing; the checkpoint is incomplete: load an "
                                      "earlier one, or save again")
            try:
                with open(path, "rb") as handle:
                    metadata = _metadata_unpickler()(handle).load()
            except pickle.UnpicklingError as err:
                if "is not allowed" in str(err):
                    raise _refused(path, err) from None
                raise damaged_file(path, _first_line(err)) from None
            except OSError as err:
                raise CheckpointError(f"checkpoint file {path} cannot be read ({err.strerror or err})") from None
            except Exception as err:  # noqa: BLE001 -- garbage makes the unpickler raise anything
                raise damaged_file(path, _first_line(err)) from None
            if not isinstance(metadata, Metadata):
                raise damaged_file(path, f"it holds a {type(metadata).__name__}, not DCP's Metadata")
            _check_shards(Path(checkpoint_id), metadata)

            storage_meta = getattr(metadata, "storage_meta", None)
            if storage_meta is None:
                storage_meta = metadata.storage_meta = StorageMeta()
            storage_meta.load_id = self.load_id
            return metadata

    return SafeFileSystemReader(checkpoint_id)


def _check_shards(directory: Path, metadata: Any) -> None:
    needed: dict[str, int] = {}
    for info in (getattr(metadata, "storage_data", None) or {}).values():
        end = int(info.offset) + int(info.length)
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), end)
    for name, end in sorted(needed.items()):
        path = directory / name
        if path.resolve().parent != directory.resolve():
            raise damaged_file(directory / ".metadata", f"it names a file outside the checkpoint: {name!r}")
        try:
            size = path.stat().st_size
        except OSError:
            raise CheckpointError(f"checkpoint file {path} is missing; the checkpoint is incomplete: load an "
                                  "earlier one, or save again") from None
        if size < end:
            raise damaged_file(path, f"truncated: {size} bytes, its index needs {end}")


def _dcp_planner():
    """DCP's ``DefaultLoadPlanner``, reading non-tensor values with ``weights_only=True`` (it uses False)."""
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._traverse import set_element

    class SafeLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            obj = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    return SafeLoadPlanner()


def dcp_load(state: dict[str, Any], checkpoint_id: str, *, no_dist: bool) -> None:
    """``torch.distributed.checkpoint.load`` that unpickles no code and names a damaged file.

    Raises:
        CheckpointError: a missing, truncated or corrupt file (named), or one holding other objects.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    reader = _dcp_reader(checkpoint_id)
    # a missing or damaged record is named here: inside dcp.load, torch logs a traceback on the root logger for
    # it, then tries a rank-local record convoy never writes and logs another. Every rank reads it and all
    # agree, so that a node whose copy is damaged does not raise alone while the others wait in dcp.load.
    try:
        reader.read_metadata()
        refusal = None
    except CheckpointError as err:
        refusal = str(err)
    if not no_dist and dist.is_available() and dist.is_initialized():
        refusals: list[str | None] = [None] * dist.get_world_size()
        dist.all_gather_object(refusals, refusal)
        refusal = next((r for r in refusals if r), None)
    if refusal:
        raise CheckpointError(refusal)
    try:
        dcp.load(state, storage_reader=reader, planner=_dcp_planner(), no_dist=no_dist)
    except CheckpointException as err:  # a BaseException: it escapes `except Exception`
        causes = [exc for exc, _ in err.failures.values()]
        own = reader.refusal or next((exc for exc in causes if isinstance(exc, CheckpointError)), None)
        if own is not None:
            raise CheckpointError(str(own)) from None
        raise _unloadable(checkpoint_id, causes[0] if causes else err) from None
    except CheckpointError:
        raise
    except (RuntimeError, ValueError, OSError, EOFError, KeyError) as err:
        raise _unloadable(checkpoint_id, err) from None


def _unloadable(checkpoint_id: str, cause: BaseException) -> CheckpointError:
    return CheckpointError(f"checkpoint {checkpoint_id} cannot be loaded ({type(cause).__name__}: "
                           f"{_first_line(cause)}); either its files are damaged or the model and optimizers "
                           "differ from those it was saved from")
