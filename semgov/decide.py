"""The data path: captured request -> facts -> policy input -> decision -> signed record -> sink.

:class:`Evaluator` is the one entry point that ``semgov check``, ``semgov bench``
and the engine hook share. It never raises for bad candidate data: any error
becomes a gate ``error`` and a signed ``deny``.
"""

from __future__ import annotations

import concurrent.futures
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

from semgov._internal.deadline import Clock, Deadline, DeadlineExceeded
from semgov.facts.compute import FactContext, PreparedPrompt, compute_facts, verify_ahead
from semgov.facts.pii import PiiScanner
from semgov.intake.capture import MalformedLine
from semgov.intake.limits import LimitError, Limits, resolve
from semgov.log import get_logger
from semgov.policy.checks import checked_result, engine_failure
from semgov.policy.engine import ApprovedSpan, EngineResult, PolicyEngine, PolicySource
from semgov.policy.source import make_engine
from semgov.signing.keys import Keyring, SigningKey
from semgov.signing.records import sign_record_canonical
from semgov.typing import DecisionSink, SignedDecision
from semgov.wire.models import DECISION_SCHEMA, Candidate, CapturedRequest, Prompt, Provenance
from semgov.wire.policy_input import PolicyInput
from semgov.wire.timefmt import rfc3339

__all__ = ["Evaluator", "SignedDecision", "refused_input"]  # NOTE: SignedDecision is in semgov.typing

# The detail of every gate of a deny the evaluator makes for its input, not by deciding: a request
# over the input limits, a malformed request line.
OVER_LIMIT = "input limit exceeded: "
MALFORMED = "malformed request ("


def refused_input(record: dict[str, object]) -> bool:
    """Whether a decision record is a deny for its input (over the limits, malformed), not a decision."""
    gates = record.get("gates")
    return (
        isinstance(gates, list)
        and bool(gates)
        and all(
            isinstance(g, dict)
            and g.get("result") == "error"
            and str(g.get("detail", "")).startswith((OVER_LIMIT, MALFORMED))
            for g in gates
        )
    )


def _over_limit(reason: str) -> EngineResult:
    """A refused input: every gate ``error``, naming the limit (nothing was computed or decided)."""
    return engine_failure(f"{OVER_LIMIT}{reason}")


def _late(timeout: float) -> EngineResult:
    """A candidate whose facts were not computed within the decision timeout: every gate ``error``."""
    return engine_failure(f"fact computation exceeded {timeout:g} s (the decision timeout); not decided")


class Evaluator:
    """Decides every donor candidate of a captured request and signs each decision.

    ``limits`` (default: :meth:`Limits.from_env`) bounds each request before any fact is
    computed: more than ``max_candidates`` candidates, or a recipient prompt over
    ``max_prompt_tokens`` / ``max_text_chars``, denies every candidate; a donor prompt over them
    denies that candidate. The deny's gates are all ``error``, naming the limit.

    ``engine_timeout`` (seconds) is the decision timeout: each :meth:`evaluate` call gets one
    deadline, that long after it starts (read on ``monotonic``, default ``time.monotonic``), and both
    fact computation (checked between candidates and inside the span search) and the policy engine
    (which gets what is left) must finish by it. A candidate whose facts are not ready by then is a
    signed deny with every gate ``error`` ("fact computation exceeded ... s").

    ``sink`` (a :class:`~semgov.typing.DecisionSink`, e.g. ``AuditSink(audit_log)``) receives every
    signed decision :meth:`evaluate` and :meth:`deny_malformed` return, in order, before they
    return: the one place the data path ends in an audit log.
    """

    def __init__(
        self,
        policy: PolicySource,
        keyring: Keyring,
        signing_key: SigningKey,
        *,
        pii_scanner: PiiScanner | None = None,
        engine: PolicyEngine | None = None,
        limits: Limits | None = None,
        engine_timeout: float | None = None,
        monotonic: Clock = time.monotonic,
        sink: DecisionSink | None = None,
    ) -> None:
        self.sink = sink
        if engine_timeout is not None and not engine_timeout > 0:
            raise ValueError(f"engine_timeout must be positive, not {engine_timeout}")
        self.engine_timeout = engine_timeout
        self.monotonic = monotonic
        self._engine_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._engine_busy: concurrent.futures.Future[Any] | None = None
        self.policy = policy
        self.limits = resolve(limits)
        self.engine: PolicyEngine = engine if engine is not None else make_engine(policy)
        self.signing_key = signing_key
        self.ctx = FactContext(keyring, pii_scanner if pii_scanner is not None else PiiScanner())
        self._policy_ref = {
            "name": policy.name,
            "version": policy.version,
            "revision": policy.revision,
            "engine": self.engine.name,
        }

    def policy_inputs(self, req: CapturedRequest, now: datetime | None = None) -> list[PolicyInput]:
        """The policy input document for each candidate (what every engine sees).

        Raises :class:`LimitError` when the request or a candidate is over :attr:`limits`
        (:meth:`evaluate` denies those instead).
        """
        problem = self.limits.request_problem(req) or next(
            (p for c in req.candidates if (p := self.limits.candidate_problem(c)) is not None), None
        )
        if problem is not None:
            raise LimitError(problem, source=f"request {req.request_id}")
        clock = now if now is not None else req.received_at
        recipient = PreparedPrompt.of(req.prompt)
        return [
            compute_facts(req, recipient, c, config=self.policy.fact_config, ctx=self.ctx, now=clock)
            for c in req.candidates
        ]

    def register_donor(self, prompt: Prompt) -> frozenset[str] | None:
        """Compute a donor's per-donor facts ahead of any decision: prepared tokens, hashes, k-gram
        index, PII scan.

        An engine calls this when a finished request becomes a donor, off any recipient's
        path, so that later decisions find the scan cached (it is keyed by token and text
        hash). Returns the forbidden entity types found, or None when there is nothing to scan
        or the scan failed (a decision then scans again and fails closed if it fails again).
        Once the donor's provenance is signed, :meth:`register_provenance` verifies it ahead too.
        """
        cfg = self.policy.fact_config
        scanner = self.ctx.pii_scanner
        if self.limits.prompt_problem(prompt, "donor prompt") is not None:
            return None  # NOTE: a decision denies this donor without scanning it
        try:
            # its tokens, segment table, hashes and k-gram index, prepared once here
            self.ctx.donors.get(prompt).kgram_index(cfg.min_span_tokens)
        except Exception as e:  # noqa: BLE001 - best effort: the decision path fails closed
            get_logger().warning("donor preparation failed", error=f"{type(e).__name__}: {e}")
            return None
        if not cfg.scan_donor_text or prompt.text is None or scanner is None:
            return None
        try:
            return scanner.scan(
                prompt.text,
                donor_token_hash=self.ctx.donors.get(prompt).token_sha256,
                min_score=cfg.pii_min_score,
                phone_regions=cfg.phone_regions,
                entities=cfg.pii_entities,
            )
        except Exception as e:  # noqa: BLE001 - best effort: the decision path fails closed
            get_logger().warning("donor registration scan failed", error=f"{type(e).__name__}: {e}")
            return None

    def register_provenance(self, provenance: Provenance | dict[str, Any]) -> bool:
        """Verify a donor's signed provenance ahead of any decision (cached exactly as a decision
        caches it), so that the donor's first decision does not pay the Ed25519 verification.
        Returns whether it verified; never raises (a malformed envelope is False: decisions deny it)."""
        try:
            prov = provenance if isinstance(provenance, Provenance) else Provenance.model_validate(provenance)
            return verify_ahead(prov, self.ctx)
        except Exception as e:  # noqa: BLE001 - best effort: the decision path fails closed
            get_logger().warning("provenance pre-verification failed", error=f"{type(e).__name__}: {e}")
            return False

    def _call_engine(self, fn: Callable[[Any], Any], arg: Any, deadline: Deadline | None = None) -> Any:
        """``fn(arg)``, within ``engine_timeout`` when one is set (the engine then runs on a worker thread),
        and by ``deadline`` when one is given (the engine is not called at all once it has passed).

        NOTE: a call that times out keeps running (a thread cannot be killed); until it returns,
        every later call fails at once instead of queueing behind it: deny, never wait.
        """
        if self.engine_timeout is None:
            return fn(arg)
        if self._engine_busy is not None and not self._engine_busy.done():
            raise TimeoutError("the policy engine is still busy with an earlier call that timed out")
        timeout = self.engine_timeout if deadline is None else min(self.engine_timeout, deadline.remaining())
        if timeout <= 0:
            raise TimeoutError(f"no time left within {self.engine_timeout:g} s: fact computation used it all")
        if self._engine_pool is None:
            self._engine_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="semgov-engine")
        fut = self._engine_pool.submit(fn, arg)
        self._engine_busy = fut
        try:
            return fut.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            within = f"{self.engine_timeout:g} s"
            if timeout != self.engine_timeout:
                within += " (the decision timeout, fact computation included)"
            raise TimeoutError(f"no answer within {within}") from None

    def wait_for_engine(self, timeout: float) -> bool:
        """Wait, at most ``timeout`` seconds, until an engine call that timed out has returned;
        whether the engine is free now.

        NOTE: for the warm-up, which runs where decisions run and in order with them: a warm-up
        whose engine call outlived the decision timeout (a cold engine's first evaluation, on a
        loaded machine) must not leave the engine busy, which would deny the first real decisions
        "still busy" without asking it."""
        busy = self._engine_busy
        if busy is None or busy.done():
            return True
        concurrent.futures.wait([busy], timeout=max(0.0, timeout))
        return busy.done()

    def decide(self, doc: PolicyInput, deadline: Deadline | None = None) -> EngineResult:
        """Run the engine over one document, failing closed on any engine error or timeout."""
        try:
            result: EngineResult | Exception = self._call_engine(self.engine.evaluate, doc, deadline)
        except Exception as e:  # noqa: BLE001 - fail closed
            result = e
        return self._settle(result, doc)

    def decide_all(self, docs: list[PolicyInput], deadline: Deadline | None = None) -> list[EngineResult]:
        """:meth:`decide` for each document; one engine call when the engine has ``evaluate_many``."""
        many = getattr(self.engine, "evaluate_many", None)
        if many is None:
            return [self.decide(doc, deadline) for doc in docs]
        try:
            results: list[EngineResult | Exception] = list(self._call_engine(many, docs, deadline))
            if len(results) != len(docs):
                raise ValueError(f"evaluate_many gave {len(results)} results for {len(docs)} documents")
        except Exception as e:  # noqa: BLE001 - fail closed
            results = [e] * len(docs)
        return [self._settle(r, doc) for r, doc in zip(results, docs, strict=True)]

    def _settle(self, result: EngineResult | Exception, doc: PolicyInput) -> EngineResult:
        """The checked result; an exception, or a result failing the checks, denies with every gate error."""
        try:
            if isinstance(result, Exception):
                raise result
            return checked_result(result, doc)
        except Exception as e:  # noqa: BLE001 - fail closed
            return engine_failure(f"policy engine {self.engine.name} failed: {type(e).__name__}: {e}")

    def evaluate(self, req: CapturedRequest, now: datetime | None = None) -> list[SignedDecision]:
        """Decide and sign every candidate. ``now`` defaults to the request's ``received_at``.

        Limits are checked first (see the class): what is over them is denied, never computed.
        With ``engine_timeout``, facts and engine share one deadline (see the class).
        """
        deadline = (
            None if self.engine_timeout is None else Deadline.after(self.engine_timeout, self.monotonic)
        )
        clock = now if now is not None else req.received_at
        refused = self.limits.request_problem(req)
        if refused is not None:
            return self._emit([self._refuse(req, c.donor_id, refused, clock) for c in req.candidates])
        recipient = PreparedPrompt.of(req.prompt)
        out: list[SignedDecision | None] = []
        docs: list[PolicyInput] = []
        for c in req.candidates:
            problem = self.limits.candidate_problem(c)
            if problem is not None:
                out.append(self._refuse(req, c.donor_id, problem, clock))
                continue
            doc = self._facts(req, recipient, c, clock, deadline)
            if doc is None:
                out.append(self._sign_result(req, c.donor_id, _late(self.engine_timeout or 0.0), clock))
                continue
            out.append(None)
            docs.append(doc)
        results = self.decide_all(docs, deadline)
        decided = iter([self._record(req, doc, r) for doc, r in zip(docs, results, strict=True)])
        return self._emit([d if d is not None else next(decided) for d in out])

    def _facts(
        self,
        req: CapturedRequest,
        recipient: PreparedPrompt,
        cand: Candidate,
        now: datetime,
        deadline: Deadline | None,
    ) -> PolicyInput | None:
        """The candidate's policy input, or None when the deadline passed before or while computing it.

        NOTE: past the deadline nothing is computed; a span search that runs past it stops at its
        next check (compute_facts records that as a token error), and the clock, read again here,
        turns the whole candidate into a deny. Nothing raises out of here for a deadline.
        """
        if deadline is not None and deadline.passed():
            return None
        try:
            doc = compute_facts(
                req, recipient, cand, config=self.policy.fact_config, ctx=self.ctx, now=now, deadline=deadline
            )
        except DeadlineExceeded:
            return None
        return None if deadline is not None and deadline.passed() else doc

    def _refuse(self, req: CapturedRequest, donor_id: str, reason: str, now: datetime) -> SignedDecision:
        return self._sign_result(req, donor_id, _over_limit(reason), now)

    def _sign_result(
        self, req: CapturedRequest, donor_id: str, result: EngineResult, now: datetime
    ) -> SignedDecision:
        return self._sign(
            req.request_id,
            req.tenant,
            req.namespace,
            donor_id,
            result,
            recipient_tokens=len(req.prompt.token_ids),
            evaluated_at=rfc3339(now),
        )

    def deny_malformed(self, bad: MalformedLine, now: datetime) -> list[SignedDecision]:
        """Signed denies for the donors a malformed request line asked about (if any are known)."""
        if bad.request_id is None:
            return []
        result = engine_failure(f"{MALFORMED}line {bad.line}): {bad.reason}")
        return self._emit(
            [
                self._sign(
                    bad.request_id,
                    bad.tenant,
                    bad.namespace,
                    donor,
                    result,
                    recipient_tokens=0,
                    evaluated_at=rfc3339(now),
                )
                for donor in bad.donor_ids
            ]
        )

    def _emit(self, decisions: list[SignedDecision]) -> list[SignedDecision]:
        """Hand each signed decision to the sink, in order (the data path's last step)."""
        if self.sink is not None:
            for d in decisions:
                self.sink.put(d)
        return decisions

    def _record(self, req: CapturedRequest, doc: PolicyInput, result: EngineResult) -> SignedDecision:
        return self._sign(
            req.request_id,
            req.tenant,
            req.namespace,
            doc.candidate.donor_id,
            result,
            recipient_tokens=doc.request.prompt_tokens,
            evaluated_at=doc.now,  # NOTE: rfc3339 of the same clock, formatted once for the document
            donor_scope=donor_scope(doc, result),
        )

    def _sign(
        self,
        request_id: str,
        tenant: str,
        namespace: str,
        donor_id: str,
        result: EngineResult,
        *,
        recipient_tokens: int,
        evaluated_at: str,
        donor_scope: tuple[str, str] | None = None,
    ) -> SignedDecision:
        allow = all(g.result == "pass" for g in result.gates) and bool(result.approved_spans)
        spans: list[ApprovedSpan] = result.approved_spans if allow else []
        crossed = crossed_boundaries((tenant, namespace), donor_scope, result) if allow else []
        unsigned = {
            "schema": DECISION_SCHEMA,
            "decision_id": uuid.uuid4().hex,
            "request_id": request_id,
            "tenant": tenant,
            "namespace": namespace,
            "donor_id": donor_id,
            "donor_tenant": donor_scope[0] if donor_scope is not None else None,
            "donor_namespace": donor_scope[1] if donor_scope is not None else None,
            "decision": "allow" if allow else "deny",
            "gates": [{"gate": g.gate, "result": g.result, "detail": g.detail} for g in result.gates],
            "approved_spans": [
                {
                    "recipient_start": s.recipient_start,
                    "donor_start": s.donor_start,
                    "length": s.length,
                    "kind": s.kind,
                    "recompute": s.recompute,
                }
                for s in spans
            ],
            "approved_tokens": sum(s.length for s in spans),
            "recipient_tokens": recipient_tokens,
            "cross_boundary": crossed,
            "policy": self._policy_ref,
            "evaluated_at": evaluated_at,
        }
        return SignedDecision(*sign_record_canonical(unsigned, self.signing_key))


def donor_scope(doc: PolicyInput, result: EngineResult) -> tuple[str, str] | None:
    """The donor's (tenant, namespace) as its provenance states them, only when the provenance gate
    passed (a trusted key's valid signature over a payload naming this donor): an unverified claim
    is never recorded as the donor's scope."""
    donor = doc.facts.donor
    verified = any(g.gate == "provenance" and g.result == "pass" for g in result.gates)
    return (donor.tenant, donor.namespace) if donor is not None and verified else None


def crossed_boundaries(
    recipient: tuple[str, str], donor: tuple[str, str] | None, result: EngineResult
) -> list[dict[str, str]]:
    """For an allow: each boundary the donor's scope differs from the recipient's in, with the rule
    that allowed it (the passing gate's detail, e.g. ``shared by namespace.sharing[0]``)."""
    if donor is None:
        return []
    detail: dict[str, str] = {g.gate: g.detail for g in result.gates}
    return [
        {"boundary": b, "rule": detail.get(b, "")}
        for b, mine, theirs in (("tenant", recipient[0], donor[0]), ("namespace", recipient[1], donor[1]))
        if mine != theirs
    ]
