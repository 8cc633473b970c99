"""The gateway as an ASGI app: who is asking, what the prompt is, the token, the forward.

One request's path (:meth:`Gateway.handle`): request id; the API key from ``Authorization:
Bearer`` only (:func:`api_key_of`), looked up by hash in the tenants file (401); the body read
with a size bound and checked (:mod:`semgov.gateway.request`, 400/413); the claims authorized
under the key (:func:`~semgov.gateway.tenants.authorize`, 403); the prompt rendered and tokenized
(:mod:`semgov.gateway.prompt`); the context token minted (:func:`semgov.context.make_context_token`:
the format the engines' one verifier reads); the engine called (:mod:`semgov.gateway.upstream`).
Nothing reaches an engine before every check passed, and every refusal is a 4xx with a message:
the handler catches what the client's input can cause, and anything else is a 500 with the
request id, logged.

Calibration requests (:meth:`Gateway.calibrate`, ``POST /v1/semgov/calibrate``) take the same path
with their own body (:mod:`semgov.gateway.calibration`): a key whose entry says ``calibrate:
true``, token ids sent as they are, a token with the calibration claim and the run's namespace,
SGLang's ``/generate`` whatever ``--upstream-api`` says (501 before vLLM), and the engine's
answer checked before it is returned.

Logs: one JSON line per request (``gateway request``: request id, tenant, key id, route, status,
outcome, milliseconds; a calibration request's engine ``rid``), never the API key, the token or
the prompt.
"""

# NOTE: long module: one ASGI app: every route's check, prepare and forward share its session,
# metrics, request log and refusal mapping, and change together.

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from semgov.context import ContextError, make_context_token
from semgov.gateway.calibration import (
    MAX_ANSWER_BYTES,
    CalibrationCall,
    answer_of,
    engine_rid,
    parse_calibration,
    run_namespace,
)
from semgov.gateway.capture import CaptureConfig, EdgeCapture, Forwarded
from semgov.gateway.fleet import (
    GenerateStream,
    completion_from_generate,
    generate_body,
    routing_key,
    routing_secret,
)
from semgov.gateway.metrics import GatewayMetrics
from semgov.gateway.prompt import ModelTokenizer, Prompt
from semgov.gateway.reload import Reloader
from semgov.gateway.request import Parsed, parse_body
from semgov.gateway.tenants import KeyEntry, Refusal, authorize, may_calibrate
from semgov.gateway.upstream import (
    Target,
    UpstreamError,
    chat_chunk,
    chat_response,
    engine_body,
    error_body,
    failure,
    sse_events,
)
from semgov.log import describe_error, get_logger

__all__ = ["Gateway", "GatewayConfig", "api_key_of"]

_WRONG_PLACES = ("x-api-key", "api-key", "openai-api-key", "x-goog-api-key")
_WRONG_QUERY = ("api_key", "api-key", "key", "apikey")


@dataclass(frozen=True)
class GatewayConfig:
    """Everything ``semgov gateway serve`` is told (docs/gateway.md, "Settings")."""

    tenants: Path
    context_key: Path
    audience: str
    target: Target
    tokenizer: Path
    token_lifetime_s: int = 60
    max_body_bytes: int = 8 << 20
    max_prompt_chars: int = 2_000_000
    reload_poll_s: float = 1.0
    capture: CaptureConfig | None = None


def api_key_of(headers: Any, query: Any) -> str:
    """The API key of a request: ``Authorization: Bearer <key>`` and nowhere else.

    Raises :class:`Refusal` 401, saying where the key should have been."""
    h = headers.get("authorization")
    if len(headers.getlist("authorization")) > 1:  # NOTE: a reader before us may take another one
        raise Refusal(401, "key_header", "send exactly one `Authorization: Bearer <key>` header")
    if h is None:
        for name in _WRONG_PLACES:
            if name in headers:
                raise Refusal(
                    401, "key_header", f"send the API key as `Authorization: Bearer <key>`, not in {name}"
                )
        for name in _WRONG_QUERY:
            if name in query:
                raise Refusal(
                    401, "key_header", "send the API key as `Authorization: Bearer <key>`, not in the URL"
                )
        raise Refusal(401, "no_key", "an API key is required: `Authorization: Bearer <key>`")
    scheme, _, value = h.partition(" ")
    if scheme.lower() != "bearer" or not value.strip() or len(value) > 512:
        raise Refusal(401, "key_header", "the Authorization header must be `Bearer <key>`")
    return str(value.strip())


async def read_body(request: Request, limit: int) -> bytes:
    """The body, at most ``limit`` bytes (raises :class:`Refusal` 413 past it, without reading on)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not (declared.isascii() and declared.isdigit()):  # NOTE: "²".isdigit(), and int() refuses it
            raise Refusal(400, "content_length", "the Content-Length header is not a number")
        if len(declared.lstrip("0")) > 18 or int(declared) > limit:  # NOTE: int() refuses 4,300+ digits
            raise Refusal(413, "body_size", f"the body is larger than {limit} bytes")
    chunks, n = [], 0
    async for chunk in request.stream():
        n += len(chunk)
        if n > limit:
            raise Refusal(413, "body_size", f"the body is larger than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _dumps(body: dict[str, Any]) -> bytes:
    """The engine's body as JSON bytes (raises :class:`Refusal` 400 for a value JSON cannot carry).

    NOTE: orjson (SGLang ships it) writes a 4,000-id prompt about ten times faster than ``json``;
    it refuses integers past 64 bits, which the strict parse lets through as Python ints."""
    try:
        return orjson.dumps(body)
    except (orjson.JSONEncodeError, TypeError) as e:
        raise Refusal(
            400, "field", f"a value of the body cannot be forwarded as JSON ({str(e)[:120]})"
        ) from e


def _ms(s: float | None) -> float | None:
    return None if s is None else round(s * 1000, 3)


@dataclass
class _Outcome:
    """What the request log line and the metrics say about one request."""

    request_id: str
    route: str
    started: float
    tenant: str = "-"
    key_id: str | None = None
    status: int = 200
    outcome: str = "ok"
    prepare_s: float | None = None
    upstream_s: float | None = None
    prompt_tokens: int | None = None
    forwarded: Forwarded | None = None  # what the capture records once the engine answered in full
    routing_key: str | None = None  # the scope routing key the router hashes on (semgov.gateway.fleet)
    engine_rid: str | None = None  # a calibration request's rid, as the engine's audit records name it


class Gateway:
    """The gateway's state (tenants, context key, tokenizer, metrics, HTTP session) and its app."""

    def __init__(self, config: GatewayConfig, tokenizer: ModelTokenizer | None = None) -> None:
        self.config = config
        self.metrics = GatewayMetrics.create()
        self.reloader = Reloader(config.tenants, config.context_key, self.metrics)  # raises on bad files
        self.tokenizer = tokenizer if tokenizer is not None else ModelTokenizer(config.tokenizer)
        self.session: aiohttp.ClientSession | None = None
        self.capture = EdgeCapture(config.capture) if config.capture is not None else None
        self._poll: asyncio.Task[None] | None = None
        self._hup = False

    # ---- the app -----------------------------------------------------------------------------

    def app(self) -> Starlette:
        routes = [
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/completions", self._completions, methods=["POST"]),
            Route("/v1/semgov/calibrate", self.calibrate, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/health", self._health, methods=["GET"]),
            Route("/metrics", self._metrics, methods=["GET"]),
        ]
        return Starlette(
            routes=routes, lifespan=self._lifespan, exception_handlers={HTTPException: self._http_error}
        )

    @asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.start()
        try:
            yield
        finally:
            await self.stop()

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        self.session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        self._poll = asyncio.create_task(self.reloader.poll_forever(self.config.reload_poll_s))
        try:
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.reloader.reload, "SIGHUP")
            self._hup = True
        except (NotImplementedError, RuntimeError, ValueError, AttributeError) as e:
            # NOTE: not the main thread, or no SIGHUP on this platform: the poll still reloads.
            get_logger().info("gateway reload on SIGHUP unavailable", why=describe_error(e))

    async def stop(self) -> None:
        if self._hup:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        if self._poll is not None:
            self._poll.cancel()
        if self.session is not None:
            await self.session.close()
        if self.capture is not None:
            await asyncio.to_thread(self.capture.close)

    async def _chat(self, request: Request) -> Response:
        return await self.handle(request, chat=True)

    async def _completions(self, request: Request) -> Response:
        return await self.handle(request, chat=False)

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        """A path or method not served (404, 405): an OpenAI-style error like every other refusal."""
        assert isinstance(exc, HTTPException)  # NOTE: the only type this handler is registered for
        return JSONResponse(
            error_body(exc.detail, "invalid_request_error", exc.status_code),
            status_code=exc.status_code,
            headers=exc.headers,
        )

    async def _health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def _metrics(self, request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def _models(self, request: Request) -> Response:
        out = _Outcome("gw-" + uuid.uuid4().hex, "models", time.perf_counter())
        try:
            self._key(request, out)
        except Refusal as r:
            return self._refused(r, out)
        model = {"id": self.config.target.model, "object": "model", "owned_by": "semgov-gateway"}
        return JSONResponse({"object": "list", "data": [model]})

    # ---- one request ---------------------------------------------------------------------------

    def _key(self, request: Request, out: _Outcome) -> KeyEntry:
        key = self.reloader.tenants.lookup(api_key_of(request.headers, request.query_params))
        if key is None:
            raise Refusal(401, "bad_key", "the API key is not valid")
        out.tenant, out.key_id = key.tenant, key.id
        return key

    async def handle(self, request: Request, *, chat: bool) -> Response:
        """Check, prepare and forward one chat or completions request."""
        out = _Outcome("gw-" + uuid.uuid4().hex, "chat" if chat else "completions", time.perf_counter())
        try:
            key = self._key(request, out)
            raw = await read_body(request, self.config.max_body_bytes)
            parsed = parse_body(raw, chat=chat, max_prompt_chars=self.config.max_prompt_chars)
            body = _dumps(self.prepare(key, parsed, out))
        except Refusal as r:
            return self._refused(r, out)
        except Exception as e:  # noqa: BLE001 - a gateway bug: 500 with the request id, never a traceback
            return self._bug(out, e)
        out.prepare_s = time.perf_counter() - out.started
        self.metrics.prepare_seconds.labels(out.route).observe(out.prepare_s)
        try:
            return await self.forward(body, parsed, out)  # NOTE: body is the JSON bytes
        except UpstreamError as e:
            out.status, out.outcome = e.status, e.outcome
            self._done(out)
            return self._error(e.status, e.message, "upstream_error", out.request_id)

    def prepare(self, key: KeyEntry, parsed: Parsed, out: _Outcome) -> dict[str, Any]:
        """The engine's body: claims authorized, prompt tokenized, token minted (raises :class:`Refusal`)."""
        target = self.config.target
        if parsed.model is not None and parsed.model != target.model:
            raise Refusal(
                404,
                "model",
                f"model {parsed.model[:128]!r} is not served here (this gateway serves {target.model!r})",
            )
        grant = authorize(key, parsed.claims, datetime.now(UTC))
        prompt = self._prompt(parsed)
        out.prompt_tokens = len(prompt.ids)
        if self.capture is not None:
            out.forwarded = Forwarded(
                out.request_id, datetime.now(UTC), grant.tenant, grant.namespace, grant.task,
                grant.response_contract, prompt.ids, prompt.segments, prompt.text,
            )  # fmt: skip
        try:
            token = make_context_token(
                self.reloader.context_key,
                audience=self.config.audience,
                tenant=grant.tenant,
                namespace=grant.namespace,
                task=grant.task,
                response_contract=grant.response_contract,
                segments=prompt.segments if prompt.segmented else None,
                lifetime_s=self.config.token_lifetime_s,
            )
        except ContextError as e:
            raise Refusal(400, "claim_malformed", f"the request's context cannot be signed: {e}") from e
        if target.routing_key_header is not None:
            secret = routing_secret(self.reloader.context_key)
            out.routing_key = routing_key(secret, grant.tenant, grant.namespace, prompt.ids, prompt.segments)
        if target.api == "generate":
            return generate_body(
                model=target.model, ids=prompt.ids, token=token, request_id=out.request_id,
                fields=parsed.forward, stream=parsed.stream,
            )  # fmt: skip
        return engine_body(
            target.engine, model=target.model, ids=prompt.ids, token=token,
            request_id=out.request_id, fields=parsed.forward, stream=parsed.stream,
        )  # fmt: skip

    # ---- calibration requests ---------------------------------------------------------------------

    async def calibrate(self, request: Request) -> Response:
        """Check, mint and forward one calibration request to SGLang's ``/generate``; its answer checked."""
        out = _Outcome("gw-" + uuid.uuid4().hex, "calibrate", time.perf_counter())
        try:
            key = self._key(request, out)
            if self.config.target.engine != "sglang":
                raise Refusal(
                    501,
                    "calibration_engine",
                    "calibration requests run against SGLang only: vLLM 0.32's connector cannot realize a "
                    "shifted span behind a chat template, so a calibration there would measure nothing "
                    '(docs/vllm.md, "What it realizes")',
                )
            may_calibrate(key, datetime.now(UTC))
            raw = await read_body(request, self.config.max_body_bytes)
            call = parse_calibration(
                raw, max_ids=self.config.max_prompt_chars, vocab_size=self.tokenizer.vocab_size
            )
            body = _dumps(self.prepare_calibration(key, call, out))
        except Refusal as r:
            return self._refused(r, out)
        except Exception as e:  # noqa: BLE001 - a gateway bug: 500 with the request id, never a traceback
            return self._bug(out, e)
        out.prepare_s = time.perf_counter() - out.started
        self.metrics.prepare_seconds.labels(out.route).observe(out.prepare_s)
        assert out.engine_rid is not None  # NOTE: set by prepare_calibration
        try:
            resp, sent = await self._send("/generate", body, out, stream=False)
            answer = answer_of(
                await self._read(resp, out, sent, limit=MAX_ANSWER_BYTES),
                rid=out.engine_rid,
                max_new_tokens=call.max_new_tokens,
            )
        except UpstreamError as e:
            out.status, out.outcome = e.status, e.outcome
            self._done(out)
            return self._error(e.status, e.message, "upstream_error", out.request_id)
        self._done(out)
        return JSONResponse(answer, headers={"x-request-id": out.request_id})

    def prepare_calibration(self, key: KeyEntry, call: CalibrationCall, out: _Outcome) -> dict[str, Any]:
        """SGLang's ``/generate`` body of a calibration request: claims authorized, the run's namespace,
        the token minted with the calibration claim, greedy (raises :class:`Refusal`)."""
        target = self.config.target
        grant = authorize(key, call.claims, datetime.now(UTC), where="")
        namespace = run_namespace(grant.namespace, call.claim.run)
        out.prompt_tokens = len(call.ids)
        out.engine_rid = engine_rid(key.id, call.request_id)
        try:
            token = make_context_token(
                self.reloader.context_key,
                audience=self.config.audience,
                tenant=grant.tenant,
                namespace=namespace,
                task=grant.task,
                response_contract=grant.response_contract,
                segments=call.segments,
                lifetime_s=self.config.token_lifetime_s,
                calibration=call.claim,
            )
        except ContextError as e:
            raise Refusal(400, "claim_malformed", f"the calibration request cannot be signed: {e}") from e
        if target.routing_key_header is not None:
            # NOTE: the run's scope alone, never its evidence: every request of a run (donor, cold,
            # recipient, release) lands on the worker that holds the run's donors.
            out.routing_key = routing_key(
                routing_secret(self.reloader.context_key), grant.tenant, namespace, (), ()
            )
        return generate_body(
            model=target.model, ids=call.ids, token=token, request_id=out.engine_rid,
            fields={"temperature": 0, "max_tokens": call.max_new_tokens}, stream=False,
        )  # fmt: skip

    def _prompt(self, parsed: Parsed) -> Prompt:
        tok = self.tokenizer
        if parsed.chat:
            assert parsed.messages is not None and parsed.roles is not None  # NOTE: parse_body's chat shape
            return tok.chat(parsed.messages, parsed.roles)
        if isinstance(parsed.prompt, str):
            return tok.text(parsed.prompt, parsed.spans)
        assert parsed.prompt is not None
        return tok.token_ids(parsed.prompt, parsed.spans)

    async def forward(self, data: bytes, parsed: Parsed, out: _Outcome) -> Response:
        """Send ``data`` (the engine's JSON body) to the engine; the client's response (raises
        :class:`UpstreamError`)."""
        target = self.config.target
        resp, sent = await self._send(target.path, data, out, stream=parsed.stream)
        if parsed.stream:
            stream = self._relay(resp, parsed, out, sent)
            return StreamingResponse(
                stream, media_type="text/event-stream", headers={"x-request-id": out.request_id}
            )
        raw = await self._read(resp, out, sent)
        if target.api == "generate":
            raw = self._from_generate(raw)
        content = orjson.dumps(chat_response(raw)) if parsed.chat else raw
        self._done(out)
        return Response(content, media_type="application/json", headers={"x-request-id": out.request_id})

    async def _send(
        self, path: str, data: bytes, out: _Outcome, *, stream: bool
    ) -> tuple[aiohttp.ClientResponse, float]:
        """POST ``data`` to the engine's ``path``: its 200 response and when it was sent (raises
        :class:`UpstreamError`). The caller releases the response and decrements ``in_flight``
        (:meth:`_read` does both)."""
        target = self.config.target
        assert self.session is not None  # NOTE: set by start(), before the app serves
        timeout = aiohttp.ClientTimeout(
            total=None if stream else target.timeout_s,
            connect=target.connect_timeout_s,
            sock_read=target.timeout_s,
        )
        # NOTE: built here, never copied from the client: a client cannot set the routing key
        headers = {"content-type": "application/json", "x-request-id": out.request_id}
        if target.routing_key_header is not None and out.routing_key is not None:
            headers[target.routing_key_header] = out.routing_key
        sent = time.perf_counter()
        self.metrics.in_flight.inc()
        try:
            resp = await self.session.post(
                target.base_url + path, data=data, headers=headers, timeout=timeout
            )
        except TimeoutError as e:
            self.metrics.in_flight.dec()
            raise UpstreamError(504, "timeout", "the engine did not answer in time") from e
        except aiohttp.ClientError as e:
            self.metrics.in_flight.dec()
            raise UpstreamError(
                502, "unreachable", f"the engine cannot be reached ({type(e).__name__})"
            ) from e
        if resp.status != 200:
            try:
                raise await failure(resp)
            finally:
                resp.release()
                self.metrics.in_flight.dec()
        return resp, sent

    async def _read(
        self, resp: aiohttp.ClientResponse, out: _Outcome, sent: float, limit: int | None = None
    ) -> bytes:
        """The whole answer of ``resp`` (at most ``limit`` bytes, if given), released and timed
        (raises :class:`UpstreamError`)."""
        try:
            if limit is None:
                raw = await resp.read()
            else:
                chunks, n = [], 0
                async for chunk in resp.content.iter_chunked(64 << 10):
                    n += len(chunk)
                    if n > limit:
                        raise UpstreamError(
                            502, "upstream_error", f"the engine's answer is over {limit} bytes"
                        )
                    chunks.append(chunk)
                raw = b"".join(chunks)
        except TimeoutError as e:
            raise UpstreamError(504, "timeout", "the engine did not answer in time") from e
        except aiohttp.ClientError as e:
            raise UpstreamError(
                502, "upstream_error", f"the engine broke off its answer ({type(e).__name__})"
            ) from e
        finally:
            resp.release()
            self.metrics.in_flight.dec()
        out.upstream_s = time.perf_counter() - sent
        self.metrics.upstream_seconds.labels(out.route).observe(out.upstream_s)
        return raw

    def _from_generate(self, raw: bytes) -> bytes:
        """SGLang's ``/generate`` answer as a completions answer (raises :class:`UpstreamError` 502)."""
        try:
            return orjson.dumps(completion_from_generate(raw, self.config.target.model))
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise UpstreamError(
                502, "upstream_error", f"the engine's answer is not a generation ({type(e).__name__})"
            ) from e

    async def _completion_events(self, resp: aiohttp.ClientResponse, parsed: Parsed) -> AsyncIterator[bytes]:
        """The engine's stream as completions ``data:`` payloads (from SGLang's /generate if so)."""
        if self.config.target.api != "generate":
            async for data in sse_events(resp):
                yield data
            return
        options = parsed.forward.get("stream_options")
        usage = isinstance(options, dict) and options.get("include_usage") is True
        converter = GenerateStream(self.config.target.model, usage)
        async for data in sse_events(resp):
            for event in converter.event(data):
                yield event

    async def _relay(
        self, resp: aiohttp.ClientResponse, parsed: Parsed, out: _Outcome, sent: float
    ) -> AsyncIterator[bytes]:
        """The engine's stream to the client, as sent or in chat form; an error event if it breaks."""
        first: set[int] = set()
        chat = parsed.chat
        try:
            if not chat and self.config.target.api != "generate":
                async for chunk in resp.content.iter_any():
                    yield chunk
            elif not chat:
                async for data in self._completion_events(resp, parsed):
                    yield b"data: " + data + b"\n\n"
            else:
                async for data in self._completion_events(resp, parsed):
                    if data == b"[DONE]":
                        yield b"data: [DONE]\n\n"
                        continue
                    doc = json.loads(data)
                    if isinstance(doc, dict) and "error" in doc:
                        yield b"data: " + data + b"\n\n"
                        continue
                    yield b"data: " + orjson.dumps(chat_chunk(doc, first)) + b"\n\n"
        except asyncio.CancelledError:
            out.status, out.outcome = 499, "aborted"
            raise
        except (TimeoutError, aiohttp.ClientError, ValueError, TypeError, AttributeError, KeyError) as e:
            out.outcome = "timeout" if isinstance(e, TimeoutError) else "upstream_error"
            msg = (
                "the engine did not go on in time"
                if out.outcome == "timeout"
                else "the engine broke off the stream"
            )
            yield b"data: " + orjson.dumps(error_body(msg, "upstream_error", 502)) + b"\n\n"
        finally:
            resp.release()
            self.metrics.in_flight.dec()
            out.upstream_s = time.perf_counter() - sent
            self.metrics.upstream_seconds.labels(out.route).observe(out.upstream_s)
            self._done(out)

    # ---- answers ---------------------------------------------------------------------------------

    def _refused(self, r: Refusal, out: _Outcome) -> Response:
        out.status, out.outcome = r.status, "refused"
        self.metrics.refusals.labels(r.reason).inc()
        self._done(out, reason=r.reason)
        kind = (
            "authentication_error"
            if r.status == 401
            else "permission_error"
            if r.status == 403
            else "invalid_request_error"
        )
        resp = self._error(r.status, r.message, kind, out.request_id)
        if r.status == 401:
            resp.headers["www-authenticate"] = "Bearer"
        return resp

    def _bug(self, out: _Outcome, e: Exception) -> Response:
        """A gateway bug: 500 naming the request id, logged (never a traceback to the client)."""
        out.status, out.outcome = 500, "gateway_error"
        self._done(out, reason=describe_error(e))
        return self._error(
            500, f"internal gateway error (request {out.request_id})", "server_error", out.request_id
        )

    @staticmethod
    def _error(status: int, message: str, kind: str, request_id: str) -> JSONResponse:
        return JSONResponse(
            error_body(message, kind, status), status_code=status, headers={"x-request-id": request_id}
        )

    def _done(self, out: _Outcome, reason: str | None = None) -> None:
        self.metrics.requests.labels(out.tenant, out.route, out.outcome).inc()
        if self.capture is not None and out.forwarded is not None and out.outcome == "ok":
            queued = self.capture.offer(out.forwarded)
            self.metrics.captured.labels("queued" if queued else "skipped").inc()
        try:
            get_logger().info(
                "gateway request", request_id=out.request_id, tenant=out.tenant, key_id=out.key_id,
                route=out.route, status=out.status, outcome=out.outcome, reason=reason,
                engine_rid=out.engine_rid,
                prepare_ms=_ms(out.prepare_s), upstream_ms=_ms(out.upstream_s),
                n_prompt_tokens=out.prompt_tokens,
                total_ms=_ms(time.perf_counter() - out.started),
            )  # fmt: skip
        except Exception as e:  # noqa: BLE001 - a log line must never fail a request
            print(f"semgov gateway: log failed: {describe_error(e)}")
