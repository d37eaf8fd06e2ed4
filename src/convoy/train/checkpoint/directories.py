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
back. The files inside are read and written by ``files.py``; nothing here uses torch.
Needs a file system that every rank of the job sees (one machine, or a shared mount).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from convoy.errors import CheckpointError
from convoy.reading import CHECKPOINT_RECORD, load_json

__all__ = ["MARKER", "begin_checkpoint", "abandon_checkpoint", "commit_checkpoint", "is_complete",
           "latest_checkpoint", "next_checkpoint_dir", "prune_checkpoints", "read_meta", "recover_checkpoint"]

MARKER = "convoy_checkpoint.json"
_NAME = re.compile(r"^checkpoint_(\d+)$")
_STAGING_PREFIX = ".staging-"


def begin_checkpoint(final_dir: str | Path) -> Path:
    """Create and return an empty staging directory next to ``final_dir`` (same file system).

    ``CheckpointError`` when ``final_dir`` cannot be written, or holds something the commit would replace and
    that is not a checkpoint (a file, a directory of the user's): the commit swaps the whole directory."""
    final_dir = Path(final_dir)
    try:
        final_dir.parent.mkdir(parents=True, exist_ok=True)
        recover_checkpoint(final_dir)  # a save killed mid-commit: put the checkpoint back before anything else
        _refuse_to_replace(final_dir)
        staging = final_dir.parent / f"{_STAGING_PREFIX}{final_dir.name}-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
    except OSError as err:
        raise CheckpointError(f"cannot write a checkpoint to {final_dir}: {err.strerror or err}; give a directory "
                              "this process can create and write") from None
    return staging


def _refuse_to_replace(final_dir: Path) -> None:
    if final_dir.is_symlink():
        raise CheckpointError(f"{final_dir} is a link; save_state() would replace the link, not what it points to: "
                              "give the directory itself, or a new path")
    if final_dir.exists() and not final_dir.is_dir():
        raise CheckpointError(f"{final_dir} is a file, not a checkpoint directory; save_state() writes a directory "
                              "of its own there: give a new path")
    if final_dir.is_dir() and not is_complete(final_dir) and any(final_dir.iterdir()):
        raise CheckpointError(f"{final_dir} holds files that are not a convoy checkpoint, and save_state() replaces "
                              "the whole directory it is given; give a new or empty directory (e.g. "
                              f"{final_dir / 'state'}), or one an earlier save_state() wrote")


def abandon_checkpoint(staging: str | Path) -> None:
    """Remove the staging directory of a save that failed (not one already marked complete: a commit killed
    between its renames is put back by ``recover_checkpoint``)."""
    staging = Path(staging)
    if staging.name.startswith(_STAGING_PREFIX) and not is_complete(staging):
        shutil.rmtree(staging, ignore_errors=True)


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
    try:
        meta = load_json(path / MARKER, CHECKPOINT_RECORD)  # bounded (convoy.reading)
    except (OSError, CheckpointError) as err:
        raise CheckpointError(f"{err if isinstance(err, CheckpointError) else f'{path / MARKER} cannot be read'}; "
                              "the checkpoint is damaged: load an earlier one") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path / MARKER} is not a convoy checkpoint's record; load an earlier checkpoint")
    return meta


def _numbered(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _NAME.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(root: str | Path, *, accept: Callable[[Path], bool] = is_complete) -> Path | None:
    """The complete ``checkpoint_<n>`` directory under ``root`` with the largest ``n``, or None. ``accept``
    says which directories count (Accelerate's checkpoints have no marker: ``accelerate.py`` passes its test)."""
    for _, path in reversed(_numbered(Path(root))):
        if accept(path):
            return path
    return None


def next_checkpoint_dir(root: str | Path) -> Path:
    """``root/checkpoint_<n>`` with ``n`` one past the largest existing number (complete or not)."""
    numbered = _numbered(Path(root))
    n = numbered[-1][0] + 1 if numbered else 0
    return Path(root) / f"checkpoint_{n}"


def prune_checkpoints(root: str | Path, total_limit: int | None) -> list[Path]:
    """Delete the oldest numbered checkpoints beyond ``total_limit``, and leftover staging directories.

    Returns the deleted paths. A numbered directory without convoy's marker is not convoy's (a commit is one
    rename of a complete directory): Accelerate's ``checkpoint_<n>``, which ``load_state()`` resumes from, or
    the user's; it is left alone and not counted.
    """
    root = Path(root)
    removed: list[Path] = []
    if root.is_dir():
        for child in root.iterdir():
            if child.name.startswith(_STAGING_PREFIX):
                shutil.rmtree(child, ignore_errors=True)
                removed.append(child)
    complete = [p for _, p in _numbered(root) if is_complete(p)]
    if total_limit is not None and total_limit > 0 and len(complete) > total_limit:
        for path in complete[: len(complete) - total_limit]:
            # renamed out of the way first (one atomic step), then deleted: a process killed while deleting leaves a
            # staging directory the next prune removes, never a checkpoint_<n> without its marker, which no later
            # prune would count or remove
            trash = path.parent / f"{_STAGING_PREFIX}pruned-{path.name}-{uuid.uuid4().hex[:8]}"
            try:
                os.replace(path, trash)
            except OSError:  # gone already (another process pruned it)
                continue
            shutil.rmtree(trash, ignore_errors=True)
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
            meta = load_json(child / MARKER, CHECKPOINT_RECORD)
        except (OSError, CheckpointError):
            continue
        if not isinstance(meta, dict):
            continue
        if meta.get("name", final_dir.name) != final_dir.name:  # e.g. ".staging-old-x-..." of a save to "old-x"
            continue
        saved = meta.get("saved_at", 0.0)
        if isinstance(saved, bool) or not isinstance(saved, (int, float)):
            continue
        found.append((float(saved), child))
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
