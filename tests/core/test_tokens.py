"""Context tokens expire, name their audience and their key, and have one verifier (issue 31, item 2).

The published test vectors (docs/test-vectors/context-tokens.json) are checked twice: rebuilt with
the standard library alone (what a gateway in another language does), and verified by semgov.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

import pytest

from engine_hooks.core.tokens import verify_context
from semgov.context import (
    MAX_PREVIOUS_KEYS,
    ContextError,
    ContextKeys,
    key_id,
    make_context_token,
    parse_context_token,
)

VECTORS = Path(__file__).resolve().parents[2] / "docs" / "test-vectors" / "context-tokens.json"
KEY, OLD = b"k" * 32, b"o" * 32
AUD = "semgov-test"
TASK = {"id": "qa", "version": "1"}
CONTRACT = {"id": "answer-json", "schema_sha256": "a" * 64}
NOW = 1_800_000_000


def _token(key: bytes = KEY, **over: Any) -> str:
    args: dict[str, Any] = {"audience": AUD, "tenant": "acme", "namespace": "ns1", "task": TASK,
                            "response_contract": CONTRACT, "now": NOW}  # fmt: skip
    args.update(over)
    return make_context_token(key, **args)


def _kind(keys: ContextKeys, token: str, now: float = NOW) -> str | None:
    try:
        parse_context_token(keys, token, now=now)
    except ContextError as e:
        return e.kind
    return None


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _sign(key: bytes, doc: dict[str, Any]) -> str:
    """A token built with the standard library only: sorted compact JSON is RFC 8785 for ASCII text."""
    payload = _b64(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())
    return (
        "semgov1."
        + payload
        + "."
        + _b64(hmac.new(key, ("semgov1." + payload).encode(), hashlib.sha256).digest())
    )


def test_a_token_is_dead_at_exp_and_alive_just_before() -> None:
    """Time rounds toward refusal: a token verifies before exp, and is refused at exp and after."""
    keys = ContextKeys(KEY, AUD)
    tok = _token(expires_at=NOW + 60)
    assert _kind(keys, tok, NOW + 59.999) is None
    assert _kind(keys, tok, NOW + 60) == "expired" and _kind(keys, tok, NOW + 10**6) == "expired"


def test_a_token_for_another_audience_is_refused() -> None:
    """A token the gateway minted for another deployment does not verify here, whatever its MAC."""
    assert _kind(ContextKeys(KEY, AUD), _token(audience="another-deployment")) == "audience"
    assert _kind(ContextKeys(KEY, "another-deployment"), _token(audience="another-deployment")) is None


def test_a_lifetime_beyond_the_verifiers_bound_is_refused() -> None:
    """exp further ahead than max_lifetime_s is refused: a leaked token is worth a bounded time."""
    keys = ContextKeys(KEY, AUD, max_lifetime_s=600)
    assert _kind(keys, _token(expires_at=NOW + 600)) is None
    assert _kind(keys, _token(expires_at=NOW + 601)) == "lifetime"


def test_the_kid_must_name_the_key_that_macs_the_token() -> None:
    """A token MACed with one key that claims another key's id is refused."""
    doc = {"tenant": "acme", "namespace": "ns1", "task": TASK, "response_contract": CONTRACT,
           "aud": AUD, "exp": NOW + 60}  # fmt: skip
    keys = ContextKeys(KEY, AUD, (OLD,))
    assert _kind(keys, _sign(KEY, {**doc, "kid": key_id(KEY)})) is None
    assert _kind(keys, _sign(KEY, {**doc, "kid": key_id(OLD)})) == "key_id"
    assert _kind(keys, _sign(OLD, {**doc, "kid": key_id(OLD)})) is None


@pytest.mark.parametrize("missing", ["aud", "exp", "kid"])
def test_a_token_without_its_claims_is_refused(missing: str) -> None:
    """A token lacking aud, exp or kid (what every token was before these claims) never verifies."""
    doc = {"tenant": "acme", "namespace": "ns1", "task": TASK, "response_contract": CONTRACT,
           "aud": AUD, "exp": NOW + 60, "kid": key_id(KEY)}  # fmt: skip
    del doc[missing]
    with pytest.raises(ContextError, match=f"lacks the claim.*{missing}"):
        parse_context_token(ContextKeys(KEY, AUD), _sign(KEY, doc), now=NOW)


@pytest.mark.parametrize(("claim", "value"), [("exp", 1.5), ("exp", -1), ("exp", "1"), ("exp", True),
                                              ("aud", ""), ("aud", "a b"), ("kid", "short")])  # fmt: skip
def test_ill_typed_claims_are_refused(claim: str, value: object) -> None:
    """A float, negative, text or boolean exp, and an empty or spaced aud or a malformed kid, are refused."""
    doc: dict[str, Any] = {"tenant": "acme", "namespace": "ns1", "task": TASK, "response_contract": CONTRACT,
                           "aud": AUD, "exp": NOW + 60, "kid": key_id(KEY)}  # fmt: skip
    doc[claim] = value
    assert _kind(ContextKeys(KEY, AUD), _sign(KEY, doc)) is not None


def test_only_the_bounded_previous_keys_verify() -> None:
    """The previous key verifies during a rotation; keys past MAX_PREVIOUS_KEYS are never tried."""
    extra = [bytes([i]) * 32 for i in range(1, MAX_PREVIOUS_KEYS + 2)]
    keys = ContextKeys(KEY, AUD, tuple(extra))
    assert _kind(keys, _token(extra[0])) is None
    assert _kind(keys, _token(extra[-1])) == "mac"


def test_one_verdict_for_every_component() -> None:
    """verify_context is what the SGLang hook, the vLLM middleware and the connector call: a refused
    token is reported as refused (never as no token), an absent one as absent."""
    keys = ContextKeys(KEY, AUD)
    assert verify_context(keys, _token(now=None)).context is not None
    assert verify_context(keys, _token(audience="x", now=None)).refused
    assert verify_context(keys, None).refused is None
    assert verify_context(keys, "client-extra-key").refused is None  # SGLang: a client's own extra_key
    assert verify_context(keys, "client-extra-key", dedicated=True).refused  # vLLM: a token-only field


def _vectors() -> dict[str, Any]:
    return json.loads(VECTORS.read_text())


def test_the_published_vector_is_rebuilt_by_the_standard_library_alone() -> None:
    """The vector's token is exactly sorted compact JSON, base64url and HMAC-SHA256 of its claims,
    and its kid follows the documented rule: a gateway in any language can reproduce it."""
    v = _vectors()
    key = bytes.fromhex(v["key_hex"])
    assert _sign(key, v["claims"]) == v["token"]
    assert v["kid"] == _b64(hashlib.sha256(b"semgov.context-key-id/v1\x00" + key).digest()[:12])
    assert v["claims"]["kid"] == v["kid"] == key_id(key)
    c = v["claims"]
    made = make_context_token(
        key,
        audience=c["aud"],
        tenant=c["tenant"],
        namespace=c["namespace"],
        task=c["task"],
        response_contract=c["response_contract"],
        segments=[tuple(s) for s in c["segments"]],
        expires_at=c["exp"],
    )
    assert made == v["token"]


def test_semgov_accepts_exactly_the_published_valid_cases() -> None:
    """Every published case verifies or is refused (with the published kind) as the vectors say."""
    v = _vectors()
    keys = ContextKeys(
        bytes.fromhex(v["key_hex"]),
        v["verifier"]["audience"],
        (bytes.fromhex(v["previous_key_hex"]),),
        v["verifier"]["max_lifetime_s"],
    )
    assert len(v["cases"]) >= 7
    for case in v["cases"]:
        try:
            ctx = parse_context_token(keys, case["token"], lora_id=case.get("lora_id"), now=case["now"])
        except ContextError as e:
            assert not case["valid"] and e.kind == case["kind"], case["name"]
        else:
            assert case["valid"] and ctx.tenant == "acme", case["name"]
