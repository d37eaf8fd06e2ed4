"""Whether the torch the ranks import can use the selected accelerators, read without importing torch.

    unusable_note("nvidia", count=2)    # 'this Python's torch (2.13.0+cpu) was built without CUDA: ...' or None

A CPU-only torch on a GPU box sees no GPU whatever ``CUDA_VISIBLE_DEVICES`` says: a job planned on GPUs ran
as CPU processes with gloo without a word, the dry run said "backend nccl ... as cuda:0", and ``convoy test``
passed on gloo. The installed torch's ``torch/version.py`` says what it was built for (``cuda``, ``hip``,
``xpu``); it is read as text, so the launcher stays torch-free. ``None`` where torch is absent or the vendor's
build cannot be told from it (the note is then not given).
"""

from __future__ import annotations

import functools
import importlib.util
import re
from pathlib import Path

__all__ = ["torch_build", "unusable_note"]

#: vendor -> (torch/version.py's field that is None without it, what a user calls that build)
_BUILDS = {"nvidia": ("cuda", "CUDA"), "amd": ("hip", "ROCm"), "intel": ("xpu", "XPU")}


@functools.cache
def torch_build() -> dict[str, str | None] | None:
    """``{"__version__": "2.13.0+cpu", "cuda": None, "hip": None, "xpu": None}`` of the importable torch, or None."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        text = (Path(list(spec.submodule_search_locations)[0]) / "version.py").read_text(encoding="utf-8")
    except OSError:
        return None
    fields: dict[str, str | None] = {}
    for name in ("__version__", *(field for field, _ in _BUILDS.values())):
        match = re.search(rf"^{re.escape(name)}\s*(?::[^=]*)?=\s*(.+)$", text, re.M)
        if match is not None:
            value = match.group(1).strip()
            fields[name] = None if value == "None" else value.strip("'\"")
    return fields if "__version__" in fields else None


def unusable_note(vendor: str, *, count: int) -> str | None:
    """The one line to say when this Python's torch cannot use ``count`` devices of ``vendor``, else None."""
    build = torch_build()
    if vendor not in _BUILDS or build is None:
        return None
    field, name = _BUILDS[vendor]
    if field not in build or build[field] is not None:
        return None
    devices = "the GPU" if count == 1 else f"the {count} GPUs"
    return (f"this Python's torch ({build['__version__']}) was built without {name}: it cannot use {devices}, so "
            f"the ranks run as CPU processes with gloo and {devices} {'is' if count == 1 else 'are'} not used or "
            f"tested; install a {name} build of torch (https://pytorch.org/get-started/locally/) to use "
            f"{'it' if count == 1 else 'them'}")
