"""vLLM's OpenAI server, scoped: exact-prefix KV never crosses a tenant or namespace (issue 19, first part).

vLLM isolates prefix-cache blocks only by ``cache_salt``, a field the client writes. This ASGI
middleware (``--middleware engine_hooks.vllm.scope.ScopeSalt``) replaces it, in the body of every
``POST /v1/completions``, ``/v1/chat/completions`` and ``/v1/responses``, by a salt derived
server-side, as the SGLang hook derives its tree key (:mod:`engine_hooks.sglang.context`):

- a request whose ``kv_transfer_params.semgov_context`` is a valid context token (written by the
  trusted gateway, HMAC under ``SEMGOV_CONTEXT_KEY``): the keyed hash of its tenant, namespace, the
  ``model`` it asked for (a LoRA adapter never shares blocks with the base model) and the salt the
  client sent (which can only narrow its scope);
- any other request (no token, a forged or malformed one): the keyed "anonymous" hash of what it
  sent (the model and its salt), so anonymous traffic shares prefixes only with anonymous traffic
  that sent the same, never with a tenant's blocks (their salts need the key).

Whatever the client sends, it cannot name another scope's salt without the key. The token stays in
``kv_transfer_params`` (the connector reads it). A body over ``SEMGOV_MAX_BODY_MB`` (default 32) is
refused with 413 (it could not be rewritten); a body that is not a JSON object is passed on as it is
(vLLM refuses it). The middleware never raises into the server: an unexpected error answers 500
naming no client data.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from engine_hooks.sglang.context import ContextError, anonymous_cache_key, parse_context_token
from engine_hooks.sglang.settings import HookConfigError, read_context_key

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SCOPED_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/responses"})
TOKEN_FIELD = "semgov_context"


def scoped_salt(key: bytes, doc: dict[str, Any]) -> tuple[str, str | None]:
    """The ``cache_salt`` a request body gets, and the tenant it was scoped to (None: anonymous).
    Pure; never raises for any JSON object."""
    client_salt = doc.get("cache_salt")
    model = doc.get("model")
    params = doc.get("kv_transfer_params")
    token = params.get(TOKEN_FIELD) if isinstance(params, dict) else None
    if token is not None:
        try:
            ctx = parse_context_token(key, token)
        except ContextError:
            ctx = None
        if ctx is not None:
            scoped = dataclasses.replace(ctx, lora_id=model if isinstance(model, str) else repr(model))
            salt = client_salt if isinstance(client_salt, str) else None
            return scoped.cache_key(key, salt), ctx.tenant
    return anonymous_cache_key(key, "vllm", model, client_salt), None


def _load_key() -> bytes:
    """The gateway's context key, read as the SGLang hook reads it (refusing a missing variable,
    an unreadable file or a key under 32 bytes, naming them)."""
    path = os.environ.get("SEMGOV_CONTEXT_KEY")
    if not path:
        raise HookConfigError("SEMGOV_CONTEXT_KEY is not set: the gateway's context key file is required")
    return read_context_key(Path(path))


class ScopeSalt:
    """The ASGI middleware (see the module docstring). vLLM adds a class given to ``--middleware``
    with ``app.add_middleware(ScopeSalt)``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.key = _load_key()
        self.max_body = int(float(os.environ.get("SEMGOV_MAX_BODY_MB", "32")) * 1024 * 1024)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope.get("type") != "http"
            or scope.get("method") != "POST"
            or scope.get("path") not in SCOPED_PATHS
        ):
            await self.app(scope, receive, send)
            return
        try:
            body = await self._read(receive)
        except _TooLarge:
            await _answer(send, 413, f"request body over {self.max_body} bytes (SEMGOV_MAX_BODY_MB)")
            return
        try:
            doc = json.loads(body)
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            try:
                doc["cache_salt"], _ = scoped_salt(self.key, doc)
                body = json.dumps(doc).encode()
            except Exception:  # noqa: BLE001 - never into the server, never with the client's salt
                await _answer(send, 500, "semgov could not scope the request")
                return
        await self.app(_with_length(scope, len(body)), _replay(body, receive), send)

    async def _read(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg.get("type") != "http.request":
                return b"".join(chunks)
            chunk = msg.get("body", b"") or b""
            size += len(chunk)
            if size > self.max_body:
                raise _TooLarge
            chunks.append(chunk)
            if not msg.get("more_body", False):
                return b"".join(chunks)


class _TooLarge(Exception):
    pass


def _with_length(scope: Scope, n: int) -> Scope:
    headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
    return {**scope, "headers": [*headers, (b"content-length", str(n).encode())]}


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # NOTE: after the body, only a disconnect can come

    return replay


async def _answer(send: Send, status: int, message: str) -> None:
    body = json.dumps({"error": {"message": message, "type": "semgov", "code": status}}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
