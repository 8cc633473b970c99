"""Who a request belongs to: the semgov request context, and the cache key derived from it.

SGLang has no authenticated per-request metadata. The hook therefore reads the request's
context (tenant, namespace, task, response contract, optional prompt segments) from a token
that a trusted gateway in front of SGLang writes into the request's ``extra_key`` field, and
that the hook verifies with a shared HMAC key:

    semgov1.<base64url(RFC 8785 JSON of the context)>.<base64url(HMAC-SHA256(key, "semgov1." + payload))>

Anything after the 43-character MAC (SGLang appends the LoRA id to ``extra_key``) is kept as
the request's own cache-key suffix.

The hook then replaces ``req.extra_key`` with a key derived server-side
(:func:`RequestContext.cache_key`): an HMAC of tenant, namespace and suffix. Two tenants or
namespaces therefore never share a node of SGLang's exact-prefix tree, whatever the caller
sent, and a caller cannot name another tenant's key without the secret. A request without a
valid token is served normally (exact-prefix reuse among requests with the same ``extra_key``
only) but never gets semantic reuse and never becomes a donor.

Everything here is pure (no I/O): the key is passed in.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from semgov.canonical import canonicalize
from semgov.models import ResponseContract, Segment, TaskRef

TOKEN_PREFIX = "semgov1."
_MAC_CHARS = 43  # base64url of 32 bytes, unpadded
MAX_TOKEN_CHARS = 16384
KEY_PREFIX = "semgov:"


class ContextError(ValueError):
    """A context token that cannot be trusted (malformed, wrong MAC, bad fields)."""


def _b64e(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _b64d(text: str) -> bytes:
    if not text or any(
        c not in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_" for c in text
    ):
        raise ContextError("not base64url")
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as e:
        raise ContextError(f"not base64url ({e})") from e


def _mac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


@dataclass(frozen=True, slots=True)
class RequestContext:
    """The verified context of one request (what semgov decides over besides the prompt)."""

    tenant: str
    namespace: str
    task: dict[str, str]
    response_contract: dict[str, str]
    segments: tuple[tuple[str, int, int], ...] | None
    suffix: str

    def scope(self, key: bytes) -> str:
        """Isolation scope of semantic candidates: tenant, namespace and suffix (the LoRA id), keyed.

        KV computed under one adapter is never a candidate for a request served by another.
        """
        msg = (
            b"scope\0" + self.tenant.encode() + b"\0" + self.namespace.encode() + b"\0" + self.suffix.encode()
        )
        return KEY_PREFIX + _mac(key, msg).hex()[:32]

    def cache_key(self, key: bytes) -> str:
        """The ``extra_key`` of the request's exact-prefix tree: tenant, namespace and suffix, keyed."""
        msg = (
            b"tree\0" + self.tenant.encode() + b"\0" + self.namespace.encode() + b"\0" + self.suffix.encode()
        )
        return KEY_PREFIX + _mac(key, msg).hex()[:32]


def anonymous_cache_key(key: bytes, extra_key: str | None) -> str:
    """The derived ``extra_key`` of a request without a valid context (isolated by what it sent)."""
    msg = b"anon\0" + (extra_key or "").encode("utf-8", "surrogatepass")
    return KEY_PREFIX + "anon:" + _mac(key, msg).hex()[:32]


def make_context_token(
    key: bytes,
    *,
    tenant: str,
    namespace: str,
    task: dict[str, str],
    response_contract: dict[str, str],
    segments: list[tuple[str, int, int]] | None = None,
) -> str:
    """What a gateway writes into ``extra_key`` (raises :class:`ContextError` on bad fields)."""
    doc: dict[str, Any] = {
        "tenant": tenant,
        "namespace": namespace,
        "task": dict(task),
        "response_contract": dict(response_contract),
    }
    if segments is not None:
        doc["segments"] = [list(s) for s in segments]
    _validate(doc)
    payload = _b64e(canonicalize(doc))
    return TOKEN_PREFIX + payload + "." + _b64e(_mac(key, (TOKEN_PREFIX + payload).encode("ascii")))


def _validate(doc: Any) -> RequestContext:
    if not isinstance(doc, dict):
        raise ContextError("context is not a JSON object")
    unknown = set(doc) - {"tenant", "namespace", "task", "response_contract", "segments"}
    if unknown:
        raise ContextError(f"unknown context field(s): {sorted(unknown)}")
    for name in ("tenant", "namespace"):
        v = doc.get(name)
        # Same id rules as the wire types: printable ASCII without spaces, 1..128 characters.
        if not isinstance(v, str) or not (1 <= len(v) <= 128) or not all("!" <= c <= "~" for c in v):
            raise ContextError(f"context {name} must be 1..128 printable ASCII characters without spaces")
    try:
        task = TaskRef.model_validate(doc.get("task"))
        contract = ResponseContract.model_validate(doc.get("response_contract"))
        segs_raw = doc.get("segments")
        segments: tuple[tuple[str, int, int], ...] | None = None
        if segs_raw is not None:
            if not isinstance(segs_raw, list) or not segs_raw:
                raise ContextError("context segments must be a non-empty list of [role, start, end]")
            parsed: list[tuple[str, int, int]] = []
            for s in segs_raw:
                if not isinstance(s, list) or len(s) != 3:
                    raise ContextError("context segments must be a non-empty list of [role, start, end]")
                seg = Segment.model_validate({"role": s[0], "start": s[1], "end": s[2]})
                expected = parsed[-1][2] if parsed else 0
                if seg.start != expected or seg.end <= seg.start:
                    raise ContextError(
                        f"context segments[{len(parsed)}] starts at {seg.start}, expected {expected}: "
                        "segments must tile the prompt in order"
                    )
                parsed.append((seg.role, seg.start, seg.end))
            segments = tuple(parsed)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        raise ContextError(f"context {'.'.join(map(str, err['loc']))}: {err['msg']}") from e
    return RequestContext(
        tenant=doc["tenant"],
        namespace=doc["namespace"],
        task=task.model_dump(),
        response_contract=contract.model_dump(),
        segments=segments,
        suffix="",
    )


def parse_context_token(key: bytes, extra_key: str | None) -> RequestContext:
    """Verify and parse a context token (raises :class:`ContextError` saying why it is not trusted)."""
    if not extra_key or not extra_key.startswith(TOKEN_PREFIX):
        raise ContextError("no semgov context token in extra_key")
    if len(extra_key) > MAX_TOKEN_CHARS:
        raise ContextError(f"context token longer than {MAX_TOKEN_CHARS} characters")
    body = extra_key[len(TOKEN_PREFIX) :]
    dot = body.find(".")
    if dot <= 0:
        raise ContextError("context token has no MAC")
    payload, rest = body[:dot], body[dot + 1 :]
    mac_text, suffix = rest[:_MAC_CHARS], rest[_MAC_CHARS:]
    if len(mac_text) != _MAC_CHARS:
        raise ContextError("context token MAC is truncated")
    expected = _mac(key, (TOKEN_PREFIX + payload).encode("ascii"))
    # NOTE: compare MACs in constant time, and before parsing anything the caller controls.
    if not hmac.compare_digest(_b64d(mac_text), expected):
        raise ContextError("context token MAC does not verify")
    raw = _b64d(payload)
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise ContextError(f"context payload is not JSON ({e})") from e
    if canonicalize(doc) != raw:
        raise ContextError("context payload is not RFC 8785 canonical JSON")
    ctx = _validate(doc)
    return RequestContext(
        tenant=ctx.tenant,
        namespace=ctx.namespace,
        task=ctx.task,
        response_contract=ctx.response_contract,
        segments=ctx.segments,
        suffix=suffix,
    )
