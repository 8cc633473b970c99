"""YAML loading that remembers where every value came from.

``yaml.safe_load`` loses line numbers and silently keeps the last of duplicate
keys. This loader composes the node graph with the safe loader, rejects
duplicate keys, and returns the data with a map from each value's path to its
1-based line, so validation errors can name ``file:line``.

Before composing, one pass over the parser's events (iterative, unlike the
recursive composer) enforces :class:`~semgov.limits.Limits` ``max_yaml_depth``
and ``max_yaml_nodes``, counting each alias as the nodes it stands for: a
billion-laughs document is refused at the alias that crosses the limit, without
ever being expanded.
"""

from __future__ import annotations

from typing import Any

import yaml

from semgov.errors import PolicyError
from semgov.limits import Limits, resolve

Path_ = tuple[str | int, ...]

# The defaults (settings: SEMGOV_MAX_YAML_NODES, SEMGOV_MAX_YAML_DEPTH).
MAX_NODES = Limits().max_yaml_nodes
MAX_DEPTH = Limits().max_yaml_depth


def _depth_error(limits: Limits, source: str, line: int | None) -> PolicyError:
    return PolicyError(
        f"YAML nested deeper than {limits.max_yaml_depth} levels ({limits.describe('max_yaml_depth')})",
        source=source,
        line=line,
    )


def _event_line(ev: yaml.Event) -> int | None:
    mark = ev.start_mark
    return mark.line + 1 if mark is not None else None


def _check_shape(text: str, source: str, limits: Limits) -> None:
    """Refuse nesting over ``max_yaml_depth`` and (alias-expanded) node counts over ``max_yaml_nodes``."""
    sizes: dict[str, int] = {}  # anchor -> nodes it expands to
    stack: list[list[Any]] = []  # open collections: [nodes so far, anchor]
    total = 0
    for ev in yaml.parse(text, Loader=yaml.SafeLoader):
        n = 0
        if isinstance(ev, yaml.ScalarEvent):
            n = 1
            if ev.anchor is not None:
                sizes[ev.anchor] = 1
        elif isinstance(ev, yaml.AliasEvent):
            n = sizes.get(ev.anchor or "", 1)  # an unknown anchor is the composer's error
        elif isinstance(ev, yaml.CollectionStartEvent):
            total += 1
            stack.append([1, ev.anchor])
            if len(stack) > limits.max_yaml_depth:
                raise _depth_error(limits, source, _event_line(ev))
        elif isinstance(ev, yaml.CollectionEndEvent):
            size, anchor = stack.pop()
            if anchor is not None:
                sizes[anchor] = size
            if stack:
                stack[-1][0] += size
        if n:
            total += n
            if stack:
                stack[-1][0] += n
        if total > limits.max_yaml_nodes:
            raise PolicyError(
                f"YAML document too large: more than {limits.max_yaml_nodes} nodes, each alias counted "
                f"as the nodes it stands for (an alias bomb?) ({limits.describe('max_yaml_nodes')})",
                source=source,
                line=_event_line(ev),
            )


def load_yaml_with_lines(
    text: str, source: str, *, limits: Limits | None = None
) -> tuple[Any, dict[Path_, int]]:
    """Parse ``text``; return ``(data, lines)`` where ``lines[path]`` is the value's line.

    ``limits`` (default: :meth:`Limits.from_env`) bounds nesting and alias expansion.
    """
    lim = resolve(limits)
    try:
        _check_shape(text, source, lim)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(e, "problem", None) or str(e)
        raise PolicyError(f"YAML syntax error: {problem}", source=source, line=line) from e
    except RecursionError as e:  # NOTE: unreachable under the depth ceiling; never a traceback
        raise _depth_error(lim, source, 1) from e
    lines: dict[Path_, int] = {}
    if root is None:
        return None, lines
    constructor = yaml.SafeLoader("")
    count = 0

    def construct(node: yaml.Node) -> Any:
        try:
            return constructor.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, TypeError, OverflowError) as e:
            # NOTE: unknown tags (!!python/..., !custom) and impossible !!timestamp values
            problem = getattr(e, "problem", None) or str(e)
            raise PolicyError(
                f"YAML value cannot be read: {problem}", source=source, line=node.start_mark.line + 1
            ) from e

    def build(node: yaml.Node, path: Path_, depth: int) -> Any:
        nonlocal count
        count += 1
        # NOTE: a backstop: _check_shape already refused anything this could catch.
        if count > lim.max_yaml_nodes or depth > lim.max_yaml_depth:
            raise PolicyError(
                f"YAML document too large or too deeply nested ({lim.describe('max_yaml_nodes')}; "
                f"{lim.describe('max_yaml_depth')})",
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
                key = construct(knode)
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
        return construct(node)

    try:
        return build(root, (), 0), lines
    except RecursionError as e:
        raise _depth_error(lim, source, 1) from e


def line_for(lines: dict[Path_, int], loc: tuple[str | int, ...]) -> int | None:
    """Line of the deepest known prefix of ``loc`` (a pydantic error location)."""
    for n in range(len(loc), -1, -1):
        hit = lines.get(tuple(loc[:n]))
        if hit is not None:
            return hit
    return None
