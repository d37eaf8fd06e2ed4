"""Run one of Accelerate's shipped test scripts against convoy (or Accelerate), reporting every check.

    convoy launch --nproc-per-node 2 tests/train/conformance/runner.py test_ops.py
    torchrun --standalone --nproc-per-node 2 tests/train/conformance/runner.py test_ops.py --library accelerate

The script is read from the installed ``accelerate`` package and only its top-level import statements are
rewritten: Accelerate's test fixtures (``RegressionModel``, ``RegressionDataset``, ``assert_exception``, ...)
still come from ``accelerate.test_utils``; every name of the library itself (``Accelerator``,
``PartialState``, ``gather``, ``DataLoaderConfiguration``, ...) comes from top-level ``convoy``. A name
convoy lacks becomes a stand-in that raises when used, so only the checks that use it fail. Accelerate's
own library classes and operations are made to raise when called, so a check cannot pass on Accelerate.

Each check function that ``main()`` calls is wrapped; every rank prints one line per check call:
``@@check <label> rank=<r> PASS|FAIL <reason>``. A failing check does not stop the script.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import os
import sys
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Accelerate's test fixtures: data sets, models and assertion helpers, not the library under test.
FIXTURES = {"RegressionDataset", "RegressionModel", "assert_exception", "are_the_same_tensors", "torch_device",
            "require_bnb"}
# Accelerate's probes of the environment (is a package installed): answered truthfully by this harness.
PROBES = {"is_bf16_available": lambda: False, "is_fp16_available": lambda: False,
          "is_cuda_available": lambda: _torch().cuda.is_available(), "is_hpu_available": lambda: False,
          "is_mps_available": lambda: False, "is_torch_xla_available": lambda *a, **k: False,
          "is_xpu_available": lambda: False, "is_rocm_available": lambda: False,
          "is_bnb_available": lambda: importlib.util.find_spec("bitsandbytes") is not None,
          "is_datasets_available": lambda: importlib.util.find_spec("datasets") is not None,
          "is_pytest_available": lambda: importlib.util.find_spec("pytest") is not None}
# Third-party packages the GPU-only checks of test_metrics.py use; absent here, only their logging calls run.
OPTIONAL_MODULES = {"datasets", "evaluate", "transformers"}


def _torch() -> Any:
    import torch

    return torch


class Missing:
    """Stands for a library name convoy does not have: raises as soon as it is used."""

    def __init__(self, name: str) -> None:
        self._name = name

    def _fail(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"convoy has no {self._name!r} "
                                  f"(the conformance harness found no convoy.{self._name})")

    __call__ = _fail

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        self._fail()

    def __mro_entries__(self, bases: tuple) -> tuple:
        self._fail()


class AbsentModule(types.ModuleType):
    """An optional package that is not installed: attribute chains resolve, calls do nothing."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return AbsentModule(f"{self.__name__}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


def library_name(name: str) -> Any:
    import convoy

    return getattr(convoy, name) if name in convoy.__all__ else Missing(name)


def optional_module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return AbsentModule(name)


def _replacement(node: ast.stmt) -> str | None:
    """The statement that replaces a top-level import from accelerate (or an optional package), else None."""
    if isinstance(node, ast.Import):
        names = [a for a in node.names if a.name.split(".")[0] in OPTIONAL_MODULES]
        if not names:
            return None
        return "; ".join(f"{a.asname or a.name} = _cf.optional_module({a.name!r})" for a in node.names)
    if not isinstance(node, ast.ImportFrom) or node.module is None:
        return None
    root = node.module.split(".")[0]
    if root in OPTIONAL_MODULES:
        return "; ".join(f"{a.asname or a.name} = getattr(_cf.optional_module({node.module!r}), {a.name!r})"
                         for a in node.names)
    if root != "accelerate":
        return None
    parts = []
    for alias in node.names:
        target = alias.asname or alias.name
        if alias.name in FIXTURES:
            parts.append(f"from accelerate.test_utils import {alias.name} as {target}")
        elif alias.name in PROBES:
            parts.append(f"{target} = _cf.PROBES[{alias.name!r}]")
        else:
            parts.append(f"{target} = _cf.library_name({alias.name!r})")
    return "; ".join(parts)


def rewrite(source: str, *, library: str = "convoy") -> str:
    """``source`` with its top-level imports of the library switched to convoy (and absent optional packages
    replaced by stand-ins); line numbers are kept. ``library="accelerate"`` replaces only the latter."""
    lines = source.splitlines()
    for node in reversed(ast.parse(source).body):
        new = _replacement(node)
        if new is None or (library == "accelerate" and "_cf.optional_module" not in new):
            continue
        span = node.end_lineno - node.lineno + 1
        lines[node.lineno - 1:node.end_lineno] = [new] + [""] * (span - 1)
    return "import tests.train.conformance.runner as _cf\n" + "\n".join(lines) + "\n"


def poison_accelerate() -> None:
    """Make Accelerate's own library entry points raise, and point its fixtures at convoy."""
    import accelerate
    import accelerate.state
    import accelerate.test_utils.testing as testing
    import accelerate.utils.operations as operations

    def refuse(what: str) -> Callable[..., Any]:
        def raiser(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError(f"conformance: accelerate's {what} was used; the library under test is convoy")
        return raiser

    for cls in (accelerate.Accelerator, accelerate.state.PartialState, accelerate.state.AcceleratorState,
                accelerate.state.GradientState):
        cls.__init__ = refuse(cls.__name__)
    for name in ("gather", "gather_object", "broadcast", "broadcast_object_list", "reduce", "pad_across_processes",
                 "send_to_device", "copy_tensor_to_devices"):
        setattr(operations, name, refuse(name))
    # are_the_same_tensors is a fixture whose body calls the library: it calls convoy's instead.
    testing.AcceleratorState = library_name("AcceleratorState")
    testing.gather = library_name("gather")


def wrap_checks(module: types.ModuleType, names: list[str], rank: Callable[[], int],
                skip: frozenset[str] = frozenset()) -> None:
    """Replace each check function by one that reports PASS/FAIL per call and never raises (SKIP for the
    names in ``skip``: a measurement of a library that hangs in one)."""
    counts: dict[str, int] = {}
    depth = [0]

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def checked(*args: Any, **kwargs: Any) -> Any:
            if depth[0]:  # a check called by another check is part of it
                return fn(*args, **kwargs)
            counts[name] = counts.get(name, 0) + 1
            label = f"{name}#{counts[name]}"
            if name in skip:
                print(f"@@check {label} rank={rank()} SKIP asked on the command line", flush=True)
                return None
            depth[0] += 1
            try:
                fn(*args, **kwargs)
                status, reason = "PASS", ""
            except Exception as exc:  # noqa: BLE001 - every failure is reported, and the next check runs
                status = "FAIL"
                reason = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:400]
                traceback.print_exc()
            finally:
                depth[0] -= 1
            print(f"@@check {label} rank={rank()} {status} {reason}", flush=True)
        return checked

    for name in names:
        setattr(module, name, wrap(name, getattr(module, name)))


def check_names(tree: ast.Module) -> list[str]:
    """The module-level functions that ``main()`` calls: the script's checks."""
    defs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    called = {c.func.id for c in ast.walk(main) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
    return sorted(n for n in called & defs if n.startswith(("test_", "check_")) or n.endswith("_check"))


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else int(os.environ.get("RANK", "0"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("script", help="path under accelerate/test_utils/scripts/, e.g. external_deps/test_metrics.py")
    parser.add_argument("--library", choices=("convoy", "accelerate"), default="convoy")
    parser.add_argument("--skip", action="append", default=[], help="a check function not to run (measurements)")
    parser.add_argument("--extra", action="append", default=[],
                        help="a call of a check main() makes only on GPUs, run after main(), e.g. "
                             "'test_gradient_accumulation(True, False, True)'")
    args = parser.parse_args()
    import accelerate.test_utils

    path = Path(accelerate.test_utils.__file__).parent / "scripts" / args.script
    source = path.read_text()
    tree = ast.parse(source)
    if args.library == "convoy":
        poison_accelerate()
    source = rewrite(source, library=args.library)
    module = types.ModuleType(f"conformance_{path.stem}")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module
    exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102 - the script under test
    wrap_checks(module, check_names(tree), _rank, frozenset(args.skip))
    module.main()
    for call in args.extra:  # the wrapped check, called as main() calls it on GPUs: reported as name#n
        eval(call, module.__dict__)  # noqa: S307 - a check call given on the command line
    print(f"@@done rank={_rank()}", flush=True)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
    main()
