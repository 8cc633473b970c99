"""RFC 8785 (JSON Canonicalization Scheme) bytes for signing.

``rfc8785.dumps`` is the reference. It is pure Python and the largest single cost
of a decision (~230 us for a 900-byte record), so :func:`canonicalize` takes a
fast path through the C JSON encoder when the value is in the subset where both
provably agree, and falls back to the reference otherwise. A property test checks
the two against each other.
"""

from __future__ import annotations

import json
import math

import rfc8785

_MAX_SAFE_INT = 2**53 - 1
# NOTE: Python's float repr and ECMAScript's Number::toString give the same
# digits (both shortest round-trip) and the same notation for 1e-4 <= |x| < 1e16;
# outside that range one uses exponents where the other does not.
_FAST_FLOAT_MIN = 1e-4
_FAST_FLOAT_MAX = 1e16

_encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":")).encode


def _fast_ok(value: object) -> bool:
    """True when the C encoder's output is byte-identical to RFC 8785 for ``value``."""
    stack = [value]
    while stack:
        v = stack.pop()
        t = type(v)
        if t is str or v is None or t is bool:
            continue
        if t is int:
            if -_MAX_SAFE_INT <= v <= _MAX_SAFE_INT:  # type: ignore[operator]
                continue
            return False
        if t is float:
            f: float = v  # type: ignore[assignment]
            a = abs(f)
            if math.isfinite(f) and not f.is_integer() and _FAST_FLOAT_MIN <= a < _FAST_FLOAT_MAX:
                continue
            return False
        if t is dict:
            for k, item in v.items():  # type: ignore[attr-defined]
                # NOTE: sort_keys orders by code point, RFC 8785 by UTF-16 code
                # unit; they agree while every key stays below the surrogates.
                if type(k) is not str or not (k.isascii() or max(k) < "\ud800"):
                    return False
                stack.append(item)
            continue
        if t is list or t is tuple:
            stack.extend(v)  # type: ignore[arg-type]
            continue
        return False
    return True


def canonicalize(value: object) -> bytes:
    """Return the RFC 8785 canonical UTF-8 bytes of a JSON-compatible value.

    Raises ``rfc8785.CanonicalizationError`` for values JSON cannot represent
    canonically (NaN, infinities, integers beyond 2**53, lone surrogates).
    """
    if _fast_ok(value):
        try:
            return _encode(value).encode("utf-8")
        except (UnicodeEncodeError, ValueError):
            pass  # lone surrogate etc.: let the reference raise its own error
    return rfc8785.dumps(value)  # type: ignore[arg-type]


def canonicalize_record(record: dict[str, object]) -> bytes:
    """Canonical bytes of a record semgov built itself (decision records).

    NOTE: precondition, guaranteed by construction in ``semgov.decide``: ASCII
    keys, no floats, integers below 2**53, strings from validated JSON (no lone
    surrogates). Under it the C encoder's output is RFC 8785; a test checks
    real records against the reference. Anything else goes to :func:`canonicalize`.
    """
    try:
        return _encode(record).encode("utf-8")
    except (UnicodeEncodeError, ValueError):
        return canonicalize(record)


def with_member(canonical: bytes, obj: dict[str, object], key: str, value: str) -> bytes:
    """Canonical bytes of ``{**obj, key: value}``, given ``canonical``, the canonical bytes of ``obj``
    (``key`` not in it): the member is spliced in where RFC 8785's key order puts it, so a record is
    canonicalized once to be signed and its signed form costs no second encoding.

    NOTE: a JSON string never holds ``,"`` (its quotes are escaped), so ``,"k":`` occurs only where a
    member named ``k`` starts; when the top-level key after ``key`` also names a nested member (the
    marker occurs twice) or a key is not ASCII (sort orders could differ), the whole value is
    canonicalized instead. A test checks the result against the reference.
    """
    if key in obj or not key.isascii() or not all(type(k) is str and k.isascii() for k in obj):
        return canonicalize({**obj, key: value})
    member = canonicalize(key) + b":" + canonicalize(value)
    later = [k for k in obj if k > key]
    if not later:
        return canonical[:-1] + (b"," if obj else b"") + member + b"}"
    nxt = min(later)
    if nxt == min(obj):
        return b"{" + member + b"," + canonical[1:]
    marker = b"," + canonicalize(nxt) + b":"
    at = canonical.find(marker)
    if at < 0 or canonical.find(marker, at + 1) >= 0:
        return canonicalize({**obj, key: value})
    return canonical[:at] + b"," + member + canonical[at:]
