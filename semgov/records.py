"""Decision records: signing and verification.

A record is signed with Ed25519 over the RFC 8785 canonical JSON of the record
without its ``signature`` field; the signature is base64.
"""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import ValidationError

from semgov.canonical import canonicalize, canonicalize_record
from semgov.errors import SignatureError
from semgov.keys import SigningKey, key_id_for, verify_signature
from semgov.models import DecisionRecord


def sign_record(unsigned: dict[str, Any], key: SigningKey) -> dict[str, Any]:
    """Return ``unsigned`` plus ``key_id`` and ``signature`` (the input is not modified)."""
    body = {**unsigned, "key_id": key.key_id}
    body.pop("signature", None)
    body["signature"] = key.sign(canonicalize_record(body))
    return body


def verify_record(record: dict[str, Any], public_key: Ed25519PublicKey) -> DecisionRecord:
    """Check shape, key id and signature of one decision record; return it typed.

    Raises :class:`SignatureError` naming the problem.
    """
    try:
        typed = DecisionRecord.model_validate(record)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise SignatureError(f"not a decision record: {loc}: {err['msg']}") from e
    expected = key_id_for(public_key)
    if typed.key_id != expected:
        raise SignatureError(f"signed by key {typed.key_id!r}, but the given public key is {expected!r}")
    body = {k: v for k, v in record.items() if k != "signature"}
    if not verify_signature(public_key, typed.signature, canonicalize(body)):
        raise SignatureError("signature does not verify: the record was altered or signed by another key")
    return typed
