"""Each module's imports point one way: no import cycle inside src/convoy (issue 26, part 4).

The graph is read from the source with ``ast``, so it holds every import a reader sees: module-level ones, the
lazy ones inside functions (a lazy import that closes a loop is still a loop to follow) and those under
``if TYPE_CHECKING:``. ``from . import x`` is resolved to the submodule ``x`` when there is one. Two graphs
are checked:

- modules: an edge points at the module named (the packages above it are not added, or every module would
  depend on ``convoy/__init__.py``);
- packages: the same edges seen from the folder both ends share, so that ``strategies/ddp.py`` importing
  ``checkpoint/optimizer_state.py`` while ``checkpoint/state.py`` imports ``strategies/base.py`` is the loop
  ``train.strategies -> train.checkpoint -> train.strategies`` it is to a reader (and to Python, which runs
  ``checkpoint/__init__.py`` on the way). A package's ``__init__`` re-exporting its own modules is not an
  edge there.

    .venv/bin/python -m pytest -q tests/test_import_graph.py
"""

from __future__ import annotations

import ast
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent / "src"

def module_files(root: Path = SOURCE) -> dict[str, Path]:
    """``convoy.a.b`` -> its file, for every module and package under ``root/convoy``."""
    modules = {}
    for path in sorted((root / "convoy").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _from_module(node: ast.ImportFrom, name: str, is_package: bool) -> str:
    """The absolute module an ``ImportFrom`` in module ``name`` reads from (``from ..a import b`` -> ``x.a``)."""
    if not node.level:
        return node.module or ""
    base = name.split(".") if is_package else name.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The convoy modules that module ``name`` imports, anywhere in its file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = _from_module(node, name, path.name == "__init__.py")
            # `from pkg import sub` imports the module pkg.sub; `from mod import name` imports mod
            targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else module
                       for alias in node.names]
        else:
            continue
        found.update(target for target in targets if target in modules and target != name)
    return found


def import_graph(root: Path = SOURCE) -> dict[str, set[str]]:
    """Module -> the modules it imports."""
    modules = module_files(root)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Each edge ``a -> b`` seen from the deepest package holding both: the child of that package on ``a``'s
    side (a module or a subpackage) -> the one on ``b``'s side. An edge from or to that package itself (its
    ``__init__``) is left out."""
    units: dict[str, set[str]] = {}
    for source, targets in graph.items():
        for target in targets:
            a, b = source.split("."), target.split(".")
            shared = 0
            while shared < min(len(a), len(b)) and a[shared] == b[shared]:
                shared += 1
            if shared < len(a) and shared < len(b):
                units.setdefault(".".join(a[:shared + 1]), set()).add(".".join(b[:shared + 1]))
    return units


def strongly_connected(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The groups of nodes that reach each other (Tarjan's algorithm), those of more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[frozenset[str]] = []

    def visit(node: str) -> None:  # recursion depth is at most the number of modules (about a hundred)
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = {node}
            while stack[-1] != node:
                on_stack.discard(stack[-1])
                group.add(stack.pop())
            on_stack.discard(stack.pop())
            if len(group) > 1:
                groups.append(frozenset(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def shortest_loop(start: str, group: frozenset[str], graph: dict[str, set[str]]) -> list[str]:
    """The shortest path ``start -> ... -> start`` inside ``group`` (breadth first)."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph.get(node, set()) & group):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return path[::-1] + [start]
                if nxt not in previous:
                    previous[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"{start} is in a strongly connected group but on no loop")


def describe(group: frozenset[str], graph: dict[str, set[str]]) -> str:
    """Every shortest loop through a member of ``group``, one per line (each loop once)."""
    loops = []
    for start in sorted(group):
        loop = shortest_loop(start, group, graph)
        if set(loop) not in [set(seen) for seen in loops]:
            loops.append(loop)
    return "\n".join("  " + " -> ".join(loop) for loop in loops)


def _new_cycles(graph: dict[str, set[str]]) -> list[str]:
    return [describe(group, graph) for group in strongly_connected(graph)]


def test_no_module_imports_a_module_that_imports_it_back():
    found = _new_cycles(import_graph())
    assert not found, ("import cycles between modules of src/convoy (give what both sides use a lower home "
                       "that both import):\n" + "\n".join(found))


def test_no_package_imports_a_package_that_imports_it_back():
    found = _new_cycles(package_graph(import_graph()))
    assert not found, ("import cycles between the folders of src/convoy (a module of each imports the other "
                       "folder):\n" + "\n".join(found))


def _write(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / "convoy" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_lazy_relative_and_type_checking_imports_close_a_cycle(tmp_path):
    # a: `from . import b`; b: a lazy import of c in a function; c: `from .a import thing` under TYPE_CHECKING
    root = _write(tmp_path, {"__init__.py": "", "pkg/__init__.py": "",
                             "pkg/a.py": "from . import b\nthing = 1\n",
                             "pkg/b.py": "def f():\n    from convoy.pkg import c\n    return c\n",
                             "pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                         "    from .a import thing\n",
                             "pkg/d.py": "from ..pkg.a import thing\nimport os, convoy.pkg\n"})
    graph = import_graph(root)
    assert graph["convoy.pkg.a"] == {"convoy.pkg.b"} and graph["convoy.pkg.b"] == {"convoy.pkg.c"}
    assert graph["convoy.pkg.d"] == {"convoy.pkg.a", "convoy.pkg"}
    groups = strongly_connected(graph)
    assert groups == [frozenset({"convoy.pkg.a", "convoy.pkg.b", "convoy.pkg.c"})]
    assert describe(groups[0], graph) == "  convoy.pkg.a -> convoy.pkg.b -> convoy.pkg.c -> convoy.pkg.a"


def test_two_folders_that_import_each_other_are_a_cycle(tmp_path):
    # the checkpoint back-and-forth as it was: no module loop, but each folder imports the other
    root = _write(tmp_path, {"__init__.py": "", "strategies/__init__.py": "", "checkpoint/__init__.py": "",
                             "strategies/base.py": "class Strategy: ...\n",
                             "strategies/ddp.py": "from convoy.checkpoint.optimizer_state import names\n",
                             "checkpoint/optimizer_state.py": "names = []\n",
                             "checkpoint/state.py": "from convoy.strategies.base import Strategy\n"})
    graph = import_graph(root)
    assert strongly_connected(graph) == []
    units = package_graph(graph)
    assert units == {"convoy.strategies": {"convoy.checkpoint"}, "convoy.checkpoint": {"convoy.strategies"}}
    assert strongly_connected(units) == [frozenset({"convoy.strategies", "convoy.checkpoint"})]


def test_imports_that_point_down_make_no_cycle(tmp_path):
    root = _write(tmp_path, {"__init__.py": "", "low.py": "x = 1\n", "mid.py": "from convoy.low import x\n",
                             "top.py": "import convoy.mid\nfrom convoy import low\n",
                             "pkg/__init__.py": "from convoy.pkg.inner import y\n", "pkg/inner.py": "y = 2\n",
                             "pkg/user.py": "from convoy.pkg import y\nfrom convoy.top import low\n"})
    graph = import_graph(root)
    assert graph["convoy.top"] == {"convoy.mid", "convoy.low"} and graph["convoy.pkg.user"] == {"convoy.pkg",
                                                                                                "convoy.top"}
    assert strongly_connected(graph) == [] and strongly_connected(package_graph(graph)) == []
