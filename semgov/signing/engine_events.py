"""Engine events: what a serving engine did with reuse, signed for the audit log.

An engine hook emits one ``semgov.engine_event/v2`` record per KV realization (the decision
that allowed it, the tokens materialized, the KV-pool slots written), per realization that
failed, per invariant violation it caught, when it disables reuse, per canary comparison and
when canaries turn shifted reuse off for a scope, and when a running engine reloads its policy
(or fails to): v1 records, which have none of the last four kinds, still verify. Records are signed
exactly like decision records (Ed25519 over the RFC 8785 canonical JSON of the record without
``signature``) and share the audit log with them.
"""

from __future__ import annotations

import operator
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import ValidationError

from semgov.errors import InputError, SignatureError
from semgov.signing.canonical import canonicalize
from semgov.signing.keys import SigningKey, key_id_for, verify_signature
from semgov.signing.records import sign_record_canonical
from semgov.wire.models import ENGINE_EVENT_SCHEMA, EngineEvent
from semgov.wire.timefmt import rfc3339


@dataclass(frozen=True, slots=True)
class SignedEvent:
    """A signed engine event and its canonical bytes (one JSON line, no newline): the audit leaf."""

    record: dict[str, Any]
    canonical: bytes

    @property
    def event_id(self) -> str:
        return str(self.record["event_id"])

    @property
    def kind(self) -> str:
        return str(self.record["kind"])


def _index(value: object, field: str, what: str) -> int:
    """``value`` as a Python int >= 0 (numpy integers too, not bools), else :class:`InputError`."""
    try:
        if isinstance(value, bool):
            raise TypeError
        n = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise InputError(f"{what} {value!r} is not an integer", field=field) from None
    if n < 0:
        raise InputError(f"{what} {n} is negative", field=field)
    return n


def slot_ranges(slots: Iterable[int]) -> list[list[int]]:
    """Compress slot indices, in the given order, into ``[start, length]`` runs.

    Each maximal run of consecutive ascending indices (``s, s+1, ...``) becomes one
    ``[s, length]``; anything else starts a new run, so expanding the runs gives back
    ``slots`` exactly. Accepts any integers (``numpy`` ones too) >= 0; raises
    :class:`InputError` naming the bad position otherwise.
    """
    out: list[list[int]] = []
    start = length = 0
    for i, raw in enumerate(slots):
        s = _index(raw, f"slots.{i}", "slot")
        if length and s == start + length:
            length += 1
            continue
        if length:
            out.append([start, length])
        start, length = s, 1
    if length:
        out.append([start, length])
    return out


def slot_indices(ranges: Sequence[Sequence[int]]) -> list[int]:
    """The slot indices a list of ``[start, length]`` runs stands for (inverse of :func:`slot_ranges`)."""
    return [s for start, length in ranges for s in range(start, start + length)]


def _invalid(e: ValidationError, what: str) -> InputError:
    err = e.errors(include_url=False)[0]
    return InputError(f"invalid {what}: {err['msg']}", field=".".join(map(str, err["loc"])))


def engine_event(
    kind: str,
    *,
    engine: str,
    at: datetime,
    request_id: str | None = None,
    decision_id: str | None = None,
    donor_id: str | None = None,
    materialized_tokens: int = 0,
    slots: Iterable[int] = (),
    spans: Sequence[Mapping[str, Any]] = (),
    detail: str = "",
) -> dict[str, Any]:
    """A validated, unsigned ``semgov.engine_event/v2`` record as JSON data.

    ``kind``: ``realization``, ``realization_failed``, ``invariant_violation``,
    ``reuse_disabled``, ``canary``, ``shifted_reuse_disabled``, ``policy_loaded``,
    ``policy_load_failed`` or ``calibration_released`` (checked here, like every other field).

    ``slots`` are the KV-pool slot indices written, one per token, in order; they are stored
    compressed (:func:`slot_ranges`). ``spans`` are the realized ``{recipient_start,
    donor_start, length, kind}`` spans. ``at`` must be timezone-aware; it is stored as RFC 3339
    UTC. ``event_id`` is a fresh random UUID (hex). Raises :class:`InputError` naming the field.
    """
    if not isinstance(at, datetime) or at.utcoffset() is None:
        raise InputError(f"{at!r} is not a timezone-aware datetime", field="at")
    for i, s in enumerate(spans):
        if not isinstance(s, Mapping):
            raise InputError(f"span {s!r} is not a mapping", field=f"spans.{i}")
    unsigned: dict[str, Any] = {
        "schema": ENGINE_EVENT_SCHEMA,
        "event_id": uuid.uuid4().hex,
        "kind": kind,
        "engine": engine,
        "request_id": request_id,
        "decision_id": decision_id,
        "donor_id": donor_id,
        "materialized_tokens": _index(materialized_tokens, "materialized_tokens", "token count"),
        "slots": slot_ranges(slots),
        "spans": [dict(s) for s in spans],
        "detail": detail,
        "at": rfc3339(at),
    }
    try:
        EngineEvent.model_validate({**unsigned, "key_id": "-", "signature": "-"})
    except ValidationError as e:
        raise _invalid(e, "engine event") from e
    return unsigned


def sign_engine_event(unsigned: dict[str, Any], key: SigningKey) -> SignedEvent:
    """Sign an event from :func:`engine_event`: the record plus its canonical bytes for the audit log.

    Raises :class:`InputError` when ``unsigned`` is not a valid engine event (the input is not
    modified).
    """
    record, canonical = sign_record_canonical(unsigned, key)
    try:
        EngineEvent.model_validate(record)
    except ValidationError as e:
        raise _invalid(e, "engine event") from e
    return SignedEvent(record, canonical)


def verify_engine_event(record: dict[str, Any], public_key: Ed25519PublicKey) -> EngineEvent:
    """Check shape, key id and signature of one engine event; return it typed.

    Raises :class:`SignatureError` naming the problem.
    """
    try:
        typed = EngineEvent.model_validate(record)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise SignatureError(f"not an engine event: {loc}: {err['msg']}") from e
    expected = key_id_for(public_key)
    if typed.key_id != expected:
        raise SignatureError(f"signed by key {typed.key_id!r}, but the given public key is {expected!r}")
    body = {k: v for k, v in record.items() if k != "signature"}
    if not verify_signature(public_key, typed.signature, canonicalize(body)):
        raise SignatureError("signature does not verify: the event was altered or signed by another key")
    return typed
