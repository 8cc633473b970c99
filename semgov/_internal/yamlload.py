"""YAML loading that remembers where every value came from.

``yaml.safe_load`` loses line numbers and silently keeps the last of duplicate
keys. This loader composes the node graph with the safe loader, rejects
duplicate keys, and returns the data with a map from each value's path to its
1-based line, so validation errors can name ``file:line``.

Before composing, one pass over the parser's events (iterative, unlike the
recursive composer) enforces :class:`~semgov.intake.limits.Limits` ``max_yaml_depth``
and ``max_yaml_nodes``, counting each alias as the nodes it stands for: a
billion-laughs document is refused at the alias that crosses the limit, without
ever being expanded.

Policies and case files are plain data, read alike by every YAML and JSON reader:
the same pass refuses every explicit tag (``!!python/object``, ``!!set``, ``!!str``,
``!custom``; on a scalar, mapping or sequence alike), plain scalars that are numbers
to JSON and YAML 1.2 but strings to YAML 1.1 (``1e5``, ``1.5e10``), and strings
with lone UTF-16 surrogates. Every error, including the reader's (a control
character), names ``file:line``.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from semgov.errors import PolicyError
from semgov.intake.limits import Limits, resolve

Path_ = tuple[str | int, ...]


def _depth_error(limits: Limits, source: str, line: int | None) -> PolicyError:
    return PolicyError(
        f"YAML nested deeper than {limits.max_yaml_depth} levels ({limits.describe('max_yaml_depth')})",
        source=source,
        line=line,
    )


def _event_line(ev: yaml.Event) -> int:
    mark = ev.start_mark
    return mark.line + 1 if mark is not None else 1  # NOTE: the parser marks every event


_YAML_TAG = "tag:yaml.org,2002:"
# JSON's number grammar (also YAML 1.2's): PyYAML (YAML 1.1) reads some of these as strings.
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_RESOLVER = yaml.resolver.Resolver()
_SURROGATE = re.compile("[\ud800-\udfff]")


def _show_tag(tag: str) -> str:
    return "!!" + tag[len(_YAML_TAG) :] if tag.startswith(_YAML_TAG) else tag


def _yaml11_tag(plain: str) -> str:
    """The tag PyYAML (YAML 1.1) resolves an untagged plain scalar to."""
    tag: str = _RESOLVER.resolve(yaml.ScalarNode, plain, (True, False))  # type: ignore[no-untyped-call]
    return tag


def _check_event(ev: yaml.Event, source: str) -> None:
    """Refuse explicit tags and plain scalars that JSON and YAML 1.1 read differently."""
    tag = getattr(ev, "tag", None)
    if tag is not None:
        raise PolicyError(
            f"YAML tags are not allowed (found {_show_tag(tag)}): policies and case files are plain data",
            source=source,
            line=_event_line(ev),
        )
    if (
        isinstance(ev, yaml.ScalarEvent)
        and ev.style is None
        and _JSON_NUMBER.fullmatch(ev.value)
        and _yaml11_tag(ev.value) == _YAML_TAG + "str"
    ):
        raise PolicyError(
            f"ambiguous value {ev.value}: a number in JSON but a string in YAML 1.1; "
            "quote it for a string, or write the number with a '.' and a signed exponent (e.g. 1.0e+5)",
            source=source,
            line=_event_line(ev),
        )


def _line_at(text: str, position: int) -> int:
    """1-based line of ``text[position]``, counting line breaks as the YAML reader does."""
    head = text[:position]
    breaks = sum(head.count(c) for c in "\n\x85\u2028\u2029") + head.count("\r") - head.count("\r\n")
    return breaks + 1


def _error_line(e: yaml.YAMLError, text: str) -> int:
    """The line a PyYAML error is about: its problem mark, its context mark, or its reader position."""
    for attr in ("problem_mark", "context_mark"):
        mark = getattr(e, attr, None)
        if mark is not None:
            return int(mark.line) + 1
    position = getattr(e, "position", None)  # ReaderError: a character the reader refuses
    if isinstance(position, int):
        return _line_at(text, position)
    return 1  # NOTE: PyYAML raises no unmarked error from a str source; never a line-less error


def _error_problem(e: yaml.YAMLError) -> str:
    if isinstance(e, yaml.reader.ReaderError):
        return f"unacceptable character #x{e.character:04x}: {e.reason}"
    problem = getattr(e, "problem", None)
    return str(problem) if problem else str(e).split("\n")[0]


def _checked_text(value: str, source: str, line: int) -> str:
    """``value`` with escaped UTF-16 surrogate pairs joined (as JSON reads them); lone ones refused."""
    if not _SURROGATE.search(value):
        return value
    try:
        return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le")
    except UnicodeDecodeError as e:
        raise PolicyError(
            "lone UTF-16 surrogate escape in a string (not Unicode text)", source=source, line=line
        ) from e


def _check_shape(text: str, source: str, limits: Limits) -> None:
    """Refuse nesting over ``max_yaml_depth`` and (alias-expanded) node counts over ``max_yaml_nodes``."""
    sizes: dict[str, int] = {}  # anchor -> nodes it expands to
    stack: list[list[Any]] = []  # open collections: [nodes so far, anchor]
    total = 0
    for ev in yaml.parse(text, Loader=yaml.SafeLoader):
        _check_event(ev, source)
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
        raise PolicyError(
            f"YAML syntax error: {_error_problem(e)}", source=source, line=_error_line(e, text)
        ) from e
    except RecursionError as e:  # NOTE: unreachable under the depth ceiling; never a traceback
        raise _depth_error(lim, source, 1) from e
    lines: dict[Path_, int] = {}
    if root is None:
        return None, lines
    constructor = yaml.SafeLoader("")
    count = 0

    def construct(node: yaml.Node) -> Any:
        line = node.start_mark.line + 1
        try:
            value = constructor.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, TypeError, OverflowError) as e:
            # NOTE: impossible !!timestamp values, ints too long to convert (tags are refused earlier)
            problem = getattr(e, "problem", None) or str(e)
            raise PolicyError(f"YAML value cannot be read: {problem}", source=source, line=line) from e
        return _checked_text(value, source, line) if isinstance(value, str) else value

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
