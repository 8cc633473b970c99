"""File digests exactly as OPA's bundle signing computes them, and the order of bundle revisions.

OPA (``v1/bundle/hash.go``, ``verify.go``) hashes two kinds of file differently:

- a *structured* file (base name ``.manifest``, ``data.json``, ``data.yaml`` or
  ``signatures.json``) is parsed as JSON (numbers kept as their literal text) and the digest is
  taken of a canonical walk: an object is ``{`` + ``"key":value`` pairs in byte order of the keys,
  joined by ``,`` + ``}``; an array ``[`` + values joined by ``,`` + ``]``; a string as Go's
  ``encoding/json`` writes it with HTML escaping off; a number as written; ``true``, ``false``,
  ``null``. Whitespace and key order in the file do not change the digest.
- every other file (``.rego``, ``policy.yaml``, ``keyring.json``, ...) is hashed as its bytes.

:func:`file_digest` is the one function both ``semgov bundle build`` and ``verify`` use.

Revisions (:func:`revision_number`): a bundle revision is a decimal number, optionally followed
by a label (``42``, ``20261207065300``, ``1337-3f2a9c1``); bundles are ordered by the number alone.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from semgov.errors import BundleError

STRUCTURED = frozenset({".manifest", "data.json", "signatures.json"})
HASH_ALGORITHM = "SHA-256"
_MAX_DEPTH = 64
_REVISION = re.compile(r"([0-9]{1,18})(?:[-+._][A-Za-z0-9._+-]{1,64})?")


class _Number(str):
    """A JSON number kept as its literal text (Go's ``json.Number``)."""


def is_structured(name: str) -> bool:
    """Whether OPA hashes ``name`` as parsed JSON (:data:`STRUCTURED`; ``data.yaml`` is refused)."""
    return name.rsplit("/", 1)[-1] in STRUCTURED


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json(data: bytes, *, source: str, field: str | None = None) -> Any:
    """Parse a structured file as OPA does (numbers kept as written); raises :class:`BundleError`."""
    try:
        text = data.decode("utf-8")
        return json.loads(text, parse_int=_Number, parse_float=_Number, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise BundleError(f"not valid JSON ({e})", source=source, field=field) from e


def _go_string(s: str) -> str:
    """``s`` as Go's ``encoding/json`` encodes it with ``SetEscapeHTML(false)``."""
    # NOTE: an unpaired surrogate (only reachable through a \\ud800 escape) is U+FFFD in Go.
    s = s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    out = json.dumps(s, ensure_ascii=False)
    return out.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _walk(v: Any, parts: list[str], depth: int) -> None:
    if depth > _MAX_DEPTH:
        raise ValueError(f"nested deeper than {_MAX_DEPTH} levels")
    if isinstance(v, dict):
        parts.append("{")
        for i, key in enumerate(sorted(v, key=lambda k: k.encode("utf-8", "surrogatepass"))):
            if i:
                parts.append(",")
            parts.append(_go_string(key) + ":")
            _walk(v[key], parts, depth + 1)
        parts.append("}")
    elif isinstance(v, list):
        parts.append("[")
        for i, e in enumerate(v):
            if i:
                parts.append(",")
            _walk(e, parts, depth + 1)
        parts.append("]")
    elif isinstance(v, _Number):
        parts.append(str(v))
    elif isinstance(v, str):
        parts.append(_go_string(v))
    elif v is True or v is False or v is None:
        parts.append(json.dumps(v))
    else:  # pragma: no cover - parse_json yields only the types above
        raise ValueError(f"unexpected JSON value {type(v).__name__}")


def canonical_bytes(value: Any) -> bytes:
    """The byte stream OPA's ``walk`` hashes for a parsed structured file."""
    parts: list[str] = []
    _walk(value, parts, 0)
    return "".join(parts).encode("utf-8", "surrogatepass")


def file_digest(name: str, data: bytes, *, source: str) -> str:
    """Hex SHA-256 of a bundle member as OPA computes it (structured files canonically)."""
    base = name.rsplit("/", 1)[-1]
    if base in ("data.yaml", "data.yml"):
        raise BundleError(
            "YAML data files are not supported in bundles (use data.json)", source=source, field=name
        )
    if not is_structured(name):
        return hashlib.sha256(data).hexdigest()
    try:
        return hashlib.sha256(canonical_bytes(parse_json(data, source=source, field=name))).hexdigest()
    except ValueError as e:
        raise BundleError(str(e), source=source, field=name) from e


def revision_number(revision: str, *, source: str) -> int:
    """The number a revision is ordered by; raises :class:`BundleError` for one that has none."""
    m = _REVISION.fullmatch(revision)
    if m is None:
        raise BundleError(
            f"revision {revision[:80]!r} is not a number optionally followed by a label "
            "(e.g. 42, 20261207065300 or 1337-3f2a9c1): revisions must be ordered",
            source=source,
            field="revision",
        )
    return int(m.group(1))


__all__ = ["canonical_bytes", "file_digest", "is_structured", "parse_json", "revision_number"]
