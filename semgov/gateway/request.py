"""What a client may send: the bounded parse of a request body, and the fields the gateway forwards.

Every parse is bounded before it runs: the body's size (``max_body_bytes``), its JSON nesting
(:data:`MAX_DEPTH`, counted before parsing), the number of messages and the length of every
string the gateway reads; the JSON is strict (no duplicate key, ``NaN`` or lone surrogate).
Everything refused is a :class:`Refusal` with a 4xx status and a message naming the field;
nothing here raises anything else.

The body is an allowlist: the OpenAI sampling fields in :data:`FORWARDED` pass to the engine as
sent (the engine checks their values), ``semgov`` holds the claims and segment marks, and any
other field is refused, naming it. So a client can never set what only the gateway may set
(``extra_key``, ``cache_salt``, ``kv_transfer_params``, ``rid``, a LoRA path).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from semgov.gateway.prompt import ROLE_DEFAULTS, ROLES
from semgov.gateway.tenants import Claims, Refusal
from semgov.wire import strictjson

__all__ = ["FORWARDED", "MAX_DEPTH", "Parsed", "parse_body"]

MAX_DEPTH = 32
MAX_MESSAGES = 1024
MAX_NAME_CHARS = 512
FORWARDED = frozenset(
    {
        "max_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "seed", "presence_penalty",
        "frequency_penalty", "repetition_penalty", "n", "stream", "stream_options", "ignore_eos",
        "min_tokens", "user",
    }
)  # fmt: skip
# NOTE: chat's logprobs (a boolean with top_logprobs) has no faithful completions form: refused.
_CHAT_ONLY = frozenset({"messages", "max_completion_tokens"})
_COMPLETION_ONLY = frozenset({"prompt", "logprobs", "echo"})
_COMMON = frozenset({"model", "semgov"})
_PROMPT = frozenset({"model", "semgov", "messages", "prompt"})
_SEMGOV = frozenset({"namespace", "task", "response_contract", "segments"})
_CHAT_ROLES = frozenset(ROLE_DEFAULTS)
_MESSAGE_KEYS = frozenset({"role", "content", "name", "tool_call_id", "tool_calls"})


@dataclass(frozen=True, slots=True)
class Parsed:
    """A checked request: claims, the prompt's source, the sampling fields to forward."""

    chat: bool
    model: str | None
    claims: Claims
    messages: list[dict[str, Any]] | None  # chat
    roles: list[str] | None  # chat: one segment role per message
    prompt: str | list[int] | None  # completion: text or token ids
    spans: list[tuple[str, int, int]] | None  # completion: client segments, in the prompt's units
    forward: dict[str, Any]
    stream: bool


def load_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, read strictly (raises :class:`Refusal` 400).

    :func:`semgov.wire.strictjson.loads`: one meaning per body, so a duplicate key (``json.loads``
    keeps the last; another reader may keep the first), ``NaN``/``Infinity``, a lone surrogate,
    invalid UTF-8, an integer past Python's digit limit and nesting past :data:`MAX_DEPTH`
    (counted before parsing) are all refused."""
    try:
        doc = strictjson.loads(raw, max_depth=MAX_DEPTH)
    except strictjson.StrictJSONError as e:
        reason = "json_depth" if str(e).startswith("nested") else "json"
        raise Refusal(400, reason, f"the body is not strict UTF-8 JSON: {str(e)[:200]}") from e
    if type(doc) is not dict:
        raise Refusal(400, "json", "the body must be a JSON object")
    return doc


def _str(value: object, field: str, limit: int = MAX_NAME_CHARS) -> str:
    if type(value) is not str or not 0 < len(value) <= limit:
        raise Refusal(400, "field", f"{field} must be a string of 1..{limit} characters")
    if any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise Refusal(400, "field", f"{field} holds a lone surrogate")
    return value


def _pair(value: object, field: str, keys: tuple[str, str]) -> dict[str, str]:
    if type(value) is not dict or set(value) != set(keys):
        raise Refusal(400, "claim_malformed", f"{field} must be an object with exactly {' and '.join(keys)}")
    return {k: _str(value[k], f"{field}.{k}") for k in keys}


def _claims(sem: dict[str, Any]) -> Claims:
    ns = sem.get("namespace")
    return Claims(
        namespace=None if ns is None else _str(ns, "semgov.namespace"),
        task=None if sem.get("task") is None else _pair(sem["task"], "semgov.task", ("id", "version")),
        response_contract=None
        if sem.get("response_contract") is None
        else _pair(sem["response_contract"], "semgov.response_contract", ("id", "schema_sha256")),
    )


def _semgov(doc: dict[str, Any]) -> dict[str, Any]:
    sem = doc.get("semgov", {})
    if type(sem) is not dict:
        raise Refusal(400, "field", "semgov must be an object")
    unknown = sorted(set(sem) - _SEMGOV)
    if unknown:
        raise Refusal(
            400,
            "unknown_field",
            f"unknown field semgov.{unknown[0][:64]!r} (allowed: {', '.join(sorted(_SEMGOV))})",
        )
    return sem


def _message(m: object, i: int) -> dict[str, Any]:
    if type(m) is not dict:
        raise Refusal(400, "messages", f"messages[{i}] must be an object")
    unknown = sorted(set(m) - _MESSAGE_KEYS)
    if unknown:
        raise Refusal(400, "messages", f"messages[{i}] has an unknown field {unknown[0][:64]!r}")
    role = m.get("role")
    if type(role) is not str or role not in _CHAT_ROLES:
        raise Refusal(400, "messages", f"messages[{i}].role must be one of {', '.join(sorted(_CHAT_ROLES))}")
    content = m.get("content")
    if isinstance(content, list):
        for p in content:
            if type(p) is not dict or p.get("type") != "text" or type(p.get("text")) is not str:
                raise Refusal(
                    400, "messages", f"messages[{i}].content parts must be {{'type': 'text', 'text': ...}}"
                )
    elif content is not None and type(content) is not str:
        raise Refusal(400, "messages", f"messages[{i}].content must be a string or a list of text parts")
    return m


def _has_text(m: dict[str, Any]) -> bool:
    """Whether a checked message has content text (a mark on one without has nothing to name)."""
    c = m.get("content")
    return bool(c) if type(c) is str else type(c) is list and any(p["text"] for p in c)


def _roles(messages: list[dict[str, Any]], marks: object) -> list[str]:
    roles = [ROLE_DEFAULTS[m["role"]] for m in messages]
    if marks is None:
        return roles
    if type(marks) is not list or len(marks) > len(messages):
        raise Refusal(400, "segments", "semgov.segments must be a list of at most one mark per message")
    seen: set[int] = set()
    for j, mark in enumerate(marks):
        if type(mark) is not dict or set(mark) != {"message", "role"}:
            raise Refusal(400, "segments", f"semgov.segments[{j}] must be {{'message': index, 'role': role}}")
        i, role = mark["message"], mark["role"]
        if type(i) is not int or not 0 <= i < len(messages):
            raise Refusal(
                400, "segments", f"semgov.segments[{j}].message names no message (there are {len(messages)})"
            )
        if i in seen:
            raise Refusal(400, "segments", f"semgov.segments marks message {i} twice")
        if not _has_text(messages[i]):
            raise Refusal(400, "segments", f"semgov.segments[{j}] marks message {i}, which has no text")
        if role not in ROLES:
            raise Refusal(400, "segments", f"semgov.segments[{j}].role must be one of {', '.join(ROLES)}")
        seen.add(i)
        roles[i] = role
    return roles


def _spans(marks: object, limit: int) -> list[tuple[str, int, int]] | None:
    if marks is None:
        return None
    if type(marks) is not list or not 0 < len(marks) <= 4096:
        raise Refusal(400, "segments", "semgov.segments must be a non-empty list")
    out = []
    for j, s in enumerate(marks):
        if type(s) is not dict or set(s) != {"role", "start", "end"}:
            raise Refusal(400, "segments", f"semgov.segments[{j}] must be {{'role', 'start', 'end'}}")
        if type(s["start"]) is not int or type(s["end"]) is not int or s["role"] not in ROLES:
            raise Refusal(
                400,
                "segments",
                f"semgov.segments[{j}]: integer start and end, role one of {', '.join(ROLES)}",
            )
        if not 0 <= s["start"] <= s["end"] <= limit:  # NOTE: bounds the numbers messages may quote
            raise Refusal(400, "segments", f"semgov.segments[{j}]: 0 <= start <= end <= {limit}")
        out.append((s["role"], s["start"], s["end"]))
    return out


def _finite(v: object) -> bool:
    """No float in ``v`` overflowed to infinity (``1e400``: JSON, but no JSON can carry it on)."""
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, list):
        return all(_finite(x) for x in v)
    if isinstance(v, dict):
        return all(_finite(x) for x in v.values())
    return True


def _forward(doc: dict[str, Any], allowed: frozenset[str]) -> dict[str, Any]:
    unknown = sorted(set(doc) - allowed - FORWARDED)
    if unknown:
        raise Refusal(
            400, "unknown_field", f"unknown field {unknown[0][:64]!r}: the gateway does not forward it"
        )
    fwd = {k: v for k, v in doc.items() if k in FORWARDED or (k in allowed and k not in _PROMPT)}
    if "max_completion_tokens" in fwd:  # NOTE: chat's name for the completions endpoint's max_tokens
        fwd.setdefault("max_tokens", fwd["max_completion_tokens"])
        del fwd["max_completion_tokens"]
    for k, v in fwd.items():
        if not _finite(v):
            raise Refusal(400, "field", f"{k} must hold finite numbers only")
    if "stream" in fwd and type(fwd["stream"]) is not bool:
        raise Refusal(400, "field", "stream must be true or false")
    return fwd


def parse_body(raw: bytes, *, chat: bool, max_prompt_chars: int) -> Parsed:
    """Check a ``/v1/chat/completions`` (``chat``) or ``/v1/completions`` body (raises :class:`Refusal`)."""
    doc = load_json(raw)
    sem = _semgov(doc)
    model = None if doc.get("model") is None else _str(doc["model"], "model")
    fwd = _forward(doc, _COMMON | (_CHAT_ONLY if chat else _COMPLETION_ONLY))
    stream = bool(fwd.pop("stream", False))
    if chat:
        msgs = doc.get("messages")
        if type(msgs) is not list or not 0 < len(msgs) <= MAX_MESSAGES:
            raise Refusal(400, "messages", f"messages must be a list of 1..{MAX_MESSAGES} messages")
        messages = [_message(m, i) for i, m in enumerate(msgs)]
        if sum(len(json.dumps(m.get("content"))) for m in messages) > max_prompt_chars:
            raise Refusal(413, "prompt_size", f"the messages exceed {max_prompt_chars} characters")
        return Parsed(
            True,
            model,
            _claims(sem),
            messages,
            _roles(messages, sem.get("segments")),
            None,
            None,
            fwd,
            stream,
        )
    prompt = doc.get("prompt")
    if type(prompt) is str:
        if not prompt or len(prompt) > max_prompt_chars:
            raise Refusal(
                400 if not prompt else 413, "prompt_size", f"prompt must be 1..{max_prompt_chars} characters"
            )
        _str(prompt, "prompt", max_prompt_chars)
    elif type(prompt) is list and 0 < len(prompt) <= max_prompt_chars and all(type(t) is int for t in prompt):
        pass
    else:
        raise Refusal(400, "prompt", "prompt must be one string or one list of token ids")
    return Parsed(
        False,
        model,
        _claims(sem),
        None,
        None,
        prompt,
        _spans(sem.get("segments"), max_prompt_chars),
        fwd,
        stream,
    )
