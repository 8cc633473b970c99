"""Fact computation is bounded by the decision timeout (issue 12, item 4), tested on injected clocks.

``Evaluator(engine_timeout=T)`` gives each ``evaluate`` call one deadline, T after it starts:
facts (between candidates and inside the span search) and then the policy engine must finish by
it. No test here waits on the wall clock for a verdict.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

import semgov.decide as decide_mod
import semgov.facts.compute as facts_mod
from benchmarks.token_adversarial import blocks
from semgov import Evaluator, load_policy
from semgov.facts.pii import PiiScanner
from semgov.policy.source import make_engine
from semgov.wire.models import GATES
from tests.conftest import DEFAULT_POLICY_DIR, Keys, candidate, parse, request, segs


class FakeClock:
    """A monotonic clock the test moves by hand; counts its readings."""

    def __init__(self) -> None:
        self.t = 0.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.t


class Recording:
    """The default policy's engine, counting the documents it is asked about."""

    name = "recording"

    def __init__(self) -> None:
        self.real = make_engine(load_policy(DEFAULT_POLICY_DIR))
        self.docs = 0

    def evaluate(self, doc: Any) -> Any:
        self.docs += 1
        return self.real.evaluate(doc)


def evaluator(
    keys: Keys, pii: PiiScanner, clock: FakeClock, timeout: float = 0.05
) -> tuple[Evaluator, Recording]:
    engine = Recording()
    ev = Evaluator(
        load_policy(DEFAULT_POLICY_DIR),
        keys.keyring,
        keys.decision,
        pii_scanner=pii,
        engine=engine,
        engine_timeout=timeout,
        monotonic=clock,
    )
    return ev, engine


def assert_late(record: dict[str, Any], timeout: str = "0.05") -> None:
    """A signed deny, every gate error, naming fact computation and the timeout."""
    assert record["decision"] == "deny" and record["approved_spans"] == []
    assert [g["gate"] for g in record["gates"]] == list(GATES)
    assert {g["result"] for g in record["gates"]} == {"error"}
    assert all(
        g["detail"] == f"fact computation exceeded {timeout} s (the decision timeout); not decided"
        for g in record["gates"]
    )


def test_timely_facts_decide_as_before(keys: Keys, pii_scanner: PiiScanner) -> None:
    """A clock that never moves decides as without a deadline (the default candidate is allowed)."""
    clock = FakeClock()
    ev, engine = evaluator(keys, pii_scanner, clock)
    [d] = ev.evaluate(parse(request([candidate(keys)])))
    assert d.decision == "allow" and engine.docs == 1


def test_deadline_passed_before_facts_denies_every_candidate_uncomputed(
    keys: Keys, pii_scanner: PiiScanner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the deadline before the first candidate: each is a signed deny naming it; no search, no engine."""

    class Jumps(FakeClock):
        def __call__(self) -> float:
            self.reads += 1
            return 0.0 if self.reads == 1 else 1.0  # the deadline is set at 0 + 0.05

    ev, engine = evaluator(keys, pii_scanner, Jumps())
    searched: list[int] = []
    real = facts_mod.find_spans
    monkeypatch.setattr(facts_mod, "find_spans", lambda *a, **kw: searched.append(1) or real(*a, **kw))
    out = ev.evaluate(parse(request([candidate(keys, f"r-{i}") for i in range(3)])))
    assert [d.donor_id for d in out] == ["r-0", "r-1", "r-2"]
    for d in out:
        assert_late(d.record)
    assert searched == [] and engine.docs == 0


def test_span_search_past_the_deadline_denies_that_candidate_and_the_rest(
    keys: Keys, pii_scanner: PiiScanner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deadline passing in the second candidate's span search: it and the third are late, uncomputed.

    The first candidate's facts were ready in time, but the shared deadline has passed by the time
    the engine would run: it is denied without calling the engine ("no time left").
    """
    clock = FakeClock()
    ev, engine = evaluator(keys, pii_scanner, clock)
    real = facts_mod.find_spans
    calls: list[str] = []

    def slow_second(*a: Any, **kw: Any) -> Any:
        calls.append("search")
        if len(calls) == 2:
            clock.t = 1.0  # the search "takes" a second: its first deadline check stops it
        return real(*a, **kw)

    monkeypatch.setattr(facts_mod, "find_spans", slow_second)
    out = ev.evaluate(parse(request([candidate(keys, f"r-{i}") for i in range(3)])))
    assert [d.donor_id for d in out] == ["r-0", "r-1", "r-2"]
    first = out[0].record
    assert first["decision"] == "deny" and {g["result"] for g in first["gates"]} == {"error"}
    assert (
        "TimeoutError: no time left within 0.05 s: fact computation used it all"
        in first["gates"][0]["detail"]
    )
    assert_late(out[1].record)
    assert_late(out[2].record)
    assert calls == ["search", "search"] and engine.docs == 0


def test_adversarial_candidate_is_stopped_inside_the_span_search(keys: Keys, pii_scanner: PiiScanner) -> None:
    """A 40,000-token repeated-blocks donor on a clock ticking per reading is cut off mid-search, denied."""

    class Ticking(FakeClock):
        def __call__(self) -> float:
            self.reads += 1
            self.t += 0.001
            return self.t

    clock = Ticking()
    ev, engine = evaluator(keys, pii_scanner, clock, timeout=0.01)
    n = 40_000
    r, d = blocks(n, 33, 100_000), blocks(n, 33, 1_000_000)
    rp, dp = segs(("evidence", r.tolist())), segs(("evidence", d.tolist()))
    [out] = ev.evaluate(parse(request([candidate(keys, "adv", dp)], prompt=rp)))
    assert_late(out.record, "0.01")
    assert engine.docs == 0
    # NOTE: a full search of this pair reads the clock ~40 times (per diagonal, per 1,024 runs):
    # stopping after ~10 readings means it was stopped inside, not after it.
    assert clock.reads <= 14


def test_engine_gets_only_what_fact_computation_left(
    keys: Keys, pii_scanner: PiiScanner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Facts that used most of the timeout leave the engine the rest; a slow engine then times out, denied."""
    release = threading.Event()
    real = make_engine(load_policy(DEFAULT_POLICY_DIR))

    class Slow:
        name = "slow"

        def evaluate(self, doc: Any) -> Any:
            release.wait(30)
            return real.evaluate(doc)

    clock = FakeClock()
    ev = Evaluator(
        load_policy(DEFAULT_POLICY_DIR),
        keys.keyring,
        keys.decision,
        pii_scanner=pii_scanner,
        engine=Slow(),
        engine_timeout=30.0,
        monotonic=clock,
    )
    real_compute = decide_mod.compute_facts

    def costly(*a: Any, **kw: Any) -> Any:
        doc = real_compute(*a, **kw)
        clock.t = 30.0 - 0.02  # 20 ms left of 30 s: the engine must answer within that, not 30 s
        return doc

    monkeypatch.setattr(decide_mod, "compute_facts", costly)
    try:
        [d] = ev.evaluate(parse(request([candidate(keys)])))
    finally:
        release.set()
    assert d.decision == "deny" and {g["result"] for g in d.record["gates"]} == {"error"}
    detail = d.record["gates"][0]["detail"]
    assert "no answer within 30 s (the decision timeout, fact computation included)" in detail


def test_no_engine_timeout_means_no_deadline(keys: Keys, pii_scanner: PiiScanner) -> None:
    """Without engine_timeout (semgov check's default) the clock is never read and facts are never cut."""
    clock = FakeClock()
    ev = Evaluator(
        load_policy(DEFAULT_POLICY_DIR), keys.keyring, keys.decision, pii_scanner=pii_scanner, monotonic=clock
    )
    clock.t = 1e9
    [d] = ev.evaluate(parse(request([candidate(keys)])))
    assert d.decision == "allow" and clock.reads == 0


def test_verified_span_check_matches_the_linear_definition() -> None:
    """checked_result's indexed containment test agrees with the old any(...) scan on random spans."""
    from semgov.policy.checks import _Verified
    from semgov.policy.engine import ApprovedSpan
    from semgov.wire.policy_input import SpanFacts

    rng = np.random.default_rng(5)
    for _ in range(300):
        verified = [
            SpanFacts(
                recipient_start=int(a),
                donor_start=int(a + rng.integers(-3, 4)),
                length=int(rng.integers(1, 12)),
                kind=str(rng.choice(["prefix", "shifted"])),  # type: ignore[arg-type]
                recipient_role="evidence",
                donor_role="evidence",
            )
            for a in rng.integers(0, 60, int(rng.integers(0, 8)))
        ]
        index = _Verified(verified)
        for _ in range(20):
            a = int(rng.integers(0, 70))
            s = ApprovedSpan(
                a,
                a + int(rng.integers(-3, 4)),
                int(rng.integers(1, 12)),
                str(rng.choice(["prefix", "shifted"])),
            )  # type: ignore[arg-type]
            old = any(
                v.recipient_start <= s.recipient_start
                and s.recipient_start + s.length <= v.recipient_start + v.length
                and s.donor_start - s.recipient_start == v.donor_start - v.recipient_start
                and s.kind == v.kind
                for v in verified
            )
            assert index.contains(s) == old
