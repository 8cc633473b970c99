"""Decision records: signature round trip, tampering, wrong key, committed fixture."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from semgov import Evaluator, SignatureError, verify_record
from semgov.signing.canonical import canonicalize
from semgov.signing.keys import load_public_key
from tests.conftest import ASSETS, Keys, candidate, parse, request


def _record(evaluator: Evaluator, keys: Keys) -> dict[str, Any]:
    [d] = evaluator.evaluate(parse(request([candidate(keys)])))
    assert json.loads(d.canonical) == d.record
    assert d.canonical == canonicalize(d.record)
    return d.record


def test_round_trip(evaluator: Evaluator, keys: Keys) -> None:
    """A fresh decision verifies under the decision key and names it."""
    rec = _record(evaluator, keys)
    typed = verify_record(rec, keys.decision.public_key)
    assert typed.key_id == keys.decision.key_id and typed.decision == "allow"


@pytest.mark.parametrize(
    "mutate",
    [
        lambda r: r.__setitem__("decision", "deny"),
        lambda r: r["gates"][0].__setitem__("result", "fail"),
        lambda r: r["approved_spans"][0].__setitem__("length", 1),
        lambda r: r.__setitem__("approved_tokens", r["approved_tokens"] + 1),
        lambda r: r["policy"].__setitem__("revision", "sha256:" + "0" * 64),
        lambda r: r.__setitem__("evaluated_at", "2030-01-01T00:00:00Z"),
    ],
    ids=["decision", "gate", "span", "tokens", "policy", "time"],
)
def test_tampering_is_detected(evaluator: Evaluator, keys: Keys, mutate: Any) -> None:
    """Changing any signed field breaks the signature."""
    rec = copy.deepcopy(_record(evaluator, keys))
    mutate(rec)
    with pytest.raises(SignatureError, match="does not verify"):
        verify_record(rec, keys.decision.public_key)


def test_wrong_key_is_named(evaluator: Evaluator, keys: Keys) -> None:
    """Verifying with another public key reports the key id mismatch."""
    with pytest.raises(SignatureError, match="signed by key"):
        verify_record(_record(evaluator, keys), keys.k1.public_key)


def test_not_a_record(keys: Keys) -> None:
    """Objects that are not decision records are refused before any crypto."""
    with pytest.raises(SignatureError, match="not a decision record"):
        verify_record({"hello": 1}, keys.decision.public_key)


def test_committed_fixture_verifies() -> None:
    """A decision record signed when the format was fixed still verifies (format stability)."""
    pub = load_public_key(ASSETS / "decision-signing-key.pub.pem")
    lines = (ASSETS / "decisions.jsonl").read_text().splitlines()
    assert len(lines) >= 2
    recs = [json.loads(x) for x in lines]
    for rec in recs:
        verify_record(rec, pub)
    assert {r["decision"] for r in recs} == {"allow", "deny"}
    bad = copy.deepcopy(recs[0])
    bad["donor_id"] += "x"
    with pytest.raises(SignatureError):
        verify_record(bad, pub)
