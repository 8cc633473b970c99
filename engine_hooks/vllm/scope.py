"""vLLM's OpenAI server, scoped: exact-prefix KV never crosses a tenant or namespace (issues 19, 31).

vLLM isolates prefix-cache blocks only by ``cache_salt``, a field the client writes, and serves
generation on many routes (``/v1/completions``, ``/v1/chat/completions``, ``/v1/responses``,
``/v1/messages``, ``/invocations``, ``/inference/v1/generate`` and more, some on by default). So
this ASGI middleware (``--middleware engine_hooks.vllm.scope.ScopeSalt``) does not consult a list
of routes: it scopes **every** HTTP request, whatever its path or method, before vLLM routes it.

- A body that is a JSON object gets its top-level ``cache_salt`` replaced by a salt derived
  server-side (:func:`scoped_salt`), as the SGLang hook derives its tree key
  (:mod:`semgov.context`): for a valid context token in
  ``kv_transfer_params.semgov_context`` (verified by
  :func:`~engine_hooks.core.tokens.verify_context` with the deployment's one key set, the same
  call the connector makes) the keyed hash of its tenant, namespace, the ``model`` it asked for
  and the salt the client sent (which can only narrow its scope); for a token that was sent and
  does not verify (forged, expired, another audience, a retired key) a salt of its own, used by
  no other request, counted in ``semgov:context_tokens_refused_total`` and logged; without a
  token, the keyed "anonymous" hash of what it sent (model and salt), so anonymous traffic shares
  prefixes only with anonymous traffic that sent the same.
- Every salt carries a tag (a MAC under the context key) that the connector checks in the engine,
  where every entry point converges: a request that reaches the scheduler with a salt this
  middleware did not issue is counted (``semgov:unscoped_requests_total``), logged, and gets no
  governed reuse (:mod:`engine_hooks.vllm.scheduler_side`).
- A ``cache_salt`` anywhere semgov cannot scope it is refused with 400: nested inside the object,
  in a JSON body that is not an object, or in a body that is not JSON (a form). A WebSocket
  connection is refused (its messages cannot be scoped).
- Every parse is bounded: a body over ``SEMGOV_MAX_BODY_MB`` (default 32) is refused with 413, JSON
  nested deeper than :data:`MAX_JSON_DEPTH` with 400. The middleware never raises into the server:
  an unexpected error answers 500 naming no client data.

Whatever the client sends, it cannot name another scope's salt without the key. The token stays
in ``kv_transfer_params`` (the connector reads it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import re
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes

from engine_hooks.core.settings import ContextSettings
from engine_hooks.core.tokens import load_context_keys, verify_context
from semgov.context import ContextKeys, anonymous_cache_key
from semgov.log import get_logger

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

TOKEN_FIELD = "semgov_context"
MAX_JSON_DEPTH = 64
_TAG_SEP = "."
_TAG_HEX = 32
_SALT_WORD = re.compile(rb"cache.?salt", re.IGNORECASE)


def _tag(key: bytes, base: str) -> str:
    mac = hmac.new(key, b"semgov.vllm-salt/v1\x00" + base.encode("utf-8", "surrogatepass"), hashlib.sha256)
    return mac.hexdigest()[:_TAG_HEX]


def tag_salt(key: bytes, base: str) -> str:
    """``base`` with its tag: the form of every salt this middleware issues."""
    return base + _TAG_SEP + _tag(key, base)


def issued_salt(key: bytes, salt: object) -> bool:
    """Whether ``salt`` is one this middleware issued under ``key`` (its tag verifies). Never raises."""
    if type(salt) is not str or len(salt) > 256:
        return False
    base, sep, tag = salt.rpartition(_TAG_SEP)
    if not sep or len(tag) != _TAG_HEX:
        return False
    return hmac.compare_digest(tag.encode("ascii", "replace"), _tag(key, base).encode("ascii"))


@dataclass(frozen=True, slots=True)
class Scoped:
    """The salt a request body gets, and whom it was scoped to."""

    salt: str
    tenant: str | None  # None: anonymous or refused
    refused: str | None = None  # why a token that was sent did not verify


def scoped_salt(keys: ContextKeys, doc: dict[str, Any], *, now: float | None = None) -> Scoped:
    """The ``cache_salt`` a request body gets (see the module docstring). Pure but for the
    refused case's random salt; never raises for any JSON object."""
    client_salt = doc.get("cache_salt")
    model = doc.get("model")
    params = doc.get("kv_transfer_params")
    token = params.get(TOKEN_FIELD) if isinstance(params, dict) else None
    key = keys.current
    verdict = verify_context(keys, token, dedicated=True, now=now)
    if verdict.context is not None:
        ctx = dataclasses.replace(verdict.context, lora_id=model if isinstance(model, str) else repr(model))
        salt = client_salt if isinstance(client_salt, str) else None
        base, tenant = ctx.cache_key(key, salt), verdict.context.tenant
    elif verdict.refused is not None:
        # NOTE: a token sent and not trusted never lands in a bucket others share.
        base, tenant = f"semgov:anon:refused:{secrets.token_hex(16)}", None
    else:
        base, tenant = anonymous_cache_key(key, "vllm", model, client_salt), None
    return Scoped(tag_salt(key, base), tenant, verdict.refused)


class Refused(Exception):
    """A body semgov will not pass on: the HTTP status and a message naming no client data."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def json_depth_within(body: bytes, limit: int) -> bool:
    """Whether the JSON text's ``[``/``{`` nesting stays within ``limit`` (strings skipped; linear,
    no recursion; for text that is not JSON the answer is only an upper bound's)."""
    depth, in_str, escaped = 0, False, False
    for b in body:
        if in_str:
            if escaped:
                escaped = False
            elif b == 0x5C:  # backslash
                escaped = True
            elif b == 0x22:
                in_str = False
        elif b == 0x22:
            in_str = True
        elif b in (0x5B, 0x7B):
            depth += 1
            if depth > limit:
                return False
        elif b in (0x5D, 0x7D):
            depth -= 1
    return True


def _shape(doc: Any) -> tuple[int, bool]:
    """``(nesting depth, whether an object below the top one has a cache_salt key)`` of a parsed
    body, in one iterative walk (no recursion, whatever encoding the text was in)."""
    deepest, nested_salt = 0, False
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, dict):
            nested_salt = nested_salt or (depth > 1 and "cache_salt" in v)
            stack.extend((x, depth + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, depth + 1) for x in v)
        else:
            continue
        deepest = max(deepest, depth)
    return deepest, nested_salt


def _raw_mentions_salt(body: bytes) -> bool:
    """Whether a body semgov cannot parse names a cache salt in any spelling a form parser decodes
    (percent-escapes, ``+``, UTF-16/32 zero bytes, any case)."""
    flat = body.replace(b"\x00", b"")
    return any(_SALT_WORD.search(v) is not None for v in (flat, unquote_to_bytes(flat.replace(b"+", b" "))))


def scope_body(keys: ContextKeys, body: bytes) -> tuple[bytes, Scoped | None]:
    """The body to pass on, and its scope (None: nothing to scope). Raises :class:`Refused`."""
    head = body.lstrip()[:1]
    if not head:
        return body, None
    # NOTE: only text that opens like JSON is depth-checked (a form's binary part may hold brackets).
    if head in (b"{", b"[") and not json_depth_within(body, MAX_JSON_DEPTH):
        raise Refused(400, f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        doc = json.loads(body)
    except RecursionError:
        raise Refused(400, f"JSON nested deeper than {MAX_JSON_DEPTH} levels") from None
    except ValueError:
        if _raw_mentions_salt(body):
            raise Refused(
                400,
                "cache_salt in a body semgov cannot parse as JSON: refused (cannot scope it)",
            ) from None
        return body, None
    depth, nested_salt = _shape(doc)  # NOTE: also bounds text json read in another encoding (UTF-16)
    if depth > MAX_JSON_DEPTH:
        raise Refused(400, f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    if not isinstance(doc, dict):
        if nested_salt:
            raise Refused(400, "cache_salt in a JSON body that is not an object: refused (cannot scope it)")
        return body, None
    if nested_salt:
        raise Refused(400, "cache_salt is accepted only at the top level of the request body")
    scoped = scoped_salt(keys, doc)
    doc["cache_salt"] = scoped.salt
    return json.dumps(doc).encode(), scoped


class ScopeSalt:
    """The ASGI middleware (see the module docstring). vLLM adds a class given to ``--middleware``
    with ``app.add_middleware(ScopeSalt)``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.keys = load_context_keys(ContextSettings.from_env())
        self.max_body = int(float(os.environ.get("SEMGOV_MAX_BODY_MB", "32")) * 1024 * 1024)
        http, sockets = route_table(app)
        # NOTE: what this covers is every route below it; the table is logged (16 routes a line, the
        # log's bound) so that an operator, and the real-server test, see vLLM's own routes.
        log = get_logger()
        log.info(
            "semgov scope middleware: every HTTP route is scoped, WebSockets refused",
            http_routes=len(http),
            websocket_routes=len(sockets),
        )
        for kind, table in (("http", http), ("websocket", sockets)):
            for i in range(0, len(table), 16):
                log.info("semgov scope middleware: route table", kind=kind, routes=table[i : i + 16])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope.get("type")
        if kind == "websocket":
            await send(
                {"type": "websocket.close", "code": 1008, "reason": "semgov: WebSockets cannot be scoped"}
            )
            return
        if kind != "http":
            await self.app(scope, receive, send)  # NOTE: lifespan: no request
            return
        try:
            body = await self._read(receive)
            body, _ = scope_body(self.keys, body)
        except Refused as e:
            await _answer(send, e.status, e.message)
            return
        except _TooLarge:
            await _answer(send, 413, f"request body over {self.max_body} bytes (SEMGOV_MAX_BODY_MB)")
            return
        except Exception as e:  # noqa: BLE001 - never into the server, never with the client's salt
            get_logger().error("semgov could not scope a request", error=type(e).__name__)
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


def route_table(app: object) -> tuple[list[str], list[str]]:
    """vLLM's own routes below this middleware (``"POST /v1/completions"``; WebSocket paths), found by
    walking the ASGI chain to the router. Never raises: an app without one gives empty lists."""
    http: list[str] = []
    sockets: list[str] = []
    try:
        node: object = app
        for _ in range(32):  # NOTE: bounded walk down Starlette's middleware stack
            routes = getattr(node, "routes", None)
            if routes is not None:
                for r in routes:
                    path = str(getattr(r, "path", "?"))
                    methods = getattr(r, "methods", None)
                    if methods is None and type(r).__name__.startswith("WebSocket"):
                        sockets.append(path)
                    else:
                        http.extend(f"{m} {path}" for m in sorted(methods or ()))
                break
            node = getattr(node, "app", None)
            if node is None:
                break
    except Exception:  # noqa: BLE001 - a diagnostic only
        pass
    return sorted(http), sorted(sockets)


class _TooLarge(Exception):
    pass


def _with_length(scope: Scope, n: int) -> Scope:
    headers = [
        (k, v)
        for k, v in scope.get("headers", [])
        if k.lower() not in (b"content-length", b"transfer-encoding")
    ]
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
