"""Where the suite starts ranks, or runs a reference outside convoy, read from its source (``ast``).

    python -m tests.launch_sites            # every site: file:line, what it is, what it states
    python -m tests.launch_sites --tests    # the tests that start ranks through convoy: the simulated GPU pass

What a CPU box cannot show and a one-GPU box does (the H100 run of 2026-11-25 failed on both):

* "2 ranks" means 2 GPUs on a GPU box: a test that means CPU processes must ask for them. A site that starts
  ranks through convoy states its devices: ``convoy launch`` (and ``convoy test``) with ``--devices`` (or a
  helper's ``*cpu`` that adds ``--devices 0``; ``tests/distributed.py::run_script`` does),
  ``convoy.launch(fn, devices=...)``, ``run_selfcheck(devices=...)``; a dry run, an in-process
  ``main(["launch", ...]) == 2`` and a call in ``pytest.raises(ConfigError)`` (bad input, refused before anything
  starts) start none;
* a reference run outside convoy (torchrun, or a script run by a plain ``python``) sees every GPU unless it
  hides them: it passes ``env=cpu_env(...)`` (``tests/distributed.py``) or sets ``CUDA_VISIBLE_DEVICES`` itself.

``tests/gpu/`` is not read: its tests mean the GPU and run only on one. ``test_suite_hygiene.py`` asserts that
every site states what it needs; a site that means to see the accelerators goes in ``SEES_ACCELERATORS`` with
the reason.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent

#: "path::function" of reference runs that mean to see the accelerators, and why (none yet)
SEES_ACCELERATORS: dict[str, str] = {}

_SUBPROCESS_CALLS = {"run", "Popen", "check_output", "check_call", "call", "start"}
_TORCHRUN = {"torch.distributed.run", "torchrun"}
_MAIN_LAUNCH_IN_CODE = re.compile(r"main\(\[\s*['\"](launch|test)['\"]")
_STARTS_RANKS = ("launch", "test")  # convoy test starts ranks as convoy launch does


@dataclass(frozen=True)
class Site:
    path: str
    """Relative to the repository root."""
    line: int
    function: str
    """The enclosing function ("<module>" at the top level)."""
    kind: str
    """"convoy launch", "convoy test", "main(launch)", "main(test)", "convoy.launch(fn)", "run_selfcheck()",
    "torchrun", "python script"."""
    states: str | None
    """How it states its devices (or hides the accelerators); None when it does not."""

    script_launches: bool = False
    """A script run by a plain python that itself starts ranks (``notebook_launcher``, ``convoy.launch``)."""

    @property
    def starts_ranks(self) -> bool:
        return self.kind not in ("torchrun", "python script") or self.script_launches

    def __str__(self) -> str:
        return f"{self.path}:{self.line} ({self.function}): {self.kind}: {self.states or 'STATES NO DEVICES'}"


def suite_files() -> list[Path]:
    """Every Python file of the suite (test modules, helpers, scripts) but the GPU tests, this one and the
    hygiene tests (their sites are examples)."""
    return sorted(p for p in TESTS.rglob("*.py") if "gpu" not in p.relative_to(TESTS).parts[:1]
                  and p.name not in ("launch_sites.py", "test_suite_hygiene.py"))


def sites(paths: list[Path] | None = None) -> list[Site]:
    found: list[Site] = []
    for path in suite_files() if paths is None else paths:
        found += _Scan(path).run()
    return found


def _text(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _is_sys_executable(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "executable" and \
        isinstance(node.value, ast.Name) and node.value.id == "sys"


def _names_devices(strings: list[str]) -> bool:
    return any(s == "--devices" or s.startswith("--devices=") for s in strings)


#: what a call refuses bad input with, before it selects a device or starts a process
_BAD_INPUT = {"ConfigError", "DeviceSpecError", "TypeError"}


def _expects_bad_input(node: ast.AST) -> bool:
    """``node`` (a ``with`` block, or a test) expects ``pytest.raises`` of bad-input errors only."""
    raised = [call.args[0] for call in ast.walk(node) if isinstance(call, ast.Call) and call.args
              and isinstance(call.func, ast.Attribute) and call.func.attr == "raises"]
    if isinstance(node, ast.With):
        raised = [item.context_expr.args[0] for item in node.items if isinstance(item.context_expr, ast.Call)
                  and isinstance(item.context_expr.func, ast.Attribute) and item.context_expr.func.attr == "raises"
                  and item.context_expr.args]
    names = {n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else "" for n in raised}
    return bool(names) and names <= _BAD_INPUT


def _hides(source: str) -> bool:
    return "cpu_env(" in source or "CUDA_VISIBLE_DEVICES" in source


class _Scan:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.rel = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
        self.source = path.read_text()
        self.tree = ast.parse(self.source)
        self.module_assigns = self._assigns(self.tree.body)
        self.found: list[Site] = []

    def run(self) -> list[Site]:
        self._visit(self.tree, "<module>", {})
        return self.found

    def _assigns(self, body: list[ast.stmt]) -> dict[str, str]:
        """name -> source of what it is bound to, for every plain assignment in ``body`` and below it (not in
        nested functions)."""
        bound: dict[str, str] = {}
        for node in body:
            for sub in ast.walk(node) if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else ():
                if isinstance(sub, ast.Assign):
                    for target in sub.targets:
                        if isinstance(target, ast.Name):
                            bound[target.id] = bound.get(target.id, "") + (ast.get_source_segment(self.source, sub)
                                                                           or "")
                elif isinstance(sub, ast.Subscript) and isinstance(sub.value, ast.Name) and \
                        isinstance(sub.ctx, ast.Store):
                    bound[sub.value.id] = bound.get(sub.value.id, "") + (_text(sub.slice) or "")
        return bound

    def _visit(self, node: ast.AST, function: str, bound: dict[str, str], refused: bool = False) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = {**bound, **self._assigns(child.body)}
                inner["<source>"] = ast.get_source_segment(self.source, child) or ""
                for decorator in child.decorator_list:  # parametrize(lambda: convoy.launch(5), ...) -> raises
                    self._visit(decorator, child.name, inner, _expects_bad_input(child))
                self._visit(ast.Module(body=child.body, type_ignores=[]), child.name, inner)
                continue
            inside = refused or (isinstance(child, ast.With) and _expects_bad_input(child))
            self._look(child, function, bound, refused)
            self._visit(child, function, bound, inside)

    def _site(self, node: ast.AST, function: str, kind: str, states: str | None) -> None:
        self.found.append(Site(self.rel, node.lineno, function, kind, states))

    def _look(self, node: ast.AST, function: str, bound: dict[str, str], refused: bool) -> None:
        if isinstance(node, (ast.List, ast.Tuple)):
            strings = [_text(e) or "" for e in node.elts]
            for a, b in zip(strings, strings[1:]):
                if a == "convoy" and b in _STARTS_RANKS:
                    self._site(node, function, f"convoy {b}", self._launch_states(node, bound))
        elif isinstance(node, ast.Call):
            self._call(node, function, bound, refused)
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Call):  # main([...]) == 2
            refused = [isinstance(op, ast.Eq) and isinstance(c, ast.Constant) and c.value == 2
                       for op, c in zip(node.ops, node.comparators)]
            node.left.refused = any(refused)  # type: ignore[attr-defined]
        elif "import " in (_text(node) or ""):  # code run by python -c
            code = _text(node) or ""
            if _MAIN_LAUNCH_IN_CODE.search(code):
                self._site(node, function, "main(launch)", "--devices" if re.search(r"['\"]--devices['\"]", code)
                           else "--dry-run" if "--dry-run" in code else None)
            if re.search(r"convoy\.launch\(", code):
                self._site(node, function, "convoy.launch(fn)", "devices=" if "devices=" in code else None)

    def _launch_states(self, node: ast.List | ast.Tuple, bound: dict[str, str]) -> str | None:
        strings = [_text(e) or "" for e in node.elts]
        if _names_devices(strings):
            return "--devices"
        for flag in ("--dry-run", "--help"):  # start nothing
            if flag in strings:
                return flag
        for element in node.elts:  # a helper's `cpu = () if "--devices" in argv else ("--devices", "0")`
            if isinstance(element, ast.Starred) and isinstance(element.value, ast.Name) and \
                    "--devices" in bound.get(element.value.id, ""):
                return f"--devices unless given (*{element.value.id})"
        return None

    def _call(self, node: ast.Call, function: str, bound: dict[str, str], refused: bool) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        first = node.args[0] if node.args else None
        if name == "main" and isinstance(first, ast.List) and first.elts and _text(first.elts[0]) in _STARTS_RANKS:
            states = self._launch_states(first, bound) or (
                "exit 2: refused before anything starts" if getattr(node, "refused", False) else None)
            self._site(node, function, f"main({_text(first.elts[0])})", states)
        elif (isinstance(func, ast.Attribute) and func.attr == "launch" and isinstance(func.value, ast.Name)
              and func.value.id == "convoy") or name == "run_selfcheck":
            devices = next((k for k in node.keywords if k.arg == "devices"), None)
            self._site(node, function, "convoy.launch(fn)" if name == "launch" else "run_selfcheck()",
                       f"devices={ast.get_source_segment(self.source, devices.value)}" if devices else
                       "refused as bad input before anything starts" if refused else None)
        elif name in _SUBPROCESS_CALLS and isinstance(first, ast.List):
            self._reference(node, first, function, bound)

    def _reference(self, node: ast.Call, argv: ast.List, function: str, bound: dict[str, str]) -> None:
        strings = [_text(e) or "" for e in argv.elts]
        if any(a == "-m" and b == "convoy" for a, b in zip(strings, strings[1:])):
            return  # convoy itself: its launches are the sites above
        # torchrun in the argv, or in a list this function splices into it (`[*prefix, ...]`)
        torchrun = bool(_TORCHRUN & set(strings)) or (
            any(isinstance(e, ast.Starred) for e in argv.elts)
            and any(f'"{t}"' in bound.get("<source>", "") for t in _TORCHRUN))
        script = len(argv.elts) > 1 and _is_sys_executable(argv.elts[0]) and not strings[1].startswith("-")
        if not (torchrun or script):
            return
        env = next((k.value for k in node.keywords if k.arg == "env"), None)
        states = None
        if env is not None:
            source = ast.get_source_segment(self.source, env) or ""
            names = {n.id for n in ast.walk(env) if isinstance(n, ast.Name)}
            if _hides(source) or any(_hides(bound.get(n, "") + self.module_assigns.get(n, "")) for n in names):
                states = "hides the accelerators (env)"
        key = f"{self.rel}::{function}"
        if states is None and key in SEES_ACCELERATORS:
            states = f"sees the accelerators: {SEES_ACCELERATORS[key]}"
        scripts = {Path(v).name for n in ast.walk(argv) if (v := _text(n)) and v.endswith(".py")}
        launches = any(re.search(r"notebook_launcher\(|convoy\.launch\(", p.read_text())
                       for p in TESTS.rglob("*.py") if p.name in scripts)
        self.found.append(Site(self.rel, node.lineno, function, "torchrun" if torchrun else "python script", states,
                               script_launches=launches))


def launching_tests(paths: list[Path] | None = None) -> list[str]:
    """Node ids (``path::test``) of the tests that start processes through convoy: a test with a site that
    starts ranks, or that calls (in its module, through helpers, lambdas or fixtures) a function with one. The
    simulated one-GPU pass runs them: on a GPU box such a site could fail with the plan's refusal or a rank on a
    missing GPU. Tests that start ranks only through ``run_script`` are not among them: it states its devices."""
    found = sites(paths)
    selected: list[str] = []
    for rel in sorted({s.path for s in found if s.starts_ranks}):
        path = REPO / rel if not Path(rel).is_absolute() else Path(rel)
        if not path.name.startswith("test_"):
            continue
        tree = ast.parse(path.read_text())
        uses = {node.name: {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {a.arg for a in node.args.args}
                for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
        reach = {s.function for s in found if s.path == rel and s.starts_ranks}
        grew = True
        while grew:
            grew = False
            for function, names in uses.items():
                if function not in reach and names & reach:
                    reach.add(function)
                    grew = True
        selected += [f"{rel}::{function}" for function in uses if function in reach and function.startswith("test_")]
    return selected


if __name__ == "__main__":
    if sys.argv[1:] == ["--tests"]:
        print("\n".join(launching_tests()))
    else:
        print("\n".join(str(s) for s in sites()))
