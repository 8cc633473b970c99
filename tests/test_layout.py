"""The import contract: the core imports no adapter, adapters use only the public API, no cycles;
the engine adapters build on the governed-serving core (engine_hooks/core) and never on each other."""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
ADAPTERS = ("engine_hooks", "semgov.cli")


def _module(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _by_name(node: ast.AST) -> ast.Call | None:
    """``importlib.import_module(...)`` as a call node, else None."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    f = node.func
    if isinstance(f, ast.Attribute) and f.attr == "import_module":
        return node
    return None


def _imports(path: Path) -> Iterator[tuple[int, str, str | None]]:
    """(line, module, imported name or None) for every import in the file, function bodies
    included, and every module imported by name (``importlib.import_module("a.b")``)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        call = _by_name(node)
        if (
            call is not None
            and isinstance(call.args[0], ast.Constant)
            and isinstance(call.args[0].value, str)
        ):
            yield node.lineno, call.args[0].value, None
        elif isinstance(node, ast.Import):
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


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every cycle a depth-first walk of ``graph`` meets (each as the path that closes it)."""
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
    return cycles


def test_modules_import_each_other_without_cycles() -> None:
    """The semgov and engine_hooks import graph, lazy imports in function bodies included, has no cycle."""
    files = _files("semgov", "engine_hooks")
    known = {_module(p) for p in files}
    graph: dict[str, set[str]] = {}
    for p in files:
        me = _module(p)
        deps = {_resolve(m, n, known) for _, m, n in _imports(p) if m.startswith(("semgov", "engine_hooks"))}
        graph[me] = {d for d in deps if d in known and d != me and not me.startswith(d + ".")}
    # NOTE: a package's __init__ importing its own submodules is no cycle worth reporting; a module
    # importing its package (``from semgov import x``) is, when that package imports it back.
    assert _cycles(graph) == []


# The governed-serving core may use torch only for the RoPE rotation math and the embedding
# provider's model; never an engine.
_CORE_TORCH = ("engine_hooks.core.rotation", "engine_hooks.core.providers.embedding")


def test_serving_core_imports_no_engine() -> None:
    """engine_hooks/core imports neither sglang nor vllm nor an engine adapter (function bodies
    included), and torch only where its math needs it."""
    bad = []
    for p in _files("engine_hooks/core"):
        for line, mod, _ in _imports(p):
            top = mod.split(".")[0]
            adapter = mod.startswith(("engine_hooks.sglang", "engine_hooks.vllm", "engine_hooks.reference"))
            torch = top == "torch" and _module(p) not in _CORE_TORCH
            if top in ("sglang", "vllm") or adapter or torch:
                bad.append(f"{p.relative_to(ROOT)}:{line}: {mod}")
    assert bad == []


def _import_graph_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_engine_adapters_never_import_each_other() -> None:
    """engine_hooks/sglang and engine_hooks/vllm share only the core: the script anyone can run
    (scripts/import_graph.py) finds no import from one into the other, and the core imports no folder."""
    script = _import_graph_script()
    edges = script.folder_edges()
    assert {"core", "sglang", "vllm"} <= set(edges)
    assert script.adapter_crossings(edges) == []
    assert edges["core"] == {}
    assert script.main([]) == 0


# NOTE: the layout's one sanctioned upward edge: the CLI (an adapter of semgov) loads the reference
# engine by name, only when `semgov bench` / `semgov calibrate` runs, because engine_hooks ships only
# in a source checkout (`pip install -e .`) and the CLI must start without it. These edges are in the
# import graph above (cycles are checked through them) and nothing else imports an adapter by name.
_BY_NAME = {
    ("semgov/cli/bench.py", "engine_hooks.reference.bench"),
    ("semgov/cli/calibrate.py", "engine_hooks.reference.calibrate"),
}
# Plugin points: a module named by a table in the file or by a setting, not by a literal.
_PLUGIN_POINTS = {
    "semgov/__init__.py",  # the lazy public API (a table of semgov modules)
    "semgov/cli/main.py",  # the subcommands (a table of semgov.cli modules)
    "engine_hooks/core/providers/__init__.py",  # SEMGOV_*_PROVIDER = module:attr
    "engine_hooks/core/donors.py",  # SEMGOV_DETOKENIZER = module:attr
}


def test_imports_by_name_are_the_declared_ones() -> None:
    """Every importlib.import_module in semgov/ and engine_hooks/ is a declared edge or plugin point."""
    literal, dynamic = set(), set()
    for p in _files("semgov", "engine_hooks"):
        rel = str(p.relative_to(ROOT))
        for node in ast.walk(ast.parse(p.read_text(), rel)):
            call = _by_name(node)
            if call is None:
                continue
            arg = call.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                literal.add((rel, arg.value))
            else:
                dynamic.add(rel)
    assert literal == _BY_NAME
    assert dynamic == _PLUGIN_POINTS


MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 600
LONG_MODULE_NOTE = "# NOTE: long module:"


def test_no_function_is_longer_than_80_lines() -> None:
    """No function or method in semgov/ or engine_hooks/ spans more than 80 lines (decorators aside)."""
    long = []
    for p in _files("semgov", "engine_hooks"):
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long.append(f"{p.relative_to(ROOT)}:{node.lineno}: {node.name} is {n} lines")
    assert long == []


def test_long_modules_say_why() -> None:
    """A module of semgov/ or engine_hooks/ over 600 lines carries a '# NOTE: long module: <why>' line."""
    bad = []
    for p in _files("semgov", "engine_hooks"):
        lines = p.read_text().splitlines()
        if len(lines) > MAX_MODULE_LINES:
            why = [ln for ln in lines if ln.lstrip().startswith(LONG_MODULE_NOTE)]
            if not why or len(why[0].split(LONG_MODULE_NOTE, 1)[1].strip()) < 20:
                bad.append(f"{p.relative_to(ROOT)}: {len(lines)} lines, no '{LONG_MODULE_NOTE} <why>'")
    assert bad == []
