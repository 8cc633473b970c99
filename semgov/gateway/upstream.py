"""Where requests go: the engine's body, the forward, and what the client gets back.

The gateway always calls the engine's ``/v1/completions`` with the prompt as token ids (neither
SGLang's nor vLLM's chat endpoint takes token ids) and the signed context token where that engine
reads it: SGLang's ``extra_key`` (and ``rid``, the gateway's request id, which labels the hook's
audit records), vLLM's ``kv_transfer_params.semgov_context``. A router in front of several
workers takes the same body as the engine behind it.

A ``/v1/completions`` response passes through byte for byte, streamed or not. A
``/v1/chat/completions`` response is the engine's completion in chat form (``chat.completion``,
``message.content``; streamed: ``chat.completion.chunk`` with ``delta``); ids, token counts and
finish reasons are the engine's.

Errors: an engine's 400/422 becomes 400 and its 413/429/503 pass as they are, each with the
engine's message; any other engine status is 502. An engine that cannot be reached is 502, one
that does not answer in time 504. A stream the engine breaks off ends with an ``error`` event.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp

__all__ = [
    "Engine",
    "UpstreamApi",
    "UpstreamError",
    "chat_chunk",
    "chat_response",
    "engine_body",
    "error_body",
]

Engine = Literal["sglang", "vllm"]
UpstreamApi = Literal["completions", "generate"]
MAX_ERROR_BYTES = 64 << 10
_PASS = {413: 413, 429: 429, 503: 503, 400: 400, 422: 400}


class UpstreamError(Exception):
    """The engine failed the request: ``status`` for the client, ``outcome`` for metrics."""

    def __init__(self, status: int, outcome: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.outcome = outcome
        self.message = message


def error_body(message: str, kind: str, code: int) -> dict[str, Any]:
    """An OpenAI-style error object."""
    return {"error": {"message": message, "type": kind, "code": code}}


def engine_body(
    engine: Engine,
    *,
    model: str,
    ids: list[int],
    token: str,
    request_id: str,
    fields: dict[str, Any],
    stream: bool,
) -> dict[str, Any]:
    """The ``/v1/completions`` body the engine gets: the token ids, the token, the client's fields."""
    body: dict[str, Any] = {**fields, "model": model, "prompt": ids, "stream": stream}
    if engine == "sglang":
        body["extra_key"] = token
        if fields.get("n") in (None, 1):
            body["rid"] = request_id  # NOTE: SGLang requires one rid per sequence
    else:
        body["kv_transfer_params"] = {"semgov_context": token}
    return body


@dataclass(frozen=True, slots=True)
class Target:
    """The engine (or router) the gateway forwards to: its ``/v1/completions``, or SGLang's
    ``/generate`` (``api``, for a router: :mod:`semgov.gateway.fleet`); ``routing_key_header``:
    the header that carries the scope routing key, if any."""

    engine: Engine
    base_url: str
    model: str
    timeout_s: float = 600.0
    connect_timeout_s: float = 5.0
    api: UpstreamApi = "completions"
    routing_key_header: str | None = None

    @property
    def path(self) -> str:
        return "/generate" if self.api == "generate" else "/v1/completions"


def _message(raw: bytes) -> str:
    try:
        doc = json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        return raw[:300].decode("utf-8", "replace")
    if isinstance(doc, dict):
        err = doc.get("error", doc)
        msg = err.get("message", doc.get("detail")) if isinstance(err, dict) else err
        return str(msg)[:500]
    return str(doc)[:300]


async def failure(resp: aiohttp.ClientResponse) -> UpstreamError:
    """The client-facing error of an engine's non-200 answer."""
    raw = await resp.content.read(MAX_ERROR_BYTES)
    status = _PASS.get(resp.status, 502)
    outcome = "engine_refused" if status < 500 or status == 503 else "upstream_error"
    return UpstreamError(status, outcome, f"the engine answered {resp.status}: {_message(raw)}")


def chat_response(raw: bytes) -> dict[str, Any]:
    """A completions response in chat form (raises :class:`UpstreamError` 502 if it is not one)."""
    try:
        doc = json.loads(raw)
        choices = [
            {
                "index": c.get("index", i),
                "message": {"role": "assistant", "content": c.get("text", "")},
                "logprobs": None,
                "finish_reason": c.get("finish_reason"),
            }
            for i, c in enumerate(doc["choices"])
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise UpstreamError(
            502, "upstream_error", f"the engine's answer is not a completion ({type(e).__name__})"
        ) from e
    return _chat_envelope(doc, "chat.completion", choices)


def _chat_envelope(doc: dict[str, Any], kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
    """The engine's id, creation time, model and usage around ``choices``, as a ``kind`` object."""
    out = {
        "id": "chatcmpl-" + str(doc.get("id", "")),
        "object": kind,
        "created": doc.get("created", int(time.time())),
        "model": doc.get("model"),
        "choices": choices,
    }
    if doc.get("usage") is not None:
        out["usage"] = doc["usage"]
    return out


def chat_chunk(doc: dict[str, Any], first: set[int]) -> dict[str, Any]:
    """A completions stream chunk in chat form; ``first``: the choices whose role was already sent."""
    choices = []
    for i, c in enumerate(doc.get("choices") or []):
        index = c.get("index", i)
        delta: dict[str, Any] = {"content": c.get("text", "")}
        if index not in first:
            first.add(index)
            delta = {"role": "assistant", **delta}
        choices.append(
            {"index": index, "delta": delta, "logprobs": None, "finish_reason": c.get("finish_reason")}
        )
    return _chat_envelope(doc, "chat.completion.chunk", choices)


async def sse_events(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The engine's server-sent events, one ``data:`` payload at a time (without the prefix)."""
    async for line in resp.content:
        line = line.rstrip(b"\r\n")
        if line.startswith(b"data:"):
            yield line[5:].lstrip(b" ")
