"""The vLLM scope middleware (engine_hooks/vllm/scope.py) as an ASGI component: the body vLLM
receives has a server-derived `cache_salt` whatever the client sent (the real vLLM server runs it
in tests/vllm/test_vllm_server.py)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from engine_hooks.sglang.context import RequestContext, anonymous_cache_key, make_context_token
from engine_hooks.sglang.settings import HookConfigError
from engine_hooks.vllm.scope import ScopeSalt, scoped_salt

KEY = b"k" * 32
TASK = {"id": "qa", "version": "1"}
CONTRACT = {"id": "answer", "schema_sha256": "ab" * 32}


def token(tenant: str = "acme", namespace: str = "ns1", key: bytes = KEY) -> str:
    return make_context_token(key, tenant=tenant, namespace=namespace, task=TASK, response_contract=CONTRACT)


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
    monkeypatch.setenv("SEMGOV_MAX_BODY_MB", "0.01")
    seen: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        msg = await receive()
        seen.append({"path": scope["path"], "body": msg["body"], "headers": dict(scope["headers"])})
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    return ScopeSalt(app), seen


def call(
    mw: ScopeSalt, raw: bytes, path: str = "/v1/completions", method: str = "POST", chunk: int = 0
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
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())],
    }
    asyncio.run(mw(scope, receive, send))
    return int(out[0]["status"])


def test_a_valid_context_salts_by_tenant_namespace_model_and_client_salt() -> None:
    """A valid token's salt is the tenant scope's keyed tree key (model folded in as the adapter,
    the client's salt only narrowing it); another tenant, namespace, model or client salt differs."""
    salt, tenant = scoped_salt(KEY, body(token()))
    ctx = RequestContext("acme", "ns1", TASK, CONTRACT, None, "tiny")
    assert tenant == "acme" and salt == ctx.cache_key(KEY, None)
    others = {
        scoped_salt(KEY, body(token("globex")))[0],
        scoped_salt(KEY, body(token("acme", "ns2")))[0],
        scoped_salt(KEY, body(token(), model="tiny-lora"))[0],
        scoped_salt(KEY, body(token(), cache_salt="mine"))[0],
    }
    assert salt not in others and len(others) == 4


def test_no_forged_or_malformed_token_reaches_a_tenant_scope() -> None:
    """Without a valid token (none, another key's, garbage, not a string) the salt is the
    anonymous one for what the client sent: never a tenant's, whatever salt it sends."""
    tenant_salt = scoped_salt(KEY, body(token()))[0]
    for doc in (
        body(),
        body(token(key=b"x" * 32)),
        body("semgov1.garbage.x"),
        body(None, kv_transfer_params={"semgov_context": 7}),
        body(None, cache_salt=tenant_salt),
        body(None, kv_transfer_params="nope"),
    ):
        salt, tenant = scoped_salt(KEY, doc)
        assert tenant is None and salt != tenant_salt
        assert salt == anonymous_cache_key(KEY, "vllm", doc.get("model"), doc.get("cache_salt"))


def test_the_body_vllm_receives_carries_the_derived_salt(
    middleware: tuple[ScopeSalt, list[dict[str, Any]]],
) -> None:
    """The client's cache_salt is replaced, the token kept for the connector, the body reassembled
    from chunks and its content-length set anew."""
    mw, seen = middleware
    raw = json.dumps(body(token(), cache_salt="client-chosen")).encode()
    assert call(mw, raw, chunk=50) == 200
    got = json.loads(seen[0]["body"])
    assert got["cache_salt"] == scoped_salt(KEY, body(token(), cache_salt="client-chosen"))[0]
    assert got["kv_transfer_params"] == {"semgov_context": token()}
    assert seen[0]["headers"][b"content-length"] == str(len(seen[0]["body"])).encode()


def test_what_is_not_a_scoped_request_passes_unchanged(
    middleware: tuple[ScopeSalt, list[dict[str, Any]]],
) -> None:
    """GETs, other paths and bodies that are not JSON objects reach vLLM as sent (vLLM refuses
    the malformed ones itself)."""
    mw, seen = middleware
    assert call(mw, b"", path="/v1/models", method="GET") == 200
    assert call(mw, b'{"input": "x"}', path="/v1/embeddings") == 200
    assert call(mw, b"[1, 2]") == 200 and call(mw, b"not json") == 200
    assert [s["body"] for s in seen] == [b"", b'{"input": "x"}', b"[1, 2]", b"not json"]


def test_an_oversized_body_is_refused_not_passed(middleware: tuple[ScopeSalt, list[dict[str, Any]]]) -> None:
    """A body over SEMGOV_MAX_BODY_MB cannot be rewritten: 413, and nothing reaches vLLM."""
    mw, seen = middleware
    raw = json.dumps(body(token(), prompt=list(range(5000)))).encode()
    assert len(raw) > 0.01 * 1024 * 1024
    assert call(mw, raw, chunk=4096) == 413 and seen == []


def test_a_missing_key_refuses_to_start(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without SEMGOV_CONTEXT_KEY, or with a short key, the server does not start (named error)."""
    monkeypatch.delenv("SEMGOV_CONTEXT_KEY", raising=False)
    with pytest.raises(HookConfigError, match="SEMGOV_CONTEXT_KEY"):
        ScopeSalt(lambda *a: None)  # type: ignore[arg-type,return-value]
    short = tmp_path / "short.key"
    short.write_bytes(b"x" * 8)
    monkeypatch.setenv("SEMGOV_CONTEXT_KEY", str(short))
    with pytest.raises(HookConfigError, match="at least 32 bytes"):
        ScopeSalt(lambda *a: None)  # type: ignore[arg-type,return-value]
    assert os.environ["SEMGOV_CONTEXT_KEY"] == str(short)
