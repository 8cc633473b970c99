"""The policy's quality plan: how approved shifted spans are realized, per task and contract, signed."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter

from semgov import Evaluator, Keyring, PolicyError, load_signing_key, parse_policy
from semgov.policy.engine import ApprovedSpan, EngineResult, GateOutcome
from semgov.policy.rego.engines import OpaInProcessEngine, RegorusEngine
from semgov.policy.rego.loader import load_rego_policy
from semgov.policy.testing import deep_merge
from semgov.policy.yaml.model import Policy, QualityPlan, load_policy
from semgov.signing.records import verify_record
from semgov.wire.models import GATES, DecisionRecord
from semgov.wire.policy_input import PolicyInput
from semgov.wire.timefmt import rfc3339
from tests.conftest import DEFAULT_POLICY_DIR, ROOT
from tests.policy.test_differential import _base, random_doc

REGO_DEFAULT = ROOT / "policies" / "rego" / "default" / "policy.rego"
EX = ROOT / "examples"
MIN = "name: p\nversion: '1'\n"
RULES: list[dict[str, Any]] = [
    {"task": "extract_financials", "response_contract": "financials", "allow_shifted": False},
    {"task": "summarize_risks", "shifted_recompute_percent": 40},
    {"response_contract": "risks", "min_recompute_tokens": 64},
]
QUALITY = {"shifted_recompute_percent": 12, "min_recompute_tokens": 4, "rules": RULES}


def _err(text: str) -> PolicyError:
    with pytest.raises(PolicyError) as e:
        parse_policy(text.encode(), "pol.yaml")
    return e.value


def _policy(quality: dict[str, Any]) -> Policy:
    return parse_policy((MIN + "quality: " + json.dumps(quality) + "\n...\n").encode(), "pol.yaml")


def test_the_default_policy_turns_shifted_spans_off_and_plans_a_tail_where_turned_on() -> None:
    """The shipped default: shifted spans off for every task (a rule must turn them on); where they are
    on, the first 16 and the last 256 tokens of each are computed. The model's own default (a policy
    that says nothing) keeps shifted spans on with 20% of each head, at least 16 tokens."""
    p = load_policy(DEFAULT_POLICY_DIR)
    plan = p.quality_plan("anything", "at-all")
    assert plan == QualityPlan(allow_shifted=False, percent=0, min_tokens=16, rule=None, tail_tokens=256)
    assert [plan.recompute("shifted", n) for n in (8, 1000)] == [8, 16]
    assert [plan.tail("shifted", n) for n in (100, 1000)] == [100, 256] and plan.tail("prefix", 1000) == 0
    bare = parse_policy(b"name: p\nversion: '1'\n...\n", "x").quality_plan("a", "b")
    assert bare == QualityPlan(allow_shifted=True, percent=20, min_tokens=16, rule=None)
    assert [bare.recompute("shifted", n) for n in (8, 50, 320, 1000)] == [8, 16, 64, 200]


def test_first_matching_rule_replaces_the_defaults_and_omitted_keys_match_any() -> None:
    """Rules match on task id and contract id; the first match wins; unset settings keep the defaults."""
    p = _policy(QUALITY)
    assert p.quality_plan("extract_financials", "financials") == QualityPlan(False, 12, 4, 0)
    assert p.quality_plan("extract_financials", "other") == QualityPlan(True, 12, 4, None)
    assert p.quality_plan("summarize_risks", "risks") == QualityPlan(True, 40, 4, 1)
    assert p.quality_plan("qa", "risks") == QualityPlan(True, 12, 64, 2)
    assert _policy(QUALITY).quality_plan("qa", "risks").recompute("shifted", 1000) == 120


def test_recompute_rounds_up_in_integers() -> None:
    """ceil(percent * length / 100) in integer arithmetic: 5% of 100 is 5, of 101 is 6 (no float drift)."""
    plan = QualityPlan(True, 5, 0, None)
    assert [plan.recompute("shifted", n) for n in (100, 101, 1, 0)] == [5, 6, 1, 0]
    assert QualityPlan(True, 100, 0, None).recompute("shifted", 37) == 37


@pytest.mark.parametrize(
    ("quality", "field", "needle"),
    [
        (
            {"shifted_recompute_percent": 101},
            "quality.shifted_recompute_percent",
            "less than or equal to 100",
        ),
        ({"shifted_recompute_percent": 0.5}, "quality.shifted_recompute_percent", "valid integer"),
        ({"min_recompute_tokens": -1}, "quality.min_recompute_tokens", "greater than or equal to 0"),
        ({"rules": [{"task": "a", "recompute": 3}]}, "quality.rules.0.recompute", "unknown key"),
        ({"rules": [{"allow_shifted": "no"}]}, "quality.rules.0.allow_shifted", "valid boolean"),
        ({"rules": [{"task": ""}]}, "quality.rules.0.task", "at least 1 character"),
    ],
)
def test_bad_quality_settings_name_the_field(quality: dict[str, Any], field: str, needle: str) -> None:
    """A wrong type, range or key in the quality section is refused naming the file, line and field."""
    e = _err(MIN + "quality: " + json.dumps(quality) + "\n")
    assert e.source == "pol.yaml" and e.line == 3 and e.field == field, e.diagnostic()
    assert needle in e.diagnostic()


def test_a_rule_cannot_allow_what_token_verification_forbids() -> None:
    """allow_shifted true in a rule under a policy-wide false is refused: rules only tighten."""
    e = _err(
        MIN
        + "token_verification: {allow_shifted: false}\nquality: {rules: [{task: a, allow_shifted: true}]}\n"
    )
    assert "a rule can forbid shifted reuse in its scope, never allow it" in e.diagnostic()
    ok = parse_policy(
        (MIN + "token_verification: {allow_shifted: false}\nquality: {rules: [{task: a}]}\n...\n").encode(),
        "x",
    )
    assert ok.quality_plan("a", "c").allow_shifted is False


def _rego_dir(tmp: Path, quality: dict[str, Any]) -> Path:
    """The default Rego policy with its quality parameters set as ``quality`` says."""
    text = REGO_DEFAULT.read_text()
    for name, value in (
        ("shifted_recompute_percent", quality["shifted_recompute_percent"]),
        ("min_recompute_tokens", quality["min_recompute_tokens"]),
        ("shifted_recompute_tail_tokens", quality.get("shifted_recompute_tail_tokens", 0)),
        ("quality_allow_shifted", quality.get("allow_shifted", True)),
        ("quality_rules", quality["rules"]),
    ):
        old = next(line for line in text.splitlines() if line.startswith(f"{name} := "))
        text = text.replace(old, f"{name} := {json.dumps(value)}", 1)
    d = tmp / "rego"
    d.mkdir()
    (d / "policy.rego").write_text(text)
    return d


def _yaml_with_quality(quality: dict[str, Any]) -> Policy:
    text = (DEFAULT_POLICY_DIR / "policy.yaml").read_text()
    text = text[: text.index("\nquality:")] + "\nquality: " + json.dumps(quality) + "\n...\n"  # replaced
    return parse_policy(text.encode(), "policy.yaml")


def _summary(r: EngineResult) -> tuple[Any, ...]:
    allow = all(g.result == "pass" for g in r.gates) and bool(r.approved_spans)
    return ("allow" if allow else "deny", tuple((g.gate, g.result) for g in r.gates), tuple(r.approved_spans))


# Shifted reuse off by default and turned on per scope by rules, with a tail planned by default and
# changed by rules: spans end early, and a span with nothing left to copy is not approved (lengths
# near head + tail are drawn).
TAIL_QUALITY = {
    "allow_shifted": False,
    "shifted_recompute_percent": 0,
    "min_recompute_tokens": 0,
    "shifted_recompute_tail_tokens": 96,
    "rules": [
        {"task": "extract_financials", "response_contract": "financials", "allow_shifted": False},
        {
            "task": "summarize_risks",
            "allow_shifted": True,
            "shifted_recompute_tail_tokens": 0,
            "shifted_recompute_percent": 20,
        },
        {
            "response_contract": "risks",
            "allow_shifted": True,
            "min_recompute_tokens": 16,
            "shifted_recompute_tail_tokens": 200,
        },
    ],
}


def test_shifted_reuse_off_by_default_and_on_per_scope() -> None:
    """quality.allow_shifted false: no scope gets shifted reuse but those a rule turns it on for, and
    never beyond token_verification.allow_shifted (a rule allowing it there is refused)."""
    p = _policy({"allow_shifted": False, "rules": [{"task": "summarize_risks", "allow_shifted": True}]})
    assert p.quality_plan("summarize_risks", "any").allow_shifted is True
    assert p.quality_plan("extract_financials", "any").allow_shifted is False
    e = _err(
        MIN
        + "token_verification: {allow_shifted: false}\n"
        + "quality: {allow_shifted: false, rules: [{task: a, allow_shifted: true}]}\n"
    )
    assert "never allow it" in e.diagnostic()


def test_a_tail_ends_shifted_spans_early_and_drops_those_left_empty() -> None:
    """Tail 96: a 300-token shifted span is approved as its first 204; one of 96 or fewer is not approved;
    prefix spans are untouched; a head and a tail together must leave something to copy."""
    p = _policy(
        {"shifted_recompute_tail_tokens": 96, "shifted_recompute_percent": 0, "min_recompute_tokens": 0}
    )
    plan = p.quality_plan("a", "b")
    assert plan.tail_tokens == 96 and plan.tail("shifted", 300) == 96 and plan.tail("prefix", 300) == 0
    kr = Keyring.load(EX / "keyring.json")
    sk = load_signing_key(EX / "keys" / "decision-signing-key.pem")
    for quality, n, want in (
        ({**TAIL_QUALITY, "rules": [], "allow_shifted": True}, 300, [(0, 20, 0), (40, 204, 0)]),
        ({**TAIL_QUALITY, "rules": [], "allow_shifted": True}, 96, [(0, 20, 0)]),
        ({**TAIL_QUALITY, "rules": [], "allow_shifted": True, "min_recompute_tokens": 50}, 146, [(0, 20, 0)]),
        (
            {**TAIL_QUALITY, "rules": [], "allow_shifted": True, "min_recompute_tokens": 50},
            147,
            [(0, 20, 0), (40, 51, 50)],
        ),
    ):
        doc = TypeAdapter(PolicyInput).validate_python(deep_merge(_base(), {"facts": {"tokens": {
            "recipient_length": 40 + n,
            "spans": [_span(0, 0, 20, "prefix", "system"), _span(40, 60, n, "shifted", "evidence")],
        }}}))  # fmt: skip
        got = Evaluator(_yaml_with_quality(quality), kr, sk).decide(doc).approved_spans
        assert [(s.recipient_start, s.length, s.recompute) for s in got] == want, (n, quality)


@pytest.mark.parametrize("quality", [QUALITY, TAIL_QUALITY], ids=["head-rules", "tail-rules"])
def test_yaml_regorus_and_opa_plan_alike_with_rules(tmp_path: Path, quality: dict[str, Any]) -> None:
    """2,000 seeded documents across tasks and contracts: same decisions, spans and recompute counts."""
    kr = Keyring.load(EX / "keyring.json")
    sk = load_signing_key(EX / "keys" / "decision-signing-key.pem")
    rego = load_rego_policy(_rego_dir(tmp_path, quality))
    evs = (
        Evaluator(_yaml_with_quality(quality), kr, sk),
        Evaluator(rego, kr, sk, engine=RegorusEngine(rego)),
        Evaluator(rego, kr, sk, engine=OpaInProcessEngine(rego)),
    )
    adapter = TypeAdapter(PolicyInput)
    rng = random.Random(20261202)
    heads: set[int] = set()
    shifted_allowed = {"extract_financials/financials": 0, "other": 0}
    for _ in range(2000):
        raw = random_doc(rng)  # NOTE: a whole document (the base with its edges applied)
        req = raw["request"]
        req["task"] = {"id": rng.choice(["extract_financials", "summarize_risks", "qa"]), "version": "1"}
        req["response_contract"] = {"id": rng.choice(["financials", "risks"]), "schema_sha256": "ab" * 32}
        donor = raw["facts"].get("donor")
        if isinstance(donor, dict) and rng.random() < 0.8:  # NOTE: mostly the donor's too, so some allow
            donor.update(task=req["task"], response_contract=req["response_contract"])
        if rng.random() < 0.6:  # NOTE: a shifted evidence span of some length behind a short prefix
            n = rng.choice([32, 33, 96, 97, 99, 100, 101, 200, 201, 216, 217, rng.randint(32, 2000)])
            spans = [
                _span(0, 0, 20, "prefix", "system"),
                _span(40, rng.randint(0, 500), n, "shifted", "evidence"),
            ]
            raw["facts"]["tokens"] = {"recipient_length": 40 + n, "donor_length": 600 + n,
                                      "common_prefix": 20,
                                      "spans": spans}  # fmt: skip
        doc = adapter.validate_python(raw)
        y, rg, opa = (_summary(ev.decide(doc)) for ev in evs)
        assert y == rg == opa, f"engines differ on {doc}:\n{y}\n{rg}\n{opa}"
        for s in y[2]:
            if s.kind == "shifted":
                heads.add(s.recompute)
                scope = f"{req['task']['id']}/{req['response_contract']['id']}"
                shifted_allowed[scope if scope in shifted_allowed else "other"] += 1
    assert shifted_allowed["extract_financials/financials"] == 0
    assert shifted_allowed["other"] > (50 if quality is QUALITY else 20)
    assert len(heads) > (5 if quality is QUALITY else 1), heads  # several rules and lengths, not one constant


def test_the_record_states_the_plan_signed_and_v1_records_still_verify() -> None:
    """A v2 record carries each span's recompute under its signature; a v1 record (no plan) verifies."""
    kr = Keyring.load(EX / "keyring.json")
    sk = load_signing_key(EX / "keys" / "decision-signing-key.pem")
    doc = TypeAdapter(PolicyInput).validate_python(
        deep_merge(
            _base(),
            {
                "facts": {
                    "tokens": {
                        "recipient_length": 400,
                        "spans": [
                            {
                                "recipient_start": 0,
                                "donor_start": 0,
                                "length": 20,
                                "kind": "prefix",
                                "recipient_role": "system",
                                "donor_role": "system",
                            },
                            {
                                "recipient_start": 40,
                                "donor_start": 60,
                                "length": 300,
                                "kind": "shifted",
                                "recipient_role": "evidence",
                                "donor_role": "evidence",
                            },
                        ],  # fmt: skip
                    }
                }
            },
        )
    )
    ev = Evaluator(
        _yaml_with_quality(
            {**QUALITY, "rules": [{"task": "extract_financials", "shifted_recompute_percent": 30}]}
        ),
        kr,
        sk,
    )
    res = ev.decide(doc)
    assert [s.recompute for s in res.approved_spans] == [0, 90]
    assert "under quality rule 0" in next(g.detail for g in res.gates if g.gate == "token_verification")
    at = rfc3339(_now())
    signed = ev._sign("r", "acme", "research/e1", "d", res, recipient_tokens=400, evaluated_at=at)
    rec = signed.record
    assert rec["schema"] == "semgov.decision/v3" and [s["recompute"] for s in rec["approved_spans"]] == [
        0,
        90,
    ]
    verify_record(rec, sk.public_key)
    forged = json.loads(json.dumps(rec))
    forged["approved_spans"][1]["recompute"] = 0  # a writer that drops the plan breaks the signature
    with pytest.raises(Exception, match="signature does not verify"):
        verify_record(forged, sk.public_key)
    v1 = json.loads((ROOT / "tests" / "assets" / "decisions.jsonl").read_text().splitlines()[0])
    assert v1["schema"] == "semgov.decision/v1" and "recompute" not in v1["approved_spans"][0]
    assert verify_record(
        v1, load_signing_key(ROOT / "tests" / "assets" / "decision-signing-key.pem").public_key
    )


@pytest.mark.parametrize(
    ("schema", "span", "why"),
    [
        ("semgov.decision/v2", {}, "states `recompute`"),
        ("semgov.decision/v1", {"recompute": 0}, "has no `recompute`"),
        ("semgov.decision/v2", {"recompute": 21}, "exceeds the span's length 20"),
    ],
)
def test_a_record_whose_plan_does_not_fit_its_version_is_refused(
    schema: str, span: dict[str, Any], why: str
) -> None:
    """v2 spans must state recompute, v1 spans must not, and no plan exceeds its span."""
    rec = json.loads((ROOT / "tests" / "assets" / "decisions.jsonl").read_text().splitlines()[0])
    rec["schema"] = schema
    rec["approved_spans"] = [{**rec["approved_spans"][0], **span}]
    with pytest.raises(ValueError, match=why):
        DecisionRecord.model_validate(rec)


@pytest.mark.parametrize("recompute", [-1, 21, True])
def test_an_engine_plan_outside_its_span_is_an_error_not_a_record(recompute: Any) -> None:
    """An engine planning a negative, oversized or non-integer recompute: a token_verification error."""
    from semgov.policy.checks import checked_result

    doc = TypeAdapter(PolicyInput).validate_python(_base())
    gates = [GateOutcome(g, "pass", "ok") for g in GATES]
    out = checked_result(EngineResult(gates, [ApprovedSpan(0, 0, 20, "prefix", recompute)]), doc)
    assert out.approved_spans == []
    assert next(g for g in out.gates if g.gate == "token_verification").result == "error"


def _span(rs: int, ds: int, n: int, kind: str, role: str) -> dict[str, Any]:
    return {"recipient_start": rs, "donor_start": ds, "length": n, "kind": kind, "recipient_role": role,
            "donor_role": role}  # fmt: skip


def _now() -> Any:
    from datetime import UTC, datetime

    return datetime(2026, 12, 2, tzinfo=UTC)
