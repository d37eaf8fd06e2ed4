"""Checkpoint directories: written atomically, named automatically, the newest complete one found again.

    staging = begin_checkpoint(final_dir)          # rank 0: a hidden temporary directory beside final_dir
    ... every rank writes into staging ...
    commit_checkpoint(staging, final_dir, meta)     # rank 0: marker file, then one rename
    latest_checkpoint(project_dir / "checkpoints")  # the newest directory whose marker exists

A checkpoint is complete when its marker file (``convoy_checkpoint.json``) exists; the marker is written
last, inside the staging directory, and the directory is then renamed into place, so a process killed at
any moment leaves either the previous checkpoint or the new one, never a half-written one that loads.
Replacing a directory of the same name takes two renames; a process killed between them leaves both copies
under staging names, and ``recover_checkpoint`` (called by the next load and the next save) puts the newest
back. Every file is read without unpickling code: ``torch.load(weights_only=True)`` for ``.pt``/``.pkl``
files, and DCP's reader with its ``.metadata`` restricted to DCP's own classes (``dcp_load``); a truncated
or corrupt file is a ``CheckpointError`` naming it.
Needs a file system that every rank of the job sees (one machine, or a shared mount).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

from convoy.errors import CheckpointError

__all__ = ["MARKER", "begin_checkpoint", "commit_checkpoint", "is_complete", "latest_checkpoint",
           "next_checkpoint_dir", "prune_checkpoints", "read_meta", "recover_checkpoint", "load_file", "save_file",
           "dcp_load"]

MARKER = "convoy_checkpoint.json"
_NAME = re.compile(r"^checkpoint_(\d+)$")
_STAGING_PREFIX = ".staging-"


def begin_checkpoint(final_dir: str | Path) -> Path:
    """Create and return an empty staging directory next to ``final_dir`` (same file system)."""
    final_dir = Path(final_dir)
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    recover_checkpoint(final_dir)  # a save killed mid-commit: put the checkpoint back before anything else
    staging = final_dir.parent / f"{_STAGING_PREFIX}{final_dir.name}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()
    return staging


def commit_checkpoint(staging: str | Path, final_dir: str | Path, meta: dict[str, Any]) -> Path:
    """Mark ``staging`` complete and move it to ``final_dir``, replacing an older one of that name."""
    staging, final_dir = Path(staging), Path(final_dir)
    meta = {**meta, "name": final_dir.name, "saved_at": time.time()}
    marker_tmp = staging / (MARKER + ".tmp")
    marker_tmp.write_text(json.dumps(meta, indent=2, sort_keys=True))
    os.replace(marker_tmp, staging / MARKER)
    _fsync_dir(staging)
    if final_dir.exists():
        # an explicit directory saved twice: move the old one aside first; the old one is only deleted
        # once the new one is in place.
        trash = final_dir.parent / f"{_STAGING_PREFIX}old-{final_dir.name}-{uuid.uuid4().hex[:8]}"
        os.replace(final_dir, trash)
        os.replace(staging, final_dir)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(staging, final_dir)
    _fsync_dir(final_dir.parent)
    return final_dir


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def is_complete(path: str | Path) -> bool:
    return (Path(path) / MARKER).is_file()


def read_meta(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not is_complete(path):
        raise CheckpointError(f"{path} is not a complete convoy checkpoint (no {MARKER}); "
                              "pass a directory written by save_state()")
    return json.loads((path / MARKER).read_text())


def _numbered(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _NAME.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(root: str | Path) -> Path | None:
    """The complete ``checkpoint_<n>`` directory under ``root`` with the largest ``n``, or None."""
    for _, path in reversed(_numbered(Path(root))):
        if is_complete(path):
            return path
    return None


def next_checkpoint_dir(root: str | Path) -> Path:
    """``root/checkpoint_<n>`` with ``n`` one past the largest existing number (complete or not)."""
    numbered = _numbered(Path(root))
    n = numbered[-1][0] + 1 if numbered else 0
    return Path(root) / f"checkpoint_{n}"


def prune_checkpoints(root: str | Path, total_limit: int | None) -> list[Path]:
    """Delete the oldest numbered checkpoints beyond ``total_limit``, and leftover staging directories.

    Returns the deleted paths. Incomplete numbered directories are removed too (they never load).
    """
    root = Path(root)
    removed: list[Path] = []
    if root.is_dir():
        for child in root.iterdir():
            if child.name.startswith(_STAGING_PREFIX):
                shutil.rmtree(child, ignore_errors=True)
                removed.append(child)
    numbered = _numbered(root)
    complete = [p for _, p in numbered if is_complete(p)]
    for _, path in numbered:
        if not is_complete(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    if total_limit is not None and total_limit > 0 and len(complete) > total_limit:
        for path in complete[: len(complete) - total_limit]:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


# --- recovery of a save killed between its two renames -------------------------------------------------

def _staged_copies(final_dir: Path) -> list[tuple[float, Path]]:
    """Complete staging directories of ``final_dir`` (the new one, or the old one moved aside), newest first."""
    if not final_dir.parent.is_dir():
        return []
    found = []
    prefixes = (f"{_STAGING_PREFIX}{final_dir.name}-", f"{_STAGING_PREFIX}old-{final_dir.name}-")
    for child in final_dir.parent.iterdir():
        if not child.name.startswith(prefixes) or not is_complete(child):
            continue
        try:
            meta = json.loads((child / MARKER).read_text())
        except (OSError, ValueError):
            continue
        if meta.get("name", final_dir.name) != final_dir.name:  # e.g. ".staging-old-x-..." of a save to "old-x"
            continue
        found.append((float(meta.get("saved_at", 0.0)), child))
    return sorted(found, reverse=True)


def recover_checkpoint(final_dir: str | Path) -> bool:
    """Put back ``final_dir`` when a save was killed after moving the old copy aside; True if it did.

    ``commit_checkpoint`` replaces an existing directory with two renames (old aside, new into place). A
    process killed between them leaves ``final_dir`` missing and both copies complete under staging names:
    the newest complete one becomes ``final_dir`` again. Safe to call from every rank at once.
    """
    final_dir = Path(final_dir)
    if is_complete(final_dir) or final_dir.exists():
        return False
    for _, candidate in _staged_copies(final_dir):
        try:
            os.replace(candidate, final_dir)
        except OSError:  # another rank was first, or the candidate went away
            if is_complete(final_dir):
                return True
            continue
        _fsync_dir(final_dir.parent)
        return True
    return False


# --- reading files a checkpoint holds, without unpickling code ------------------------------------------

def _damaged(path: str | Path, reason: str) -> CheckpointError:
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
    import pickle

    import torch

    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} is missing; the checkpoint is incomplete: load an "
                              "earlier one, or save again")
    try:
        with torch.serialization.safe_globals(numpy_rng_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)  # tensors saved on a GPU too
    except pickle.UnpicklingError as err:
        if "weights_only" in str(err) or "Unsupported" in str(err) or "GLOBAL" in str(err):
            raise _refused(path, err) from None
        raise _damaged(path, _first_line(err)) from None
    except (RuntimeError, EOFError, ValueError, OSError, KeyError, IndexError) as err:
        raise _damaged(path, _first_line(err)) from None


def save_file(obj: Any, path: str | Path, what: str) -> None:
    """``torch.save``, refusing (``CheckpointError``) what ``load_file`` could not read back safely."""
    import io
    import pickle

    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
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
    import importlib
    import pickle

    class MetadataUnpickler(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            if (module, name) in _DCP_METADATA_NAMES:
                return super().find_class(module, name)
            if module in _DCP_METADATA_MODULES:
                obj = getattr(importlib.import_module(module), name, None)
                if isinstance(obj, type) and obj.__module__ == module:
                    return obj
            if module == "torch":
                import torch

                if isinstance(getattr(torch, name, None), torch.dtype):
                    return getattr(torch, name)
            raise pickle.UnpicklingError(f"global '{module}.{name}' is not allowed in checkpoint metadata")

    return MetadataUnpickler


def _dcp_reader(checkpoint_id: str):
    """DCP's ``FileSystemReader`` with metadata read through ``_metadata_unpickler`` and every shard file
    checked against the byte ranges the metadata gives it (a truncated shard is named before reading)."""
    import pickle

    from torch.distributed.checkpoint import FileSystemReader

    class SafeFileSystemReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any):
            rank = kwargs.get("rank")
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
                raise _damaged(path, _first_line(err)) from None
            except (EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as err:
                raise _damaged(path, _first_line(err)) from None
            _check_shards(Path(checkpoint_id), metadata)
            from torch.distributed.checkpoint.metadata import StorageMeta

            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
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
            raise _damaged(directory / ".metadata", f"it names a file outside the checkpoint: {name!r}")
        try:
            size = path.stat().st_size
        except OSError:
            raise CheckpointError(f"checkpoint file {path} is missing; the checkpoint is incomplete: load an "
                                  "earlier one, or save again") from None
        if size < end:
            raise _damaged(path, f"truncated: {size} bytes, its index needs {end}")


def _dcp_planner():
    """DCP's ``DefaultLoadPlanner``, reading non-tensor values with ``weights_only=True`` (it uses False)."""
    import io

    import torch
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

    try:
        dcp.load(state, storage_reader=_dcp_reader(checkpoint_id), planner=_dcp_planner(), no_dist=no_dist)
    except CheckpointException as err:  # a BaseException: it escapes `except Exception`
        causes = [exc for exc, _ in err.failures.values()]
        own = next((exc for exc in causes if isinstance(exc, CheckpointError)), None)
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
