"""YAML, regorus and real OPA decide alike: same decision, same gate outcomes, same spans.

The shipped workload (every candidate) and 6,000 seeded random policy input documents
built around every gate's edges are decided by the YAML default policy, and by the Rego
default policy under regorus and under the real OPA evaluator.
"""

from __future__ import annotations

import gzip
import random
from collections import Counter
from functools import cache
from typing import Any

import pytest
from pydantic import TypeAdapter

from semgov import CapturedRequest, Evaluator, Keyring, load_signing_key
from semgov.policy.engine import EngineResult
from semgov.policy.rego.engines import OpaInProcessEngine, RegorusEngine
from semgov.policy.rego.loader import load_rego_policy
from semgov.policy.testing import deep_merge
from semgov.policy.yaml.model import load_policy
from semgov.wire.models import GATES
from semgov.wire.policy_input import PolicyInput
from tests.conftest import DEFAULT_POLICY_DIR, ROOT

REGO_DIR = ROOT / "policies" / "rego" / "default"
EX = ROOT / "examples"
N_RANDOM = 6000


@cache
def evaluators() -> tuple[Evaluator, ...]:
    return three_engines(load_policy(DEFAULT_POLICY_DIR), load_rego_policy(REGO_DIR))


def three_engines(yaml_pol: Any, rego_pol: Any) -> tuple[Evaluator, ...]:
    """Evaluators for a YAML policy and its Rego twin under regorus and the real OPA evaluator."""
    kr = Keyring.load(EX / "keyring.json")
    sk = load_signing_key(EX / "keys" / "decision-signing-key.pem")
    return (
        Evaluator(yaml_pol, kr, sk),
        Evaluator(rego_pol, kr, sk, engine=RegorusEngine(rego_pol)),
        Evaluator(rego_pol, kr, sk, engine=OpaInProcessEngine(rego_pol)),
    )


def summary(r: EngineResult) -> tuple[Any, ...]:
    allow = all(g.result == "pass" for g in r.gates) and bool(r.approved_spans)
    spans = tuple(r.approved_spans) if allow else ()
    return ("allow" if allow else "deny", tuple((g.gate, g.result) for g in r.gates), spans)


def assert_agree(doc: PolicyInput) -> str:
    y, rg, opa = (summary(ev.decide(doc)) for ev in evaluators())
    assert y == rg, f"YAML vs regorus differ on {doc}:\n{y}\n{rg}"
    assert y == opa, f"YAML vs OPA differ on {doc}:\n{y}\n{opa}"
    return str(y[0])


def test_rego_default_declares_the_same_fact_parameters() -> None:
    """Both default policies measure the same facts (spans, PII scan settings)."""
    yaml_ev, rego_ev, _ = evaluators()
    assert yaml_ev.policy.fact_config == rego_ev.policy.fact_config


def test_shipped_workload_every_candidate() -> None:
    """Every candidate of the shipped example gets identical decisions and gates from all three."""
    yaml_ev = evaluators()[0]
    counts: Counter[str] = Counter()
    with gzip.open(EX / "captured.jsonl.gz", "rb") as f:
        for line in f:
            for doc in yaml_ev.policy_inputs(CapturedRequest.model_validate_json(line)):
                counts[assert_agree(doc)] += 1
    assert counts["allow"] > 1000 and counts["deny"] > 2000


# ---- seeded random documents around every gate's edges ------------------

NOW = 1_795_946_400_000_000_000
DAY = 86_400_000_000_000
ROLES = ["system", "instruction", "evidence", "question", "other"]
PII = [
    "EMAIL_ADDRESS",
    "PHONE_NUMBER",
    "US_SSN",
    "CREDIT_CARD",
    "IBAN_CODE",
    "IP_ADDRESS",
    "URL",
    "DATE_TIME",
]


def _base() -> dict[str, Any]:
    contract = {"id": "financials", "schema_sha256": "ab" * 32}
    task = {"id": "extract_financials", "version": "1"}
    return {
        "now": "2026-11-29T10:00:00Z", "now_ns": NOW,
        "request": {"request_id": "r", "tenant": "acme", "namespace": "research/e1", "task": task,
                    "response_contract": contract, "prompt_tokens": 200},
        "candidate": {"donor_id": "d", "similarity": 0.9, "prompt_tokens": 200, "key_id": "k1",
                      "has_text": False},
        "facts": {
            "provenance": {"key_status": "trusted", "signature_valid": True, "payload_valid": True,
                           "payload_error": None, "donor_id_matches": True, "token_hash_matches": True,
                           "segments_hash_matches": True, "text_hash_matches": True},
            "donor": {"tenant": "acme", "namespace": "research/e1", "task": task,
                      "response_contract": contract, "created_at": "x", "expires_at": "y",
                      "created_at_ns": NOW - DAY,
                      "expires_at_ns": NOW + 6 * DAY, "policy_version": "default@1", "visibility": "tenant"},
            "pii": {"provenance_scanned": True, "provenance_entities": [], "text_scanned": False,
                    "text_entities": []},
            "tokens": {"recipient_length": 200, "donor_length": 200, "common_prefix": 200,
                       "spans": [{"recipient_start": 0, "donor_start": 0, "length": 200, "kind": "prefix",
                                  "recipient_role": "evidence", "donor_role": "evidence"}]},
            "errors": {},
        },
    }  # fmt: skip


def _spans(rng: random.Random, n: int) -> list[dict[str, Any]]:
    out, pos = [], 0
    while pos < n and len(out) < 6:
        length = rng.choice([1, 16, 31, 32, 33, 64, rng.randint(1, n)])
        length = min(length, n - pos)
        if length <= 0:
            break
        kind = (
            "prefix"
            if pos == 0 or (out and out[-1]["kind"] == "prefix" and rng.random() < 0.5)
            else "shifted"
        )
        out.append({"recipient_start": pos, "donor_start": pos if kind == "prefix" else rng.randint(0, 500),
                    "length": length, "kind": kind, "recipient_role": rng.choice(ROLES),
                    "donor_role": rng.choice(ROLES)})  # fmt: skip
        pos += length + rng.choice([0, 0, 3])
    return out


def random_doc(rng: random.Random) -> dict[str, Any]:
    """One document: each gate's fields are left passing, or pushed to or across their edge."""
    p: dict[str, Any] = {"facts": {}}
    f = p["facts"]
    if rng.random() < 0.35:
        f["donor"] = {
            "tenant": rng.choice(["acme", "globex", "Acme"]),
            "visibility": rng.choice(["tenant", "public"]),
        }
    if rng.random() < 0.3:
        f.setdefault("donor", {})["namespace"] = rng.choice(["research/e1", "research/e2", "research/e1/x"])
    if rng.random() < 0.35:
        f["provenance"] = {
            k: rng.random() < 0.7
            for k in (
                "signature_valid",
                "payload_valid",
                "donor_id_matches",
                "token_hash_matches",
                "segments_hash_matches",
                "text_hash_matches",
            )
        }
        f["provenance"]["key_status"] = rng.choice(["trusted", "trusted", "unknown", "revoked"])
    if rng.random() < 0.4:
        edge = rng.choice(
            [0, 1, -1, 1000, -1000, DAY, 30 * DAY, 30 * DAY - 1, 30 * DAY + 1, 30 * DAY - 1000, -DAY]
        )
        f.setdefault("donor", {})["created_at_ns"] = NOW - edge
        f["donor"]["expires_at_ns"] = NOW + rng.choice([0, 1, -1, 1000, -1000, DAY, 40 * DAY])
    if rng.random() < 0.25:
        f.setdefault("donor", {})["policy_version"] = rng.choice(
            ["default@1", "default@0", "other@1", "Default@1"]
        )
    if rng.random() < 0.35:
        f["pii"] = {"provenance_scanned": rng.random() < 0.8, "text_scanned": rng.random() < 0.5,
                    "provenance_entities": rng.sample(PII, rng.randint(0, 2)),
                    "text_entities": rng.sample(PII, rng.randint(0, 1))}  # fmt: skip
    if rng.random() < 0.25:
        f.setdefault("donor", {})["task"] = {"id": rng.choice(["extract_financials", "summarize_risks"]),
                                            "version": rng.choice(["1", "2"])}  # fmt: skip
    if rng.random() < 0.25:
        f.setdefault("donor", {})["response_contract"] = {
            "id": rng.choice(["financials", "risk_summary"]),
            "schema_sha256": rng.choice(["ab" * 32, "cd" * 32]),
        }
    if rng.random() < 0.4:
        p["candidate"] = {
            "similarity": rng.choice([0.6, 0.6 - 1e-12, 0.5999, 0.0, 1.0, -1.0, 2.0, rng.random()])
        }
    if rng.random() < 0.6:
        n = rng.choice([0, 1, 63, 64, 127, 128, 129, 200, 1000])
        p["request"] = {"prompt_tokens": n}
        f["tokens"] = {"recipient_length": n, "common_prefix": 0, "spans": _spans(rng, n)}
    if rng.random() < 0.08:
        f["donor"] = None
        f["provenance"] = {"payload_valid": False, "payload_error": "tenant: Field required"}
    if rng.random() < 0.08:
        fact = rng.choice(["provenance", "pii", "tokens"])
        f[fact] = None
        f["errors"] = {fact: "RuntimeError: boom"}
        if fact == "provenance":
            f["donor"] = None
    return deep_merge(_base(), p)


def test_random_documents_cover_every_gate_and_agree() -> None:
    """6,000 seeded documents at every gate's edges: identical outcomes; each gate passes and fails."""
    adapter = TypeAdapter(PolicyInput)
    rng = random.Random(20261129)
    seen: Counter[tuple[str, str]] = Counter()
    decisions: Counter[str] = Counter()
    yaml_ev = evaluators()[0]
    for _ in range(N_RANDOM):
        doc = adapter.validate_python(random_doc(rng))
        decisions[assert_agree(doc)] += 1
        for g in yaml_ev.decide(doc).gates:
            seen[(g.gate, g.result)] += 1
    for gate in GATES:
        assert seen[(gate, "pass")] > 50 and seen[(gate, "fail")] > 50, (gate, seen)
    assert seen[("pii", "error")] and seen[("token_verification", "error")] and seen[("tenant", "error")]
    assert decisions["allow"] > 200 and decisions["deny"] > 3000, decisions


@pytest.mark.parametrize("engine", ["regorus", "opa-inprocess"])
def test_yaml_case_file_holds_for_rego(engine: str) -> None:
    """The default YAML policy's case file passes against the Rego default policy too."""
    from semgov.policy.source import make_engine
    from semgov.policy.testing import run_case_file

    outcomes = run_case_file(
        DEFAULT_POLICY_DIR / "policy_test.yaml", make_engine(load_rego_policy(REGO_DIR), engine)
    )
    assert len(outcomes) >= 30
    assert [o for o in outcomes if o.status != "PASS"] == []


JOINED_ALIKE = [({"id": "qa", "version": "1@2"}, {"id": "qa@1", "version": "2"})]


@pytest.mark.parametrize(("mine", "theirs"), JOINED_ALIKE)
def test_tasks_compare_as_pairs_in_every_engine(mine: dict[str, str], theirs: dict[str, str]) -> None:
    """Tasks whose id@version strings coincide are different tasks in YAML, regorus and OPA."""
    doc = TypeAdapter(PolicyInput).validate_python(
        deep_merge(_base(), {"request": {"task": mine}, "facts": {"donor": {"task": theirs}}})
    )
    assert assert_agree(doc) == "deny"
    assert {g.gate: g.result for g in evaluators()[0].decide(doc).gates}["task"] == "fail"


MAX_AGE = 30 * DAY


@pytest.mark.parametrize("delta", [1, 1_000, 1_000_000_000], ids=["1ns", "1us", "1s"])
def test_time_boundaries_in_nanoseconds_in_every_engine(delta: int) -> None:
    """Expiry, not-yet-valid and max age at 1 ns, 1 us and 1 s from each edge: the same in all three."""
    cases = [  # (created_at_ns, expires_at_ns, expected)
        (NOW, NOW + delta, "allow"),
        (NOW - DAY, NOW, "deny"),
        (NOW + delta, NOW + DAY, "deny"),
        (NOW - MAX_AGE, NOW + DAY, "deny"),
        (NOW - MAX_AGE - delta, NOW + DAY, "deny"),
        (NOW - MAX_AGE + delta, NOW + DAY, "allow"),
    ]
    for created, expires, want in cases:
        doc = TypeAdapter(PolicyInput).validate_python(
            deep_merge(_base(), {"facts": {"donor": {"created_at_ns": created, "expires_at_ns": expires}}})
        )
        assert assert_agree(doc) == want, (created - NOW, expires - NOW)


def test_a_blank_fact_error_still_names_a_reason_in_every_engine() -> None:
    """facts.errors {pii: ""}: the pii gate errors with a non-empty detail in YAML, regorus and OPA."""
    doc = TypeAdapter(PolicyInput).validate_python(
        deep_merge(_base(), {"facts": {"pii": None, "errors": {"pii": ""}}})
    )
    assert assert_agree(doc) == "deny"
    for ev in evaluators():
        [g] = [g for g in ev.decide(doc).gates if g.gate == "pii"]
        assert g.result == "error" and g.detail.strip(), g


# ---- scoped rules: public donors for some requests only -------------------------------------

SCOPES = [
    {"task": "summarize_risks@1"},
    {"tenant": "globex", "namespace": "research/*"},
    {"tenant": "acme", "namespace": "legal/contracts", "task": "extract_financials@2"},
]
SHARING = [
    {"donor": "research/*", "recipients": ["research/*"], "scope": {"task": "summarize_risks@1"}},
    {"donor": "research/e2", "recipients": ["legal/contracts"], "scope": {"tenant": "globex"}},
    {"donor": "research/e1/x", "recipients": ["research/e1"]},
]
SHARING = [
    {"donor": "research/*", "recipients": ["research/*"], "scope": {"task": "summarize_risks@1"}},
    {"donor": "research/e2", "recipients": ["legal/contracts"], "scope": {"tenant": "globex"}},
    {"donor": "research/e1/x", "recipients": ["research/e1"]},
]


@pytest.fixture(scope="module")
def scoped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Evaluator, ...]:
    """The default policies, YAML and Rego, with the same public_donors_for scopes and scoped sharing."""
    import json

    d = tmp_path_factory.mktemp("scoped")
    (d / "yaml").mkdir()
    text = (DEFAULT_POLICY_DIR / "policy.yaml").read_text()
    text = text.replace(
        "  allow_public_donors: false\n",
        f"  allow_public_donors: false\n  public_donors_for: {json.dumps(SCOPES)}\n",
    ).replace("  sharing: []", f"  sharing: {json.dumps(SHARING)}")
    (d / "yaml" / "policy.yaml").write_text(text)
    (d / "rego").mkdir()
    rego = (
        (REGO_DIR / "policy.rego")
        .read_text()
        .replace("public_donors_for := []", f"public_donors_for := {json.dumps(SCOPES)}")
        .replace("namespace_sharing := []", f"namespace_sharing := {json.dumps(SHARING)}")
    )
    (d / "rego" / "policy.rego").write_text(rego)
    yaml_pol, rego_pol = load_policy(d / "yaml"), load_rego_policy(d / "rego")
    assert yaml_pol.tenant.public_donors_for and yaml_pol.namespace.sharing[0].scope is not None
    assert rego_pol.revision != load_rego_policy(REGO_DIR).revision
    return three_engines(yaml_pol, rego_pol)


def test_public_donors_for_scopes_agree_in_every_engine(scoped: tuple[Evaluator, ...]) -> None:
    """Public donors and shared namespaces, requests in and out of each scope: YAML, regorus, OPA agree."""
    adapter = TypeAdapter(PolicyInput)
    rng = random.Random(20261202)
    tenant_results: Counter[str] = Counter()
    shared: Counter[str] = Counter()
    for _ in range(1500):
        raw = random_doc(rng)
        raw["request"]["tenant"] = rng.choice(["acme", "globex", "Globex"])
        raw["request"]["namespace"] = rng.choice(
            ["research/e1", "research", "legal/contracts", "research/../x"]
        )
        task = rng.choice(
            [
                ("summarize_risks", "1"),
                ("summarize_risks", "2"),
                ("extract_financials", "2"),
                ("summarize_risks@1", ""),
            ]
        )
        raw["request"]["task"] = {"id": task[0], "version": task[1] or "1"}
        if raw["facts"]["donor"] is not None:
            raw["facts"]["donor"] |= {
                "tenant": rng.choice(["initech", "acme"]),
                "visibility": rng.choice(["public", "public", "tenant"]),
                "namespace": rng.choice(["research/e1", "research/e2", "research/e1/x", "legal/x"]),
            }
        doc = adapter.validate_python(raw)
        out = [summary(ev.decide(doc)) for ev in scoped]
        assert out[0] == out[1] == out[2], f"engines differ on {doc}:\n{out}"
        gates = dict(out[0][1])
        tenant_results[gates["tenant"]] += 1
        d = doc.facts.donor
        if d is not None and d.namespace != doc.request.namespace:
            shared[gates["namespace"]] += 1  # NOTE: only a sharing rule can pass these
    assert tenant_results["pass"] > 300 and tenant_results["fail"] > 300, tenant_results
    assert shared["pass"] > 100 and shared["fail"] > 300, shared


def test_public_donors_for_rejects_empty_and_malformed_scopes(tmp_path: Any) -> None:
    """An empty scope, a task without one '@', a bad pattern or an unknown key fails to load in both."""
    from semgov.errors import PolicyError

    for bad in (
        {},
        {"task": "summarize_risks"},
        {"task": "a@b@c"},
        {"namespace": "research/*/x"},
        {"role": "x"},
    ):
        y = tmp_path / f"y{len(list(tmp_path.iterdir()))}"
        y.mkdir()
        text = (DEFAULT_POLICY_DIR / "policy.yaml").read_text()
        (y / "policy.yaml").write_text(
            text.replace(
                "  allow_public_donors: false\n",
                f"  allow_public_donors: false\n  public_donors_for: [{json_of(bad)}]\n",
            )
        )
        with pytest.raises(PolicyError, match="public_donors_for"):
            load_policy(y)
        r = tmp_path / f"r{len(list(tmp_path.iterdir()))}"
        r.mkdir()
        rego = (
            (REGO_DIR / "policy.rego")
            .read_text()
            .replace("public_donors_for := []", f"public_donors_for := [{json_of(bad)}]")
        )
        (r / "policy.rego").write_text(rego)
        with pytest.raises(PolicyError, match="public_donors_for"):
            load_rego_policy(r)


def json_of(v: Any) -> str:
    import json

    return json.dumps(v)
