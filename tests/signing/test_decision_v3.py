"""`semgov.decision/v3`: a decision names the donor's verified scope and, for an allow across a
tenant or namespace boundary, the rule that allowed it (issue 18); older records still verify."""

from __future__ import annotations

import json
from typing import Any

import pytest

from semgov import Evaluator
from semgov.errors import SignatureError
from semgov.signing.records import sign_record_canonical, verify_record
from semgov.wire.models import DECISION_SCHEMA, DECISION_V3_FIELDS
from tests.conftest import Keys, candidate, parse, policy_with, request

SHARED = "namespace: {sharing: [{donor: research/entity-043, recipients: ['research/*']}]}"


def _decide(ev: Evaluator, cand: dict[str, Any]) -> dict[str, Any]:
    [d] = ev.evaluate(parse(request([cand])))
    return d.record


def test_same_scope_allow_names_the_donor_scope_and_no_boundary(evaluator: Evaluator, keys: Keys) -> None:
    """An allow within the recipient's own tenant and namespace names that scope and crosses nothing."""
    rec = _decide(evaluator, candidate(keys))
    assert rec["schema"] == DECISION_SCHEMA == "semgov.decision/v3" and rec["decision"] == "allow"
    assert (rec["donor_tenant"], rec["donor_namespace"], rec["cross_boundary"]) == (
        "acme", "research/entity-042", [])  # fmt: skip


def test_shared_namespace_allow_names_the_sharing_rule(keys: Keys, pii_scanner: Any) -> None:
    """An allow of a donor from another namespace names the boundary and the sharing rule that allowed it."""
    ev = Evaluator(policy_with(SHARED), keys.keyring, keys.decision, pii_scanner=pii_scanner)
    rec = _decide(ev, candidate(keys, namespace="research/entity-043"))
    assert rec["decision"] == "allow" and rec["donor_namespace"] == "research/entity-043"
    assert rec["cross_boundary"] == [{"boundary": "namespace", "rule": "shared by namespace.sharing[0]"}]
    verify_record(rec, keys.decision.public_key)


def test_public_donor_of_another_tenant_names_the_tenant_rule(keys: Keys, pii_scanner: Any) -> None:
    """A public donor of another tenant allowed by the policy names the tenant boundary and why."""
    ev = Evaluator(policy_with("tenant: {allow_public_donors: true}"), keys.keyring, keys.decision,
                   pii_scanner=pii_scanner)  # fmt: skip
    rec = _decide(ev, candidate(keys, tenant="globex", visibility="public"))
    assert rec["decision"] == "allow" and rec["donor_tenant"] == "globex"
    [crossed] = rec["cross_boundary"]
    assert crossed["boundary"] == "tenant" and "allowed by policy" in crossed["rule"]


def test_a_denied_cross_scope_donor_is_named_but_crosses_nothing(evaluator: Evaluator, keys: Keys) -> None:
    """A donor of another namespace that is denied keeps its verified scope; nothing was crossed."""
    rec = _decide(evaluator, candidate(keys, namespace="research/entity-043"))
    assert rec["decision"] == "deny" and rec["donor_namespace"] == "research/entity-043"
    assert rec["cross_boundary"] == []


def test_an_unverified_donor_scope_is_never_recorded(evaluator: Evaluator, keys: Keys) -> None:
    """A donor whose provenance does not verify (signed by an unknown key) has no recorded scope:
    its claims are not evidence."""
    rec = _decide(evaluator, candidate(keys, tenant="globex", signer="k9"))
    assert rec["decision"] == "deny" and rec["donor_tenant"] is None and rec["donor_namespace"] is None


_DROP = object()


def _resigned(keys: Keys, rec: dict[str, Any], **change: Any) -> dict[str, Any]:
    """``rec`` changed and signed again by the decision key (the writer itself could do this)."""
    body = {k: v for k, v in {**rec, **change}.items() if k not in ("signature", "key_id") and v is not _DROP}
    return sign_record_canonical(body, keys.decision)[0]


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"cross_boundary": _DROP}, "a semgov.decision/v3 record must state cross_boundary"),
        ({"schema": "semgov.decision/v2"}, "a semgov.decision/v2 record has no donor_tenant"),
        ({"cross_boundary": []}, "cross_boundary: names [], the decision crossed ['namespace']"),
        ({"donor_namespace": None}, "both null or both set"),
    ],
)
def test_a_record_must_name_exactly_what_it_crossed(
    keys: Keys, pii_scanner: Any, change: dict[str, Any], problem: str
) -> None:
    """A signed v3 record that leaves out a field, an older record that carries one, or an allow
    whose boundaries do not match its scopes is not a decision record."""
    ev = Evaluator(policy_with(SHARED), keys.keyring, keys.decision, pii_scanner=pii_scanner)
    rec = _decide(ev, candidate(keys, namespace="research/entity-043"))
    verify_record(rec, keys.decision.public_key)
    with pytest.raises(SignatureError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        verify_record(_resigned(keys, rec, **change), keys.decision.public_key)


def test_older_records_verify_as_they_are(evaluator: Evaluator, keys: Keys) -> None:
    """A v2 record (no donor scope) signed as written still verifies and reads with no scope."""
    rec = _decide(evaluator, candidate(keys))
    v2 = {k: v for k, v in rec.items() if k not in DECISION_V3_FIELDS}
    old = _resigned(keys, v2, schema="semgov.decision/v2")
    typed = verify_record(json.loads(json.dumps(old)), keys.decision.public_key)
    assert (
        typed.schema_ == "semgov.decision/v2" and typed.donor_tenant is None and typed.cross_boundary is None
    )
