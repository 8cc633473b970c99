"""YAML loading that remembers where every value came from.

``yaml.safe_load`` loses line numbers and silently keeps the last of duplicate
keys. This loader composes the node graph with the safe loader, rejects
duplicate keys, and returns the data with a map from each value's path to its
1-based line, so validation errors can name ``file:line``.
"""

from __future__ import annotations

from typing import Any

import yaml

from semgov.errors import PolicyError

Path_ = tuple[str | int, ...]

# NOTE: bounds against YAML bombs: aliases may not expand without limit.
MAX_NODES = 100_000
MAX_DEPTH = 64


def load_yaml_with_lines(text: str, source: str) -> tuple[Any, dict[Path_, int]]:
    """Parse ``text``; return ``(data, lines)`` where ``lines[path]`` is the value's line."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(e, "problem", None) or str(e)
        raise PolicyError(f"YAML syntax error: {problem}", source=source, line=line) from e
    lines: dict[Path_, int] = {}
    if root is None:
        return None, lines
    constructor = yaml.SafeLoader("")
    count = 0

    def build(node: yaml.Node, path: Path_, depth: int) -> Any:
        nonlocal count
        count += 1
        if count > MAX_NODES or depth > MAX_DEPTH:
            raise PolicyError(
                "document too large or too deeply nested (alias expansion?)",
                source=source,
                line=node.start_mark.line + 1,
            )
        lines[path] = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            for knode, vnode in node.value:
                if knode.tag == "tag:yaml.org,2002:merge":
                    raise PolicyError(
                        "merge keys (<<) are not supported", source=source, line=knode.start_mark.line + 1
                    )
                key = constructor.construct_object(knode, deep=True)
                if not isinstance(key, str):
                    raise PolicyError(
                        f"mapping keys must be strings, got {key!r}",
                        source=source,
                        line=knode.start_mark.line + 1,
                    )
                if key in out:
                    raise PolicyError(f"duplicate key {key!r}", source=source, line=knode.start_mark.line + 1)
                out[key] = build(vnode, (*path, key), depth + 1)
            return out
        if isinstance(node, yaml.SequenceNode):
            return [build(v, (*path, i), depth + 1) for i, v in enumerate(node.value)]
        return constructor.construct_object(node, deep=True)

    return build(root, (), 0), lines


def line_for(lines: dict[Path_, int], loc: tuple[str | int, ...]) -> int | None:
    """Line of the deepest known prefix of ``loc`` (a pydantic error location)."""
    for n in range(len(loc), -1, -1):
        hit = lines.get(tuple(loc[:n]))
        if hit is not None:
            return hit
    return None
