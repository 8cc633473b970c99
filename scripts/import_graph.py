"""Print, for each folder under engine_hooks/, what it imports from the other folders.

    python scripts/import_graph.py            # one table: folder -> the folders it imports
    python scripts/import_graph.py --modules  # also the module-level edges behind each cell

Imports are read with ``ast`` from the source (function-body imports included, nothing is
imported), so the answer needs neither SGLang nor vLLM installed. ``engine_hooks.core`` is the
governed-serving core; ``engine_hooks.sglang`` and ``engine_hooks.vllm`` are the engine adapters
and must not import each other (``tests/test_layout.py`` holds them to it). Exit status 1 when
they do.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ADAPTERS = ("sglang", "vllm")


def module_name(path: Path) -> str:
    """``engine_hooks/core/rope.py`` -> ``engine_hooks.core.rope`` (a package: its folder)."""
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module) for every import in the file, function bodies included; a
    relative import is resolved against the file's package."""
    me = module_name(path).split(".")
    package = me if path.name == "__init__.py" else me[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            yield node.lineno, base


def folder_of(module: str) -> str | None:
    """The engine_hooks folder a module belongs to (``engine_hooks.core.x`` -> ``core``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "engine_hooks" else None


def folder_edges() -> dict[str, dict[str, set[tuple[str, str]]]]:
    """folder -> imported folder -> {(importing module, imported module)}, across folders only."""
    edges: dict[str, dict[str, set[tuple[str, str]]]] = {}
    for path in sorted((ROOT / "engine_hooks").rglob("*.py")):
        me = module_name(path)
        mine = folder_of(me)
        if mine is None:
            continue
        edges.setdefault(mine, {})
        for _, mod in imports(path):
            theirs = folder_of(mod)
            if theirs is not None and theirs != mine:
                edges[mine].setdefault(theirs, set()).add((me, mod))
    return edges


def adapter_crossings(edges: dict[str, dict[str, set[tuple[str, str]]]]) -> list[str]:
    """Every import from one engine adapter into the other (there should be none)."""
    return [
        f"{src} -> {dst}"
        for a in ADAPTERS
        for b in ADAPTERS
        if a != b
        for src, dst in sorted(edges.get(a, {}).get(b, ()))
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", action="store_true", help="list the module edges behind each cell")
    args = parser.parse_args(argv)
    edges = folder_edges()
    width = max(len(f) for f in edges)
    for folder in sorted(edges):
        used = sorted(edges[folder])
        print(f"engine_hooks/{folder:<{width}}  imports: {', '.join(used) if used else '(none)'}")
        if args.modules:
            for other in used:
                for src, dst in sorted(edges[folder][other]):
                    print(f"    {src} -> {dst}")
    crossings = adapter_crossings(edges)
    for line in crossings:
        print(f"ADAPTER CROSSING: {line}", file=sys.stderr)
    return 1 if crossings else 0


if __name__ == "__main__":
    sys.exit(main())
