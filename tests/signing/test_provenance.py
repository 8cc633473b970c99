"""Producer-side provenance: payloads are validated and signatures verify over RFC 8785 bytes."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from semgov import InputError, canonicalize, provenance_payload, sign_provenance, tokens_sha256
from semgov.signing.keys import verify_signature
from tests.conftest import CONTRACT, TASK, Keys

WHEN = datetime(2026, 11, 28, 10, tzinfo=UTC)


def _payload(**over: object) -> dict[str, object]:
    args: dict[str, object] = dict(
        donor_id="r-1", tenant="acme", namespace="ns", task=TASK, response_contract=CONTRACT,
        created_at=WHEN, expires_at=WHEN, policy_version="default@1", token_ids=[1, 2, 3],
        segments=[{"role": "evidence", "start": 0, "end": 3}],
    )  # fmt: skip
    args.update(over)
    return provenance_payload(**args)  # type: ignore[arg-type]


def test_payload_fields_and_token_hash() -> None:
    """The payload carries the schema tag, RFC 3339 UTC times and the LE-uint32 token hash."""
    p = _payload(pii_entities=["PHONE_NUMBER", "EMAIL_ADDRESS"])
    assert p["schema"] == "semgov.provenance/v1"
    assert p["created_at"] == "2026-11-28T10:00:00Z"
    assert p["token_ids_sha256"] == tokens_sha256([1, 2, 3])
    assert p["pii"] == {"scanned": True, "entities": ["EMAIL_ADDRESS", "PHONE_NUMBER"]}


def test_invalid_payload_is_refused() -> None:
    """A producer cannot sign an invalid payload by accident: the error names the field."""
    with pytest.raises(InputError) as e:
        _payload(tenant="")
    assert e.value.field == "tenant"
    with pytest.raises(InputError):
        _payload(response_contract={"id": "c", "schema_sha256": "not-hex"})


def test_signature_covers_canonical_payload(keys: Keys) -> None:
    """sign_provenance signs the canonical bytes: any change to the payload breaks it."""
    prov = sign_provenance(_payload(), keys.k1)
    assert prov["key_id"] == "k1"
    assert verify_signature(keys.k1.public_key, prov["signature"], canonicalize(prov["payload"]))
    changed = {**prov["payload"], "namespace": "other"}
    assert not verify_signature(keys.k1.public_key, prov["signature"], canonicalize(changed))


def test_token_hash_is_the_same_for_a_prompts_token_array_and_its_list() -> None:
    """A prompt's TokenIds, an array('q') and a list of the same ids give one token hash."""
    from array import array

    import numpy as np

    from semgov.facts.token_ids import TokenIds

    ids = [7, 0, 2**32 - 1, 40_000]
    want = tokens_sha256(ids)
    assert _payload(token_ids=TokenIds(np.array(ids)))["token_ids_sha256"] == want
    assert _payload(token_ids=array("q", ids))["token_ids_sha256"] == want
    assert _payload(token_ids=TokenIds(np.array([7, 0, 1, 40_000])))["token_ids_sha256"] != want
