"""Gateway context tokens: verification, parsing, and the server-side cache keys derived from them."""

from __future__ import annotations

import base64
import json

import pytest

from engine_hooks.sglang.context import (
    ContextError,
    anonymous_cache_key,
    make_context_token,
    parse_context_token,
)

KEY = b"k" * 32
TASK = {"id": "qa", "version": "1"}
CONTRACT = {"id": "answer-json", "schema_sha256": "a" * 64}


def _token(**over: object) -> str:
    args: dict[str, object] = {
        "tenant": "acme",
        "namespace": "ns1",
        "task": TASK,
        "response_contract": CONTRACT,
        "segments": [("system", 0, 10), ("evidence", 10, 30)],
    }
    args.update(over)
    return make_context_token(KEY, **args)  # type: ignore[arg-type]


def test_round_trip_keeps_every_field() -> None:
    """A token made with the key parses back to the same tenant, namespace, task, contract and segments."""
    ctx = parse_context_token(KEY, _token())
    assert (ctx.tenant, ctx.namespace, ctx.task, ctx.response_contract) == ("acme", "ns1", TASK, CONTRACT)
    assert ctx.segments == (("system", 0, 10), ("evidence", 10, 30))
    assert ctx.suffix == ""


def test_wrong_key_is_refused() -> None:
    """A token MACed with another key does not verify."""
    with pytest.raises(ContextError, match="MAC does not verify"):
        parse_context_token(b"x" * 32, _token())


def test_edited_payload_is_refused() -> None:
    """Changing the tenant inside a valid token breaks the MAC."""
    tok = _token()
    prefix, payload, mac = tok.split(".")
    doc = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    doc["tenant"] = "globex"
    forged = base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()
    with pytest.raises(ContextError, match="MAC"):
        parse_context_token(KEY, f"{prefix}.{forged}.{mac}")


@pytest.mark.parametrize(
    "bad",
    [None, "", "plain-extra-key", "semgov1.", "semgov1.abc", "semgov1.abc.short", "semgov1.a*c." + "A" * 43],
)
def test_malformed_tokens_are_refused(bad: str | None) -> None:
    """Missing, truncated or non-base64 tokens are refused with a reason, never parsed."""
    with pytest.raises(ContextError):
        parse_context_token(KEY, bad)


def test_lora_suffix_is_kept_apart_from_the_token() -> None:
    """SGLang appends the LoRA id to extra_key: it becomes the suffix, separating tree keys and scopes."""
    plain = parse_context_token(KEY, _token())
    lora = parse_context_token(KEY, _token() + "my-lora")
    assert lora.suffix == "my-lora"
    assert lora.scope(KEY) != plain.scope(KEY)  # another adapter's KV is never a candidate
    assert lora.cache_key(KEY) != plain.cache_key(KEY)


def test_cache_keys_separate_tenants_and_namespaces() -> None:
    """Different tenants or namespaces give different tree keys and scopes; the same gives the same."""
    a = parse_context_token(KEY, _token())
    b = parse_context_token(KEY, _token(tenant="globex"))
    c = parse_context_token(KEY, _token(namespace="ns2"))
    again = parse_context_token(KEY, _token())
    assert len({a.cache_key(KEY), b.cache_key(KEY), c.cache_key(KEY)}) == 3
    assert len({a.scope(KEY), b.scope(KEY), c.scope(KEY)}) == 3
    assert a.cache_key(KEY) == again.cache_key(KEY)


def test_anonymous_keys_never_equal_context_keys() -> None:
    """A request without a context cannot land in a tenant's tree, whatever extra_key it sends."""
    a = parse_context_token(KEY, _token())
    assert anonymous_cache_key(KEY, a.cache_key(KEY)) != a.cache_key(KEY)
    assert anonymous_cache_key(KEY, "x") != anonymous_cache_key(KEY, "y")
    assert anonymous_cache_key(KEY, None) == anonymous_cache_key(KEY, "")


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("tenant", "ac me", "printable ASCII"),
        ("tenant", "", "printable ASCII"),
        ("tenant", "a" * 129, "printable ASCII"),
        ("tenant", "аcme", "printable ASCII"),  # Cyrillic a: a confusable
        ("namespace", "ns\t1", "printable ASCII"),
        ("task", {"id": "qa"}, "version"),
        ("segments", [("system", 0, 10), ("evidence", 12, 30)], "starts at"),
        ("segments", [("boss", 0, 10)], "role"),
    ],
)
def test_bad_fields_are_refused_when_making_a_token(field: str, value: object, match: str) -> None:
    """Invalid ids, tasks and segments are refused, naming the field."""
    with pytest.raises(ContextError, match=match):
        _token(**{field: value})


def test_non_canonical_payload_is_refused_even_with_a_valid_mac() -> None:
    """A MAC over non-canonical JSON (e.g. duplicate keys) is refused: one context, one encoding."""
    import hashlib
    import hmac

    raw = b'{"namespace":"ns1","response_contract":{"id":"answer-json","schema_sha256":"' + b"a" * 64
    raw += b'"},"task":{"id":"qa","version":"1"},"tenant":"globex","tenant":"acme"}'
    payload = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
    mac = hmac.new(KEY, ("semgov1." + payload).encode(), hashlib.sha256).digest()
    tok = "semgov1." + payload + "." + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()
    with pytest.raises(ContextError, match="canonical"):
        parse_context_token(KEY, tok)
