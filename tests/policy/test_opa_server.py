"""OPA server engine: decides like the embedded engines, batches, and fails closed on every fault."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from opa_client import OpaClient

from semgov import Evaluator, verify_record
from semgov.errors import PolicyError
from semgov.policy.rego.engines import OpaInProcessEngine, RegorusEngine
from semgov.policy.rego.loader import RegoPolicy, load_rego_policy
from semgov.policy.rego.opa_server import OpaServerEngine
from semgov.wire.policy_input import PolicyInput
from tests.conftest import Keys, candidate, parse, request
from tests.opa_rest_server import OpaRestServer

POLICY = """\
package semgov.reuse

metadata := {"name": "opa-test", "version": "1"}

deny contains {"gate": "similarity", "detail": msg} if {
\tinput.candidate.similarity < 0.6
\tmsg := sprintf("similarity %v < 0.6", [input.candidate.similarity])
}

deny contains {"gate": "token_verification", "detail": "no token facts"} if input.facts.tokens == null

deny contains {"gate": "tenant", "detail": "donor of another tenant"} if {
\tinput.facts.donor.tenant != input.request.tenant
}

default allow := false

allow if count(deny) == 0

approved_spans := [{"recipient_start": s.recipient_start, "donor_start": s.donor_start, "length": s.length,
\t"kind": s.kind} | some s in input.facts.tokens.spans; s.kind == "prefix"]
"""
TIMEOUT = 0.3


def write(tmp_path: Path, files: dict[str, str]) -> Path:
    d = tmp_path / "rego"
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text)
    return d


@pytest.fixture
def server() -> Iterator[OpaRestServer]:
    with OpaRestServer() as s:
        yield s


@pytest.fixture
def policy(tmp_path: Path) -> RegoPolicy:
    return load_rego_policy(write(tmp_path, {"main.rego": POLICY}))


def docs(ev: Evaluator, keys: Keys) -> list[PolicyInput]:
    """Policy inputs of one request: an allow, a similarity deny, a tenant deny, and no token facts."""
    cands = [
        candidate(keys, "r-01"),
        candidate(keys, "r-02", similarity=0.5),
        candidate(keys, "r-03", tenant="globex"),
        candidate(keys, "r-04"),
    ]
    out = ev.policy_inputs(parse(request(cands)))
    # A failed token computation: tokens null and the error recorded (as compute_facts does).
    out[3] = replace(out[3], facts=replace(out[3].facts, tokens=None, errors={"tokens": "ValueError: x"}))
    return out


def evaluator(policy: RegoPolicy, keys: Keys, pii: Any, engine: Any) -> Evaluator:
    return Evaluator(policy, keys.keyring, keys.decision, pii_scanner=pii, engine=engine)


def test_decisions_equal_embedded_engines(
    server: OpaRestServer, policy: RegoPolicy, keys: Keys, pii_scanner: Any
) -> None:
    """OPA over HTTP gives the same gates and spans as regorus and in-process OPA, allow and deny."""
    engines = [OpaServerEngine(policy, server.url), RegorusEngine(policy), OpaInProcessEngine(policy)]
    evs = [evaluator(policy, keys, pii_scanner, e) for e in engines]
    documents = docs(evs[0], keys)
    results = [[ev.decide(d) for d in documents] for ev in evs]
    assert results[0] == results[1] == results[2]
    outcome = [all(g.result == "pass" for g in r.gates) for r in results[0]]
    assert outcome == [True, False, False, False]
    assert results[0][0].approved_spans and results[0][1].gates[-2].detail == "similarity 0.5 < 0.6"
    recs = [ev.evaluate(parse(request([candidate(keys, "r-01"), candidate(keys, "r-02", similarity=0.5)])))
            for ev in evs]  # fmt: skip
    assert [[d.decision for d in r] for r in recs] == [["allow", "deny"]] * 3
    assert [[d.record["gates"] for d in r] for r in recs[1:]] == [[d.record["gates"] for d in recs[0]]] * 2
    assert recs[0][0].record["policy"]["engine"] == "opa-server"


def test_evaluate_many_is_one_request_and_matches_evaluate(
    server: OpaRestServer, policy: RegoPolicy, keys: Keys, pii_scanner: Any
) -> None:
    """All candidates of a request go in one POST /v1/query, deciding exactly as per-document calls."""
    engine = OpaServerEngine(policy, server.url)
    ev = evaluator(policy, keys, pii_scanner, engine)
    documents = docs(ev, keys)
    single = [ev.decide(d) for d in documents]
    server.requests.clear()
    assert engine.evaluate_many(documents) == [engine.evaluate(d) for d in documents]
    server.requests.clear()
    assert ev.decide_all(documents) == single
    assert server.requests == [("POST", "/v1/query")]
    server.requests.clear()
    assert len(ev.evaluate(parse(request([candidate(keys, f"r-0{i}") for i in range(1, 6)])))) == 5
    assert server.requests == [("POST", "/v1/query")]


FAULTS: dict[str, tuple[Any, str]] = {
    "down": (lambda s: s.stop(), "connection failed: Connection refused"),
    "slow": (lambda s: setattr(s, "delay", TIMEOUT + 0.3), f"timed out after {TIMEOUT}s"),
    "http 500": (lambda s: setattr(s, "status", 500), "returned HTTP 500: internal_error: injected fault"),
    "not json": (lambda s: setattr(s, "body", b"<html>busy</html>"), "returned malformed JSON"),
    "wrong shape": (lambda s: setattr(s, "body", b'{"result": [1, 2]}'), "returned a malformed"),
    "undefined": (lambda s: setattr(s, "body", b"{}"), "data.semgov.reuse is undefined"),
}


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("batched", [False, True], ids=["evaluate", "evaluate_many"])
def test_server_faults_deny_with_every_gate_error(
    server: OpaRestServer, policy: RegoPolicy, keys: Keys, pii_scanner: Any, fault: str, batched: bool
) -> None:
    """Down, slow, HTTP 500, non-JSON, wrong-shaped or undefined answers: signed deny, every gate error."""
    engine = OpaServerEngine(policy, server.url, timeout=TIMEOUT)
    if not batched:
        engine.evaluate_many = None  # type: ignore[assignment,method-assign]
    ev = evaluator(policy, keys, pii_scanner, engine)
    inject, reason = FAULTS[fault]
    inject(server)
    decisions = ev.evaluate(parse(request([candidate(keys, "r-01"), candidate(keys, "r-02")])))
    assert len(decisions) == 2
    for d in decisions:
        rec = d.record
        assert rec["decision"] == "deny" and rec["approved_spans"] == [] and rec["approved_tokens"] == 0
        assert {g["result"] for g in rec["gates"]} == {"error"}
        detail = rec["gates"][0]["detail"]
        assert detail.startswith(f"policy engine opa-server failed: OpaServerError: OPA server {server.url}")
        assert reason in detail, detail
        verify_record(rec, keys.decision.public_key)


def test_undefined_package_on_server_denies(
    server: OpaRestServer, policy: RegoPolicy, keys: Keys, pii_scanner: Any
) -> None:
    """When the server no longer holds the package, data.semgov.reuse is undefined and every gate errors."""
    engine = OpaServerEngine(policy, server.url, timeout=TIMEOUT)
    OpaClient(host="127.0.0.1", port=server.port).delete_policy("semgov/opa-test/main.rego")
    ev = evaluator(policy, keys, pii_scanner, engine)
    for batched in (True, False):
        if not batched:
            engine.evaluate_many = None  # type: ignore[assignment,method-assign]
        [d] = ev.evaluate(parse(request([candidate(keys, "r-01")])))
        assert d.decision == "deny" and {g["result"] for g in d.record["gates"]} == {"error"}
        assert "data.semgov.reuse is undefined" in d.record["gates"][0]["detail"]


def test_upload_syntax_error_names_the_file(server: OpaRestServer, tmp_path: Path) -> None:
    """A module the server cannot parse is a load error naming that file and line."""
    pol = load_rego_policy(write(tmp_path, {"main.rego": POLICY}))
    pol.modules["broken.rego"] = "package semgov.reuse\n\nx := }\n\ny := 1\n"
    with pytest.raises(PolicyError) as err:
        OpaServerEngine(pol, server.url)
    assert err.value.source == str(pol.directory / "broken.rego") and err.value.line == 3
    assert "rego_parse_error" in str(err.value) and server.url in str(err.value)


def test_upload_unreachable_server_is_a_load_error(policy: RegoPolicy) -> None:
    """Constructing against a server that is down raises PolicyError naming the server."""
    with OpaRestServer() as s:
        url = s.url
    with pytest.raises(PolicyError, match=r"OPA server http://127\.0\.0\.1:\d+ connection failed"):
        OpaServerEngine(policy, url, timeout=TIMEOUT)


def test_multi_module_upload_replaces_stale_modules(server: OpaRestServer, tmp_path: Path) -> None:
    """Modules upload whatever their order of dependence, and a module no longer in the policy is removed."""
    lib = "package semgov.reuse\n\nlow(x) if x < 0.6\n"
    main = POLICY.replace("input.candidate.similarity < 0.6", "low(input.candidate.similarity)")
    pol = load_rego_policy(
        write(tmp_path, {"a_main.rego": main, "b_lib.rego": lib, "c_old.rego": "package x\n"})
    )
    OpaServerEngine(pol, server.url)
    puts = [p for m, p in server.requests if m == "PUT"]
    assert puts == [
        f"/v1/policies/semgov/opa-test/{f}" for f in ("a_main.rego", "b_lib.rego", "c_old.rego")
    ] + [
        "/v1/policies/semgov/opa-test/a_main.rego"  # rejected before b_lib.rego was there
    ]
    (pol.directory / "c_old.rego").unlink()
    OpaServerEngine(load_rego_policy(pol.directory), server.url)
    held = OpaClient(host="127.0.0.1", port=server.port).get_policies_list()
    assert sorted(held) == ["semgov/opa-test/a_main.rego", "semgov/opa-test/b_lib.rego"]


def test_no_upload_uses_the_servers_policy_and_checks_its_metadata(
    server: OpaRestServer, policy: RegoPolicy, tmp_path: Path, keys: Keys, pii_scanner: Any
) -> None:
    """Without upload the server's copy decides; a server holding another policy is a load error."""
    with pytest.raises(PolicyError, match="metadata"):
        OpaServerEngine(policy, server.url, upload=False)
    OpaServerEngine(policy, server.url)
    server.requests.clear()
    engine = OpaServerEngine(policy, server.url, upload=False)
    assert [m for m, _ in server.requests] == ["POST"]
    [d] = evaluator(policy, keys, pii_scanner, engine).evaluate(parse(request([candidate(keys)])))
    assert d.decision == "allow"
    other = load_rego_policy(write(tmp_path / "v2", {"main.rego": POLICY.replace('"1"}', '"2"}')}))
    with pytest.raises(PolicyError, match="expected {'name': 'opa-test', 'version': '2'}"):
        OpaServerEngine(other, server.url, upload=False)


@pytest.mark.parametrize("url", ["127.0.0.1:8181", "ftp://h:1", "http://h:1/v1", "http://h:99999"])
def test_malformed_url_is_a_load_error(policy: RegoPolicy, url: str) -> None:
    """A URL other than http(s)://host:port is refused before any request."""
    with pytest.raises(PolicyError, match="OPA server URL"):
        OpaServerEngine(policy, url)
