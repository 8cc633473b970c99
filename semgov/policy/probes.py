"""Does each gate of a policy deny what it must? One probe per gate, asked of the policy's own engine.

``semgov policy check`` runs these on every policy, YAML or Rego. Each probe starts from
:func:`semgov.policy.rollout.probe` (a donor whose every fact is benign, produced under the
policy's own ``name@version``) and breaks exactly one gate's facts in a way no reuse policy may
accept: a donor of another tenant that is not public, a forged provenance signature, an expired
donor, an unaccepted policy version, forbidden PII, another task, another response contract,
similarity 0, and no verified token span. What the engine answers is checked, not the rules'
text, so the result is what deciding would do:

- an engine that cannot decide a probe (it raises, or answers what the evaluator refuses: a deny
  entry naming an unknown gate, ``allow`` disagreeing with ``deny``) is a problem;
- a policy that allows every probe has an unconditional ``allow``: a problem;
- a probe allowed, or whose gate passed, is a warning naming the gate (a policy may deliberately
  share every namespace or accept every task: then say so in a test, not by accident).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from semgov.policy.engine import PolicyEngine
from semgov.policy.rollout import probe
from semgov.wire.models import ResponseContract, TaskRef
from semgov.wire.policy_input import PolicyInput

Probe = Callable[[PolicyInput], PolicyInput]


def _facts(doc: PolicyInput, **changes: Any) -> PolicyInput:
    return replace(doc, facts=replace(doc.facts, **changes))


def _donor(doc: PolicyInput, **changes: Any) -> PolicyInput:
    assert doc.facts.donor is not None
    return _facts(doc, donor=replace(doc.facts.donor, **changes))


def _expired(doc: PolicyInput) -> PolicyInput:
    hour = 3600 * 10**9
    return _donor(
        doc,
        created_at="2026-11-29T00:00:00Z",
        expires_at="2026-11-30T00:00:00Z",
        created_at_ns=doc.now_ns - 48 * hour,
        expires_at_ns=doc.now_ns - 24 * hour,
    )


def _forged(doc: PolicyInput) -> PolicyInput:
    assert doc.facts.provenance is not None
    return _facts(doc, provenance=replace(doc.facts.provenance, signature_valid=False))


def _pii(doc: PolicyInput) -> PolicyInput:
    assert doc.facts.pii is not None
    found = ["CREDIT_CARD", "EMAIL_ADDRESS", "IBAN_CODE", "PHONE_NUMBER", "US_SSN"]
    return _facts(doc, pii=replace(doc.facts.pii, provenance_entities=found, text_entities=found))


def _unverified(doc: PolicyInput) -> PolicyInput:
    assert doc.facts.tokens is not None
    return _facts(doc, tokens=replace(doc.facts.tokens, spans=[], common_prefix=0))


# gate -> (what the probe's donor is, how to make it)
PROBES: dict[str, tuple[str, Probe]] = {
    "tenant": ("a donor of another tenant, not public", lambda d: _donor(d, tenant="probe-other-tenant")),
    "provenance": ("a donor whose provenance signature does not verify", _forged),
    "expiry": ("a donor that expired a day ago", _expired),
    "policy_version": (
        "a donor produced under an unaccepted policy version",
        lambda d: _donor(d, policy_version="probe-never-accepted@0"),
    ),  # fmt: skip  # noqa: E501
    "pii": ("a donor with forbidden PII (card, e-mail, IBAN, phone, SSN)", _pii),
    "task": (
        "a donor of another task",
        lambda d: _donor(d, task=TaskRef(id="probe-other-task", version="1")),
    ),
    "response_contract": (
        "a donor of another response contract",
        lambda d: _donor(d, response_contract=ResponseContract(id="probe-other", schema_sha256="f" * 64)),
    ),
    "similarity": (
        "a candidate of similarity 0",
        lambda d: replace(d, candidate=replace(d.candidate, similarity=0.0)),
    ),  # fmt: skip  # noqa: E501
    "token_verification": ("a donor with no verified token span", _unverified),
}


def probe_findings(engine: PolicyEngine, ref: str) -> tuple[list[str], list[str]]:
    """``(problems, warnings)`` of the policy ``engine`` decides, whose ``name@version`` is ``ref``."""
    from semgov.policy.checks import checked_result

    problems: list[str] = []
    warnings: list[str] = []
    allowed = 0
    for gate, (what, make) in PROBES.items():
        doc = make(probe(ref))
        try:
            raw = engine.evaluate(doc)
            checked = checked_result(raw, doc)
        except Exception as e:  # noqa: BLE001 - an engine that cannot decide the probe is a problem
            problems.append(f"the engine cannot decide {what}: {type(e).__name__}: {str(e)[:200]}")
            continue
        if all(g.result == "error" for g in checked.gates):
            problems.append(f"the engine cannot decide {what}: {checked.gates[0].detail[:200]}")
            continue
        # NOTE: what the policy said, before the evaluator's own span check fails it closed.
        outcome = {str(g.gate): g.result for g in raw.gates}.get(gate)
        if all(g.result == "pass" for g in raw.gates):
            allowed += 1
            warnings.append(f"gate {gate} allows {what}")
        elif outcome == "pass":
            warnings.append(f"gate {gate} passes {what} (another gate denied it)")
    if allowed == len(PROBES):
        problems.append("`allow` is unconditional: every probe that must be denied was allowed")
    return problems, warnings
