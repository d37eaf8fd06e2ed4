"""How a launched Python worker ends: with its program's status, after every exit handler and the finalizers of
the program's objects, without the interpreter's C-level teardown when the program used ``torch.distributed``.

    end_without_teardown()      # in convoy.launch.record, before the program starts
    program_ended(status)       # once the program's status is known

Why: gloo's worker threads can outlive ``destroy_process_group()`` when something (a DDP module, a device
mesh, a global) still holds the group. A work item a gloo thread finishes drops the last reference to its
tensors, which takes the GIL; once the interpreter is finalizing, a thread that takes the GIL is ended with
``pthread_exit``, and inside gloo's C++ loop that is ``std::terminate``: a process that finished all its work
aborts with SIGABRT and ``terminate called without an active exception`` (pytorch/pytorch#179291; the thread's
stack: ``ProcessGroupGloo::runLoop`` -> ``~AsyncWork`` -> ``decref_pyobject`` -> ``take_gil`` ->
``PyThread_exit_thread``). Before finalization starts, the same thread simply waits for the GIL.

So the interpreter's finalization of the program's objects is done here, in the last exit handler, while the
interpreter still runs normally: the program's namespaces (its ``__main__``, the modules of its own code and the
modules it made) are cleared as the interpreter clears them, and the garbage is collected, so every ``__del__``
and ``weakref.finalize`` of those objects runs (an unclosed gzip or zip file is completed, a temporary file
removed, a tqdm bar closed). Then the process ends with the program's status. What is skipped is what comes
after: the clearing of installed packages' modules (torch's, whose process groups would wait for their peers
there) and C++ static destructors, which the operating system does at exit anyway. A script launched by
convoy ends plainly, with no ``os._exit`` of its own.
"""

from __future__ import annotations

import _io
import atexit
import gc
import os
import site
import sys
import sysconfig
from types import ModuleType

__all__ = ["end_without_teardown", "exit_status", "program_ended", "program_modules"]

_status: int | None = None  # the program's exit status, once it is known


def end_without_teardown() -> None:
    """Register the handler that ends the process, so that it runs after every other exit handler.

    Exit handlers run last-registered first, so this must be called before the program starts. Does nothing
    when a handler is registered already: an earlier call's (then in place), or another, which would run after
    this one and never run (the interpreter's teardown is then kept).
    """
    if atexit._ncallbacks() == 0:
        atexit.register(_leave)


def program_ended(status: int | None) -> None:
    """Record the program's exit status (None: not known, so the interpreter ends as usual)."""
    global _status
    _status = status


def exit_status(code: object) -> int | None:
    """The status Python exits with for ``SystemExit(code)``: 0 for None, the number for an int (a bool too),
    1 for anything else (Python prints it); None for a number the operating system cannot take."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code if -(2**31) <= code < 2**31 else None
    return 1


def program_modules(modules: dict[str, ModuleType] | None = None) -> list[ModuleType]:
    """The modules that hold the program's objects, in the order the interpreter's teardown clears them
    (the reverse of their import): its ``__main__`` (under every name it has: torch's import of
    multiprocessing keeps it as ``__mp_main__`` too), the modules of its own code, and modules it made; not
    the standard library, installed packages (torch among them) or convoy."""
    modules = dict(sys.modules if modules is None else modules)
    installed = _installed_roots()
    found: dict[int, ModuleType] = {}
    for name, module in reversed(modules.items()):
        if isinstance(module, ModuleType) and id(module) not in found and _is_programs(
                name, module, modules, installed):
            found[id(module)] = module
    return list(found.values())


def _leave() -> None:
    if _status is None or "torch.distributed" not in sys.modules:
        return
    _finalize_program()
    _flush_open_files()
    os._exit(_status)


def _finalize_program() -> None:
    """What the interpreter's teardown does to the program's objects: each namespace cleared (names starting
    with an underscore first, each set to None, as ``_PyModule_ClearDict`` does), then the garbage collected,
    so every finalizer of an object only the program held runs, with the interpreter still whole."""
    for module in program_modules():
        namespace = vars(module)
        for first in (True, False):
            for name in [n for n in namespace if n.startswith("_") == first and n != "__builtins__"]:
                try:
                    namespace[name] = None
                except Exception:  # a value whose finalizer fails: the interpreter ignores it too
                    pass
    while gc.collect():
        pass


def _installed_roots() -> tuple[str, ...]:
    """The folders of the standard library and of installed packages."""
    paths = {sysconfig.get_path(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths.update(site.getsitepackages() if hasattr(site, "getsitepackages") else ())
    paths.add(site.getusersitepackages())
    return tuple(os.path.join(os.path.realpath(p), "") for p in paths if p)


def _is_programs(name: str, module: ModuleType, modules: dict[str, ModuleType], installed: tuple[str, ...]) -> bool:
    spec = getattr(module, "__spec__", None)
    root_name = (getattr(spec, "name", None) or name).partition(".")[0]  # `python -m pkg.mod` runs as __main__
    if root_name == "convoy" or root_name in sys.builtin_module_names:
        return False
    if getattr(module, "__name__", None) == "__main__":
        return True
    root = modules.get(root_name, module)
    if getattr(getattr(root, "__spec__", None), "origin", None) in ("built-in", "frozen"):
        return False
    files = [f for f in [getattr(root, "__file__", None), *(getattr(root, "__path__", None) or ())]
             if isinstance(f, str)]
    if not files:  # a module made at run time: the program's unless a package's own part of it
        return root is module
    return not any(os.path.realpath(f).startswith(installed) for f in files)


def _flush_open_files() -> None:
    """What the interpreter's teardown would write: the standard streams, then every open file's buffer."""
    for stream in (sys.stdout, sys.stderr):
        _flush(stream)
    for obj in gc.get_objects():
        # every file object's C base; a plain subclass check (io.IOBase's is an ABC's, three times slower), and
        # not isinstance, which reads __class__, which a proxy (a deprecated torch name) answers with a warning
        if issubclass(type(obj), _io._IOBase):
            _flush(obj)


def _flush(stream: object) -> None:
    try:
        stream.flush()  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):  # None, a closed file, a reader gone
        pass
