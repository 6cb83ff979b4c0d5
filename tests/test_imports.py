"""The import structure of src/blockscaled, read with ``ast`` (no import, no GPU).

* The module-level imports between blockscaled modules form no cycle. An import of
  ``blockscaled.a.b`` also runs ``blockscaled/a/__init__.py`` first, so it counts as an edge to
  the package ``blockscaled.a`` too, unless that package encloses the importing module (then it
  is already being imported). Imports under ``if TYPE_CHECKING:`` never run and do not count.
* An import of a blockscaled module inside a function (run at call time) is kept only where a
  module-level one would close an import cycle, or where it loads an optional part lazily (the
  Gluon kernels, which fail to import on some triton versions): each says why in a comment
  containing "cycle" or "optional", on the import's lines or the line above.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "blockscaled"
REASON_WORDS = ("cycle", "optional")


def module_files(src: Path = SRC) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the package (``__init__`` -> the package)."""
    out = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def resolve_from(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute module named by ``from <'.' * level><target> import ...`` written in ``module``
    (``is_package``: ``module`` is a package's ``__init__.py``, whose own package is itself)."""
    if not level:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level - 1 > len(base) - 1:
        raise ValueError(f"{module}: relative import beyond the top-level package")
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def imports_of(module: str, is_package: bool, source: str, modules) -> list[tuple[ast.stmt, bool, list[str]]]:
    """(import statement, at module level, [blockscaled modules it imports]) for every import of a
    module in ``modules``. Module level: run at import time (the module body, class bodies and the
    branches of module-level ``if`` / ``try`` / ``with``); inside a function: not."""
    out = []

    def targets(node) -> list[str]:
        found = []
        if isinstance(node, ast.Import):
            found = [alias.name for alias in node.names]
        else:
            base = resolve_from(module, is_package, node.level, node.module)
            for alias in node.names:  # `from pkg import sub` imports the submodule pkg.sub
                sub = f"{base}.{alias.name}"
                found.append(sub if sub in modules else base)
        return sorted({t for t in found if t in modules})

    def visit(node, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and top and _is_type_checking(child.test):
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), top)
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, False)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found = targets(child)
                if found:
                    out.append((child, top, found))
            visit(child, top)

    visit(ast.parse(source), True)
    return out


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def edges_for(module: str, targets) -> set[str]:
    """What importing ``targets`` from ``module`` runs: each target and its enclosing packages,
    less those that enclose ``module`` (already being imported when ``module`` runs)."""
    own = set(_ancestors(module))
    out = set()
    for t in targets:
        out.add(t)
        out.update(a for a in _ancestors(t) if a not in own)
    out.discard(module)
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def dfs(u: str) -> list[str] | None:
        state[u] = 1
        path.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == 1:
                return path[path.index(v):] + [v]
            if v not in state:
                cycle = dfs(v)
                if cycle:
                    return cycle
        path.pop()
        state[u] = 2
        return None

    for u in sorted(graph):
        if u not in state:
            cycle = dfs(u)
            if cycle:
                return cycle
    return None


def _comments(source: str) -> dict[int, str]:
    """Line number -> the comment on that line."""
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string
    return out


def scan(src: Path = SRC):
    """(module-level import graph, [(module, line, targets, reason comment or '')] of local imports)."""
    files = module_files(src)
    graph: dict[str, set[str]] = {m: set() for m in files}
    local = []
    for module, path in files.items():
        source = path.read_text()
        comments = _comments(source)
        for node, top, found in imports_of(module, path.name == "__init__.py", source, files):
            if top:
                graph[module] |= edges_for(module, found)
                continue
            lines = range(node.lineno - 1, (node.end_lineno or node.lineno) + 1)
            reason = " ".join(comments[i] for i in lines if i in comments)
            local.append((module, node.lineno, found, reason))
    return graph, local


@pytest.fixture(scope="module")
def scanned():
    return scan()


def test_resolve_relative_imports():
    assert resolve_from("blockscaled.ops.grouped", False, 2, "reference") == "blockscaled.reference"
    assert resolve_from("blockscaled.ops.grouped", False, 1, None) == "blockscaled.ops"
    assert resolve_from("blockscaled.ops", True, 1, "gemm") == "blockscaled.ops.gemm"
    assert resolve_from("blockscaled", True, 1, "config") == "blockscaled.config"
    assert resolve_from("blockscaled.plan.device", False, 0, "torch") == "torch"
    with pytest.raises(ValueError):
        resolve_from("blockscaled.tensor", False, 3, "x")


def test_imports_of_classifies_and_resolves():
    modules = {"blockscaled", "blockscaled.ops", "blockscaled.ops.gemm", "blockscaled.ops.quantize",
               "blockscaled.reference", "blockscaled.reference.gemm", "blockscaled.tensor"}
    source = (
        "from typing import TYPE_CHECKING\n"
        "import torch\n"
        "from ..reference import gemm as ref\n"
        "from ..tensor import ScaledTensor\n"
        "from . import quantize, missing\n"
        "if TYPE_CHECKING:\n"
        "    from .gemm import X\n"
        "try:\n"
        "    import blockscaled.reference\n"
        "except ImportError:\n"
        "    pass\n"
        "def f():\n"
        "    from .gemm import gemm  # import cycle\n"
        "class C:\n"
        "    def m(self):\n"
        "        from blockscaled import tensor\n"
    )
    got = [(n.lineno, top, t) for n, top, t in imports_of("blockscaled.ops.linear", False, source, modules)]
    assert got == [
        (3, True, ["blockscaled.reference.gemm"]),
        (4, True, ["blockscaled.tensor"]),
        (5, True, ["blockscaled.ops", "blockscaled.ops.quantize"]),
        (9, True, ["blockscaled.reference"]),
        (13, False, ["blockscaled.ops.gemm"]),
        (16, False, ["blockscaled.tensor"]),
    ]
    assert edges_for("blockscaled.ops.linear", ["blockscaled.reference.gemm", "blockscaled.ops.quantize"]) == {
        "blockscaled.reference.gemm", "blockscaled.reference", "blockscaled.ops.quantize"}


def test_find_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_scan_reads_the_package(scanned):
    graph, _ = scanned
    assert len(graph) > 40
    assert "blockscaled.ops.gemm" in graph["blockscaled"]
    assert {"blockscaled.tensor", "blockscaled.reference.gemm", "blockscaled.reference"} <= graph["blockscaled.ops.linear"]


def test_no_module_level_import_cycle(scanned):
    graph, _ = scanned
    cycle = find_cycle(graph)
    assert cycle is None, "module-level import cycle: " + " -> ".join(cycle)


def test_local_imports_say_why(scanned):
    _, local = scanned
    assert local, "expected the known cycle-breaking local imports (e.g. in tensor.py)"
    unexplained = [f"{m}:{line} imports {', '.join(t)}" for m, line, t, reason in local
                   if not any(w in reason.lower() for w in REASON_WORDS)]
    assert not unexplained, (
        "function-local imports of blockscaled modules need a comment with 'cycle' or 'optional' "
        "(on the import or the line above); else move them to the module's top:\n  " + "\n  ".join(unexplained))
