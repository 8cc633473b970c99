"""The producer's side of provenance: build and sign the payload a donor carries.

Whatever registers a request as a donor (a serving engine, a capture tool)
signs what it knows about it; semgov later verifies that signature and every
claim as facts (``semgov.facts.compute``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import ValidationError

from semgov._internal.bindings import segments_sha256, text_sha256
from semgov.errors import InputError
from semgov.facts.token_ids import TokenIds
from semgov.facts.tokens import as_tokens, token_hash
from semgov.signing.canonical import canonicalize
from semgov.signing.keys import SigningKey
from semgov.wire.models import PROVENANCE_SCHEMA, ProvenancePayload
from semgov.wire.timefmt import rfc3339


def provenance_payload(
    *,
    donor_id: str,
    tenant: str,
    namespace: str,
    task: dict[str, str],
    response_contract: dict[str, str],
    created_at: datetime,
    expires_at: datetime,
    policy_version: str,
    token_ids: Sequence[int],
    segments: Iterable[Any],
    text: str | None = None,
    pii_entities: Sequence[str] = (),
    pii_scanned: bool = True,
    visibility: Literal["tenant", "public"] = "tenant",
) -> dict[str, Any]:
    """A validated ``semgov.provenance/v1`` payload as JSON data (raises :class:`InputError`).

    ``segments`` and ``text`` are the donor prompt's as it will be offered (``text`` None when
    no text goes with it): both are bound by hash, so a candidate whose segments or text differ
    from these fails the provenance gate.
    """
    payload: dict[str, Any] = {
        "schema": PROVENANCE_SCHEMA,
        "donor_id": donor_id,
        "tenant": tenant,
        "namespace": namespace,
        "task": dict(task),
        "response_contract": dict(response_contract),
        "created_at": rfc3339(created_at),
        "expires_at": rfc3339(expires_at),
        "policy_version": policy_version,
        # NOTE: a prompt's TokenIds is hashed from its array as is (no list round trip)
        "token_ids_sha256": token_hash(
            token_ids.array if isinstance(token_ids, TokenIds) else as_tokens(list(token_ids))
        ),
        "segments_sha256": segments_sha256(segments),
        "text_sha256": None if text is None else text_sha256(text),
        "pii": {"scanned": pii_scanned, "entities": sorted(pii_entities)},
        "visibility": visibility,
    }
    try:
        ProvenancePayload.model_validate(payload)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        raise InputError(
            f"invalid provenance payload: {err['msg']}", field=".".join(map(str, err["loc"]))
        ) from e
    return payload


def sign_provenance(payload: dict[str, Any], key: SigningKey) -> dict[str, Any]:
    """The candidate's ``provenance`` object: payload, key id, base64 Ed25519 over its RFC 8785 bytes."""
    return {"payload": payload, "key_id": key.key_id, "signature": key.sign(canonicalize(payload))}
