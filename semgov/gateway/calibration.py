"""Calibration requests: ``POST /v1/semgov/calibrate`` (docs/gateway.md, "Calibration requests").

``semgov calibrate CAPTURED --server URL`` runs each sampled pair in the team's own SGLang server:
the donor, the recipient cold, the recipient under a realization plan, then a release of the
run's donors. Each request's context token carries a calibration claim
(:class:`semgov.context.CalibrationClaim`) and the run's namespace
(:func:`semgov.context.calibration_namespace`). A client that holds the context key mints those
itself; one that holds an API key sends them here, and the gateway mints them under the rules
of every other route: the tenant is the key's, the claims are authorized by
:func:`semgov.gateway.tenants.authorize`, and only a key whose entry says ``calibrate: true``
(:func:`semgov.gateway.tenants.may_calibrate`) is heard at all.

This module holds the route's pure pieces: the body's strict, bounded parse
(:func:`parse_calibration`, every refusal a :class:`Refusal` naming the field), the run's
namespace (:func:`run_namespace`), the ``rid`` the engine records (:func:`engine_rid`) and the
engine's answer, checked and bounded (:func:`answer_of`, a :class:`UpstreamError` 502 otherwise).
The claim's own rules (run, role, plan) are the token verifier's: the gateway mints the token
with :func:`semgov.context.make_context_token`, which validates the claim exactly as
:func:`semgov.context.parse_context_token` does, and its refusal is the client's 400.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from semgov.context import CALIBRATION_MARK, CalibrationClaim, calibration_namespace
from semgov.gateway.prompt import ROLES
from semgov.gateway.request import _pair, _str, load_json
from semgov.gateway.tenants import Claims, Refusal
from semgov.gateway.upstream import UpstreamError
from semgov.wire import strictjson

__all__ = [
    "MAX_NEW_TOKENS",
    "CalibrationCall",
    "answer_of",
    "engine_rid",
    "parse_calibration",
    "run_namespace",
]

MAX_NEW_TOKENS = 4096
MAX_SEGMENTS = 4096
MAX_ANSWER_BYTES = 4 << 20
MAX_NAMESPACE_CHARS = 128  # the token's bound on a namespace (semgov.context)
RID_PREFIX = "semgov-calibrate-"
_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_READABLE = re.compile(r"[^A-Za-z0-9_-]")  # NOTE: no "." in the key id's readable part (see engine_rid)
_READABLE_CHARS = 12
_RID_DIGEST_HEX = 32
_FIELDS = frozenset(
    {"request_id", "input_ids", "segments", "namespace", "task", "response_contract", "calibration",
     "max_new_tokens"}
)  # fmt: skip
_CLAIM_KEYS = frozenset({"run", "role", "plan"})
_MAX_CLAIM_CHARS = 64  # a bound on the parse only: the verifier's rules are tighter (semgov.context)
_MAX_TOKEN_ID = 2**31  # an engine's output id (its vocabulary may be padded past the tokenizer's)
_MAX_COUNT = 2**53 - 1


@dataclass(frozen=True, slots=True)
class CalibrationCall:
    """A checked calibration request: what the token will claim and what the engine is sent."""

    request_id: str
    ids: list[int]
    segments: list[tuple[str, int, int]] | None
    claims: Claims  # the base namespace, task and contract, as sent (None: not sent)
    claim: CalibrationClaim
    max_new_tokens: int


def _unknown(doc: dict[str, Any]) -> None:
    unknown = sorted(set(doc) - _FIELDS)
    if not unknown:
        return
    if "tenant" in unknown:
        raise Refusal(
            400, "unknown_field", "a calibration request cannot name a tenant: the tenant is the API key's"
        )
    raise Refusal(
        400,
        "unknown_field",
        f"unknown field {unknown[0][:64]!r} (a calibration request has {', '.join(sorted(_FIELDS))})",
    )


def _ids(value: object, max_ids: int, vocab_size: int) -> list[int]:
    if type(value) is not list or not value:
        raise Refusal(400, "prompt", "input_ids must be a non-empty list of token ids")
    if len(value) > max_ids:
        raise Refusal(413, "prompt_size", f"input_ids holds {len(value)} ids, over this gateway's {max_ids}")
    if not all(type(t) is int and 0 <= t < vocab_size for t in value):
        raise Refusal(400, "token_id", f"input_ids must be integers in [0, {vocab_size})")
    return value


def _segments(value: object, n_ids: int) -> list[tuple[str, int, int]] | None:
    """``[[role, start, end], ...]`` tiling ``[0, n_ids)`` in order, each non-empty (the token's rule)."""
    if value is None:
        return None
    if type(value) is not list or not 0 < len(value) <= min(MAX_SEGMENTS, n_ids):
        raise Refusal(
            400, "segments", f"segments must be a list of 1..{min(MAX_SEGMENTS, n_ids)} [role, start, end]"
        )
    out: list[tuple[str, int, int]] = []
    pos = 0
    for i, s in enumerate(value):
        if type(s) is not list or len(s) != 3 or type(s[1]) is not int or type(s[2]) is not int:
            raise Refusal(400, "segments", f"segments[{i}] must be [role, start, end] with integer offsets")
        role, start, end = s
        if type(role) is not str or role not in ROLES:
            raise Refusal(400, "segments", f"segments[{i}]: the role must be one of {', '.join(ROLES)}")
        if start != pos or not start < end <= n_ids:
            raise Refusal(
                400,
                "segments",
                f"segments[{i}] is [{start}, {end}): segments tile input_ids in order from 0, "
                f"each non-empty, up to its {n_ids} ids",
            )
        out.append((role, start, end))
        pos = end
    if pos != n_ids:
        raise Refusal(400, "segments", f"segments end at {pos}: input_ids has {n_ids} ids")
    return out


def _claim(value: object) -> CalibrationClaim:
    """The ``calibration`` member's shape; its rules are the token verifier's, checked at minting."""
    if type(value) is not dict or not {"run", "role"} <= set(value) or not set(value) <= _CLAIM_KEYS:
        raise Refusal(400, "claim_malformed", "calibration must be an object {run, role[, plan]}")
    for k, v in value.items():
        if type(v) is not str or not 0 < len(v) <= _MAX_CLAIM_CHARS:
            raise Refusal(
                400, "claim_malformed", f"calibration.{k} must be a string of 1..{_MAX_CLAIM_CHARS}"
            )
    return CalibrationClaim(value["run"], value["role"], value.get("plan"))


def _max_new_tokens(value: object) -> int:
    if type(value) is not int or not 1 <= value <= MAX_NEW_TOKENS:
        raise Refusal(400, "field", f"max_new_tokens must be an integer in 1..{MAX_NEW_TOKENS}")
    return value


def parse_calibration(raw: bytes, *, max_ids: int, vocab_size: int) -> CalibrationCall:
    """Check a calibration body (raises :class:`Refusal`, a 4xx naming the field).

    Strict JSON (:func:`semgov.gateway.request.load_json`); every member known, typed and bounded:
    ``request_id`` ``[A-Za-z0-9._-]{1,64}``; ``input_ids`` 1..``max_ids`` ids below
    ``vocab_size``; optional ``segments``; optional ``namespace``, ``task``,
    ``response_contract``; ``calibration``; ``max_new_tokens`` 1..:data:`MAX_NEW_TOKENS`."""
    doc = load_json(raw)
    _unknown(doc)
    rid = doc.get("request_id")
    if type(rid) is not str or not _REQUEST_ID.fullmatch(rid):
        raise Refusal(400, "field", "request_id must be 1..64 characters of A-Z a-z 0-9 . _ -")
    ids = _ids(doc.get("input_ids"), max_ids, vocab_size)
    task, contract = doc.get("task"), doc.get("response_contract")
    claims = Claims(
        namespace=None if doc.get("namespace") is None else _str(doc["namespace"], "namespace"),
        task=None if task is None else _pair(task, "task", ("id", "version")),
        response_contract=None
        if contract is None
        else _pair(contract, "response_contract", ("id", "schema_sha256")),
    )
    if "calibration" not in doc:
        raise Refusal(400, "claim_missing", "calibration ({run, role[, plan]}) is required")
    return CalibrationCall(
        request_id=rid,
        ids=ids,
        segments=_segments(doc.get("segments"), len(ids)),
        claims=claims,
        claim=_claim(doc["calibration"]),
        max_new_tokens=_max_new_tokens(doc.get("max_new_tokens")),
    )


def run_namespace(base: str, run: str) -> str:
    """The namespace the token claims: ``<base>/semgov-calibration/<run>`` (raises :class:`Refusal`
    400 for a base that already holds the mark, or a result past the token's 128 characters)."""
    if CALIBRATION_MARK in base:
        raise Refusal(
            400,
            "claim_malformed",
            f"namespace {base[:128]!r} holds {CALIBRATION_MARK!r}, reserved for calibration runs: claim the "
            "base namespace, the gateway adds the run's",
        )
    namespace = calibration_namespace(base, run)
    if len(namespace) > MAX_NAMESPACE_CHARS:
        raise Refusal(
            400,
            "claim_malformed",
            f"the run's namespace <namespace>{CALIBRATION_MARK}<run> would be {len(namespace)} characters, "
            f"over the token's {MAX_NAMESPACE_CHARS}: claim a shorter namespace or use a shorter run id",
        )
    return namespace


def engine_rid(key_id: str, request_id: str) -> str:
    """The ``rid`` the engine gets, and its audit records name the request by.

    ``semgov-calibrate-<readable>.<digest>-<request_id>``: ``readable`` is the key id's first 12
    characters with anything but ``A-Z a-z 0-9 _ -`` as ``_`` (for people), ``digest`` 32 hex
    characters of SHA-256 over the whole key id (for uniqueness). The first ``.`` after the prefix
    starts the digest, so the rid gives back ``(readable, digest, request_id)``: two keys' ids
    give one rid only if their digests collide. At most 127 characters of the hook's label
    alphabet (engine_hooks/core/plan.py ``request_label``): recorded as sent, never hashed."""
    readable = _READABLE.sub("_", key_id[:_READABLE_CHARS])
    raw = b"semgov.calibrate-rid/v1\x00" + key_id.encode("utf-8", "surrogatepass")
    digest = hashlib.sha256(raw).hexdigest()[:_RID_DIGEST_HEX]
    return f"{RID_PREFIX}{readable}.{digest}-{request_id}"


def _bad(why: str) -> UpstreamError:
    return UpstreamError(502, "upstream_error", f"the engine's answer is not a generation: {why}")


def _count(meta: dict[str, Any], name: str, required: bool) -> int | None:
    v = meta.get(name)
    if v is None and not required:
        return None
    if type(v) is not int or not 0 <= v <= _MAX_COUNT:
        raise _bad(f"meta_info.{name} is not a count")
    return v


def _finish(meta: dict[str, Any]) -> str | None:
    """SGLang's ``finish_reason`` (``{"type": ...}``, a string, or null) as its type."""
    reason = meta.get("finish_reason")
    if type(reason) is dict:
        reason = reason.get("type")
    if reason is None:
        return None
    if type(reason) is not str or not 0 < len(reason) <= 64:
        raise _bad("meta_info.finish_reason is not a reason")
    return reason


def answer_of(raw: bytes, *, rid: str, max_new_tokens: int) -> dict[str, Any]:
    """The route's answer from SGLang's ``/generate`` answer ``raw`` (raises :class:`UpstreamError`
    502 for one that is not a generation of this request: types checked, sizes bounded)."""
    if len(raw) > MAX_ANSWER_BYTES:
        raise _bad(f"larger than {MAX_ANSWER_BYTES} bytes")
    try:
        doc = strictjson.loads(raw, max_depth=32)
    except strictjson.StrictJSONError as e:
        raise _bad(f"not strict JSON ({str(e)[:120]})") from e
    if type(doc) is list and len(doc) == 1:
        doc = doc[0]
    if type(doc) is not dict or type(doc.get("meta_info")) is not dict:
        raise _bad("no object with meta_info")
    ids, text, meta = doc.get("output_ids"), doc.get("text"), doc["meta_info"]
    if type(ids) is not list or len(ids) > max_new_tokens:
        raise _bad(f"output_ids is not a list of at most {max_new_tokens} ids")
    if not all(type(t) is int and 0 <= t < _MAX_TOKEN_ID for t in ids):
        raise _bad("output_ids holds something other than token ids")
    if text is not None and type(text) is not str:
        raise _bad("text is not a string")
    if meta.get("id") is not None and meta["id"] != rid:
        raise _bad("it names another request (meta_info.id is not the rid sent)")
    return {
        "request_id": rid,
        "output_ids": ids,
        "text": text,
        "meta_info": {
            "prompt_tokens": _count(meta, "prompt_tokens", True),
            "completion_tokens": _count(meta, "completion_tokens", True),
            "cached_tokens": _count(meta, "cached_tokens", False),
            "finish_reason": _finish(meta),
        },
    }
