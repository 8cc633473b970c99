"""Shadow decision records: made from real evaluator decisions, signed, verified, paired, compared."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from semgov import Evaluator, SignatureError, load_signing_key, verify_record
from semgov.errors import InputError
from semgov.facts.pii import PiiScanner
from semgov.signing.canonical import canonicalize
from semgov.signing.keys import generate_keypair, load_public_key
from semgov.signing.shadow import is_disagreement, shadow_record, verify_shadow_record
from semgov.typing import SignedDecision
from semgov.wire.models import DECISION_V3_FIELDS, SHADOW_DECISION_SCHEMA, ShadowDecisionRecord
from tests.conftest import Keys, candidate, parse, policy_with, request

SHADOW_ONLY = ("schema", "live_decision_id", "live_decision", "key_id", "signature")


def _shadow_evaluator(keys: Keys, pii_scanner: PiiScanner, min_similarity: float) -> Evaluator:
    return Evaluator(
        policy_with(f"similarity: {{min: {min_similarity}}}"),
        keys.keyring,
        keys.decision,
        pii_scanner=pii_scanner,
    )


def _pair(
    evaluator: Evaluator, shadow: Evaluator, keys: Keys, similarity: float = 0.9, request_id: str = "r-17"
) -> tuple[SignedDecision, SignedDecision]:
    """The live and the shadow policy's decisions of one request with one candidate."""
    req = parse(request([candidate(keys, "d-1", similarity=similarity)], request_id=request_id))
    [live] = evaluator.evaluate(req)
    [sh] = shadow.evaluate(req)
    return live, sh


@pytest.fixture
def strict(keys: Keys, pii_scanner: PiiScanner) -> Evaluator:
    """A shadow policy stricter than the default: similarity 0.95 (the default allows 0.6)."""
    return _shadow_evaluator(keys, pii_scanner, 0.95)


@pytest.fixture
def lenient(keys: Keys, pii_scanner: PiiScanner) -> Evaluator:
    """A shadow policy more lenient than the default: similarity 0.1."""
    return _shadow_evaluator(keys, pii_scanner, 0.1)


def test_round_trip(evaluator: Evaluator, strict: Evaluator, keys: Keys) -> None:
    """A shadow record keeps the shadow decision's content (less the v3 donor scope: a shadow crossed
    nothing), names the live decision, and verifies."""
    live, sh = _pair(evaluator, strict, keys)
    rec = shadow_record(sh, live, keys.decision)
    assert rec.canonical == canonicalize(rec.record) and json.loads(rec.canonical) == rec.record
    typed = verify_shadow_record(rec.record, keys.decision.public_key)
    assert isinstance(typed, ShadowDecisionRecord) and typed.schema_ == SHADOW_DECISION_SCHEMA
    assert (typed.live_decision_id, typed.live_decision) == (live.record["decision_id"], "allow")
    assert typed.decision == "deny" and typed.key_id == keys.decision.key_id
    assert {k: v for k, v in rec.record.items() if k not in SHADOW_ONLY} == {
        k: v for k, v in sh.record.items() if k not in SHADOW_ONLY and k not in DECISION_V3_FIELDS
    }
    assert all(k in sh.record and k not in rec.record for k in DECISION_V3_FIELDS)


def test_allowed_spans_keep_their_plan(evaluator: Evaluator, lenient: Evaluator, keys: Keys) -> None:
    """An allowing shadow record carries the v2 spans, each with its `recompute`."""
    live, sh = _pair(evaluator, lenient, keys)
    typed = verify_shadow_record(shadow_record(sh, live, keys.decision).record, keys.decision.public_key)
    assert typed.decision == "allow" and typed.approved_spans
    assert [s.recompute for s in typed.approved_spans] == [s["recompute"] for s in sh.approved_spans]


def test_resigned_with_the_given_key(
    evaluator: Evaluator, strict: Evaluator, keys: Keys, tmp_path: Path
) -> None:
    """The shadow record is signed by the key passed in, not the one that signed the evaluator's decision."""
    priv, pub = generate_keypair(tmp_path)
    other = load_signing_key(priv)
    live, sh = _pair(evaluator, strict, keys)
    rec = shadow_record(sh, live, other).record
    assert rec["key_id"] == other.key_id != sh.record["key_id"]
    verify_shadow_record(rec, load_public_key(pub))
    with pytest.raises(SignatureError, match="signed by key"):
        verify_shadow_record(rec, keys.decision.public_key)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda r: r.__setitem__("decision", "allow"),
        lambda r: r.__setitem__("live_decision", "deny"),
        lambda r: r.__setitem__("live_decision_id", "0" * 32),
        lambda r: r["gates"][8].__setitem__("result", "pass"),
        lambda r: r["policy"].__setitem__("revision", "sha256:" + "0" * 64),
    ],
    ids=["decision", "live_decision", "live_decision_id", "gate", "policy"],
)
def test_tampering_is_detected(evaluator: Evaluator, strict: Evaluator, keys: Keys, mutate: Any) -> None:
    """Changing any signed field of a shadow record, its live pairing included, breaks the signature."""
    live, sh = _pair(evaluator, strict, keys)
    rec = copy.deepcopy(shadow_record(sh, live, keys.decision).record)
    mutate(rec)
    with pytest.raises(SignatureError, match="does not verify"):
        verify_shadow_record(rec, keys.decision.public_key)


@pytest.mark.parametrize(
    ("mutate", "why"),
    [
        (lambda r: r.__setitem__("schema", "semgov.decision/v2"), "schema"),
        (lambda r: r.pop("live_decision_id"), "live_decision_id: Field required"),
        (lambda r: r.__setitem__("live_decision", None), "both null or both set"),
        (lambda r: r["approved_spans"][0].pop("recompute"), "approved_spans.0.recompute"),
        (lambda r: r.__setitem__("evaluated_at", 1795946400), "evaluated_at"),
    ],
    ids=["live-schema", "no-live-id", "half-paired", "span-without-plan", "unix-time"],
)
def test_shape_is_checked_strictly(
    evaluator: Evaluator, lenient: Evaluator, keys: Keys, mutate: Any, why: str
) -> None:
    """A record of another shape is refused as not a shadow decision record, naming the field."""
    live, sh = _pair(evaluator, lenient, keys)
    rec = copy.deepcopy(shadow_record(sh, live, keys.decision).record)
    mutate(rec)
    with pytest.raises(SignatureError, match="not a shadow decision record") as e:
        verify_shadow_record(rec, keys.decision.public_key)
    assert why in str(e.value)


def test_shadow_and_live_records_are_never_taken_for_each_other(
    evaluator: Evaluator, strict: Evaluator, keys: Keys
) -> None:
    """verify_record refuses a shadow record as a live decision, and verify_shadow_record a live one."""
    live, sh = _pair(evaluator, strict, keys)
    with pytest.raises(SignatureError, match="not a decision record: schema"):
        verify_record(shadow_record(sh, live, keys.decision).record, keys.decision.public_key)
    with pytest.raises(SignatureError, match="not a shadow decision record"):
        verify_shadow_record(live.record, keys.decision.public_key)


def test_wrong_live_pairing_raises(evaluator: Evaluator, strict: Evaluator, keys: Keys) -> None:
    """A live decision of another donor or another request is refused, naming the field."""
    two = parse(request([candidate(keys, "d-1"), candidate(keys, "d-2")], request_id="r-1"))
    live1, live2 = evaluator.evaluate(two)
    sh1, _ = strict.evaluate(two)
    with pytest.raises(InputError, match="donor_id 'd-2'") as e:
        shadow_record(sh1, live2, keys.decision)
    assert e.value.field == "donor_id"
    other, _ = _pair(evaluator, strict, keys, request_id="r-2")
    with pytest.raises(InputError, match="request_id 'r-2'") as e:
        shadow_record(sh1, other, keys.decision)
    assert e.value.field == "request_id"
    assert shadow_record(sh1, live1, keys.decision).record["live_decision_id"] == live1.record["decision_id"]


def test_only_live_decisions_are_paired_and_shadowed(
    evaluator: Evaluator, strict: Evaluator, keys: Keys
) -> None:
    """A shadow record is neither the live side of a pair nor made into a shadow record again."""
    live, sh = _pair(evaluator, strict, keys)
    rec = shadow_record(sh, live, keys.decision)
    with pytest.raises(InputError, match="not a live decision"):
        shadow_record(sh, rec, keys.decision)
    with pytest.raises(InputError, match="made from a semgov.decision/v3 record"):
        shadow_record(rec, live, keys.decision)


def test_without_a_live_decision(
    evaluator: Evaluator, strict: Evaluator, lenient: Evaluator, keys: Keys
) -> None:
    """No live decision: both live fields are null; a shadow allow then disagrees, a shadow deny does not."""
    _, deny = _pair(evaluator, strict, keys)
    _, allow = _pair(evaluator, lenient, keys)
    denied = shadow_record(deny, None, keys.decision).record
    allowed = shadow_record(allow, None, keys.decision).record
    typed = verify_shadow_record(denied, keys.decision.public_key)
    assert typed.live_decision_id is None and typed.live_decision is None
    assert not is_disagreement(denied) and is_disagreement(allowed)


@pytest.mark.parametrize(
    ("similarity", "shadow", "disagrees"),
    [(0.9, "strict", True), (0.2, "lenient", True), (0.9, "lenient", False), (0.2, "strict", False)],
    ids=["allow->deny", "deny->allow", "allow-allow", "deny-deny"],
)
def test_disagreement(
    evaluator: Evaluator,
    strict: Evaluator,
    lenient: Evaluator,
    keys: Keys,
    similarity: float,
    shadow: str,
    disagrees: bool,
) -> None:
    """is_disagreement is true exactly when the shadow's outcome differs from the live one's."""
    policy = {"strict": strict, "lenient": lenient}[shadow]
    live, sh = _pair(evaluator, policy, keys, similarity=similarity)
    rec = shadow_record(sh, live, keys.decision).record
    assert (rec["live_decision"] != rec["decision"]) is disagrees
    assert is_disagreement(rec) is disagrees


def test_disagreement_of_a_live_decision_is_an_error(evaluator: Evaluator, keys: Keys) -> None:
    """is_disagreement refuses a record that is not a shadow decision record."""
    [live] = evaluator.evaluate(parse(request([candidate(keys)])))
    with pytest.raises(InputError, match="not a semgov.shadow_decision/v1 record"):
        is_disagreement(live.record)
