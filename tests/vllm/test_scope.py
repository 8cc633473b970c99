"""The vLLM scope middleware (engine_hooks/vllm/scope.py) as an ASGI component: the body vLLM
receives has a server-derived `cache_salt` whatever the client sent, on every route (the real
vLLM server runs it against its own route table in tests/vllm/test_vllm_server.py)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from engine_hooks.core.metrics import hook_metrics
from engine_hooks.core.settings import HookConfigError
from engine_hooks.vllm.scope import MAX_JSON_DEPTH, ScopeSalt, issued_salt, scope_body, scoped_salt
from semgov.context import ContextKeys, RequestContext, anonymous_cache_key, make_context_token

KEY = b"k" * 32
OLD_KEY = b"o" * 32
AUDIENCE = "semgov-test"
KEYS = ContextKeys(KEY, AUDIENCE)
TASK = {"id": "qa", "version": "1"}
CONTRACT = {"id": "answer", "schema_sha256": "ab" * 32}


def token(tenant: str = "acme", namespace: str = "ns1", key: bytes = KEY, **claims: Any) -> str:
    claims.setdefault("audience", AUDIENCE)
    return make_context_token(
        key, tenant=tenant, namespace=namespace, task=TASK, response_contract=CONTRACT, **claims
    )


def salt_of(doc: dict[str, Any], keys: ContextKeys = KEYS) -> str:
    return scoped_salt(keys, doc).salt


def body(tok: str | None = None, **over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 1, **over}
    if tok is not None:
        doc["kv_transfer_params"] = {"semgov_context": tok}
    return doc


@pytest.fixture
def middleware(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ScopeSalt, list[dict[str, Any]]]:
    key = tmp_path / "context.key"
    key.write_bytes(KEY)
    monkeypatch.setenv("SEMGOV_CONTEXT_KEY", str(key))
    monkeypatch.setenv("SEMGOV_CONTEXT_AUDIENCE", AUDIENCE)
    monkeypatch.delenv("SEMGOV_CONTEXT_KEY_PREVIOUS", raising=False)
    monkeypatch.setenv("SEMGOV_MAX_BODY_MB", "0.01")
    seen: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        msg = await receive()
        seen.append({"path": scope["path"], "body": msg["body"], "headers": dict(scope["headers"])})
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return ScopeSalt(app), seen


def call(
    mw: ScopeSalt,
    raw: bytes,
    path: str = "/v1/completions",
    method: str = "POST",
    chunk: int = 0,
    content_type: bytes = b"application/json",
) -> int:
    """Send one request through the middleware (in ``chunk``-byte pieces); the status answered."""
    pieces = [raw[i : i + chunk] for i in range(0, len(raw), chunk)] if chunk else [raw]
    msgs = [
        {"type": "http.request", "body": p, "more_body": i < len(pieces) - 1} for i, p in enumerate(pieces)
    ]
    out: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return msgs.pop(0) if msgs else {"type": "http.disconnect"}

    async def send(msg: dict[str, Any]) -> None:
        out.append(msg)

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": [(b"content-type", content_type), (b"content-length", str(len(raw)).encode())],
    }
    asyncio.run(mw(scope, receive, send))
    return int(out[0]["status"])


def test_a_valid_context_salts_by_tenant_namespace_model_and_client_salt() -> None:
    """A valid token's salt is the tenant scope's keyed tree key (model folded in as the adapter,
    the client's salt only narrowing it), tagged; another tenant, namespace, model or salt differs."""
    scoped = scoped_salt(KEYS, body(token()))
    ctx = RequestContext("acme", "ns1", TASK, CONTRACT, None, "tiny")
    assert scoped.tenant == "acme" and scoped.salt.startswith(ctx.cache_key(KEY, None) + ".")
    assert issued_salt(KEY, scoped.salt) and not issued_salt(OLD_KEY, scoped.salt)
    others = {
        salt_of(body(token("globex"))),
        salt_of(body(token("acme", "ns2"))),
        salt_of(body(token(), model="tiny-lora")),
        salt_of(body(token(), cache_salt="mine")),
    }
    assert scoped.salt not in others and len(others) == 4


def test_a_token_sent_and_not_trusted_gets_a_salt_of_its_own() -> None:
    """A forged, expired, other-audience, long-lived or garbage token never lands in a shared
    bucket: each request gets a salt no other request has, and the refusal is counted."""
    tenant_salt = salt_of(body(token()))
    anon_salt = salt_of(body())
    refused = hook_metrics().context_refused
    before = {
        k: refused.labels(k)._value.get() for k in ("mac", "expired", "audience", "lifetime", "malformed")
    }
    bad = [
        token(key=b"x" * 32),
        token(expires_at=1_000_000),
        token(audience="another-deployment"),
        token(lifetime_s=10 * 86400),
        "semgov1.garbage.x",
        7,
    ]
    salts = []
    for tok in bad:
        for _ in range(2):
            scoped = scoped_salt(KEYS, body(None, kv_transfer_params={"semgov_context": tok}))
            assert scoped.tenant is None and scoped.refused and issued_salt(KEY, scoped.salt)
            salts.append(scoped.salt)
    assert len(set(salts)) == len(salts) and not {tenant_salt, anon_salt} & set(salts)
    after = {k: refused.labels(k)._value.get() for k in before}
    assert all(after[k] - before[k] >= 2 for k in before), (before, after)


def test_without_a_token_the_salt_is_the_anonymous_one_for_what_was_sent() -> None:
    """No token: the keyed anonymous salt of model and client salt, never a tenant's, whatever
    salt the client sends (even a copy of a tenant's)."""
    tenant_salt = salt_of(body(token()))
    for doc in (body(), body(None, cache_salt=tenant_salt), body(None, kv_transfer_params="nope")):
        scoped = scoped_salt(KEYS, doc)
        base = anonymous_cache_key(KEY, "vllm", doc.get("model"), doc.get("cache_salt"))
        assert scoped.tenant is None and scoped.refused is None and scoped.salt.startswith(base + ".")
        assert scoped.salt != tenant_salt


def test_a_previous_key_token_is_the_same_tenant_scope_during_a_rotation() -> None:
    """With the previous key in the one key set, its tokens get the tenant's salt (the same as a
    current-key token's); without it they are refused with a salt of their own, never anonymous."""
    rotating = ContextKeys(KEY, AUDIENCE, (OLD_KEY,))
    current = scoped_salt(rotating, body(token()))
    old = scoped_salt(rotating, body(token(key=OLD_KEY)))
    assert old.tenant == "acme" and old.salt == current.salt
    after = scoped_salt(KEYS, body(token(key=OLD_KEY)))
    assert after.tenant is None and after.refused and after.salt != salt_of(body())


def test_the_body_vllm_receives_carries_the_derived_salt(
    middleware: tuple[ScopeSalt, list[dict[str, Any]]],
) -> None:
    """The client's cache_salt is replaced, the token kept for the connector, the body reassembled
    from chunks and its content-length set anew."""
    mw, seen = middleware
    raw = json.dumps(body(token(), cache_salt="client-chosen")).encode()
    assert call(mw, raw, chunk=50) == 200
    got = json.loads(seen[0]["body"])
    assert got["cache_salt"] == salt_of(body(token(), cache_salt="client-chosen"))
    assert got["kv_transfer_params"] == {"semgov_context": token()}
    assert seen[0]["headers"][b"content-length"] == str(len(seen[0]["body"])).encode()


@pytest.mark.parametrize(
    "path, method",
    [
        ("/v1/messages", "POST"),
        ("/invocations", "POST"),
        ("/inference/v1/generate", "POST"),
        ("/v1/completions/", "POST"),
        ("//v1/completions", "POST"),
        ("/prefix/v1/chat/completions", "POST"),
        ("/v1/completions", "PUT"),
        ("/a-route-added-in-a-later-vllm", "POST"),
    ],
)
def test_every_route_and_method_is_scoped(
    middleware: tuple[ScopeSalt, list[dict[str, Any]]], path: str, method: str
) -> None:
    """Isolation does not depend on a list of routes: any JSON object body on any path or method
    reaches vLLM with the derived salt, never the client's."""
    mw, seen = middleware
    assert call(mw, json.dumps(body(token(), cache_salt="shared")).encode(), path=path, method=method) == 200
    assert json.loads(seen[0]["body"])["cache_salt"] == salt_of(body(token(), cache_salt="shared"))


def test_a_cache_salt_semgov_cannot_scope_is_refused(
    middleware: tuple[ScopeSalt, list[dict[str, Any]]],
) -> None:
    """A cache_salt nested in the object, in a JSON array, or in a form body (any spelling a form
    parser decodes) is refused with 400, and nothing reaches vLLM."""
    mw, seen = middleware
    cases = [
        (
            json.dumps(
                body(None, kv_transfer_params={"semgov_context": token(), "cache_salt": "x"})
            ).encode(),
            b"application/json",
        ),
        (
            json.dumps(body(None, messages=[{"role": "user", "content": "x", "cache_salt": "y"}])).encode(),
            b"application/json",
        ),
        (json.dumps([body(None, cache_salt="x")]).encode(), b"application/json"),
        (b"model=tiny&cache_salt=shared", b"application/x-www-form-urlencoded"),
        (b"model=tiny&cache%5Fsalt=shared", b"application/x-www-form-urlencoded"),
        (b"model=tiny&CACHE%5fSALT=shared", b"application/x-www-form-urlencoded"),
        (
            b'--b\r\nContent-Disposition: form-data; name="cache_salt"\r\n\r\nx\r\n--b--',
            b"multipart/form-data",
        ),
        ("cache_salt=x".encode("utf-16"), b"application/x-www-form-urlencoded"),
    ]
    for raw, ctype in cases:
        assert call(mw, raw, content_type=ctype) == 400, raw[:60]
    assert seen == []


def test_what_carries_no_salt_passes_unchanged(middleware: tuple[ScopeSalt, list[dict[str, Any]]]) -> None:
    """Empty bodies, JSON that is not an object, and forms (an audio upload) without a cache salt
    reach vLLM as sent; they reach the engine without a salt, which the connector counts."""
    mw, seen = middleware
    audio = bytes(range(256)) * 40  # brackets and quotes in binary: not JSON, not depth-checked
    raw = [b"", b"[1, 2]", b"not json", b"--b\r\nContent-Disposition: form-data; name=file\r\n\r\n" + audio]
    assert call(mw, raw[0], path="/v1/models", method="GET") == 200
    for r in raw[1:]:
        assert call(mw, r, content_type=b"multipart/form-data; boundary=b") == 200
    assert [s["body"] for s in seen] == raw


def test_deep_json_is_a_clear_400_not_a_crash(middleware: tuple[ScopeSalt, list[dict[str, Any]]]) -> None:
    """JSON nested past MAX_JSON_DEPTH (as UTF-8 or UTF-16) is refused with 400 before any
    recursive parse; nothing raises into the server."""
    mw, seen = middleware
    for depth in (MAX_JSON_DEPTH + 1, 1500):  # within the fixture's 0.01 MB body limit
        raw = b'{"a":' * depth + b"1" + b"}" * depth
        assert call(mw, raw) == 400
        assert call(mw, b"[" * depth + b"]" * depth) == 400
    deep16 = ('{"a":' * 800 + "1" + "}" * 800).encode("utf-16")
    assert call(mw, deep16) == 400
    ok = b'{"a":' * (MAX_JSON_DEPTH - 1) + b"1" + b"}" * (MAX_JSON_DEPTH - 1)
    assert call(mw, ok) == 200 and len(seen) == 1


def test_scope_body_is_total_on_hostile_bodies() -> None:
    """scope_body answers a body or a Refused for arbitrary bytes, never another exception."""
    import random

    from engine_hooks.vllm.scope import Refused

    rng = random.Random(31)
    alphabet = b'{}[]":,\\ a0-eE.nulltrue\x00\xff\xfe'
    for _ in range(3000):
        raw = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
        try:
            scope_body(KEYS, raw)
        except Refused as e:
            assert e.status == 400


def test_a_websocket_is_refused(middleware: tuple[ScopeSalt, list[dict[str, Any]]]) -> None:
    """A WebSocket connection (vLLM's realtime route) cannot be scoped: closed with 1008 before accept."""
    mw, seen = middleware
    out: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(msg: dict[str, Any]) -> None:
        out.append(msg)

    asyncio.run(mw({"type": "websocket", "path": "/v1/realtime", "headers": []}, receive, send))
    assert out and out[0]["type"] == "websocket.close" and out[0]["code"] == 1008 and seen == []


def test_an_oversized_body_is_refused_not_passed(middleware: tuple[ScopeSalt, list[dict[str, Any]]]) -> None:
    """A body over SEMGOV_MAX_BODY_MB cannot be rewritten: 413, and nothing reaches vLLM."""
    mw, seen = middleware
    raw = json.dumps(body(token(), prompt=list(range(5000)))).encode()
    assert len(raw) > 0.01 * 1024 * 1024
    assert call(mw, raw, chunk=4096) == 413 and seen == []


def test_a_missing_key_or_audience_refuses_to_start(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without SEMGOV_CONTEXT_KEY, with a short key, or without SEMGOV_CONTEXT_AUDIENCE, the server
    does not start (named error)."""
    monkeypatch.delenv("SEMGOV_CONTEXT_KEY", raising=False)
    monkeypatch.setenv("SEMGOV_CONTEXT_AUDIENCE", AUDIENCE)
    with pytest.raises(HookConfigError, match="SEMGOV_CONTEXT_KEY"):
        ScopeSalt(lambda *a: None)  # type: ignore[arg-type,return-value]
    short = tmp_path / "short.key"
    short.write_bytes(b"x" * 8)
    monkeypatch.setenv("SEMGOV_CONTEXT_KEY", str(short))
    with pytest.raises(HookConfigError, match="at least 32 bytes"):
        ScopeSalt(lambda *a: None)  # type: ignore[arg-type,return-value]
    assert os.environ["SEMGOV_CONTEXT_KEY"] == str(short)
    good = tmp_path / "good.key"
    good.write_bytes(KEY)
    monkeypatch.setenv("SEMGOV_CONTEXT_KEY", str(good))
    monkeypatch.delenv("SEMGOV_CONTEXT_AUDIENCE")
    with pytest.raises(HookConfigError, match="SEMGOV_CONTEXT_AUDIENCE"):
        ScopeSalt(lambda *a: None)  # type: ignore[arg-type,return-value]
