"""Gateway context tokens: verification, parsing, and the server-side cache keys derived from them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from semgov.context import (
    ANON_KEY_PREFIX,
    KEY_PREFIX,
    MAX_LORA_ID_CHARS,
    MAX_TOKEN_CHARS,
    ContextError,
    ContextKeys,
    RequestContext,
    anonymous_cache_key,
    bounded_repr,
    key_id,
    make_context_token,
    parse_context_token,
)

KEY = b"k" * 32
AUD = "semgov-test"
KEYS = ContextKeys(KEY, AUD)
TASK = {"id": "qa", "version": "1"}
CONTRACT = {"id": "answer-json", "schema_sha256": "a" * 64}
LORA = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"  # what SGLang's lora_id looks like (uuid hex)
LORA_MISMATCH = "do not match the request's LoRA adapter"


def _token(**over: object) -> str:
    args: dict[str, object] = {
        "tenant": "acme",
        "namespace": "ns1",
        "task": TASK,
        "response_contract": CONTRACT,
        "segments": [("system", 0, 10), ("evidence", 10, 30)],
    }
    args.update(over)
    return make_context_token(KEY, audience=AUD, **args)  # type: ignore[arg-type]


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _signed(raw: bytes, key: bytes = KEY) -> str:
    """A token over arbitrary payload bytes, correctly MACed (what a buggy gateway could send)."""
    payload = _b64(raw)
    mac = hmac.new(key, ("semgov1." + payload).encode(), hashlib.sha256).digest()
    return "semgov1." + payload + "." + _b64(mac)


def _ctx(
    tenant: Any = "acme", namespace: Any = "ns1", lora_id: Any = None, segments: Any = None
) -> RequestContext:
    return RequestContext(tenant, namespace, dict(TASK), dict(CONTRACT), segments, lora_id)


def _only_context_error(extra_key: object, lora_id: object = None) -> None:
    try:
        parse_context_token(KEYS, extra_key, lora_id=lora_id)
    except ContextError as e:
        assert str(e)
    except Exception as e:  # noqa: BLE001 - what this helper exists to catch
        raise AssertionError(f"{type(e).__name__} (not ContextError) for {bounded_repr(extra_key)}") from e


# ---- verification -----------------------------------------------------------------------------------


def test_round_trip_keeps_every_field() -> None:
    """A token made with the key parses back to the same tenant, namespace, task, contract and segments."""
    ctx = parse_context_token(KEYS, _token())
    assert (ctx.tenant, ctx.namespace, ctx.task, ctx.response_contract) == ("acme", "ns1", TASK, CONTRACT)
    assert ctx.segments == (("system", 0, 10), ("evidence", 10, 30))
    assert ctx.lora_id is None


def test_wrong_key_is_refused() -> None:
    """A token MACed with another key does not verify."""
    with pytest.raises(ContextError, match="MAC does not verify"):
        parse_context_token(ContextKeys(b"x" * 32, AUD), _token())


def test_edited_payload_is_refused() -> None:
    """Changing the tenant inside a valid token breaks the MAC."""
    tok = _token()
    prefix, payload, mac = tok.split(".")
    doc = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    doc["tenant"] = "globex"
    forged = base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()
    with pytest.raises(ContextError, match="MAC"):
        parse_context_token(KEYS, f"{prefix}.{forged}.{mac}")


@pytest.mark.parametrize(
    "bad",
    [None, "", "plain-extra-key", "semgov1.", "semgov1.abc", "semgov1.abc.short", "semgov1.a*c." + "A" * 43],
)
def test_malformed_tokens_are_refused(bad: str | None) -> None:
    """Missing, truncated or non-base64 tokens are refused with a reason, never parsed."""
    with pytest.raises(ContextError):
        parse_context_token(KEYS, bad)


def test_mac_in_another_spelling_is_refused() -> None:
    """The MAC's last character with its two spare bits set decodes to the same bytes but is refused."""
    tok = _token()
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    other = alphabet[alphabet.index(tok[-1]) ^ 0b11]
    assert base64.urlsafe_b64decode(tok[-43:] + "=") == base64.urlsafe_b64decode(tok[-43:-1] + other + "=")
    with pytest.raises(ContextError, match="MAC does not verify"):
        parse_context_token(KEYS, tok[:-1] + other)


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("tenant", "ac me", "printable ASCII"),
        ("tenant", "", "printable ASCII"),
        ("tenant", "a" * 129, "printable ASCII"),
        ("tenant", "\u0430cme", "printable ASCII"),  # Cyrillic a: a confusable
        ("namespace", "ns\t1", "printable ASCII"),
        ("task", {"id": "qa"}, "task.version"),
        ("task", {"id": "q\ud800", "version": "1"}, "task.id"),  # a lone surrogate
        ("response_contract", {"id": "c", "schema_sha256": "A" * 64}, "response_contract.schema_sha256"),
        ("segments", [("system", 0, 10), ("evidence", 12, 30)], "expected to start at 10"),
        ("segments", [("boss", 0, 10)], "segments\\[0\\].role"),
        ("segments", [], "non-empty"),
    ],
)
def test_bad_fields_are_refused_when_making_a_token(field: str, value: object, match: str) -> None:
    """Invalid ids, tasks, contracts and segments are refused, naming the field."""
    with pytest.raises(ContextError, match=match):
        _token(**{field: value})


def test_non_canonical_payload_is_refused_even_with_a_valid_mac() -> None:
    """A MAC over non-canonical JSON (e.g. duplicate keys) is refused: one context, one encoding."""
    raw = b'{"namespace":"ns1","response_contract":{"id":"answer-json","schema_sha256":"' + b"a" * 64
    raw += b'"},"task":{"id":"qa","version":"1"},"tenant":"globex","tenant":"acme"}'
    with pytest.raises(ContextError, match="canonical"):
        parse_context_token(KEYS, _signed(raw))


def _doc(**over: object) -> dict[str, object]:
    doc: dict[str, object] = {
        "namespace": "ns1",
        "response_contract": CONTRACT,
        "task": TASK,
        "tenant": "acme",
        "aud": AUD,
        "kid": key_id(KEY),
        "exp": int(time.time()) + 300,
    }
    doc.update(over)
    return doc


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        # NOTE: documents with an expiry are built when the test runs, not at collection: a
        # suite that runs longer than the token lifetime would otherwise see "expired".
        ({"segments": None}, "segments"),
        ({"segments": []}, "segments"),
        ({"admin": True}, "unknown"),
        (b'{"tenant":' + b"[" * 6000 + b"]" * 6000 + b"}", "JSON"),  # deeper than the JSON reader goes
        (b'{"tenant":"\\ud800"}', "RFC 8785"),  # a lone surrogate has no canonical form
        (b'{"tenant":NaN}', "RFC 8785"),
        (b'{"tenant":"\xff"}', "UTF-8"),
        (b"[]", "not a JSON object"),
    ],
)
def test_well_formed_but_bad_payloads_are_refused(raw: bytes | dict[str, object], match: str) -> None:
    """Correctly MACed payloads that are not a canonical, documented context are refused, never raise."""
    if isinstance(raw, dict):
        raw = json.dumps(_doc(**raw), sort_keys=True, separators=(",", ":")).encode()
    with pytest.raises(ContextError, match=match):
        parse_context_token(KEYS, _signed(raw))


def test_non_canonical_base64_payload_is_refused() -> None:
    """A payload whose base64url has spare bits set (same bytes, other text) is refused even with a MAC."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    payload = next(p for t in ("acme", "acme1", "acme12") if len(p := _token(tenant=t).split(".")[1]) % 4)
    spare = 0b1111 if len(payload) % 4 == 2 else 0b11  # the bits the decoder drops
    last = alphabet.index(payload[-1])
    assert last & spare == 0
    other = payload[:-1] + alphabet[last | spare]
    assert base64.urlsafe_b64decode(other + "==") == base64.urlsafe_b64decode(payload + "==")
    mac = hmac.new(KEY, ("semgov1." + other).encode(), hashlib.sha256).digest()
    with pytest.raises(ContextError, match="canonical base64url"):
        parse_context_token(KEYS, "semgov1." + other + "." + _b64(mac))


# ---- totality: any input is a ContextError or a context, never another exception -------------------------

HOSTILE_CHARS = ["\udcff", "\ud800", "\udfff", "\ud83d", "é", "\u202e", "\x00", "\U0001f600", "\ufeff", " "]


@pytest.mark.parametrize("ch", HOSTILE_CHARS)
@pytest.mark.parametrize("lora", [None, LORA])
def test_non_ascii_and_lone_surrogates_anywhere_are_context_errors(ch: str, lora: str | None) -> None:
    """A non-ASCII character or lone surrogate before, inside or after a valid token is a ContextError."""
    tok = _token()
    suffix = lora or ""
    places = [
        ch + tok,
        tok[:5] + ch + tok[5:],
        tok[:40] + ch + tok[40:],
        tok[:-10] + ch + tok[-10:],
        tok + ch,
    ]
    for extra_key in places:
        with pytest.raises(ContextError):
            parse_context_token(KEYS, extra_key + suffix, lora_id=lora)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40), st.integers(min_value=0), st.one_of(st.none(), st.text(max_size=40)))
def test_any_text_spliced_into_a_token_is_a_context_error_or_the_same_context(
    junk: str, at: int, lora: str | None
) -> None:
    """Any text (lone surrogates too) spliced anywhere into a token is a ContextError, never another error."""
    tok = _token()
    i = at % (len(tok) + 1)
    extra_key = tok[:i] + junk + tok[i:] + (lora or "")
    try:
        ctx = parse_context_token(KEYS, extra_key, lora_id=lora)
    except ContextError as e:
        assert str(e)
        return
    assert junk == "" or tok[:i] + junk + tok[i:] == tok  # only the untouched token verifies
    assert ctx.lora_id == lora


_ANY = st.one_of(
    st.none(),
    st.text(),
    st.binary(),
    st.integers(),
    st.floats(),
    st.booleans(),
    st.lists(st.text(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(_ANY, _ANY)
def test_any_objects_are_context_errors(extra_key: object, lora_id: object) -> None:
    """parse_context_token raises only ContextError for any Python objects as extra_key and lora_id."""
    _only_context_error(extra_key, lora_id)


class _HostileStr(str):
    """A str subclass whose methods all lie or raise."""

    def __len__(self) -> int:
        raise RuntimeError("len")

    def __getitem__(self, i: object) -> str:
        raise RuntimeError("getitem")

    def startswith(self, *a: object) -> bool:
        raise RuntimeError("startswith")

    def endswith(self, *a: object) -> bool:
        raise RuntimeError("endswith")

    def encode(self, *a: object, **k: object) -> bytes:
        raise RuntimeError("encode")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("eq")

    __hash__ = str.__hash__


class _FakeStr:
    """Not a str, but claims to be one to isinstance."""

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # noqa: N802
        return str

    def __repr__(self) -> str:
        raise RuntimeError("repr")


def test_non_str_inputs_are_refused() -> None:
    """bytes, ints, lists, a fake str and non-str LoRA ids are refused as ContextError naming the type."""
    tok = _token()
    for extra_key in (tok.encode(), 7, [tok], {"extra_key": tok}, 1.5, _FakeStr(), object()):
        with pytest.raises(ContextError, match="not a string"):
            parse_context_token(KEYS, extra_key)
    for lora in (7, b"lora", [LORA], _FakeStr()):
        with pytest.raises(ContextError, match="lora_id is not a string"):
            parse_context_token(KEYS, tok, lora_id=lora)


def test_a_hostile_str_subclass_is_read_as_its_text() -> None:
    """A str subclass whose methods raise is read as plain text: it parses like the token it holds."""
    tok = _token()
    ctx = parse_context_token(KEYS, _HostileStr(tok + LORA), lora_id=_HostileStr(LORA))
    assert ctx == parse_context_token(KEYS, tok + LORA, lora_id=LORA)
    assert type(ctx.lora_id) is str
    assert anonymous_cache_key(KEY, _HostileStr("x"), _HostileStr("y")) == anonymous_cache_key(KEY, "x", "y")
    assert ctx.cache_key(KEY, _HostileStr("salt")) == ctx.cache_key(KEY, "salt")


def test_work_is_bounded_before_anything_else() -> None:
    """A huge extra_key or LoRA id is refused by its length, whatever it holds."""
    with pytest.raises(ContextError, match="longer than"):
        parse_context_token(KEYS, "\udcff" * (MAX_TOKEN_CHARS + 1))
    with pytest.raises(ContextError, match="longer than"):
        parse_context_token(KEYS, _token() + "x" * MAX_TOKEN_CHARS)
    huge = "L" * (MAX_LORA_ID_CHARS + 1)
    with pytest.raises(ContextError, match="LoRA id longer than"):
        parse_context_token(KEYS, _token() + huge, lora_id=huge)
    with pytest.raises(ContextError, match="longer than"):
        _token(segments=[("other", i, i + 1) for i in range(4000)])  # the gateway cannot mint one either


# ---- LoRA binding ---------------------------------------------------------------------------------------


def test_lora_id_comes_from_the_server_and_must_match_the_suffix() -> None:
    """token + lora_id parses with that lora_id; the context carries it, and keys differ per adapter."""
    plain = parse_context_token(KEYS, _token())
    lora = parse_context_token(KEYS, _token() + LORA, lora_id=LORA)
    other = parse_context_token(KEYS, _token() + "other-adapter", lora_id="other-adapter")
    assert lora.lora_id == LORA
    assert len({plain.scope(KEY), lora.scope(KEY), other.scope(KEY)}) == 3  # never another adapter's KV
    assert len({plain.cache_key(KEY), lora.cache_key(KEY), other.cache_key(KEY)}) == 3


@pytest.mark.parametrize(
    ("suffix", "lora"),
    [
        ("X", None),  # the client appended text: not an adapter
        (LORA, None),  # the client appended an adapter's id itself
        ("", "X"),  # the request runs under adapter X but extra_key lacks it
        ("Y", "X"),  # another adapter
        ("XX", "X"),  # extra text before the adapter id
        (LORA + LORA, LORA),
    ],
)
def test_trailing_text_that_is_not_the_request_adapter_is_refused(suffix: str, lora: str | None) -> None:
    """extra_key must be exactly the token, or the token followed by the request's lora_id."""
    with pytest.raises(ContextError, match=LORA_MISMATCH):
        parse_context_token(KEYS, _token() + suffix, lora_id=lora)


def test_token_tail_cannot_pose_as_the_adapter() -> None:
    """A lora_id equal to the MAC's last characters does not let extra_key = token through."""
    tok = _token()
    with pytest.raises(ContextError, match="truncated"):
        parse_context_token(KEYS, tok, lora_id=tok[-3:])


def test_empty_lora_id_means_extra_key_is_the_token() -> None:
    """lora_id "" (nothing appended by SGLang) accepts exactly the token, and stays its own adapter value."""
    ctx = parse_context_token(KEYS, _token(), lora_id="")
    assert ctx.lora_id == ""
    with pytest.raises(ContextError, match=LORA_MISMATCH):
        parse_context_token(KEYS, _token() + "X", lora_id="")


# ---- derived keys -------------------------------------------------------------------------------------


def test_cache_keys_separate_tenants_and_namespaces() -> None:
    """Different tenants or namespaces give different tree keys and scopes; the same gives the same."""
    a = parse_context_token(KEYS, _token())
    b = parse_context_token(KEYS, _token(tenant="globex"))
    c = parse_context_token(KEYS, _token(namespace="ns2"))
    again = parse_context_token(KEYS, _token())
    assert len({a.cache_key(KEY), b.cache_key(KEY), c.cache_key(KEY)}) == 3
    assert len({a.scope(KEY), b.scope(KEY), c.scope(KEY)}) == 3
    assert a.cache_key(KEY) == again.cache_key(KEY)


def test_keys_have_the_documented_shape() -> None:
    """Tree keys and scopes are 'semgov:' + 32 hex, anonymous keys 'semgov:anon:' + 32 hex; they differ."""
    ctx = parse_context_token(KEYS, _token())
    for k in (ctx.cache_key(KEY), ctx.scope(KEY), ctx.cache_key(KEY, "s")):
        assert k.startswith(KEY_PREFIX) and len(k) == len(KEY_PREFIX) + 32
        int(k[len(KEY_PREFIX) :], 16)
    anon = anonymous_cache_key(KEY, "x")
    assert anon.startswith(ANON_KEY_PREFIX) and len(anon) == len(ANON_KEY_PREFIX) + 32
    assert ctx.scope(KEY) != ctx.cache_key(KEY)  # domain tags: a scope is never a tree key


def test_cache_salt_separates_scopes_and_trees() -> None:
    """Different cache salts never share a scope or a tree key; None and "" both mean no salt."""
    ctx = parse_context_token(KEYS, _token())
    for f in (ctx.scope, ctx.cache_key):
        assert len({f(KEY), f(KEY, "s1"), f(KEY, "s2")}) == 3
        assert f(KEY, None) == f(KEY, "") == f(KEY)
    assert anonymous_cache_key(KEY, "x", None, "s1") != anonymous_cache_key(KEY, "x", None, "s2")
    assert anonymous_cache_key(KEY, "x", None, "") == anonymous_cache_key(KEY, "x", None, None)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        # (tenant, namespace, lora_id, cache_salt): pairs a NUL- or concatenation-joined encoding confuses
        (("a", "b\x00c", None, None), ("a\x00b", "c", None, None)),
        (("a", "bc", None, None), ("ab", "c", None, None)),
        (("acme", "ns1", "x", None), ("acme", "ns1x", None, None)),
        (("acme", "ns1", "s", None), ("acme", "ns1", None, "s")),  # an adapter is not a salt
        (("acme", "ns1", "", None), ("acme", "ns1", None, None)),
        (("acme", "ns1", "a\x00", "b"), ("acme", "ns1", "a", "\x00b")),
        (("acme", "ns1", "\ud800", None), ("acme", "ns1", "\ufffd", None)),
    ],
)
def test_separator_collision_pairs_get_distinct_keys(a: tuple[Any, ...], b: tuple[Any, ...]) -> None:
    """Fields are length-prefixed: moving text between fields, or a NUL inside one, changes the key."""
    ca, cb = _ctx(*a[:3]), _ctx(*b[:3])
    assert ca.cache_key(KEY, a[3]) != cb.cache_key(KEY, b[3])
    assert ca.scope(KEY, a[3]) != cb.scope(KEY, b[3])


_FIELD = st.one_of(st.none(), st.text(max_size=12))


def _salted(salt: str | None) -> str | None:
    return salt or None


@settings(max_examples=400, deadline=None)
@given(
    st.tuples(st.text(max_size=12), st.text(max_size=12), _FIELD, _FIELD),
    st.tuples(st.text(max_size=12), st.text(max_size=12), _FIELD, _FIELD),
)
def test_context_keys_are_injective_over_arbitrary_text(a: tuple[Any, ...], b: tuple[Any, ...]) -> None:
    """For any text fields (surrogates, NULs), scope and tree key are equal exactly when the fields are."""
    ca, cb = _ctx(*a[:3]), _ctx(*b[:3])
    same = a[:3] == b[:3] and _salted(a[3]) == _salted(b[3])
    assert (ca.cache_key(KEY, a[3]) == cb.cache_key(KEY, b[3])) == same
    assert (ca.scope(KEY, a[3]) == cb.scope(KEY, b[3])) == same
    assert ca.scope(KEY, a[3]) != cb.cache_key(KEY, b[3])


def test_key_derivation_never_raises_on_odd_field_values() -> None:
    """A context built with non-str fields (or a hostile repr) still gets keys, and distinct ones."""
    odd = [_ctx(7, "ns1"), _ctx(b"acme", "ns1"), _ctx("acme", ["ns1"]), _ctx(_FakeStr(), "ns1"), _ctx()]
    keys = {c.cache_key(KEY, s) for c in odd for s in (None, "s")}
    assert len(keys) == 2 * len(odd)


def test_anonymous_keys_never_equal_context_keys() -> None:
    """A request without a context cannot land in a tenant's tree, whatever extra_key it sends."""
    a = parse_context_token(KEYS, _token())
    assert anonymous_cache_key(KEY, a.cache_key(KEY)) != a.cache_key(KEY)
    assert anonymous_cache_key(KEY, "x") != anonymous_cache_key(KEY, "y")
    assert anonymous_cache_key(KEY, None) != anonymous_cache_key(KEY, "")  # distinct inputs, distinct keys
    assert anonymous_cache_key(KEY, "x", None) != anonymous_cache_key(KEY, "", "x")  # SGLang joins them
    assert anonymous_cache_key(KEY, "x") != anonymous_cache_key(KEY, b"x")


_ANON_FIELD = st.one_of(st.none(), st.text(max_size=16))


@settings(max_examples=400, deadline=None)
@given(
    st.tuples(_ANON_FIELD, _ANON_FIELD, _ANON_FIELD),
    st.tuples(_ANON_FIELD, _ANON_FIELD, _ANON_FIELD),
)
def test_anonymous_keys_are_total_and_injective(a: tuple[Any, ...], b: tuple[Any, ...]) -> None:
    """anonymous_cache_key takes any text (lone surrogates too) and maps distinct inputs to distinct keys."""
    ka, kb = anonymous_cache_key(KEY, *a), anonymous_cache_key(KEY, *b)
    assert ka.startswith(ANON_KEY_PREFIX)
    same = a[:2] == b[:2] and _salted(a[2]) == _salted(b[2])
    assert (ka == kb) == same


def test_anonymous_keys_of_odd_objects_never_raise() -> None:
    """Non-str extra_key, lora_id and cache_salt (a raising repr, deep nesting) still get a key."""
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    for v in (_FakeStr(), deep, object(), 1.5, {"a": 1}, b"\xff", _HostileStr("x")):
        assert anonymous_cache_key(KEY, v, v, v).startswith(ANON_KEY_PREFIX)


# ---- the governor -------------------------------------------------------------------------------------


class _Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **kw: Any) -> None:
        self.lines.append((event, kw))


def test_governor_context_of_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """context_of returns None for refused tokens and even for a parser bug, logging a bounded repr only."""
    import engine_hooks.core.governor as governor
    import engine_hooks.core.tokens as tokens

    log = _Log()
    monkeypatch.setattr(tokens, "get_logger", lambda: log)
    gov = SimpleNamespace(context_keys=KEYS)
    gov.verdict_of = lambda *a, **k: governor.Governor.verdict_of(gov, *a, **k)  # type: ignore[arg-type]
    ctx = governor.Governor.context_of(gov, _token() + LORA, LORA)  # type: ignore[arg-type]
    assert ctx is not None and ctx.lora_id == LORA
    assert governor.Governor.context_of(gov, _token() + "X") is None  # type: ignore[arg-type]
    assert governor.Governor.context_of(gov, "plain") is None  # type: ignore[arg-type]
    assert governor.Governor.context_of(gov, 5, [1]) is None  # type: ignore[arg-type]
    assert [e for e, _ in log.lines] == ["semgov context token refused"]  # only the semgov1. token

    def broken(*a: object, **k: object) -> RequestContext:
        raise RuntimeError("parser bug")

    monkeypatch.setattr(tokens, "parse_context_token", broken)
    sent = "semgov1." + "\udcff" * 100_000
    assert governor.Governor.context_of(gov, sent, _FakeStr()) is None  # type: ignore[arg-type]
    event, kw = log.lines[-1]
    assert event == "semgov context token parser failed" and kw["error"] == "RuntimeError"
    assert len(kw["token"]) < 200 and kw["token"].isascii()
    assert kw["lora_id"] == "<_FakeStr>"  # its real type; its repr is never called


# Documents near the valid ones: a valid context, then up to three fields replaced by right or
# wrong types, lengths at the limits and odd characters.
_text = st.one_of(
    st.sampled_from(["acme", "ns1", "qa", "1", "", "a" * 128, "a" * 129, "a" * 512, "a" * 513, "a b", "é"]),
    st.sampled_from(["\ud800", "qa\udfff", "😀" * 512]),  # lone surrogates: the models refuse them
    st.text(max_size=6),
)
_scalar = st.one_of(
    _text, st.integers(-3, 3), st.integers(2**62, 2**70), st.booleans(), st.none(), st.floats(0, 2)
)
_hex = st.one_of(
    st.sampled_from(["a" * 64, "A" * 64, "a" * 63]), st.text("0123456789abcdef", min_size=64, max_size=64)
)
_segment = st.one_of(
    st.tuples(st.sampled_from(["system", "evidence", "question", "Evidence"]), _scalar, _scalar).map(list),
    st.lists(_scalar, max_size=4),
)
_run = st.sampled_from(["r1-c0", "r1", "", "bad run", "a" * 48, "a" * 49, "r1/c0"])
_claim = st.one_of(
    st.fixed_dictionaries(
        {"run": _run, "role": st.sampled_from(["donor", "cold", "recipient", "release", "admin"])},
        optional={"plan": st.sampled_from(["bookend:16+256", "trailing:128", "none", "BAD", "a" * 80]),
                  "extra": _scalar},
    ),
    _scalar,
)  # fmt: skip
_changes = {
    "tenant": _text,
    "namespace": st.one_of(
        _text, st.sampled_from(["ns1/semgov-calibration/r1-c0", "/semgov-calibration/r1"])
    ),
    "calibration": _claim,
    "task": st.one_of(st.fixed_dictionaries({"id": _text, "version": _text}), _scalar),
    "task.id": _text,
    "response_contract": st.one_of(st.fixed_dictionaries({"id": _text, "schema_sha256": _hex}), _scalar),
    "response_contract.schema_sha256": _hex,
    "segments": st.one_of(st.lists(_segment, max_size=4), _scalar),
    "segments.end": st.one_of(st.integers(-1, 12), st.integers(2**62, 2**70), st.booleans()),
    "extra": _scalar,
}


@st.composite
def _obj(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "tenant": "acme",
        "namespace": "ns1",
        "task": dict(TASK),
        "response_contract": dict(CONTRACT),
        "segments": [["system", 0, 3], ["evidence", 3, 9]],
    }
    if draw(st.booleans()):
        del doc["segments"]
    for name in draw(st.lists(st.sampled_from(sorted(_changes)), max_size=3)):
        value = draw(_changes[name])
        if name == "task.id" and isinstance(doc.get("task"), dict):
            doc["task"]["id"] = value
        elif name == "response_contract.schema_sha256" and isinstance(doc.get("response_contract"), dict):
            doc["response_contract"]["schema_sha256"] = value
        elif name == "segments.end" and isinstance(doc.get("segments"), list) and doc["segments"]:
            last = doc["segments"][-1]
            if isinstance(last, list) and last:
                last[-1] = value
        elif "." not in name:
            doc[name] = value
    return doc


@settings(max_examples=4000, deadline=None)
@given(_obj())
def test_the_fast_validation_accepts_only_what_the_models_accept_and_means_the_same(
    doc: dict[str, Any],
) -> None:
    """Whatever the fast path accepts, the wire models accept too, with exactly the same context."""
    from semgov.context import _valid_fast, _validate_models

    doc = json.loads(json.dumps(doc))  # NOTE: JSON's own types, as the parser sees them
    fast = _valid_fast(doc, "lora")
    if fast is None:
        return
    assert _validate_models(doc, "lora") == fast


def test_the_fast_validation_takes_a_gateways_usual_context() -> None:
    """A plain valid context (segments included) is accepted by the fast path, not left to the models."""
    from semgov.context import _valid_fast

    token = _token(segments=[("system", 0, 3), ("evidence", 3, 9)])
    payload = token.split(".")[1]
    doc = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert {doc.pop("aud"), doc.pop("kid")} == {AUD, key_id(KEY)} and doc.pop("exp") > time.time()
    fast = _valid_fast(doc, None)
    assert fast is not None and fast == parse_context_token(KEYS, token)


# ---- the calibration claim -----------------------------------------------------------------------


def test_a_calibration_claim_round_trips_in_its_runs_namespace() -> None:
    """A token with a calibration claim and the run's namespace parses to a context that carries it."""
    from semgov.context import CalibrationClaim, calibration_namespace

    claim = CalibrationClaim("r7-c3", "recipient", "bookend:16+256")
    ns = calibration_namespace("acme/research", "r7-c3")
    assert ns == "acme/research/semgov-calibration/r7-c3"
    ctx = parse_context_token(KEYS, _token(namespace=ns, calibration=claim))
    assert ctx.calibration == claim and ctx.namespace == ns


@pytest.mark.parametrize(
    "namespace, claim, match",
    [
        ("acme/research", ("r7", "donor", None), "must be <namespace>/semgov-calibration/<run>"),
        ("acme/semgov-calibration/r8", ("r7", "donor", None), "must be <namespace>/semgov-calibration/<run>"),
        ("/semgov-calibration/r7", ("r7", "donor", None), "must be <namespace>/semgov-calibration/<run>"),
        ("a/semgov-calibration/r7", ("r7", "recipient", None), "plan is given for the recipient role"),
        ("a/semgov-calibration/r7", ("r7", "donor", "none"), "plan is given for the recipient role"),
        ("a/semgov-calibration/r7", ("r7", "admin", None), "role must be one of"),
        ("a/semgov-calibration/r/7", ("r/7", "donor", None), "calibration.run must be"),
    ],
)
def test_a_calibration_claim_out_of_its_namespace_or_malformed_is_refused(
    namespace: str, claim: tuple[str, str, str | None], match: str
) -> None:
    """A claim whose namespace is not its run's, or whose role or plan is wrong, is refused by name."""
    from semgov.context import CalibrationClaim

    with pytest.raises(ContextError, match=match):
        _token(namespace=namespace, calibration=CalibrationClaim(*claim))


def test_the_calibration_namespace_is_reserved_for_claims() -> None:
    """A context claiming a calibration run's namespace without the claim is refused (MAC or not)."""
    with pytest.raises(ContextError, match="reserved for calibration runs"):
        _token(namespace="acme/semgov-calibration/r7")
    doc = {**_doc(), "namespace": "acme/semgov-calibration/r7"}
    with pytest.raises(ContextError, match="reserved for calibration runs"):
        parse_context_token(KEYS, _signed(json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()))


def test_calibration_namespaces_separate_scopes_from_production() -> None:
    """A calibration run's donors live in a scope no production request of the namespace shares."""
    from semgov.context import CalibrationClaim, calibration_namespace

    prod = parse_context_token(KEYS, _token(namespace="acme/research"))
    ns = calibration_namespace("acme/research", "r1")
    cal = parse_context_token(KEYS, _token(namespace=ns, calibration=CalibrationClaim("r1", "donor")))
    other = parse_context_token(
        KEYS,
        _token(
            namespace=calibration_namespace("acme/research", "r2"),
            calibration=CalibrationClaim("r2", "donor"),
        ),
    )
    scopes = {c.scope(KEY) for c in (prod, cal, other)}
    assert len(scopes) == 3
