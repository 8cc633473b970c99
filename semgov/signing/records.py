"""Decision records: signing and verification.

A record is signed with Ed25519 over the RFC 8785 canonical JSON of the record
without its ``signature`` field; the signature is base64.
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import ValidationError

from semgov.errors import SignatureError
from semgov.signing.canonical import canonicalize, canonicalize_record, with_member
from semgov.signing.keys import SigningKey, key_id_for, verify_signature
from semgov.wire.models import DecisionFields, DecisionRecord
from semgov.wire.strictjson import StrictJSONError
from semgov.wire.strictjson import loads as strict_loads


def sign_record(unsigned: dict[str, Any], key: SigningKey) -> dict[str, Any]:
    """Return ``unsigned`` plus ``key_id`` and ``signature`` (the input is not modified)."""
    return sign_record_canonical(unsigned, key)[0]


def sign_record_canonical(unsigned: dict[str, Any], key: SigningKey) -> tuple[dict[str, Any], bytes]:
    """:func:`sign_record`, and the signed record's canonical bytes (the audit log's line), from one
    canonicalization: the signature is spliced into the signed message (:func:`with_member`)."""
    body = {**unsigned, "key_id": key.key_id}
    body.pop("signature", None)
    message = canonicalize_record(body)
    signature = key.sign(message)
    return {**body, "signature": signature}, with_member(message, body, "signature", signature)


# RFC 3339 ``date-time`` with a zone, as semgov writes ``evaluated_at`` (pydantic alone also takes
# dates, spaces for ``T`` and zoneless times).
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:\d{2})")

R = TypeVar("R", bound=DecisionFields)


def verify_record(record: dict[str, Any], public_key: Ed25519PublicKey) -> DecisionRecord:
    """Check shape, key id and signature of one decision record; return it typed.

    The shape is checked strictly, as ``schemas/decision.schema.json`` says: no value is coerced
    across JSON types (``"5"`` or ``true`` is not an integer) and ``evaluated_at`` is an RFC 3339
    timestamp with a zone. Raises :class:`SignatureError` naming the problem.
    """
    return verify_record_as(record, public_key, DecisionRecord, "decision record")


def verify_record_as(record: dict[str, Any], public_key: Ed25519PublicKey, model: type[R], what: str) -> R:
    """:func:`verify_record` for any signed decision record type ``model`` (a live decision, a
    shadow decision); ``what`` names it in the messages (``not a {what}: ...``)."""
    try:
        text = json.dumps(record, allow_nan=False, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise SignatureError(f"not a {what}: a string holds a lone surrogate") from e
    except (TypeError, ValueError, RecursionError) as e:
        raise SignatureError(f"not a {what}: not JSON data ({e})") from e
    try:
        # by_name=False: the wire name is "schema"; the Python name "schema_" is not a member.
        typed = model.model_validate_json(text, strict=True, by_alias=True, by_name=False)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise SignatureError(f"not a {what}: {loc + ': ' if loc else ''}{err['msg']}") from e
    at = record.get("evaluated_at")
    if not isinstance(at, str) or not _RFC3339.fullmatch(at):
        raise SignatureError(f"not a {what}: evaluated_at: {at!r} is not an RFC 3339 date-time with a zone")
    expected = key_id_for(public_key)
    if typed.key_id != expected:
        raise SignatureError(f"signed by key {typed.key_id!r}, but the given public key is {expected!r}")
    body = {k: v for k, v in record.items() if k != "signature"}
    try:
        message = canonicalize(body)
    except ValueError as e:  # rfc8785: integers beyond 2**53, lone surrogates
        raise SignatureError(f"not a {what}: no RFC 8785 form ({e})") from e
    if not verify_signature(public_key, typed.signature, message):
        raise SignatureError("signature does not verify: the record was altered or signed by another key")
    return typed


def verify_record_json(line: bytes | str, public_key: Ed25519PublicKey) -> DecisionRecord:
    """:func:`verify_record` for one serialized record (a line of ``semgov check --format jsonl``).

    The text must be strict JSON (see :mod:`semgov.wire.strictjson`): a repeated key, NaN,
    invalid UTF-8 or deep nesting is a :class:`SignatureError`, never a last-one-wins reading.
    """
    try:
        rec = strict_loads(line)
    except StrictJSONError as e:
        raise SignatureError(f"not a JSON record: {e}") from e
    if not isinstance(rec, dict):
        raise SignatureError("not a JSON object")
    return verify_record(rec, public_key)
