"""How the values of two answers are read and compared (:mod:`semgov.contracts` says what for).

Pure, bounded functions over untrusted text: the model's output decides how long each takes, so
each has a ceiling (matches per pattern, a time budget for pattern searches, JSON depth), and
:func:`pattern_values` and :func:`json_values` say why when one is reached (``Values.doubt``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from semgov.wire import strictjson

MAX_JSON_DEPTH = 32
MAX_MATCHES = 256  # matches per pattern and answer
MATCH_BUDGET_S = 0.5  # pattern matching per comparison, both answers together
MAX_VALUE_CHARS = 80

Path_ = tuple[str, ...]


def printable(text: str, limit: int = MAX_VALUE_CHARS) -> str:
    """``text`` on one line, non-printable characters escaped, cut to ``limit`` characters."""
    head = text[: limit + 1]
    out = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in head)
    return out if len(out) <= limit and len(head) <= limit else out[: limit - 1] + "…"


def first_difference(a: str, b: str) -> int:
    """The first index where ``a`` and ``b`` differ (the shorter one's length if one extends the other)."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


@dataclass(frozen=True, slots=True)
class Values:
    """What comparing the required values of two answers found (``doubt``: why nothing could be)."""

    lost: list[str]
    gained: list[str]
    doubt: str | None = None
    note: str = ""

    @property
    def changed(self) -> bool:
        return bool(self.lost or self.gained or self.doubt)


def describe(v: Values) -> str:
    """What ``v`` found, in a few words and its first values (the caller bounds the line)."""
    if v.doubt is not None:
        return v.doubt
    if not v.changed:
        return f"required values unchanged{v.note}"
    parts = []
    if v.lost:
        parts.append(f"{len(v.lost)} lost ({', '.join(v.lost[:3])})")
    if v.gained:
        parts.append(f"{len(v.gained)} gained ({', '.join(v.gained[:3])})")
    return f"required values changed{v.note}: " + "; ".join(parts)


# ---- patterns (free text) ------------------------------------------------------------------------


def _matches(name: str, pattern: Any, text: str, who: str, deadline: float) -> set[str] | str:
    """The distinct non-empty matches of ``pattern`` in ``text``, or why there are none to compare."""
    out: set[str] = set()
    count = 0
    try:
        for m in pattern.finditer(text, timeout=max(deadline - time.monotonic(), 1e-6)):
            value = m.group(0).strip()
            if not value:
                continue
            count += 1
            if count > MAX_MATCHES:
                return f"more than {MAX_MATCHES} matches of pattern {name!r} in {who}'s answer: changed"
            out.add(value)
    except TimeoutError:
        return f"pattern {name!r} gave up after {MATCH_BUDGET_S} s on {who}'s answer: changed"
    return out


def pattern_values(patterns: Sequence[tuple[str, Any]], cold: str, warm: str) -> Values:
    """Per named pattern, the matches in cold's answer and not in warm's (lost) and the reverse, each
    answer's whitespace runs collapsed to one space first (a space in a pattern matches any run)."""
    deadline = time.monotonic() + MATCH_BUDGET_S
    cold, warm = " ".join(cold.split()), " ".join(warm.split())
    lost: list[str] = []
    gained: list[str] = []
    for name, pattern in patterns:
        c = _matches(name, pattern, cold, "cold", deadline)
        if isinstance(c, str):
            return Values([], [], doubt=c)
        w = _matches(name, pattern, warm, "warm", deadline)
        if isinstance(w, str):
            return Values([], [], doubt=w)
        lost.extend(f"{name}={printable(v)}" for v in sorted(c - w))
        gained.extend(f"{name}={printable(v)}" for v in sorted(w - c))
    return Values(lost, gained)


# ---- JSON answers --------------------------------------------------------------------------------

_FENCE = "```json"


def _json_candidates(text: str) -> list[str]:
    """Where an answer's JSON value may be, in order: the whole text, the first ```json block, the
    outermost ``{...}`` (each found by one linear scan)."""
    out = [text.strip()]
    start = text.find(_FENCE)
    if start >= 0:
        body = start + len(_FENCE)
        end = text.find("```", body)
        out.append(text[body : end if end >= 0 else len(text)])
    first, last = text.find("{"), text.rfind("}")
    if 0 <= first < last:
        out.append(text[first : last + 1])
    return out


def find_json(text: str) -> tuple[bool, Any]:
    """``(True, value)``: the first candidate (:func:`_json_candidates`) that is one strict JSON
    document at most :data:`MAX_JSON_DEPTH` deep; ``(False, None)`` when none is."""
    for candidate in _json_candidates(text):
        if not candidate.strip():
            continue
        try:
            return True, strictjson.loads(candidate, max_depth=MAX_JSON_DEPTH)
        except strictjson.StrictJSONError:
            continue
    return False, None


def _canon(v: Any) -> Any:
    """A hashable form under which equal JSON values are equal: ``1 == 1.0``, ``true != 1``, key
    order ignored, arrays in order."""
    if isinstance(v, bool):
        return ("bool", v)
    if isinstance(v, int | float):
        return ("number", v)
    if isinstance(v, str):
        return ("string", v)
    if v is None:
        return ("null",)
    if isinstance(v, list):
        return ("array", tuple(_canon(x) for x in v))
    return ("object", frozenset((k, _canon(x)) for k, x in v.items()))


def _dumps(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def _at(doc: Any, path: Path_) -> tuple[Any, str]:
    """The value at ``path`` of a JSON value: ``(canonical form, printable)``; a missing field and a
    field under something that is not an object are values of their own."""
    node = doc
    for i, key in enumerate(path):
        if not isinstance(node, dict):
            where = ".".join(path[:i]) or "the answer"
            return ("not an object", path[:i], _canon(node)), f"(missing: {where} is {_dumps(node)})"
        if key not in node:
            return ("missing",), "(missing)"
        node = node[key]
    return _canon(node), _dumps(node)


def path_name(path: Path_) -> str:
    """A required path as printed: ``a.b``, or ``$`` for the whole value."""
    return ".".join(path) if path else "$"


def json_values(paths: Sequence[Path_], cold: str, warm: str) -> Values:
    """The values at ``paths`` of each answer's JSON value, compared as JSON; the texts, exactly,
    when neither answer has one; changed when only one has."""
    (c_ok, c_doc), (w_ok, w_doc) = find_json(cold), find_json(warm)
    if not c_ok and not w_ok:
        note = " (no JSON value in either answer: compared as text)"
        changed = ["answer=" + printable(cold)], ["answer=" + printable(warm)]
        return Values(*changed, note=note) if cold != warm else Values([], [], note=note)
    if c_ok != w_ok:
        has, lacks = ("cold", "warm") if c_ok else ("warm", "cold")
        return Values([], [], doubt=f"{has}'s answer has a JSON value and {lacks}'s has none: changed")
    lost: list[str] = []
    gained: list[str] = []
    for path in paths:
        (ck, cs), (wk, ws) = _at(c_doc, path), _at(w_doc, path)
        if ck != wk:
            lost.append(f"{path_name(path)}={printable(cs)}")
            gained.append(f"{path_name(path)}={printable(ws)}")
    return Values(lost, gained)
