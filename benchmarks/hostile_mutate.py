"""Mutation engines for the hostile-input campaign (``benchmarks/hostile.py``).

Two of the three engines live here; both drive the same mutation grammar through a
:class:`Chooser`:

- ``random``: a seeded :class:`random.Random` (:class:`RandomChooser`);
- ``hypothesis``: Hypothesis's ``st.data()`` draws every choice (:class:`HypothesisChooser`), with
  Hypothesis's own boundary-biased integers, floats and text for the hostile values.

The third engine (atheris/libFuzzer byte mutation) is driven from ``hostile_targets``.

The grammar works on parsed JSON (delete, duplicate key, type swap, boundary numbers, NaN and
Infinity literals, unicode confusables and controls, lone surrogates, huge strings, deep nesting,
list surgery), on text (line and token surgery with a per-format dictionary) and on bytes.
JSON is re-serialised by :func:`dumps`, which can also write what ``json.dumps`` cannot:
duplicate keys (:class:`Dup`) and raw literals (:class:`Raw`: ``NaN``, ``1e400``, deep nesting).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
Path_ = tuple[str | int, ...]


# ---- JSON with hostile extensions -------------------------------------------------------------


@dataclass(frozen=True)
class Raw:
    """A literal emitted verbatim by :func:`dumps` (``NaN``, ``1e400``, ``[[[...]]]``, ...)."""

    text: str


@dataclass(frozen=True)
class Dup:
    """An object whose members may repeat a key (emitted in this order)."""

    pairs: tuple[tuple[str, Any], ...]


def dumps(value: Any, *, ascii_only: bool = False, compact: bool = True) -> str:
    """JSON text of ``value``; :class:`Raw` and :class:`Dup` nodes are written as they are.

    The C encoder writes everything else: each Raw or Dup node goes through it as a placeholder
    string that is then replaced by the node's own text.
    """
    sep_item, sep_key = (",", ":") if compact else (", ", ": ")
    raws: list[str] = []
    nonce = f"{id(raws):x}"

    def default(o: Any) -> str:
        if isinstance(o, Raw):
            text = o.text
        elif isinstance(o, Dup):
            members = (
                json.dumps(k, ensure_ascii=ascii_only)
                + sep_key
                + dumps(v, ascii_only=ascii_only, compact=compact)
                for k, v in o.pairs
            )
            text = "{" + sep_item.join(members) + "}"
        else:
            raise TypeError(f"not JSON: {type(o).__name__}")
        raws.append(text)
        return f"\x00{nonce}:{len(raws) - 1}\x00"

    out = json.dumps(value, ensure_ascii=ascii_only, separators=(sep_item, sep_key), default=default)
    if not raws:
        return out
    marker = re.compile(r'"\\u0000' + nonce + r':(\d+)\\u0000"')
    return marker.sub(lambda m: raws[int(m.group(1))], out)


def encode(text: str) -> bytes:
    """UTF-8, keeping lone surrogates as their (invalid) 3-byte forms rather than failing."""
    return text.encode("utf-8", "surrogatepass")


# ---- choosers -----------------------------------------------------------------------------------


class Chooser(Protocol):
    """Where every mutation decision comes from (a seeded PRNG, or Hypothesis)."""

    def int(self, lo: int, hi: int) -> int: ...

    def pick(self, seq: Sequence[T]) -> T: ...

    def chance(self, p: float) -> bool: ...

    def hostile_value(self) -> Any: ...

    def hostile_text(self) -> str: ...


# Hostile strings: confusables, invisible and bidi controls, NUL, non-characters, long runs.
CONFUSABLES = {"a": "\u0430", "e": "\u0435", "o": "\u043e", "c": "\u0441", "k": "\u043a", "1": "\u0661"}
SPECIAL_STRINGS: tuple[str, ...] = (
    "",
    " ",
    "\u0000",
    "\u200b",
    "\u200d",
    "\u202e",
    "\ufeff",
    "\uffff",
    "\U0010ffff",
    "\ud800",
    "\udfff",
    "e\u0301",
    "\u00e9",
    "\r\n",
    "\t",
    "../../etc/passwd",
    "%s%n",
    "' OR 1=1 --",
    "true",
    "null",
    "0",
    "-1",
    "1e400",
    "NaN",
    "k1",
    "k2",
    "k9",
    "acme",
    "globex",
    "research/*",
    "default@1",
    "semgov.captured_request/v1",
    "semgov.provenance/v1",
    "semgov.decision/v1",
    "semgov.decision/v2",
    "semgov.decision/v3",
    "semgov.policy_input/v1",
    "semgov.audit_proof/v1",
    "2026-11-29T10:00:00Z",
    "2026-11-29T10:00:00",
    "2026-11-29 10:00:00Z",
    "2026-02-30T10:00:00Z",
    "2026-11-29T10:00:60Z",
    "9999-12-31T23:59:59Z",
    "0001-01-01T00:00:00+14:00",
    "1795946400",
    "-----BEGIN PUBLIC KEY-----",
    "A" * 88,
    "=" * 4,
)
SPECIAL_NUMBERS: tuple[Any, ...] = (
    0,
    -1,
    1,
    2,
    255,
    256,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    2**53 - 1,
    2**53,
    2**53 + 1,
    2**63 - 1,
    2**63,
    2**64,
    -(2**63),
    10**30,
    0.5,
    -0.5,
    1.0,
    0.6,
    0.5999999999999999,
    1.0000000000000002,
    1e-7,
    1e16,
    1.7976931348623157e308,
    5e-324,
    Raw("-0"),
    Raw("-0.0"),
    Raw("1e400"),
    Raw("-1e400"),
    Raw("NaN"),
    Raw("Infinity"),
    Raw("-Infinity"),
    Raw("1" + "0" * 5000),
    Raw("0.1e1"),
    Raw("1E2"),
    Raw("100000000000000000000000000000000000000000000.5"),
)


def deep_nesting(depth: int, kind: str = "[") -> Raw:
    close = {"[": "]", "{": "}"}[kind]
    if kind == "{":
        return Raw('{"a":' * depth + "1" + close * depth)
    return Raw(kind * depth + close * depth)


class RandomChooser:
    """Every choice from one seeded :class:`random.Random`."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def pick(self, seq: Sequence[T]) -> T:
        return seq[self.rng.randrange(len(seq))]

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def hostile_text(self) -> str:
        r = self.rng
        k = r.randrange(6)
        if k == 0:
            return r.choice(SPECIAL_STRINGS)
        if k == 1:
            return r.choice(SPECIAL_STRINGS) * r.choice((2, 64, 600, 5000))
        if k == 2:
            return "".join(chr(r.randrange(0x20, 0x7F)) for _ in range(r.randrange(1, 40)))
        if k == 3:
            return "".join(chr(r.randrange(0, 0x3000)) for _ in range(r.randrange(1, 20)))
        if k == 4:
            return "x" * r.choice((513, 1025, 70_000))
        return "".join(r.choice(SPECIAL_STRINGS) for _ in range(r.randrange(2, 5)))

    def hostile_value(self) -> Any:
        r = self.rng
        k = r.randrange(9)
        if k == 0:
            return None
        if k == 1:
            return r.choice((True, False))
        if k in (2, 3):
            return r.choice(SPECIAL_NUMBERS)
        if k in (4, 5):
            return self.hostile_text()
        if k == 6:
            return r.choice(([], {}, [None], {"": None}, [[]], {"a": {"b": {}}}))
        if k == 7:
            return deep_nesting(r.choice((50, 2000, 200_000)), r.choice("[{"))
        return [self.hostile_value() for _ in range(r.randrange(0, 4))]


class HypothesisChooser:
    """Every choice drawn by Hypothesis from ``st.data()``."""

    def __init__(self, data: Any) -> None:
        from hypothesis import strategies as st

        self._data = data
        self._st = st

    def int(self, lo: int, hi: int) -> int:
        return int(self._data.draw(self._st.integers(lo, hi)))

    def pick(self, seq: Sequence[T]) -> T:
        return seq[self.int(0, len(seq) - 1)]

    def chance(self, p: float) -> bool:
        return self.int(0, 999) < int(p * 1000)

    def hostile_text(self) -> str:
        return str(self._data.draw(_hyp_text()))

    def hostile_value(self) -> Any:
        return self._data.draw(_hyp_value())


_HYP: dict[str, Any] = {}


def _hyp_text() -> Any:
    if "text" not in _HYP:
        from hypothesis import strategies as st

        _HYP["text"] = st.one_of(
            st.sampled_from(SPECIAL_STRINGS),
            st.text(max_size=40),
            st.text(st.characters(codec="utf-8"), max_size=20),
            st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3),
            st.builds(lambda s, n: s * n, st.sampled_from(SPECIAL_STRINGS[1:8]), st.integers(1, 3000)),
        )
    return _HYP["text"]


def _hyp_value() -> Any:
    if "value" not in _HYP:
        from hypothesis import strategies as st

        leaves = st.one_of(
            st.none(),
            st.booleans(),
            st.integers(),
            st.integers(min_value=-(2**70), max_value=2**70),
            st.floats(allow_nan=True, allow_infinity=True),
            st.sampled_from(SPECIAL_NUMBERS),
            _hyp_text(),
            st.builds(deep_nesting, st.integers(1, 100_000), st.sampled_from("[{")),
        )
        _HYP["value"] = st.recursive(
            leaves,
            lambda kids: st.one_of(
                st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=8), kids, max_size=4)
            ),
            max_leaves=8,
        )
    return _HYP["value"]


# ---- JSON tree surgery ---------------------------------------------------------------------------


def pick_path(ch: Chooser, tree: Any, focus: Callable[[Path_], bool] | None = None) -> Path_:
    """A random path: from the root, stop (30%) or step into a random member, until a leaf.

    O(depth), and every level of the structure gets its share (a uniform pick over all paths
    would almost always land in a long token list). ``focus`` picks the first step (80%).
    """
    path: Path_ = ()
    node = tree
    while True:
        if isinstance(node, dict) and node:
            kids: list[str | int] = list(node)
        elif isinstance(node, list) and node:
            kids = list(range(len(node)))
        else:
            return path
        if path and ch.chance(0.3):
            return path
        if not path and focus is not None and ch.chance(0.8):
            kids = [k for k in kids if focus((k,))] or kids
        k = ch.pick(kids)
        path = (*path, k)
        node = node[k]


def get(tree: Any, path: Path_) -> Any:
    for p in path:
        tree = tree[p]
    return tree


def put(tree: Any, path: Path_, value: Any) -> Any:
    """``tree`` with the value at ``path`` replaced (copies only along the path)."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(tree, dict):
        out = dict(tree)
        out[head] = put(tree[head], rest, value)
        return out
    out_l = list(tree)
    out_l[head] = put(tree[head], rest, value)  # type: ignore[index]
    return out_l


def pathstr(path: Path_) -> str:
    return ".".join(str(p) for p in path) or "$"


def _swap_type(ch: Chooser, v: Any) -> Any:
    if isinstance(v, bool):
        return ch.pick((str(v).lower(), int(v), None, [v], Raw("True")))
    if isinstance(v, int):
        return ch.pick((str(v), float(v), Raw(f"{v}.0"), bool(v % 2), [v], {"v": v}, None))
    if isinstance(v, float):
        return ch.pick((str(v), int(v), [v], None, Raw(repr(v) + "e0")))
    if isinstance(v, str):
        as_num: Any = None
        try:
            as_num = json.loads(v)
        except ValueError:
            pass
        return ch.pick(
            (
                as_num if as_num is not None else 0,
                [v],
                {"value": v},
                None,
                True,
                v.encode("utf-8", "surrogatepass").hex(),
            )
        )
    if isinstance(v, list):
        return ch.pick(({str(i): x for i, x in enumerate(v)}, v[0] if v else None, "", len(v)))
    if isinstance(v, dict):
        return ch.pick((list(v.values()), list(v.items()), dumps(v), None, []))
    return ch.hostile_value()


def _mutate_string(ch: Chooser, s: str) -> Any:
    k = ch.int(0, 11)
    if k == 0 and s:
        i = ch.int(0, len(s) - 1)
        c = CONFUSABLES.get(s[i].lower())
        return s[:i] + (c if c is not None else chr(ord(s[i]) ^ 1)) + s[i + 1 :]
    if k == 1:
        i = ch.int(0, len(s))
        return s[:i] + ch.pick(SPECIAL_STRINGS[:12]) + s[i:]
    if k == 2:
        return s + ch.pick((" ", "\n", "\u0000", "\u200b", "/", "."))
    if k == 3:
        return s[: ch.int(0, max(0, len(s) - 1))]
    if k == 4:
        return s.upper() if s != s.upper() else s.lower()
    if k == 5:
        return s * ch.pick((2, 100, 3000))
    if k == 6 and s:
        i = ch.int(0, len(s) - 1)
        return s[:i] + chr((ord(s[i]) + ch.int(1, 5)) % 0x110000) + s[i + 1 :]
    if k == 7:
        return ch.hostile_text()
    if k == 8:
        # Lone surrogate inside the string: only expressible as a JSON escape.
        return Raw(json.dumps(s[: len(s) // 2]).rstrip('"') + "\\ud800" + json.dumps(s[len(s) // 2 :])[1:])
    if k == 9:
        return s.encode("utf-8").decode("latin-1")
    if k == 10 and len(s) > 1:
        i = ch.int(0, len(s) - 2)
        return s[:i] + s[i + 1] + s[i] + s[i + 2 :]
    return " " + s


def _mutate_number(ch: Chooser, v: int | float) -> Any:
    k = ch.int(0, 5)
    if k == 0:
        return ch.pick(SPECIAL_NUMBERS)
    if k == 1:
        return v + ch.pick((1, -1))
    if k == 2:
        return -v if v else -1
    if k == 3:
        return v * ch.pick((2, 1000, 2**32))
    if k == 4:
        return Raw(json.dumps(v) + ch.pick((".0", "e0", "0", "e-0")))
    return float(v) + ch.pick((0.1, -0.1, 1e-9))


OPS = (
    "delete",
    "hostile",
    "swap_type",
    "number",
    "string",
    "dup_key",
    "unknown_key",
    "wrap",
    "deep",
    "list",
    "swap_paths",
    "copy_value",
)


def mutate_json(
    ch: Chooser, tree: Any, *, focus: Callable[[Path_], bool] | None = None, rounds: int | None = None
) -> tuple[Any, list[str]]:
    """Apply 1-3 structural mutations (biased towards ``focus`` paths); return the tree and what was done."""
    done: list[str] = []
    n = rounds if rounds is not None else ch.pick((1, 1, 1, 2, 3))
    for _ in range(n):
        path = pick_path(ch, tree, focus) if not isinstance(tree, Raw | Dup) else ()
        tree, what = _mutate_at(ch, tree, path)
        done.append(f"{what}@{pathstr(path)}")
        if isinstance(tree, Raw | Dup):
            break
    return tree, done


def _mutate_at(ch: Chooser, tree: Any, path: Path_) -> tuple[Any, str]:
    cur = get(tree, path) if not isinstance(tree, Raw | Dup) else tree
    op = ch.pick(OPS)
    parent_path, last = path[:-1], path[-1] if path else None
    parent: Any = get(tree, parent_path) if path else None
    if op == "delete" and path:
        new: Any = (
            {k: v for k, v in parent.items() if k != last}
            if isinstance(parent, dict)
            else [v for i, v in enumerate(parent) if i != last]
        )
        return put(tree, parent_path, new), op
    if op == "hostile":
        return put(tree, path, ch.hostile_value()), op
    if op == "swap_type":
        return put(tree, path, _swap_type(ch, cur)), op
    if op == "number" and isinstance(cur, int | float) and not isinstance(cur, bool):
        return put(tree, path, _mutate_number(ch, cur)), op
    if op == "string" and isinstance(cur, str):
        return put(tree, path, _mutate_string(ch, cur)), op
    if op == "dup_key" and isinstance(parent, dict) and isinstance(last, str):
        pairs = list(parent.items())
        i = next(j for j, (k, _) in enumerate(pairs) if k == last)
        other = ch.pick((ch.hostile_value(), _swap_type(ch, cur), cur))
        at = i if ch.chance(0.5) else i + 1
        pairs.insert(at, (last, other))
        return put(tree, parent_path, Dup(tuple(pairs))), op
    if op == "unknown_key" and isinstance(cur, dict):
        key = ch.pick(("extra", "", "Schema", "signature ", "__proto__", "x" * 300, "key_id\u0000"))
        new = dict(cur)
        new[key] = ch.hostile_value()
        return put(tree, path, new), op
    if op == "wrap":
        return put(tree, path, ch.pick(([cur], {"value": cur}, [[cur]]))), op
    if op == "deep":
        return put(tree, path, deep_nesting(ch.pick((100, 990, 5000, 100_000)), ch.pick("[{"))), op
    if op == "list" and isinstance(cur, list):
        new_l = list(cur)
        k = ch.int(0, 5)
        if k == 0 and new_l:
            new_l.append(new_l[ch.int(0, len(new_l) - 1)])
        elif k == 1 and len(new_l) > 1:
            i, j = ch.int(0, len(new_l) - 1), ch.int(0, len(new_l) - 1)
            new_l[i], new_l[j] = new_l[j], new_l[i]
        elif k == 2 and new_l:
            del new_l[ch.int(0, len(new_l) - 1)]
        elif k == 3:
            new_l.insert(ch.int(0, len(new_l)), ch.hostile_value())
        elif k == 4:
            new_l = new_l[: ch.int(0, len(new_l))]
        else:
            new_l = new_l[::-1] if len(new_l) > 1 else new_l * 3
        return put(tree, path, new_l), op
    if op == "swap_paths" and isinstance(parent, dict) and len(parent) > 1:
        other_key = ch.pick([k for k in parent if k != last])
        new = dict(parent)
        new[last], new[other_key] = parent[other_key], parent[last]
        return put(tree, parent_path, new), op
    if op == "copy_value" and not isinstance(tree, Raw | Dup):
        src = pick_path(ch, tree)
        return put(tree, path, get(tree, src)), f"{op}<-{pathstr(src)}"
    # The op did not fit the node: a hostile value instead.
    return put(tree, path, ch.hostile_value()), "hostile"


# ---- text and bytes ---------------------------------------------------------------------------------


def mutate_text(ch: Chooser, text: str, snippets: Sequence[str], tokens: Sequence[str]) -> tuple[str, str]:
    """One line- or token-level mutation of ``text``, using a format's ``snippets`` and ``tokens``."""
    lines = text.split("\n")
    k = ch.int(0, 10)
    i = ch.int(0, max(0, len(lines) - 1))
    if k == 0 and len(lines) > 1:
        del lines[i]
        return "\n".join(lines), "delete line"
    if k == 1:
        lines.insert(i, lines[i])
        return "\n".join(lines), "duplicate line"
    if k == 2:
        lines.insert(i, ch.pick(snippets))
        return "\n".join(lines), "insert snippet"
    if k == 3:
        j = ch.int(0, max(0, len(lines) - 1))
        lines[i], lines[j] = lines[j], lines[i]
        return "\n".join(lines), "swap lines"
    if k == 4:
        present = [t for t in tokens if t in text]
        if present:
            a = ch.pick(present)
            return text.replace(a, ch.pick(tokens), 1), "replace token"
    if k == 5:
        lines[i] = ch.pick(("", " ", "\t", "  ", "    ")) + lines[i]
        return "\n".join(lines), "indent"
    if k == 6 and text:
        j = ch.int(0, len(text) - 1)
        return text[:j] + ch.hostile_text()[:200] + text[j + 1 :], "hostile text"
    if k == 7:
        return text[: ch.int(0, len(text))], "truncate"
    if k == 8:
        lines.append(ch.pick(snippets))
        return "\n".join(lines), "append snippet"
    if k == 9:
        return text.replace("\n", ch.pick(("\r\n", "\r", "\n\n", "\u2028"))), "newlines"
    lines[i] = lines[i] + ch.pick(tokens)
    return "\n".join(lines), "append token"


def mutate_bytes(ch: Chooser, data: bytes) -> tuple[bytes, str]:
    """One byte-level mutation (bit flip, overwrite, insert, delete, splice, truncate)."""
    b = bytearray(data)
    k = ch.int(0, 6)
    if not b:
        return bytes([ch.int(0, 255)]), "insert byte"
    i = ch.int(0, len(b) - 1)
    if k == 0:
        b[i] ^= 1 << ch.int(0, 7)
        return bytes(b), f"flip bit at {i}"
    if k == 1:
        b[i] = ch.pick((0, 0xFF, 0x7F, 0x80, 0x22, 0x5C, 0x0A, ch.int(0, 255)))
        return bytes(b), f"set byte at {i}"
    if k == 2:
        b[i:i] = bytes(ch.int(0, 255) for _ in range(ch.int(1, 8)))
        return bytes(b), f"insert at {i}"
    if k == 3:
        del b[i : i + ch.int(1, 16)]
        return bytes(b), f"delete at {i}"
    if k == 4:
        j = ch.int(0, len(b) - 1)
        n = ch.int(1, 64)
        b[i:i] = b[j : j + n]
        return bytes(b), f"splice {j}->{i}"
    if k == 5:
        return bytes(b[:i]), f"truncate at {i}"
    return bytes(b) + bytes(b[i : i + ch.int(1, 200)]), "append copy"
