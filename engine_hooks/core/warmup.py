"""Warming the decision path: one synthetic decision at start and after each policy reload.

The first governed decision after start-up paid every lazy initialisation of the path at once
(imports done on first use, the PII scanner's models, the tokenizer, the policy engine's first
evaluation, the first Ed25519 signature and verification, the provider's first query) and came
in past ``SEMGOV_DECISION_TIMEOUT_MS``: audited, never acted on. :func:`warm_decision_path` runs
the whole path once on a synthetic, clearly labelled input where real decisions run (the decision
thread, or the decision process), queued by the governor as a :class:`Warm` job in order with the
other jobs, so the server never waits for it at start (a decision queued meanwhile waits behind
it, as it would have waited for the same initialisation).

What it runs, in the order a real donor and recipient do: the donor's build (detokenized text when
the hook has a detokenizer, its preparation and PII scan, its signed provenance and the
provenance's verification), the provider's ``add`` / ``query`` / ``remove`` under a scope of its
own, and the live (and shadow) policy's evaluation and signing of one decision.

NOTE: invariants:
- Nothing it makes is kept or acted on: the decisions are not appended to the audit log (the
  hook's evaluators have no sink), the donor never enters the donor registry, and the provider's
  synthetic entry lives under a random scope no request can have (real scopes are keyed
  digests), removed before the job returns; no capture, no metrics of decisions.
- It never raises: a failure is returned (logged and counted by the governor), and the server
  serves as it would have without it.
"""

from __future__ import annotations

import secrets
import time
from array import array
from dataclasses import dataclass
from datetime import UTC, datetime

from engine_hooks.core.donors import Detokenize, DonorSpec, build_donor_entry
from engine_hooks.core.policies import HookPolicies, build_request
from engine_hooks.core.settings import HookSettings
from semgov.context import RequestContext
from semgov.log import bound, describe_error
from semgov.signing.keys import SigningKey
from semgov.typing import CandidateProvider

WARMUP_TENANT = "semgov-warmup"  # the synthetic input's tenant and id prefix: never a real request's
_TOKENS = 512  # long enough for span finding and a k-gram index, short enough to cost little
ENGINE_WAIT_S = 30.0  # how long the warm-up waits for an engine call that outlived the decision timeout


@dataclass(frozen=True, slots=True)
class Warm:
    """A job: warm the decision path (``reason``: ``start`` or ``reload``)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Warmed:
    """What a warm-up took (seconds) and why it failed (None: it did not)."""

    reason: str
    seconds: float
    error: str | None


def synthetic_tokens(n: int = _TOKENS) -> tuple[array[int], array[int]]:
    """A donor prompt and a recipient that shares its first 3/4 (small ids: any vocabulary has them)."""
    donor = array("q", (100 + (i * 7) % 251 for i in range(n)))
    head = (3 * n) // 4
    recipient = array("q", donor[:head])
    recipient.extend(100 + (i * 11) % 241 for i in range(n - head))
    return donor, recipient


def warm_decision_path(
    policies: HookPolicies,
    provider: CandidateProvider,
    *,
    settings: HookSettings,
    signing_key: SigningKey,
    detokenize: Detokenize | None,
    reason: str,
) -> Warmed:
    """Run the decision path once on a synthetic input (see the module docstring); never raises."""
    t0 = time.perf_counter()
    try:
        # NOTE: inside ``bound`` as every real decision is: its first use imports structlog (the
        # largest first-decision cost measured in the decision process, benchmarks/first_decision.py)
        with bound(request_id=f"{WARMUP_TENANT}-{reason}", tenant=WARMUP_TENANT, namespace="warmup"):
            _run(policies, provider, settings, signing_key, detokenize)
    except Exception as e:  # noqa: BLE001 - a warm-up failure never stops the server
        return Warmed(reason, time.perf_counter() - t0, describe_error(e))
    return Warmed(reason, time.perf_counter() - t0, None)


def _run(
    policies: HookPolicies,
    provider: CandidateProvider,
    settings: HookSettings,
    signing_key: SigningKey,
    detokenize: Detokenize | None,
) -> None:
    now = datetime.now(UTC)
    tag = f"{WARMUP_TENANT}-{secrets.token_hex(6)}"
    task = {"id": WARMUP_TENANT, "version": "0"}
    n = _TOKENS
    contract = {"id": WARMUP_TENANT, "schema_sha256": "0" * 64}
    # NOTE: segmented as a real request's context is (system, evidence, question): the segment
    # facts run too
    segs = (("system", 0, n // 4), ("evidence", n // 4, (3 * n) // 4), ("question", (3 * n) // 4, n))
    ctx = RequestContext(WARMUP_TENANT, "warmup", task, contract, segs, None)
    scope = f"{WARMUP_TENANT}:{secrets.token_hex(16)}"  # NOTE: no real scope looks like this
    donor_tokens, recipient_tokens = synthetic_tokens()
    live = policies.live  # NOTE: read once, as a registration does
    spec = DonorSpec(f"{tag}-donor", ctx, "", None, donor_tokens, None)
    entry = build_donor_entry(
        spec,
        scope,
        evaluator=live.evaluator,
        detokenize=detokenize,
        signing_key=signing_key,
        policy_version=live.version,
        ttl_s=settings.donor_ttl_s,
        now=now,
    )
    provider.add(entry.donor_id, scope, entry.token_ids, entry.prompt.text)
    try:
        found = provider.query(scope, recipient_tokens, None, limit=settings.max_candidates)
    finally:
        provider.remove(entry.donor_id)
    sim = next((float(m.similarity) for m in found if m.donor_id == entry.donor_id), 1.0)
    req = build_request(now, f"{tag}-recipient", ctx, recipient_tokens, None, [(entry, sim)])
    evaluators = [live.evaluator, *([policies.shadow.evaluator] if policies.shadow is not None else [])]
    for ev in evaluators:
        ev.evaluate(req, now=now)  # NOTE: signed, never appended: the hook's evaluators have no sink
        # NOTE: an engine call past the decision timeout keeps running; the warm-up waits for it, so
        # the first real decision finds the engine free and warm (or, if stuck, denies "still busy")
        if not ev.wait_for_engine(ENGINE_WAIT_S):
            raise TimeoutError(f"the policy engine's warm-up call is still running after {ENGINE_WAIT_S:g} s")


__all__ = ["WARMUP_TENANT", "Warm", "Warmed", "synthetic_tokens", "warm_decision_path"]
