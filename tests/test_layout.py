"""The import contract: the core imports no adapter, adapters use only the public API, no cycles."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ADAPTERS = ("engine_hooks", "semgov.cli")


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path: Path) -> Iterator[tuple[int, str, str | None]]:
    """(line, module, imported name or None) for every import in the file, function bodies included."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, None
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            for a in node.names:
                yield node.lineno, node.module, a.name


def _files(*roots: str) -> list[Path]:
    return sorted(p for r in roots for p in (ROOT / r).rglob("*.py") if ".venv" not in p.parts)


def _resolve(module: str, name: str | None, known: set[str]) -> str:
    """The semgov module an import loads: ``from a import b`` is module ``a.b`` when that exists."""
    if name is not None and f"{module}.{name}" in known:
        return f"{module}.{name}"
    return module


def test_core_imports_no_adapter() -> None:
    """Nothing in semgov/ outside semgov/cli imports engine_hooks, the CLI, benchmarks, examples or tests."""
    bad = [
        f"{p.relative_to(ROOT)}:{line}: {mod}"
        for p in _files("semgov")
        if not _module(p).startswith("semgov.cli")
        for line, mod, _ in _imports(p)
        if mod.split(".")[0] in ("engine_hooks", "benchmarks", "examples", "tests")
        or mod.startswith("semgov.cli")
    ]
    assert bad == []


def test_adapters_import_only_the_public_api() -> None:
    """engine_hooks/ and semgov/cli import no semgov._internal module and no _private semgov module."""
    bad = []
    for p in _files("engine_hooks", "semgov/cli"):
        for line, mod, name in _imports(p):
            if not mod.startswith("semgov"):
                continue
            private = any(part.startswith("_") for part in mod.split("."))
            if private or (name is not None and name.startswith("_") and mod.startswith("semgov.")):
                bad.append(f"{p.relative_to(ROOT)}:{line}: {mod} {name or ''}".rstrip())
    assert bad == []


def test_semgov_modules_import_each_other_without_cycles() -> None:
    """The semgov import graph, lazy imports in function bodies included, has no cycle."""
    files = _files("semgov")
    known = {_module(p) for p in files}
    graph: dict[str, set[str]] = {}
    for p in files:
        me = _module(p)
        deps = {_resolve(m, n, known) for _, m, n in _imports(p) if m.startswith("semgov")}
        graph[me] = {d for d in deps if d in known and d != me and not me.startswith(d + ".")}
    # NOTE: a package's __init__ importing its own submodules is no cycle worth reporting; a module
    # importing its package (``from semgov import x``) is, when that package imports it back.
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d) :] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert cycles == []
