"""The evaluator's contract: never raises on parsed input, every allow is fully justified."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from semgov import Evaluator
from semgov.facts.pii import PiiScanner
from semgov.policy.source import make_engine
from semgov.wire.models import GATES, CapturedRequest
from tests.conftest import Keys, candidate, gate, policy_with, request, segs, with_text

# Low thresholds so that random small prompts are allowed often enough to test allows.
LENIENT = "token_verification: {min_span_tokens: 4, min_approved_tokens: 1, min_approved_fraction: 0.1}"
SEEN: dict[str, int] = {"allow": 0, "deny": 0}


@pytest.fixture(scope="module")
def lenient(keys: Keys, pii_scanner: PiiScanner) -> Evaluator:
    return Evaluator(policy_with(LENIENT), keys.keyring, keys.decision, pii_scanner=pii_scanner)


ROLES = ("system", "instruction", "evidence", "question", "other")


@st.composite
def prompts(draw: st.DrawFn) -> dict[str, Any]:
    """Prompts of 0-6 segments over a tiny vocabulary, so donor and recipient overlap a lot."""
    parts = draw(
        st.lists(
            st.tuples(st.sampled_from(ROLES), st.lists(st.integers(0, 5), min_size=1, max_size=80)),
            max_size=6,
        )
    )
    return segs(*parts)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    recipient=prompts(),
    donor=prompts(),
    relation=st.sampled_from(["independent", "same", "wrapped"]),
    similarity=st.one_of(st.just(0.9), st.floats(-1, 2)),
    over=st.fixed_dictionaries(
        {},
        optional={
            "tenant": st.sampled_from(["acme", "globex"]),
            "visibility": st.sampled_from(["tenant", "public"]),
            "created_at": st.sampled_from(
                ["2026-11-29T10:00:00Z", "2026-12-01T00:00:00Z", "2020-01-01T00:00:00Z"]
            ),
            "pii": st.sampled_from(
                [{"scanned": False, "entities": []}, {"scanned": True, "entities": ["IBAN_CODE"]}]
            ),
            "policy_version": st.just("other@1"),
        },
    ),
)
def test_random_candidates_never_raise_and_allows_are_justified(
    lenient: Evaluator,
    keys: Keys,
    recipient: dict[str, Any],
    donor: dict[str, Any],
    relation: str,
    similarity: float,
    over: dict[str, Any],
) -> None:
    """Any parsed request yields one record per candidate; an allow has ten passes and exact spans."""
    if relation == "same":
        donor = recipient
    elif relation == "wrapped":  # the recipient again behind another leading segment
        n = len(donor["token_ids"])
        donor = {
            "token_ids": donor["token_ids"] + recipient["token_ids"],
            "segments": donor["segments"]
            + [{**x, "start": x["start"] + n, "end": x["end"] + n} for x in recipient["segments"]],
        }
    req = CapturedRequest.model_validate_json(
        json.dumps(request([candidate(keys, prompt=donor, similarity=similarity, **over)], prompt=recipient))
    )
    [d] = lenient.evaluate(req)
    rec = d.record
    SEEN[rec["decision"]] += 1
    assert [g["gate"] for g in rec["gates"]] == list(GATES)
    if rec["decision"] == "allow":
        assert all(g["result"] == "pass" for g in rec["gates"])
        r, t = recipient["token_ids"], donor["token_ids"]
        assert rec["approved_tokens"] == sum(s["length"] for s in rec["approved_spans"]) > 0
        for s in rec["approved_spans"]:
            a, b = s["recipient_start"], s["donor_start"]
            assert r[a : a + s["length"]] == t[b : b + s["length"]]
            if s["kind"] == "prefix":
                assert a == b and r[: a + s["length"]] == t[: a + s["length"]]
    else:
        assert rec["approved_spans"] == [] and rec["approved_tokens"] == 0


def test_random_cases_covered_both_outcomes(lenient: Evaluator, keys: Keys) -> None:
    """The property test really exercises allows and denies (re-run here if it has not run yet)."""
    if sum(SEEN.values()) == 0:
        test_random_candidates_never_raise_and_allows_are_justified(lenient, keys)
    assert SEEN["allow"] >= 10 and SEEN["deny"] >= 10, SEEN


def test_register_donor_scans_once_ahead_of_decisions(keys: Keys) -> None:
    """register_donor runs the donor's PII scan; the decision then finds it cached."""
    from semgov import load_policy
    from tests.conftest import DEFAULT_POLICY_DIR, parse

    scanner = PiiScanner()
    ev = Evaluator(load_policy(DEFAULT_POLICY_DIR), keys.keyring, keys.decision, pii_scanner=scanner)
    cand = candidate(keys)
    cand = with_text(keys, cand, "Reach the desk at ops@example.com.")
    req = parse(request([cand]))
    assert ev.register_donor(req.candidates[0].prompt) == frozenset({"EMAIL_ADDRESS"})
    assert scanner.scans == 1
    [d] = ev.evaluate(req)
    assert scanner.scans == 1 and d.decision == "deny"
    assert ev.register_donor(parse(request([candidate(keys)])).candidates[0].prompt) is None  # no text


def test_sink_receives_every_signed_decision_in_order(keys: Keys, pii_scanner: PiiScanner) -> None:
    """A sink gets each decision evaluate and deny_malformed return, in order, before they return."""
    from datetime import UTC, datetime

    from semgov import load_policy
    from semgov.intake.capture import MalformedLine
    from semgov.typing import AuditSink
    from tests.conftest import DEFAULT_POLICY_DIR, parse

    class Log:
        def __init__(self) -> None:
            self.records: list[bytes] = []

        def append(self, record: bytes) -> None:
            self.records.append(record)

    log = Log()
    ev = Evaluator(
        load_policy(DEFAULT_POLICY_DIR), keys.keyring, keys.decision, pii_scanner=pii_scanner,
        sink=AuditSink(log),
    )  # fmt: skip
    ds = ev.evaluate(parse(request([candidate(keys, "r-03"), candidate(keys, "r-04")])))
    bad = MalformedLine(7, "not JSON", "q-9", "acme", "research/shared", ("r-05",))
    ds += ev.deny_malformed(bad, datetime(2026, 12, 2, tzinfo=UTC))
    assert [d.canonical for d in ds] == log.records and len(log.records) == 3
    assert [d.donor_id for d in ds] == ["r-03", "r-04", "r-05"]


def test_engine_timeout_denies_with_every_gate_error(keys: Keys, pii_scanner: PiiScanner) -> None:
    """With engine_timeout, an engine that does not answer in time gives a signed deny naming the timeout."""
    import threading

    from semgov import load_policy
    from tests.conftest import DEFAULT_POLICY_DIR, parse

    release = threading.Event()
    policy = load_policy(DEFAULT_POLICY_DIR)
    real = make_engine(policy)

    class Slow:
        name = "slow"

        def evaluate(self, doc: Any) -> Any:
            release.wait(30)
            return real.evaluate(doc)

    ev = Evaluator(
        policy, keys.keyring, keys.decision, pii_scanner=pii_scanner, engine=Slow(), engine_timeout=0.05
    )
    try:
        [d] = ev.evaluate(parse(request([candidate(keys)])))
        [again] = ev.evaluate(parse(request([candidate(keys)])))
    finally:
        release.set()
    assert d.decision == "deny" and {g["result"] for g in d.record["gates"]} == {"error"}
    assert "TimeoutError: no answer within 0.05 s" in d.record["gates"][0]["detail"]
    assert "still busy" in again.record["gates"][0]["detail"]
    ok = Evaluator(policy, keys.keyring, keys.decision, pii_scanner=pii_scanner, engine_timeout=5.0)
    [fine] = ok.evaluate(parse(request([candidate(keys)])))
    assert fine.decision == "allow"  # a timely engine through the worker thread decides as before
    with pytest.raises(ValueError, match="engine_timeout must be positive"):
        Evaluator(policy, keys.keyring, keys.decision, engine_timeout=0)


def test_register_donor_prepares_the_donor_once_for_every_decision(
    keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A registered donor's tokens and hashes are prepared once; decisions on that prompt reuse them."""
    import semgov.facts.compute as facts_mod
    from semgov import load_policy
    from tests.conftest import DEFAULT_POLICY_DIR, parse

    made: list[int] = []
    real_of = facts_mod.DonorDigest.of

    def counting(prompt: Any) -> Any:
        made.append(id(prompt))
        return real_of(prompt)

    monkeypatch.setattr(facts_mod.DonorDigest, "of", staticmethod(counting))
    ev = Evaluator(load_policy(DEFAULT_POLICY_DIR), keys.keyring, keys.decision)
    req = parse(request([candidate(keys)]))
    ev.register_donor(req.candidates[0].prompt)
    first = [d.decision for d in ev.evaluate(req)]
    again = [d.decision for d in ev.evaluate(req)]
    assert first == again == ["allow"] and made == [id(req.candidates[0].prompt)]
    fresh = parse(request([candidate(keys)]))  # equal content, another object: prepared anew, same outcome
    assert [d.decision for d in ev.evaluate(fresh)] == ["allow"] and len(made) == 2


def test_donor_digest_never_hits_for_a_recycled_object_id(keys: Keys) -> None:
    """A digest is taken only for the very prompt object it was made from (a weak reference confirms it)."""
    from semgov.facts.compute import DonorDigest, _ByIdentity
    from semgov.wire.models import Prompt
    from tests.conftest import parse

    cache = _ByIdentity(DonorDigest.of, size=8)
    a = parse(request([candidate(keys)])).candidates[0].prompt
    da = cache.get(a)
    key = id(a)
    del a
    import gc

    gc.collect()
    b = Prompt.model_validate({"token_ids": [5, 6, 7], "segments": [{"role": "other", "start": 0, "end": 3}]})
    cache._d[id(b)] = cache._d.pop(key)  # as if b had been given a's id
    db = cache.get(b)
    assert db is not da and db.token_sha256 == DonorDigest.of(b).token_sha256 != da.token_sha256


def test_a_provenance_envelope_is_canonicalized_once_per_object(keys: Keys) -> None:
    """Deciding the same envelope object twice canonicalizes its payload once; another object anew."""
    from semgov import load_policy
    from tests.conftest import DEFAULT_POLICY_DIR, parse

    ev = Evaluator(load_policy(DEFAULT_POLICY_DIR), keys.keyring, keys.decision)
    made: list[int] = []
    make = ev.ctx.messages._make
    ev.ctx.messages._make = lambda prov: made.append(id(prov)) or make(prov)  # type: ignore[method-assign,func-returns-value]
    req = parse(request([candidate(keys)]))
    first = [d.decision for d in ev.evaluate(req)]
    again = [d.decision for d in ev.evaluate(req)]
    assert first == again == ["allow"] and made == [id(req.candidates[0].provenance)]
    fresh = parse(request([candidate(keys)]))
    assert [d.decision for d in ev.evaluate(fresh)] == ["allow"] and len(made) == 2


def test_register_provenance_verifies_ahead_so_the_first_decision_does_not(
    keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """register_provenance verifies the signature once; the donor's decisions then find it cached."""
    import semgov.facts.compute as facts_mod
    from semgov import load_policy
    from tests.conftest import DEFAULT_POLICY_DIR, parse

    calls: list[str] = []
    real = facts_mod.verify_signature

    def counting(key: Any, sig: str, message: bytes) -> bool:
        calls.append(sig)
        return real(key, sig, message)

    monkeypatch.setattr(facts_mod, "verify_signature", counting)
    ev = Evaluator(load_policy(DEFAULT_POLICY_DIR), keys.keyring, keys.decision)
    req = parse(request([candidate(keys)]))
    assert ev.register_provenance(req.candidates[0].provenance.model_dump()) is True and len(calls) == 1
    [d] = ev.evaluate(req)
    assert d.decision == "allow" and len(calls) == 1
    plain = Evaluator(load_policy(DEFAULT_POLICY_DIR), keys.keyring, keys.decision)
    [same] = plain.evaluate(req)  # the same decision as one that verified on its own path
    assert {k: v for k, v in same.record.items() if k not in ("decision_id", "signature")} == {
        k: v for k, v in d.record.items() if k not in ("decision_id", "signature")
    }


def test_register_provenance_of_a_bad_envelope_is_false_and_the_decision_still_denies(keys: Keys) -> None:
    """A forged signature pre-verifies False (cached: deny); a malformed envelope is False, never raises."""
    from semgov import load_policy
    from tests.conftest import DEFAULT_POLICY_DIR, parse

    ev = Evaluator(load_policy(DEFAULT_POLICY_DIR), keys.keyring, keys.decision)
    cand = candidate(keys)
    cand["provenance"]["signature"] = candidate(keys, donor_id="r-04")["provenance"]["signature"]
    req = parse(request([cand]))
    assert ev.register_provenance(req.candidates[0].provenance) is False
    [d] = ev.evaluate(req)
    assert d.decision == "deny" and gate(d.record, "provenance")["result"] == "fail"
    assert ev.register_provenance({"payload": {}, "key_id": 3}) is False
    assert ev.register_provenance(candidate(keys, signer="k9")["provenance"]) is False  # not in the keyring
