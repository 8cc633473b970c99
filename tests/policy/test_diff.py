"""Comparing two policies' decisions (semgov.policy.diff): what counts as a change, and where."""

from __future__ import annotations

from typing import Any

import pytest

from semgov.policy.diff import Diff, compare
from semgov.typing import SignedDecision

GATE_NAMES = ("tenant", "similarity", "token_verification")


def _dec(
    decision: str = "allow", results: dict[str, str] | None = None, spans: int = 1, **over: Any
) -> SignedDecision:
    res = {g: "pass" for g in GATE_NAMES} | (results or {})
    rec: dict[str, Any] = {
        "request_id": "q1", "donor_id": "d1", "tenant": "acme", "namespace": "research/a",
        "decision": decision,
        "gates": [{"gate": g, "result": r, "detail": f"{g} {r}"} for g, r in res.items()],
        "approved_spans": [
            {"recipient_start": i, "donor_start": i, "length": 64, "kind": "prefix", "recompute": 0}
            for i in range(spans if decision == "allow" else 0)
        ],
    } | over  # fmt: skip
    rec["approved_tokens"] = sum(s["length"] for s in rec["approved_spans"])
    return SignedDecision(rec, b"")


def test_identical_decisions_and_detail_only_changes_are_no_change() -> None:
    """The same decision, or one whose only difference is a gate's detail text, is not a change."""
    assert compare(_dec(), _dec(), task="t@1") is None
    detail = _dec()
    detail.record["gates"][0]["detail"] = "worded differently"
    assert compare(_dec(), detail, task="t@1") is None


def test_flips_name_the_gates_whose_result_changed() -> None:
    """allow->deny and deny->allow are flips; only gates whose result or detail changed are listed."""
    c = compare(_dec(), _dec("deny", {"similarity": "fail"}), task="t@1")
    assert c is not None and c.kind == "allow->deny" and (c.a_tokens, c.b_tokens) == (64, 0)
    assert [(g.gate, g.a, g.b) for g in c.gates] == [("similarity", "pass", "fail")]
    back = compare(_dec("deny", {"tenant": "error"}), _dec(), task="t@1")
    assert back is not None and back.kind == "deny->allow" and back.b_tokens == 64


def test_span_and_reason_changes_are_told_apart_from_flips() -> None:
    """Both allow with other spans is 'spans'; both deny with other failing gates is 'reasons'."""
    spans = compare(_dec(spans=1), _dec(spans=2), task="t@1")
    assert spans is not None and spans.kind == "spans" and (spans.a_tokens, spans.b_tokens) == (64, 128)
    reasons = compare(_dec("deny", {"tenant": "fail"}), _dec("deny", {"similarity": "fail"}), task="t@1")
    assert reasons is not None and reasons.kind == "reasons"


def test_decisions_on_different_candidates_are_refused() -> None:
    """Pairing decisions of two different candidates is an error, never a silent comparison."""
    with pytest.raises(ValueError, match="different candidates"):
        compare(_dec(), _dec(donor_id="d2"), task="t@1")


def test_diff_counts_flips_and_groups_them_with_tokens_under_each_policy() -> None:
    """Totals count each kind; groups hold flips and span changes with A's and B's approved tokens."""
    d = Diff()
    d.add_pair(_dec(), _dec(), task="t@1")
    d.add_pair(_dec(), _dec("deny", {"similarity": "fail"}), task="t@1")
    d.add_pair(_dec(tenant="globex"), _dec(spans=3, tenant="globex"), task="u@2")
    d.add_pair(_dec("deny", {"tenant": "fail"}), _dec("deny", {"similarity": "fail"}), task="t@1")
    s = d.summary_json()
    assert (s["decisions_compared"], s["flipped"], s["spans"], s["reasons"], s["unchanged"]) == (
        4,
        1,
        1,
        1,
        1,
    )
    assert s["allow"] == {"a": 3, "b": 2} and d.acted_on == 2
    g = d.groups_json()
    assert g["gate"]["similarity"]["allow->deny"] == 1 and g["gate"]["(spans only)"]["spans"] == 1
    assert g["tenant"]["globex"]["approved_tokens"] == {"a": 64, "b": 192}
    assert g["tenant"]["acme"]["approved_tokens"] == {"a": 64, "b": 0}  # NOTE: 'reasons' adds no tokens
    assert g["task"]["u@2"]["spans"] == 1 and g["task"]["t@1"]["reasons"] == 1
