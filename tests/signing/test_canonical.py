"""Canonical JSON: the fast path is byte-identical to the rfc8785 reference."""

from __future__ import annotations

import math

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from semgov.signing.canonical import canonicalize

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=2000, deadline=None)
@given(json_values)
def test_matches_reference(value: object) -> None:
    """For any JSON value the output equals rfc8785.dumps (or both refuse it)."""
    try:
        want = rfc8785.dumps(value)
    except rfc8785.CanonicalizationError:
        with pytest.raises(rfc8785.CanonicalizationError):
            canonicalize(value)
        return
    assert canonicalize(value) == want


@pytest.mark.parametrize("x", [1.0, 1e-7, 1e21, 123456789012345680.0, 5e-324, -0.0, 0.1, 1e16, 0.0001])
def test_floats_at_notation_edges(x: float) -> None:
    """Floats where Python and ECMAScript notations differ still match the reference."""
    assert canonicalize({"x": x}) == rfc8785.dumps({"x": x})


def test_non_finite_and_huge_ints_are_refused() -> None:
    """NaN, infinity and integers beyond 2**53 cannot be canonicalized."""
    for bad in (math.nan, math.inf, 2**60):
        with pytest.raises(rfc8785.CanonicalizationError):
            canonicalize({"x": bad})


def test_key_order_is_utf16() -> None:
    """Keys sort by UTF-16 code units (astral characters before U+E000-U+FFFF)."""
    value = {"\ue000": 1, "\U0001f600": 2}
    assert canonicalize(value) == rfc8785.dumps(value)
    assert canonicalize(value).index("\U0001f600".encode()) < canonicalize(value).index("\ue000".encode())


def test_record_fast_path_matches_reference(evaluator: object, keys: object) -> None:
    """Signed decision records (allow and deny, odd ids) canonicalize exactly as RFC 8785 says."""
    from semgov import Evaluator
    from semgov.signing.canonical import canonicalize_record
    from tests.conftest import candidate, parse, request

    assert isinstance(evaluator, Evaluator)
    req = request(
        [candidate(keys, "dönör-ü\u2028"), candidate(keys, "b", tenant='x"\\\n\x01')],  # type: ignore[arg-type]
        request_id="r-\U0001f600-\ue000",
    )
    for d in evaluator.evaluate(parse(req)):
        assert canonicalize_record(d.record) == rfc8785.dumps(d.record) == d.canonical


# Keys that collide with a decision record's (so splice markers also occur nested), and odd ones.
_keys = st.sampled_from(["tenant", "schema", "signature", "a", "z", "key_id"]) | st.text(max_size=6)
_objects = st.dictionaries(
    _keys,
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**53) + 1, 2**53 - 1)
        | st.text(alphabet=',"\\:{}aé\u2028😀'),
        lambda children: st.lists(children, max_size=3) | st.dictionaries(_keys, children, max_size=3),
        max_leaves=12,
    ),
    max_size=6,
)


@settings(max_examples=3000, deadline=None)
@given(_objects, _keys, st.text(alphabet=',"\\:{}aé😀', max_size=8))
def test_spliced_member_matches_reference(obj: dict[str, object], key: str, value: str) -> None:
    """A member spliced into an object's canonical bytes gives the reference bytes of the whole."""
    from semgov.signing.canonical import with_member

    if key in obj:
        return
    assert with_member(canonicalize(obj), obj, key, value) == rfc8785.dumps({**obj, key: value})


def test_signed_record_bytes_are_the_reference_of_the_signed_record() -> None:
    """Records signed with one canonicalization carry exactly the RFC 8785 bytes of the signed record."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from semgov.signing.keys import SigningKey
    from semgov.signing.records import sign_record_canonical

    key = SigningKey.from_private(Ed25519PrivateKey.generate())
    odd = {"tenant": 'x",\\"tenant":', "schema": "s", "z": [{"tenant": 1}]}
    for unsigned in (
        odd,
        {},
        {"zz": 1},
        {"a": {"signature": 2}},
        {"tenant": "t", "b": {"a": 1, "tenant": "u"}},
    ):
        record, canonical = sign_record_canonical(unsigned, key)
        assert canonical == rfc8785.dumps(record)
        assert record == {**unsigned, "key_id": key.key_id, "signature": record["signature"]}
