"""The native engine: a declarative YAML policy decided over the policy input document.

Each gate is a small pure function of ``(policy, doc)`` returning ``(passed, detail)``.
All gates run for every candidate. A gate that raises, or whose facts could not
be computed, reports ``error``: the decision is then ``deny`` (fail closed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from semgov.policy.engine import ApprovedSpan, EngineResult, GateOutcome, fact_error
from semgov.policy.rules import namespace_matches
from semgov.policy.yaml.model import Policy, QualityPlan
from semgov.wire.models import GATES, GateName
from semgov.wire.policy_input import DonorFacts, PolicyInput, SpanFacts

Outcome = tuple[bool, str]
_NO_DONOR = "no valid provenance payload, so the donor's claims are unknown"


def _donor(doc: PolicyInput) -> DonorFacts:
    if doc.facts.donor is None:
        raise _Unknown(_NO_DONOR)
    return doc.facts.donor


class _Unknown(Exception):
    """A gate cannot tell: the fact it needs is absent (this fails, not errors)."""


def gate_tenant(p: Policy, doc: PolicyInput) -> Outcome:
    d = _donor(doc)
    if d.tenant == doc.request.tenant:
        return True, "same tenant"
    if d.visibility == "public":
        if p.tenant.allow_public_donors:
            return True, "public donor from another tenant, allowed by policy"
        r = doc.request
        for i, scope in enumerate(p.tenant.public_donors_for):
            if scope.matches(r.tenant, r.namespace, r.task.id, r.task.version):
                return True, f"public donor from another tenant, allowed by tenant.public_donors_for[{i}]"
        return False, "public donor from another tenant; policy does not allow public donors"
    return False, "donor belongs to another tenant"


def gate_namespace(p: Policy, doc: PolicyInput) -> Outcome:
    d = _donor(doc)
    ns = doc.request.namespace
    if d.namespace == ns:
        return True, "same namespace"
    r = doc.request
    for i, rule in enumerate(p.namespace.sharing):
        if (
            namespace_matches(rule.donor, d.namespace)
            and any(namespace_matches(pat, ns) for pat in rule.recipients)
            and (rule.scope is None or rule.scope.matches(r.tenant, ns, r.task.id, r.task.version))
        ):
            return True, f"shared by namespace.sharing[{i}]"
    return False, f"donor namespace {d.namespace!r} differs and no sharing rule covers {ns!r}"


def gate_provenance(p: Policy, doc: PolicyInput) -> Outcome:
    f = doc.facts.provenance
    if f is None:
        raise RuntimeError("provenance facts missing")
    kid = doc.candidate.key_id
    problems = []
    if f.key_status == "unknown":
        problems.append(f"key {kid!r} is not in the keyring")
    elif f.key_status == "revoked":
        problems.append(f"key {kid!r} is revoked")
    elif not f.signature_valid:
        problems.append("signature does not verify")
    if not f.payload_valid:
        problems.append(f"payload invalid ({f.payload_error})")
    else:
        if not f.donor_id_matches:
            problems.append("payload donor_id differs from the candidate's")
        if not f.token_hash_matches:
            problems.append("payload token hash differs from the donor's tokens")
        if not f.segments_hash_matches:
            problems.append("payload segments hash differs from the donor's segments")
        if not f.text_hash_matches:
            problems.append("the donor's text is not the text signed (payload text_sha256)")
    if problems:
        return False, "; ".join(problems)
    return True, f"signed by trusted key {kid!r}; donor id, token, segment and text hashes match"


def gate_expiry(p: Policy, doc: PolicyInput) -> Outcome:
    d = _donor(doc)
    now = doc.now_ns  # NOTE: exact integers, so every engine compares alike
    if now < d.created_at_ns:
        return False, f"donor created in the future ({d.created_at} > now {doc.now})"
    if now >= d.expires_at_ns:
        return False, f"donor expired at {d.expires_at} (now {doc.now})"
    max_age = p.expiry.max_age_seconds
    if max_age is not None and now - d.created_at_ns >= max_age * 1_000_000_000:
        return False, f"donor older than policy max age of {max_age}s"
    return True, f"valid until {d.expires_at}"


def gate_policy_version(p: Policy, doc: PolicyInput) -> Outcome:
    v = _donor(doc).policy_version
    if v in p.accepted_versions:
        return True, f"{v!r} accepted"
    return False, f"donor produced under {v!r}; accepted: {sorted(p.accepted_versions)}"


def gate_pii(p: Policy, doc: PolicyInput) -> Outcome:
    f = doc.facts.pii
    if f is None:
        raise RuntimeError("PII facts missing")
    found = set(f.provenance_entities) | set(f.text_entities)
    bad = sorted(found & set(p.pii.forbidden_entities))
    if bad:
        return False, f"donor carries forbidden PII: {', '.join(bad)}"
    if p.pii.require_scan and not (f.provenance_scanned or f.text_scanned):
        return False, "donor was never scanned for PII (provenance unscanned, no text to scan)"
    how = [w for w, ok in (("provenance", f.provenance_scanned), ("text", f.text_scanned)) if ok]
    return True, f"no forbidden PII (scanned: {', '.join(how) or 'none'})"


def gate_task(p: Policy, doc: PolicyInput) -> Outcome:
    d = _donor(doc)
    # NOTE: tasks compare as (id, version) pairs, never joined: {id: "qa", version: "1@2"} and
    # {id: "qa@1", version: "2"} are different tasks.
    mine = (doc.request.task.id, doc.request.task.version)
    theirs = (d.task.id, d.task.version)
    if mine == theirs:
        return True, f"same task {_task(mine)}"
    if theirs in p.compatible_tasks.get(mine, frozenset()):
        return True, f"task {_task(theirs)} compatible with {_task(mine)}"
    return False, f"donor task {_task(theirs)} differs from {_task(mine)}"


def _task(t: tuple[str, str]) -> str:
    """A task for a message: ``id@version``, or id and version quoted apart if either holds an ``@``."""
    if "@" in t[0] or "@" in t[1]:
        return f"{{id: {t[0]!r}, version: {t[1]!r}}}"
    return f"{t[0]}@{t[1]}"


def gate_response_contract(p: Policy, doc: PolicyInput) -> Outcome:
    d = _donor(doc)
    want = doc.request.response_contract
    got = d.response_contract
    if got.id != want.id:
        return False, f"donor contract {got.id!r} differs from {want.id!r}"
    if got.schema_sha256 != want.schema_sha256:
        return False, f"contract {want.id!r} schema hash differs"
    return True, f"same contract {want.id!r}"


def gate_similarity(p: Policy, doc: PolicyInput) -> Outcome:
    s = doc.candidate.similarity
    if s >= p.similarity.min:
        return True, f"similarity {s:.4g} >= {p.similarity.min:.4g}"
    return False, f"similarity {s:.4g} < {p.similarity.min:.4g}"


def _plan(p: Policy, doc: PolicyInput) -> QualityPlan:
    return p.quality_plan(doc.request.task.id, doc.request.response_contract.id)


def approved_spans(p: Policy, doc: PolicyInput) -> list[SpanFacts]:
    """Prefix spans always; shifted ones if allowed (for this request's task and contract), long
    enough, in reusable roles on both sides."""
    t = doc.facts.tokens
    if t is None:
        raise RuntimeError("token facts missing")
    tv = p.token_verification
    roles = set(tv.reusable_roles)
    shifted_ok = _plan(p, doc).allow_shifted
    return [
        s
        for s in t.spans
        if s.kind == "prefix"
        or (
            shifted_ok
            and s.length >= tv.min_span_tokens
            and s.recipient_role in roles
            and s.donor_role in roles
        )
    ]


def gate_token_verification(p: Policy, doc: PolicyInput) -> Outcome:
    spans = approved_spans(p, doc)
    t = doc.facts.tokens
    assert t is not None
    n = sum(s.length for s in spans)
    total = t.recipient_length
    frac = n / total if total else 0.0
    tv = p.token_verification
    summary = f"{n}/{total} tokens approved in {len(spans)} spans ({frac:.1%})"
    rule = _plan(p, doc).rule
    if rule is not None:
        summary += f" under quality rule {rule}"
    if n == 0:
        return False, "no verified tokens to reuse"
    if n < tv.min_approved_tokens:
        return False, f"{summary}; need >= {tv.min_approved_tokens} tokens"
    if frac < tv.min_approved_fraction:
        return False, f"{summary}; need >= {tv.min_approved_fraction:.1%}"
    return True, summary


GATE_FUNCS: dict[GateName, Callable[[Policy, PolicyInput], Outcome]] = {
    "tenant": gate_tenant,
    "namespace": gate_namespace,
    "provenance": gate_provenance,
    "expiry": gate_expiry,
    "policy_version": gate_policy_version,
    "pii": gate_pii,
    "task": gate_task,
    "response_contract": gate_response_contract,
    "similarity": gate_similarity,
    "token_verification": gate_token_verification,
}
assert tuple(GATE_FUNCS) == GATES


class YamlEngine:
    """Evaluates a loaded :class:`Policy`."""

    name = "yaml"

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def evaluate(self, doc: PolicyInput) -> EngineResult:
        results: list[GateOutcome] = []
        for gate, fn in GATE_FUNCS.items():
            # NOTE: every gate runs for every candidate, whatever earlier gates said.
            err = fact_error(gate, doc)
            if err is not None:
                results.append(GateOutcome(gate=gate, result="error", detail=err))
                continue
            res: Literal["pass", "fail", "error"]
            try:
                ok, detail = fn(self.policy, doc)
                res = "pass" if ok else "fail"
            except _Unknown as e:
                res, detail = "fail", str(e)
            except Exception as e:  # noqa: BLE001 - fail closed
                res, detail = "error", f"{type(e).__name__}: {e}"
            results.append(GateOutcome(gate=gate, result=res, detail=detail))
        spans: list[ApprovedSpan] = []
        if all(r.result == "pass" for r in results):
            plan = _plan(self.policy, doc)
            for s in approved_spans(self.policy, doc):
                head, tail = plan.recompute(s.kind, s.length), plan.tail(s.kind, s.length)
                if tail and head + tail >= s.length:
                    continue  # NOTE: a tail that leaves nothing to copy: the span is not approved
                spans.append(
                    ApprovedSpan(
                        recipient_start=s.recipient_start,
                        donor_start=s.donor_start,
                        length=s.length - tail,
                        kind=s.kind,
                        recompute=head,
                    )
                )
        return EngineResult(results, spans)
