"""Every gate of the YAML engine, passing and failing, and fail-closed behaviour."""

from __future__ import annotations

from typing import Any

import pytest

from semgov import Evaluator
from semgov.policy.engine import ApprovedSpan, EngineResult, GateOutcome
from semgov.wire.models import GATES
from tests.conftest import (
    EVIDENCE,
    QUESTION,
    SYSTEM,
    Keys,
    candidate,
    gate,
    parse,
    policy_with,
    request,
    segs,
    with_text,
)


def decide(ev: Evaluator, req: dict[str, Any]) -> dict[str, Any]:
    [d] = ev.evaluate(parse(req))
    return d.record


def failed(rec: dict[str, Any]) -> list[str]:
    return [g["gate"] for g in rec["gates"] if g["result"] != "pass"]


def test_exact_repeat_is_allowed_with_prefix_spans(evaluator: Evaluator, keys: Keys) -> None:
    """An exact repeat passes every gate and approves the whole prompt as prefix spans."""
    rec = decide(evaluator, request([candidate(keys)]))
    assert rec["decision"] == "allow", failed(rec)
    assert [g["gate"] for g in rec["gates"]] == list(GATES)
    assert rec["approved_tokens"] == rec["recipient_tokens"] == 370
    assert {s["kind"] for s in rec["approved_spans"]} == {"prefix"}


def test_shifted_repeat_approves_only_evidence(evaluator: Evaluator, keys: Keys, pii_scanner: Any) -> None:
    """A new leading wrapper shifts evidence: denied by the default (shifted spans off); where quality
    turns them on, only evidence (not the question) is approved, as shifted, ending 128 tokens early
    (the default plan's tail, computed before the question), with no head; the prefix whole."""
    recipient = segs(
        ("system", SYSTEM),
        ("instruction", list(range(300, 345))),
        ("evidence", EVIDENCE),
        ("question", QUESTION),
    )
    req = request([candidate(keys)], prompt=recipient)
    off = decide(evaluator, req)
    assert off["decision"] == "deny" and failed(off) == ["token_verification"]
    assert "20/385 tokens approved" in gate(off, "token_verification")["detail"]
    on = Evaluator(
        policy_with("quality: {allow_shifted: true, shifted_recompute_percent: 0, min_recompute_tokens: 0, "
                    "shifted_recompute_tail_tokens: 128}"),
        keys.keyring, keys.decision, pii_scanner=pii_scanner,
    )  # fmt: skip
    rec = decide(on, req)
    assert rec["decision"] == "allow", failed(rec)
    spans = rec["approved_spans"]
    assert spans[0] == {
        "recipient_start": 0,
        "donor_start": 0,
        "length": 20,
        "kind": "prefix",
        "recompute": 0,
    }
    assert spans[1] == {
        "recipient_start": 65,
        "donor_start": 50,
        "length": 172,
        "kind": "shifted",
        "recompute": 0,
    }
    assert rec["approved_tokens"] == 192 and rec["schema"] == "semgov.decision/v3"


def test_all_gates_run_even_after_a_failure(evaluator: Evaluator, keys: Keys) -> None:
    """A failing early gate does not skip later gates: all ten are always reported."""
    rec = decide(evaluator, request([candidate(keys, tenant="globex", similarity=0.1)]))
    assert rec["decision"] == "deny"
    assert len(rec["gates"]) == len(GATES)
    # Another tenant's private donor is never token-compared (a timing side channel): that gate
    # reports why instead of a comparison.
    assert set(failed(rec)) == {"tenant", "similarity", "token_verification"}
    tok = next(g for g in rec["gates"] if g["gate"] == "token_verification")
    assert "not compared" in tok["detail"]
    assert rec["approved_spans"] == [] and rec["approved_tokens"] == 0
    public = decide(
        evaluator, request([candidate(keys, tenant="globex", visibility="public", similarity=0.1)])
    )
    assert set(failed(public)) == {"tenant", "similarity"}  # a public donor is compared as before


@pytest.mark.parametrize(
    ("mutation", "gate_name", "detail"),
    [
        ({"tenant": "globex"}, "tenant", "another tenant"),
        ({"tenant": "globex", "visibility": "public"}, "tenant", "does not allow public donors"),
        ({"namespace": "research/entity-043"}, "namespace", "no sharing rule"),
        ({"expires_at": "2026-11-29T10:00:00Z"}, "expiry", "expired"),
        ({"created_at": "2026-11-29T10:00:01Z"}, "expiry", "future"),
        ({"created_at": "2026-10-01T00:00:00Z", "expires_at": "2027-01-01T00:00:00Z"}, "expiry", "max age"),
        ({"policy_version": "default@0"}, "policy_version", "default@0"),
        ({"pii": {"scanned": True, "entities": ["EMAIL_ADDRESS"]}}, "pii", "EMAIL_ADDRESS"),
        ({"pii": {"scanned": False, "entities": []}}, "pii", "never scanned"),
        ({"task": {"id": "summarize_risks", "version": "1"}}, "task", "summarize_risks@1"),
        ({"task": {"id": "extract_financials", "version": "2"}}, "task", "differs"),
        (
            {"response_contract": {"id": "risk_summary", "schema_sha256": "ab" * 32}},
            "response_contract",
            "risk_summary",
        ),
        (
            {"response_contract": {"id": "financials", "schema_sha256": "cd" * 32}},
            "response_contract",
            "hash",
        ),
        ({"token_ids_sha256": "00" * 32}, "provenance", "token hash"),
    ],
)
def test_single_gate_mutation_denies(
    evaluator: Evaluator, keys: Keys, mutation: dict[str, Any], gate_name: str, detail: str
) -> None:
    """A signed payload that breaks exactly one gate is denied by that gate alone."""
    rec = decide(evaluator, request([candidate(keys, **mutation)]))
    assert rec["decision"] == "deny"
    if mutation == {"tenant": "globex"}:  # another tenant's private donor is never token-compared
        assert failed(rec) == [gate_name, "token_verification"]
        assert "not compared" in gate(rec, "token_verification")["detail"]
    else:
        assert failed(rec) == [gate_name]
    assert detail in gate(rec, gate_name)["detail"]


def test_expiry_boundary_now_equal_to_expires_at_denies(evaluator: Evaluator, keys: Keys) -> None:
    """``now < expires_at`` is strict; ``created_at == now`` passes."""
    ok = decide(evaluator, request([candidate(keys, created_at="2026-11-29T10:00:00Z")]))
    assert gate(ok, "expiry")["result"] == "pass"
    bad = decide(evaluator, request([candidate(keys, expires_at="2026-11-29T10:00:00Z")]))
    assert gate(bad, "expiry")["result"] == "fail"


@pytest.mark.parametrize(("signer", "detail"), [("k2", "revoked"), ("k9", "not in the keyring")])
def test_untrusted_keys_fail_provenance(evaluator: Evaluator, keys: Keys, signer: str, detail: str) -> None:
    """Revoked and unknown keys fail the provenance gate even with a valid signature."""
    rec = decide(evaluator, request([candidate(keys, signer=signer)]))
    assert failed(rec) == ["provenance"]
    assert detail in gate(rec, "provenance")["detail"]


def test_tampered_payload_fails_provenance(evaluator: Evaluator, keys: Keys) -> None:
    """Changing a signed payload field after signing breaks the signature."""
    cand = candidate(keys)
    cand["provenance"]["payload"]["expires_at"] = "2027-12-05T10:00:00Z"
    rec = decide(evaluator, request([cand]))
    assert failed(rec) == ["provenance"]
    assert "signature does not verify" in gate(rec, "provenance")["detail"]


def test_signature_garbage_fails_provenance(evaluator: Evaluator, keys: Keys) -> None:
    """A signature that is not base64 or not 64 bytes fails, it does not raise."""
    for sig in ("%%%", "AAAA"):
        cand = candidate(keys)
        cand["provenance"]["signature"] = sig
        assert failed(decide(evaluator, request([cand]))) == ["provenance"]


def test_invalid_payload_fails_every_claim_gate(evaluator: Evaluator, keys: Keys) -> None:
    """A payload that does not parse leaves donor claims unknown: those gates fail, none pass."""
    cand = candidate(keys)
    del cand["provenance"]["payload"]["tenant"]
    rec = decide(evaluator, request([cand]))
    assert rec["decision"] == "deny"
    # pii fails too: with no valid payload nobody vouches for a scan, and there is no text.
    assert set(failed(rec)) == {
        "provenance",
        "tenant",
        "namespace",
        "expiry",
        "policy_version",
        "task",
        "response_contract",
        "pii",
    }
    assert "payload invalid" in gate(rec, "provenance")["detail"]


def test_provenance_replayed_for_another_donor_fails(evaluator: Evaluator, keys: Keys) -> None:
    """A valid provenance presented under another donor id fails (donor_id mismatch)."""
    cand = candidate(keys)
    cand["donor_id"] = "r-04"
    rec = decide(evaluator, request([cand]))
    assert failed(rec) == ["provenance"]
    assert "donor_id" in gate(rec, "provenance")["detail"]


def test_donor_token_swap_fails_provenance(evaluator: Evaluator, keys: Keys) -> None:
    """Donor tokens that differ from what provenance signed fail the token-hash check."""
    cand = candidate(keys)
    cand["prompt"]["token_ids"][5] += 1
    rec = decide(evaluator, request([cand]))
    assert "token hash" in gate(rec, "provenance")["detail"]


def test_similarity_can_deny_but_never_allow_alone(evaluator: Evaluator, keys: Keys) -> None:
    """Low similarity denies; perfect similarity with unrelated tokens still denies."""
    low = decide(evaluator, request([candidate(keys, similarity=0.59)]))
    assert failed(low) == ["similarity"]
    unrelated = segs(("system", list(range(7000, 7020))), ("evidence", list(range(8000, 8350))))
    rec = decide(evaluator, request([candidate(keys, similarity=1.0)], prompt=unrelated))
    assert failed(rec) == ["token_verification"]


def test_question_tokens_are_never_reused_shifted(evaluator: Evaluator, keys: Keys) -> None:
    """Identical question tokens at another position are not approved (question is not reusable)."""
    donor = segs(("system", SYSTEM), ("question", list(range(3000, 3400))))
    recipient = segs(("system", list(range(60, 90))), ("question", list(range(3000, 3400))))
    rec = decide(evaluator, request([candidate(keys, prompt=donor)], prompt=recipient))
    assert failed(rec) == ["token_verification"]


def test_shifted_spans_off_denies_shifted_only_pairs(keys: Keys, pii_scanner: Any) -> None:
    """With allow_shifted false, a shifted-only match fails token verification."""
    pol = policy_with("token_verification: {allow_shifted: false}")
    ev = Evaluator(pol, keys.keyring, keys.decision, pii_scanner=pii_scanner)
    recipient = segs(("instruction", list(range(300, 345))), ("evidence", EVIDENCE), ("question", QUESTION))
    rec = decide(ev, request([candidate(keys)], prompt=recipient))
    assert failed(rec) == ["token_verification"]


def test_min_approved_fraction(keys: Keys, pii_scanner: Any) -> None:
    """Too small a share of the recipient approved fails token verification."""
    recipient = segs(("system", SYSTEM), ("evidence", list(range(9000, 9400))))
    ev = Evaluator(
        policy_with("token_verification: {min_approved_tokens: 1}"),
        keys.keyring,
        keys.decision,
        pii_scanner=pii_scanner,
    )
    rec = decide(ev, request([candidate(keys)], prompt=recipient))
    assert failed(rec) == ["token_verification"]
    assert "need >=" in gate(rec, "token_verification")["detail"]


def test_public_donor_allowed_when_policy_says_so(keys: Keys, pii_scanner: Any) -> None:
    """allow_public_donors lets a public donor of another tenant pass the tenant gate."""
    ev = Evaluator(
        policy_with("tenant: {allow_public_donors: true}"),
        keys.keyring,
        keys.decision,
        pii_scanner=pii_scanner,
    )
    rec = decide(ev, request([candidate(keys, tenant="globex", visibility="public")]))
    assert rec["decision"] == "allow", failed(rec)
    priv = decide(ev, request([candidate(keys, tenant="globex")]))
    assert failed(priv) == ["tenant", "token_verification"]  # private: not even compared


def test_public_donors_for_allows_only_requests_in_scope(keys: Keys, pii_scanner: Any) -> None:
    """A public donor of another tenant passes for a request in a public_donors_for scope, and only then."""

    def tenant_gate(scope: str) -> dict[str, Any]:
        pol = policy_with(f"tenant: {{allow_public_donors: false, public_donors_for: [{scope}]}}")
        ev = Evaluator(pol, keys.keyring, keys.decision, pii_scanner=pii_scanner)
        return gate(decide(ev, request([candidate(keys, tenant="globex", visibility="public")])), "tenant")

    inside = tenant_gate("{task: extract_financials@1, tenant: acme}")
    assert inside["result"] == "pass" and "tenant.public_donors_for[0]" in inside["detail"]
    assert tenant_gate("{task: summarize_risks@1}")["result"] == "fail"
    assert tenant_gate("{tenant: globex}")["result"] == "fail"  # NOTE: the request's tenant, not the donor's


def test_namespace_sharing_rule(keys: Keys, pii_scanner: Any) -> None:
    """An explicit sharing rule admits a donor namespace for matching recipients only."""
    ev = Evaluator(
        policy_with("namespace: {sharing: [{donor: 'research/common', recipients: ['research/*']}]}"),
        keys.keyring,
        keys.decision,
        pii_scanner=pii_scanner,
    )
    ok = decide(ev, request([candidate(keys, namespace="research/common")]))
    assert gate(ok, "namespace")["result"] == "pass"
    other = decide(ev, request([candidate(keys, namespace="research/common")], namespace="legal/x"))
    assert gate(other, "namespace")["result"] == "fail"
    # the pattern covers research/<anything>, not research itself
    bare = decide(ev, request([candidate(keys, namespace="research/common")], namespace="research"))
    assert gate(bare, "namespace")["result"] == "fail"


def test_scoped_sharing_rule_covers_only_requests_in_its_scope(keys: Keys, pii_scanner: Any) -> None:
    """A scoped sharing rule admits the donor namespace for requests in its scope only; a bad scope fails."""
    from semgov.errors import PolicyError

    def namespace_gate(scope: str) -> str:
        rule = f"{{donor: 'research/common', recipients: ['research/*'], scope: {scope}}}"
        ev = Evaluator(
            policy_with(f"namespace: {{sharing: [{rule}]}}"),
            keys.keyring,
            keys.decision,
            pii_scanner=pii_scanner,
        )
        return str(
            gate(decide(ev, request([candidate(keys, namespace="research/common")])), "namespace")["result"]
        )

    assert namespace_gate("{task: extract_financials@1}") == "pass"
    assert namespace_gate("{task: extract_financials@2}") == "fail"
    assert namespace_gate("{tenant: globex}") == "fail"
    with pytest.raises(PolicyError, match="at least one of tenant, namespace, task"):
        namespace_gate("{}")


def test_compatible_task_group(keys: Keys, pii_scanner: Any) -> None:
    """A declared compatible group lets another task version pass the task gate."""
    ev = Evaluator(
        policy_with("task: {compatible_groups: [['extract_financials@1', 'extract_financials@2']]}"),
        keys.keyring,
        keys.decision,
        pii_scanner=pii_scanner,
    )
    rec = decide(ev, request([candidate(keys, task={"id": "extract_financials", "version": "2"})]))
    assert gate(rec, "task")["result"] == "pass"


def test_accepted_policy_versions(keys: Keys, pii_scanner: Any) -> None:
    """A version listed in accepted_policy_versions passes the version gate."""
    ev = Evaluator(
        policy_with("accepted_policy_versions: ['default@0']"),
        keys.keyring,
        keys.decision,
        pii_scanner=pii_scanner,
    )
    rec = decide(ev, request([candidate(keys, policy_version="default@0")]))
    assert rec["decision"] == "allow", failed(rec)


def test_pii_in_donor_text_found_by_presidio(evaluator: Evaluator, keys: Keys) -> None:
    """Donor text with an email fails the PII gate even though provenance declared none."""
    cand = candidate(keys)
    cand = with_text(keys, cand, "Q3 revenue was 4.2 million; contact jane.roe@example.com for the filing.")
    rec = decide(evaluator, request([cand]))
    assert failed(rec) == ["pii"]
    assert "EMAIL_ADDRESS" in gate(rec, "pii")["detail"]


def test_pii_scan_failure_is_an_error_and_denies(keys: Keys, default_policy: Any) -> None:
    """A PII scanner that raises makes the pii gate 'error' and the decision deny."""

    class Broken:
        def scan(self, *a: Any, **k: Any) -> frozenset[str]:
            raise OSError("scanner crashed")

    ev = Evaluator(default_policy, keys.keyring, keys.decision, pii_scanner=Broken())  # type: ignore[arg-type]
    cand = candidate(keys)
    cand = with_text(keys, cand, "harmless")
    rec = decide(ev, request([cand]))
    assert rec["decision"] == "deny"
    assert gate(rec, "pii") == {"gate": "pii", "result": "error", "detail": "OSError: scanner crashed"}


def test_gate_exception_fails_closed(
    evaluator: Evaluator, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception inside one gate is reported as 'error' and denies; other gates still run."""
    from semgov.policy.yaml import engine as yaml_engine

    def boom(p: Any, doc: Any) -> tuple[bool, str]:
        raise ZeroDivisionError("bad math")

    monkeypatch.setitem(yaml_engine.GATE_FUNCS, "task", boom)
    rec = decide(evaluator, request([candidate(keys)]))
    assert rec["decision"] == "deny"
    assert gate(rec, "task")["result"] == "error"
    assert all(g["result"] == "pass" for g in rec["gates"] if g["gate"] != "task")


class _Engine:
    name = "fake"

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def evaluate(self, doc: Any) -> EngineResult:
        return self.fn(doc)  # type: ignore[no-any-return]


def _all_pass(spans: list[ApprovedSpan]) -> EngineResult:
    return EngineResult([GateOutcome(gate=g, result="pass", detail="") for g in GATES], spans)


@pytest.mark.parametrize(
    "result",
    [
        lambda doc: (_ for _ in ()).throw(TimeoutError("engine timed out")),
        lambda doc: EngineResult([], []),
        lambda doc: _all_pass([ApprovedSpan(recipient_start=0, donor_start=5, length=10, kind="shifted")]),
        lambda doc: _all_pass([ApprovedSpan(recipient_start=0, donor_start=0, length=10_000, kind="prefix")]),
        lambda doc: _all_pass([]),
        lambda doc: _all_pass([ApprovedSpan(recipient_start=0, donor_start=0, length=20, kind="prefix")] * 2),
        lambda doc: EngineResult([GateOutcome(gate=g, result="ok", detail="") for g in GATES], []),  # type: ignore[arg-type]
    ],
    ids=[
        "raises",
        "no-gates",
        "unverified-span",
        "span-past-end",
        "allow-without-spans",
        "duplicate-span",
        "junk-result",
    ],
)
def test_engine_misbehaviour_denies(keys: Keys, default_policy: Any, pii_scanner: Any, result: Any) -> None:
    """Engines that raise, omit gates or approve unverified spans never produce an allow."""
    ev = Evaluator(
        default_policy, keys.keyring, keys.decision, pii_scanner=pii_scanner, engine=_Engine(result)
    )
    rec = decide(ev, request([candidate(keys)]))
    assert rec["decision"] == "deny"
    assert rec["approved_spans"] == []
    assert any(g["result"] in ("error", "fail") for g in rec["gates"])


def test_one_request_many_candidates_each_decided(evaluator: Evaluator, keys: Keys) -> None:
    """Each candidate of a request gets its own signed decision."""
    req = request(
        [candidate(keys, "a"), candidate(keys, "b", tenant="globex"), candidate(keys, "c", signer="k9")]
    )
    out = evaluator.evaluate(parse(req))
    assert [(d.donor_id, d.decision) for d in out] == [("a", "allow"), ("b", "deny"), ("c", "deny")]
    assert len({d.record["decision_id"] for d in out}) == 3


def test_pii_scanned_once_per_donor(keys: Keys, default_policy: Any) -> None:
    """The same donor text seen by many candidates is scanned by Presidio once."""
    from semgov.facts.pii import PiiScanner

    scanner = PiiScanner()
    ev = Evaluator(default_policy, keys.keyring, keys.decision, pii_scanner=scanner)
    cand = candidate(keys)
    cand = with_text(keys, cand, "Operating margin improved to 18 percent.")
    for i in range(5):
        ev.evaluate(parse(request([cand], request_id=f"r-{i}")))
    assert scanner.scans == 1
