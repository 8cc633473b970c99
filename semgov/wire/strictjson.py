"""Strict JSON for everything semgov reads back: one meaning per document, or a clear error.

``loads`` refuses what ``json.loads`` silently accepts or crashes on: duplicate object keys (the
last one would win), ``NaN`` / ``Infinity`` literals, integers beyond Python's digit limit,
invalid UTF-8, lone surrogate escapes, and nesting deeper than ``max_depth`` (``json`` would
raise ``RecursionError`` or worse). Every failure is a :class:`StrictJSONError` (a
``ValueError``) whose message says what is wrong; callers add the file and field.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 64


class StrictJSONError(ValueError):
    """The bytes are not one strict JSON document."""


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise StrictJSONError(f"duplicate key {k!r}: a JSON object may not repeat a key")
        out[k] = v
    return out


def _constant(name: str) -> Any:
    raise StrictJSONError(f"{name} is not JSON")


def _depth(text: str, max_depth: int) -> None:
    """Refuse nesting deeper than ``max_depth`` before parsing (ignores brackets inside strings)."""
    if text.count("[") + text.count("{") <= max_depth:
        return  # fast path: cannot be deeper than the number of openers
    depth = 0
    in_str = esc = False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                raise StrictJSONError(f"nested deeper than {max_depth} levels")
        elif ch in "]}":
            depth -= 1


def _no_surrogates(v: Any) -> None:
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, str):
            try:
                x.encode("utf-8")
            except UnicodeEncodeError:
                raise StrictJSONError("a string holds a lone surrogate (not valid Unicode)") from None
        elif isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)


def loads(data: bytes | str, *, max_depth: int = MAX_DEPTH) -> Any:
    """Parse one strict JSON document (raises :class:`StrictJSONError`)."""
    if isinstance(data, bytes | bytearray):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise StrictJSONError(f"not UTF-8 (byte {e.start})") from None
    else:
        text = data
    _depth(text, max_depth)
    try:
        doc = json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant)
    except StrictJSONError:
        raise
    except json.JSONDecodeError as e:
        raise StrictJSONError(f"not JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise StrictJSONError("nested too deeply") from None
    except ValueError as e:  # an integer over Python's digit limit
        if "digits" in str(e):
            raise StrictJSONError("an integer has too many digits (over 4,300)") from None
        raise StrictJSONError(f"not JSON: {e}") from None
    _no_surrogates(doc)
    return doc


def is_int(v: Any) -> bool:
    """A JSON integer (``True``/``False`` and floats such as ``4.0`` are not)."""
    return isinstance(v, int) and not isinstance(v, bool)
