"""OPA's digest of structured bundle files: canonical JSON, as Go's encoder writes it."""

from __future__ import annotations

import hashlib

import pytest

from semgov.bundle.canonical import canonical_bytes, file_digest, parse_json
from semgov.errors import BundleError


def canon(text: str) -> str:
    return canonical_bytes(parse_json(text.encode(), source="x")).decode()


def test_objects_are_sorted_and_whitespace_ignored() -> None:
    """Keys in byte order, no whitespace, nested arrays and objects walked."""
    assert (
        canon('{ "b": [1, {"d": null, "c": true}],\n "a": "x" }') == '{"a":"x","b":[1,{"c":true,"d":null}]}'
    )


def test_numbers_keep_their_literal_text() -> None:
    """Numbers are hashed as written (Go's json.Number), not normalized."""
    assert canon("[1.50, 1e3, -0, 10]") == "[1.50,1e3,-0,10]"


def test_strings_are_escaped_as_go_writes_them() -> None:
    """HTML characters and non-ASCII stay literal; control characters, U+2028 and U+2029 are escaped."""
    assert canon('"<a&b> \\u00e9 \\b\\f\\n\\u0001 \\u2028"') == '"<a&b> \u00e9 \\b\\f\\n\\u0001 \\u2028"'


def test_only_structured_names_are_parsed() -> None:
    """.manifest and data.json are hashed canonically; any other file as its bytes; data.yaml is refused."""
    body = b'{"b": 1, "a": 2}'
    assert file_digest("x/data.json", body, source="b") == hashlib.sha256(b'{"a":2,"b":1}').hexdigest()
    assert file_digest("keyring.json", body, source="b") == hashlib.sha256(body).hexdigest()
    with pytest.raises(BundleError, match="b: data.yaml: YAML data files are not supported"):
        file_digest("data.yaml", b"a: 1", source="b")
    with pytest.raises(BundleError, match="b: .manifest: not valid JSON"):
        file_digest(".manifest", b"{", source="b")
