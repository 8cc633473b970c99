"""Rego engines: regorus and real OPA decide alike; malformed policy output always denies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from semgov import Evaluator
from semgov.policy.rego.engines import EngineOutputError, OpaInProcessEngine, RegorusEngine, interpret
from semgov.policy.rego.loader import load_rego_policy
from semgov.wire.models import GATES
from tests.conftest import Keys, candidate, parse, request, with_text
from tests.policy.test_rego_policy import MINIMAL, write


def _evaluators(tmp_path: Path, keys: Keys, pii: Any, text: str = MINIMAL) -> list[Evaluator]:
    pol = load_rego_policy(write(tmp_path, text))
    return [
        Evaluator(pol, keys.keyring, keys.decision, pii_scanner=pii, engine=e)
        for e in (RegorusEngine(pol), OpaInProcessEngine(pol))
    ]


def test_engines_agree_and_name_themselves(tmp_path: Path, keys: Keys, pii_scanner: Any) -> None:
    """regorus and OPA give the same decision and gates, and the record names engine and revision."""
    for sim, want in ((0.9, "allow"), (0.3, "deny")):
        recs = [ev.evaluate(parse(request([candidate(keys, similarity=sim)])))[0].record for ev in
                _evaluators(tmp_path, keys, pii_scanner)]  # fmt: skip
        assert {r["decision"] for r in recs} == {want}
        assert recs[0]["gates"] == recs[1]["gates"]
        assert [r["policy"]["engine"] for r in recs] == ["regorus", "opa-inprocess"]
        assert recs[0]["policy"]["name"] == "mini" and recs[0]["policy"]["revision"].startswith("sha256:")
        if want == "allow":
            assert recs[0]["approved_spans"] == recs[1]["approved_spans"] != []


def test_fact_errors_become_gate_errors(tmp_path: Path, keys: Keys) -> None:
    """A PII scan failure is the pii gate's error in Rego engines too, and denies."""

    class Broken:
        def scan(self, *a: Any, **k: Any) -> frozenset[str]:
            raise OSError("scanner crashed")

    cand = candidate(keys)
    cand = with_text(keys, cand, "words")
    for ev in _evaluators(tmp_path, keys, Broken()):
        rec = ev.evaluate(parse(request([cand])))[0].record
        assert rec["decision"] == "deny"
        assert next(g for g in rec["gates"] if g["gate"] == "pii")["result"] == "error"


@pytest.mark.parametrize(
    ("rule", "needle"),
    [
        ('allow := "yes"', "not a boolean"),
        ("deny := 5", "not a set"),
        ('deny contains {"gate": "nonsense", "detail": "x"} if true', "no known gate"),
        ('deny contains {"gate": "tenant"} if true', "not {gate, detail}"),
        ('approved_spans := [{"recipient_start": 0}]', "malformed"),
    ],
)
def test_malformed_policy_output_denies(
    tmp_path: Path, keys: Keys, pii_scanner: Any, rule: str, needle: str
) -> None:
    """Output that breaks the convention makes every gate error and the decision deny."""
    name = rule.split()[0]
    blocks = [b for b in MINIMAL.split("\n\n") if not b.lstrip().startswith((name, f"default {name}"))]
    text = "\n\n".join(blocks) + "\n" + rule + "\n"
    if name == "deny" and ":=" in rule:
        text = text.replace("count(deny) == 0", "true")
    if name == "allow":
        text = text.replace("default allow := false\n", "")
    for ev in _evaluators(tmp_path, keys, pii_scanner, text):
        rec = ev.evaluate(parse(request([candidate(keys)])))[0].record
        assert rec["decision"] == "deny" and rec["approved_spans"] == []
        assert all(g["result"] == "error" for g in rec["gates"]), rec["gates"]
        assert needle in rec["gates"][0]["detail"]


def test_allow_inconsistent_with_deny_is_refused() -> None:
    """allow=true with deny entries (or false without any) is malformed output."""
    doc: Any = type("D", (), {"facts": type("F", (), {"errors": {}})()})()  # all interpret reads
    with pytest.raises(EngineOutputError, match="allow"):
        interpret({"allow": True, "deny": [{"gate": "tenant", "detail": "x"}], "approved_spans": []}, doc)
    with pytest.raises(EngineOutputError, match="allow"):
        interpret({"allow": False, "deny": [], "approved_spans": []}, doc)
    ok = interpret({"allow": False, "deny": [{"gate": "tenant", "detail": "x"}], "approved_spans": []}, doc)
    assert [g.result for g in ok.gates] == ["fail"] + ["pass"] * (len(GATES) - 1)


def test_undefined_result_denies(tmp_path: Path, keys: Keys, pii_scanner: Any) -> None:
    """approved_spans undefined for an input (tokens fact missing) denies instead of raising."""
    text = MINIMAL.replace("some s in input.facts.tokens.spans", "some s in input.nothing.spans")
    text = text.replace("approved_spans := [", "approved_spans := x if {\n  input.nothing\n  x := [") + "}\n"
    for ev in _evaluators(tmp_path, keys, pii_scanner, text):
        rec = ev.evaluate(parse(request([candidate(keys)])))[0].record
        assert rec["decision"] == "deny" and "undefined" in rec["gates"][0]["detail"]


def test_regorus_decides_on_threads_other_than_the_one_that_built_it(
    tmp_path: Path, keys: Keys, pii_scanner: Any
) -> None:
    """A regorus engine built on one thread decides on others (the hook's engine thread, a pool),
    each with the same answer: a regorus Engine itself must never cross threads (pyo3 panics)."""
    import concurrent.futures

    pol = load_rego_policy(write(tmp_path, MINIMAL))
    ev = Evaluator(pol, keys.keyring, keys.decision, pii_scanner=pii_scanner, engine=RegorusEngine(pol))
    req = parse(request([candidate(keys, similarity=0.9)]))
    here = ev.evaluate(req)[0].record["decision"]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        there = list(pool.map(lambda _: ev.evaluate(req)[0].record["decision"], range(6)))
    assert here == "allow" and there == ["allow"] * 6
    timed = Evaluator(
        pol,
        keys.keyring,
        keys.decision,
        pii_scanner=pii_scanner,
        engine=RegorusEngine(pol),
        engine_timeout=5.0,
    )
    assert timed.evaluate(req)[0].record["decision"] == "allow"  # NOTE: the engine runs on a worker thread


def test_a_dropped_regorus_policy_is_freed_on_the_threads_that_compiled_it(tmp_path: Path) -> None:
    """A reload drops the old policy's engine on whatever thread: no regorus engine is ever freed on
    another thread than its own (pyo3 refuses, an unraisable error); the next compile frees it there."""
    import gc
    import sys
    import threading

    errors: list[Any] = []
    before = sys.unraisablehook
    sys.unraisablehook = errors.append
    try:
        pol = load_rego_policy(write(tmp_path, MINIMAL))
        eng = RegorusEngine(pol)
        compiled, dropped = threading.Event(), threading.Event()

        def work(e: RegorusEngine) -> None:
            e._engine()
            compiled.set()
            dropped.wait(10)  # NOTE: a long-lived thread (the hook's registration thread) outlives it

        worker = threading.Thread(target=work, args=(eng,))
        worker.start()
        compiled.wait(10)
        del eng  # NOTE: dropped here, on the main thread, while the worker still runs
        gc.collect()
        dropped.set()
        worker.join()
        RegorusEngine(pol)  # a new policy on this thread frees this thread's dead entries, here
        gc.collect()
    finally:
        sys.unraisablehook = before
    assert errors == [], [str(e.exc_value) for e in errors]
