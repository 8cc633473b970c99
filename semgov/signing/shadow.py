"""Shadow decision records (``semgov.shadow_decision/v1``): signing and verification.

A shadow policy decides every donor candidate alongside the live policy (the SGLang hook's
``SEMGOV_SHADOW_POLICY``). Its decisions are signed and appended to the same audit log, but
nothing ever acts on them: they carry their own schema id, so that no reader of the log can
take one for a live ``semgov.decision/v1|v2|v3`` record, and name the live decision of the same
request and donor (``live_decision_id``, ``live_decision``).

- :func:`shadow_record` turns a signed decision made by the shadow policy's evaluator into a
  signed shadow record, paired with the live decision it shadows;
- :func:`verify_shadow_record` checks one (as :func:`semgov.signing.records.verify_record`
  checks a decision);
- :func:`is_disagreement` says whether the shadow decided otherwise than the live policy.
"""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import ValidationError

from semgov.errors import InputError
from semgov.signing.keys import SigningKey
from semgov.signing.records import sign_record_canonical, verify_record_as
from semgov.typing import SignedDecision
from semgov.wire.models import (
    DECISION_SCHEMA,
    DECISION_SCHEMAS,
    DECISION_V3_FIELDS,
    SHADOW_DECISION_SCHEMA,
    ShadowDecisionRecord,
)
from semgov.wire.names import disagrees

__all__ = ["is_disagreement", "shadow_record", "verify_shadow_record"]


def shadow_record(decision: SignedDecision, live: SignedDecision | None, key: SigningKey) -> SignedDecision:
    """The shadow record of ``decision``, signed with ``key``.

    ``decision``: a signed ``semgov.decision/v3`` record made by the shadow policy's evaluator
    (its donor scope and boundaries are left out: a shadow was never acted on, nothing crossed);
    ``live``: the live policy's decision of the same request and donor, or None when it made
    none. The result has ``decision``'s content, ``schema`` ``semgov.shadow_decision/v1``, and
    ``live_decision_id``/``live_decision`` from ``live`` (null without one); its old ``key_id``
    and signature are replaced. Raises :class:`InputError` when ``decision`` is not a v3 decision,
    ``live`` is not a live decision of the same ``request_id`` and ``donor_id``, or the result
    is not a valid :class:`ShadowDecisionRecord`.
    """
    rec = decision.record
    if rec.get("schema") != DECISION_SCHEMA:
        raise InputError(
            f"a shadow record is made from a {DECISION_SCHEMA} record, not {rec.get('schema')!r}"
        )
    pair: dict[str, Any] = {"live_decision_id": None, "live_decision": None}
    if live is not None:
        lrec = live.record
        if lrec.get("schema") not in DECISION_SCHEMAS:
            raise InputError(f"the live decision is a {lrec.get('schema')!r} record, not a live decision")
        for name in ("request_id", "donor_id"):
            if lrec.get(name) != rec.get(name):
                raise InputError(
                    f"the live decision is for {name} {lrec.get(name)!r}, the shadow's for {rec.get(name)!r}",
                    field=name,
                )
        pair = {"live_decision_id": lrec.get("decision_id"), "live_decision": lrec.get("decision")}
    body = {k: v for k, v in rec.items() if k not in DECISION_V3_FIELDS}
    signed, canonical = sign_record_canonical({**body, "schema": SHADOW_DECISION_SCHEMA, **pair}, key)
    try:
        ShadowDecisionRecord.model_validate(signed, by_alias=True, by_name=False)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise InputError(
            f"not a valid shadow decision record: {loc + ': ' if loc else ''}{err['msg']}"
        ) from e
    return SignedDecision(signed, canonical)


def verify_shadow_record(record: dict[str, Any], public_key: Ed25519PublicKey) -> ShadowDecisionRecord:
    """Check shape, key id and signature of one shadow decision record; return it typed.

    As strict as :func:`semgov.signing.records.verify_record` (``schemas/shadow_decision.schema.json``,
    no value coerced across JSON types, ``evaluated_at`` RFC 3339 with a zone). A live decision
    record is not a shadow record. Raises :class:`SignatureError` naming the problem.
    """
    return verify_record_as(record, public_key, ShadowDecisionRecord, "shadow decision record")


def is_disagreement(record: dict[str, Any]) -> bool:
    """Whether a shadow record's ``decision`` differs from its ``live_decision``.

    No live decision (``live_decision`` null) counts as a deny: nothing was reused. Raises
    :class:`InputError` for a record that is not a shadow decision record.
    """
    if record.get("schema") != SHADOW_DECISION_SCHEMA:
        raise InputError(f"not a {SHADOW_DECISION_SCHEMA} record: schema {record.get('schema')!r}")
    return disagrees(record.get("decision"), record.get("live_decision"))
