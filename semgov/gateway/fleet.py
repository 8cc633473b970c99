"""Many workers behind a router: SGLang's native ``/generate`` upstream and the scope routing key.

**Why /generate.** The engines' routers (``smg`` 1.13.0 and ``sglang-router`` 0.3.2) parse a
``/v1/completions`` body into a typed request whose ``prompt`` is a string or a list of strings:
a prompt of token ids is refused (400 / 422) before any worker sees it. Both carry SGLang's own
``/generate`` with ``input_ids``, and keep the fields they do not know (``extra_key``) beside
the ones they do (``rid``). With ``--upstream-api generate`` the gateway sends that body and turns
SGLang's answer back into a completions answer (streamed or not), so clients see no difference.

**The routing key.** With ``--routing-key-header NAME`` every forward carries ``NAME:
<32 hex>``, an HMAC-SHA256 under a secret derived from the context key, of the request's tenant
and namespace (from the API key and the authorized claims, never from the client's text) and
the SHA-256 of its first evidence segment's token ids. Requests that could share evidence (same
scope, same evidence) get the same key, so a router hashing on it puts them on one worker. The key
reveals nothing about the scope or the evidence to whoever sees it, and no tenant can produce
another tenant's key. The client never sets it: the gateway builds the upstream headers itself.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Sequence
from typing import Any

import orjson

from semgov.gateway.tenants import Refusal

__all__ = [
    "GenerateStream",
    "completion_from_generate",
    "generate_body",
    "routing_key",
    "routing_secret",
]

# Completions field -> SGLang sampling parameter (the names SGLang's own /v1/completions maps to).
_SAMPLING = {
    "max_tokens": "max_new_tokens", "temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
    "min_p": "min_p", "stop": "stop", "seed": "sampling_seed", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty", "repetition_penalty": "repetition_penalty",
    "ignore_eos": "ignore_eos", "min_tokens": "min_new_tokens",
}  # fmt: skip
# Completions fields with no faithful /generate form here: refused, naming them.
_NOT_SERVED = ("logprobs", "echo")
_ROUTING_LABEL = b"semgov/routing-key/v1"


def routing_secret(context_key: bytes) -> bytes:
    """The routing key's secret: derived from the context key (every gateway of a fleet has it)."""
    return hmac.new(context_key, _ROUTING_LABEL, hashlib.sha256).digest()


def routing_key(
    secret: bytes, tenant: str, namespace: str, ids: Sequence[int], segments: Sequence[tuple[str, int, int]]
) -> str:
    """The routing key of one request: HMAC of (tenant, namespace, hash of its first evidence
    segment's ids); without an evidence segment, of the scope alone (32 hex characters)."""
    evidence = next(((s, e) for role, s, e in segments if role == "evidence"), None)
    digest = (
        ""
        if evidence is None
        else hashlib.sha256(orjson.dumps(list(ids[evidence[0] : evidence[1]]))).hexdigest()
    )
    message = orjson.dumps([tenant, namespace, digest])
    return hmac.new(secret, message, hashlib.sha256).hexdigest()[:32]


def generate_body(
    *, model: str, ids: list[int], token: str, request_id: str, fields: dict[str, Any], stream: bool
) -> dict[str, Any]:
    """SGLang's ``/generate`` body for a completions request (raises :class:`Refusal` 400 for a
    field that has no faithful form there)."""
    for name in _NOT_SERVED:
        if fields.get(name) not in (None, False, 0):
            raise Refusal(400, "field", f"{name} is not served through a router (--upstream-api generate)")
    if fields.get("n") not in (None, 1):
        raise Refusal(400, "field", "n > 1 is not served through a router (--upstream-api generate)")
    params = {_SAMPLING[k]: v for k, v in fields.items() if k in _SAMPLING}
    return {
        "model": model, "input_ids": ids, "sampling_params": params, "stream": stream,
        "extra_key": token, "rid": request_id,
    }  # fmt: skip


def _finish(meta: dict[str, Any]) -> str | None:
    reason = meta.get("finish_reason")
    if isinstance(reason, dict):
        return str(reason.get("type")) if reason.get("type") is not None else None
    return None if reason is None else str(reason)


def _usage(meta: dict[str, Any]) -> dict[str, int]:
    prompt, completion = int(meta.get("prompt_tokens") or 0), int(meta.get("completion_tokens") or 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion_from_generate(raw: bytes, model: str) -> dict[str, Any]:
    """SGLang's ``/generate`` answer as a ``text_completion`` (raises ``ValueError``, ``KeyError``,
    ``TypeError`` if it is not one)."""
    doc = orjson.loads(raw)
    if isinstance(doc, list):
        if len(doc) != 1:
            raise ValueError("one answer expected")
        doc = doc[0]
    meta = doc["meta_info"]
    return {
        "id": str(meta.get("id", "")), "object": "text_completion", "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": str(doc["text"]), "logprobs": None, "finish_reason": _finish(meta)}],
        "usage": _usage(meta),
    }  # fmt: skip


class GenerateStream:
    """SGLang's streamed ``/generate`` events (cumulative text) as completions stream events."""

    def __init__(self, model: str, include_usage: bool) -> None:
        self.model = model
        self.include_usage = include_usage
        self.text = ""
        self.created = int(time.time())
        self.meta: dict[str, Any] = {}

    def event(self, data: bytes) -> list[bytes]:
        """The completions events of one ``data:`` payload (``[DONE]`` closes the stream)."""
        if data == b"[DONE]":
            out = []
            if self.include_usage and self.meta:
                out.append(orjson.dumps({**self._envelope([]), "usage": _usage(self.meta)}))
            return [*out, b"[DONE]"]
        doc = orjson.loads(data)
        if not isinstance(doc, dict) or "error" in doc:
            return [data]
        text = str(doc.get("text", ""))
        # NOTE: SGLang streams the text so far (unless --incremental-streaming-output): send the rest.
        delta = text[len(self.text) :] if text.startswith(self.text) else text
        self.text = text if text.startswith(self.text) else self.text + text
        self.meta = dict(doc.get("meta_info") or {})
        choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": _finish(self.meta)}
        return [orjson.dumps(self._envelope([choice]))]

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": str(self.meta.get("id", "")), "object": "text_completion", "created": self.created,
            "model": self.model, "choices": choices,
        }  # fmt: skip
