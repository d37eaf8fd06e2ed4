"""What the ``convoy`` command's own process does to start quickly (``convoy.cli.main.entry_point``), never a
program that calls convoy's functions.

    from convoy.cli.startup import inspect_when_used, dataclass_methods_kept
    inspect_when_used()              # inspect (ast, dis, tokenize) imported at its first use, not by dataclasses
    dataclass_methods_kept("plan")   # convoy's records' generated methods compiled once, then read like a .pyc

``dataclasses`` writes the source of each record's ``__init__``, ``__repr__``, ``__eq__``, ``__hash__`` (and a
frozen record's ``__setattr__``/``__delattr__``) and compiles it on every start: about two thirds of importing the
planner (26 records) and ~5 ms of ``convoy select``'s start. The same source always compiles to the same code,
so the command keeps the code objects of convoy's own records (the source text is the key: a changed record is
compiled again) in a file beside the package's ``.pyc`` files, ``convoy/__pycache__``, one per command and Python
version, and runs that code as ``dataclasses`` would have run the source (``exec`` of the compiled source, with no
``__future__`` flags, as ``dataclasses`` compiles it). Where that folder is not writable nothing is kept. Every
other class (torch's, a user's) is made as before.
"""

from __future__ import annotations

import os
import sys
import types

TYPE_CHECKING = False  # typing is not imported at run time: `convoy select` starts without it
if TYPE_CHECKING:
    from typing import Any

__all__ = ["inspect_when_used", "dataclass_methods_kept"]

#: where the compiled methods are kept: the package's own ``__pycache__``, as trusted as its ``.pyc`` files
CACHE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "__pycache__")


class _ImportedWhenUsed(types.ModuleType):
    """A module's stand-in in ``sys.modules``: the module itself is imported at the first attribute asked of it,
    and its names are copied into the stand-in (the module's own functions, classes and globals, so that who
    imported the stand-in uses them as they are)."""

    def __getattr__(self, name: str) -> Any:
        import importlib

        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        module = importlib.import_module(self.__name__)
        vars(self).update(vars(module))
        return getattr(module, name)


def inspect_when_used() -> None:
    """``inspect`` imported when it is first used, not when ``dataclasses`` imports it: it imports ast, dis and
    tokenize (~6 ms of the ~40 a device command takes), and dataclasses uses it for one thing only, the
    docstring of a class that has none (every record of convoy's has one). A command that uses it (torch does)
    imports it then."""
    if "inspect" not in sys.modules:
        sys.modules["inspect"] = _ImportedWhenUsed("inspect")


def _cache_file(command: str) -> str:
    name = command if command.isidentifier() else "other"
    return os.path.join(CACHE_DIR, f"dataclass-methods.{name}.{sys.implementation.cache_tag}.marshal")


def _read(path: str) -> dict[str, types.CodeType]:
    """The kept code by source text; empty when there is none, or it was written by another Python."""
    import marshal

    try:
        with open(path, "rb") as handle:
            version, codes = marshal.load(handle)
    except (OSError, EOFError, ValueError, TypeError):
        return {}
    if version != sys.hexversion or not isinstance(codes, dict):
        return {}
    return {text: code for text, code in codes.items() if type(text) is str and type(code) is types.CodeType}


def _write(path: str, codes: dict[str, types.CodeType]) -> None:
    """``codes`` written atomically (a temporary file, then a rename); nothing where the folder is not writable."""
    import marshal

    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as handle:
            marshal.dump((sys.hexversion, codes), handle)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def dataclass_methods_kept(command: str) -> None:
    """convoy's records' generated methods compiled once and kept for ``command``'s next start (the module's
    docstring says how); the file is written again, as the process exits, when a record's source changed."""
    import dataclasses

    if "exec" in vars(dataclasses) or not os.path.isdir(CACHE_DIR) or not os.access(CACHE_DIR, os.W_OK):
        return
    path = _cache_file(command)
    kept = _read(path)
    used: dict[str, types.CodeType] = {}
    compiled = []

    def exec_(source: Any, globals: Any = None, locals: Any = None, /) -> None:  # noqa: A002 -- exec's own names
        if type(source) is str and type(globals) is dict and str(globals.get("__name__", "")).startswith("convoy."):
            code = kept.get(source)
            if code is None:
                code = compile(source, "<string>", "exec", dont_inherit=True)  # dataclasses' own flags: none
                compiled.append(source)
            used[source] = code
            source = code
        exec(source, globals, locals)  # noqa: S102 -- what dataclasses runs, as it would

    def keep() -> None:
        if compiled:  # what this start used, and what the command's other starts did (a file of stale code is
            codes = {**kept, **used}  # dropped when it outgrows this start's use four times)
            _write(path, codes if len(codes) <= 4 * len(used) else used)

    import atexit

    dataclasses.exec = exec_  # type: ignore[attr-defined]  # the builtin dataclasses calls, for this process
    atexit.register(keep)
