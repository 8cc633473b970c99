"""The semgov side of the hook, with no SGLang import: :class:`Governor`, its composition root.

:class:`Governor` is the thin adapter between an engine and semgov's core data path
(``captured request -> facts -> policy input -> decision -> signed record -> audit log``). It
loads the hook's policy, keys and provider, builds the parts below, and is what the cache calls:

- a request's context comes from a gateway-signed token (:mod:`semgov.context`,
  verified with this deployment's one key set: :meth:`Governor.context_of`,
  :mod:`engine_hooks.core.tokens`);
- a finished request becomes a donor through :meth:`Governor.submit_donor`: its PII scan and the
  signing of its provenance run off the scheduler (in the decision process, or on the
  registration thread without it), and the scheduler sees the donor when it next calls
  :meth:`Governor.drain_donors` (:mod:`engine_hooks.core.donors`);
- :meth:`Governor.decide_later` queues a recipient's candidate search and decision for the
  decision thread and returns a :class:`~engine_hooks.core.decisions.PendingDecision` the
  scheduler thread polls, never waits on; with the decision process
  (:mod:`engine_hooks.core.decider`, the default) that thread only forwards jobs to it and a
  reader thread audits the decisions it answers with (:mod:`engine_hooks.core.decisions`);
- :meth:`Governor.event` only queues a plain engine event: it is built and signed off the
  scheduler thread, in order after the decisions queued before it, and every decision record and
  engine event is appended to the audit log, which only queues it
  (:mod:`engine_hooks.core.events`);
- :meth:`Governor.not_realized` is how both engines say why an allow was not acted on (a reason
  code, :mod:`engine_hooks.core.unrealized`); a decision its adapter abandoned (late, aborted)
  is reported here when it finishes with allows (:meth:`Governor.decided`);
- the decision path is warmed at start and after each reload that loaded a policy
  (:mod:`engine_hooks.core.warmup`, ``SEMGOV_WARMUP``), where decisions are made, never waited for.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from engine_hooks.core.bundles import BundleWatcher
from engine_hooks.core.decider import DecisionProcess
from engine_hooks.core.decisions import (
    DecisionThread,
    LocalDecisions,
    PendingDecision,
    Register,
    Reload,
    RemoteDecisions,
)
from engine_hooks.core.donors import (
    Clock,
    DonorBuilder,
    DonorRegistry,
    DonorSpec,
    LiveDonor,
    load_detokenizer,
)
from engine_hooks.core.events import AuditTrail, EventJob, open_audit_log
from engine_hooks.core.metrics import BacklogSampler, hook_metrics
from engine_hooks.core.policies import HookPolicies, ReloadOutcome, load_own_key, open_capture
from engine_hooks.core.providers import load_provider
from engine_hooks.core.reload import ReloadWatcher, install_sighup
from engine_hooks.core.settings import HookConfigError, HookSettings
from engine_hooks.core.tokens import Verdict, load_context_keys, verify_context
from engine_hooks.core.unrealized import Reason, abandoned_allows, detail_of
from engine_hooks.core.warmup import Warm, Warmed, warm_decision_path
from semgov.context import RequestContext
from semgov.decide import Evaluator
from semgov.log import describe_error, get_logger
from semgov.policy.engine import PolicySource
from semgov.signing.keys import SigningKey
from semgov.typing import CandidateProvider, SignedDecision


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _provider_here(
    settings: HookSettings, provider: CandidateProvider | None, remote: bool
) -> CandidateProvider | None:
    """The candidate provider of this process (None with the decision process)."""
    if remote and provider is not None:
        raise HookConfigError(
            "a provider object cannot cross into the decision process: name it in SEMGOV_PROVIDER, "
            "or set SEMGOV_DECISION_PROCESS=0"
        )
    # NOTE: with the decision process, the provider lives there only (loading it here too would
    # load an embedding model twice and index every donor twice).
    if remote:
        return None
    if provider is not None:
        return provider
    return load_provider(settings.provider, max_donors_per_scope=settings.max_donors_per_scope)


class Governor:
    """Decides reuse for one engine process and audits what it decides and does: a donor registry
    (``donors``), a decision thread (``jobs``) whose jobs run here (``local``) or in the decision
    process (``forwarding``, ``remote``), and an audit trail (``trail``)."""

    def __init__(
        self,
        settings: HookSettings,
        *,
        engine_name: str,
        clock: Clock = _utcnow,
        provider: CandidateProvider | None = None,
        tokenizer_path: str | None = None,
    ) -> None:
        self.settings = settings
        self.engine_name = engine_name
        self.clock = clock
        if settings.log_format is not None:
            from semgov import log

            log.configure(settings.log_format)
        self.signing_key: SigningKey = load_own_key(settings)
        self.context_keys = load_context_keys(settings)
        self.context_key = self.context_keys.current
        remote = settings.async_decisions and settings.decision_process
        # NOTE: with the decision process these are only checked here (a bad policy, shadow policy
        # or capture directory refuses the server at start); the child decides and captures.
        self.metrics = hook_metrics()
        self.policies = HookPolicies(
            settings,
            self.signing_key,
            capture=None if remote else open_capture(settings),
            metrics=self.metrics,
        )
        self.revision = self.policies.live.revision  # the live revision in force (updated on reload)
        self.on_revision: list[Callable[[str], object]] = []  # called with each new live revision
        self.reloads = self.reload_failures = self.shadow_records = self.shadow_disagreements = 0
        self.watcher: ReloadWatcher | None = None
        self.bundles: BundleWatcher | None = None
        if self.policies.bundle is not None:
            self.metrics.bundle(self.policies.bundle.revision)
        self.provider = _provider_here(settings, provider, remote)
        self.detokenize = load_detokenizer(settings.detokenizer, tokenizer_path)
        if self.detokenize is None:
            get_logger().warning(
                "semgov hook has no donor text: donors are registered without a PII scan",
                detokenizer=settings.detokenizer,
            )
        self.audit = open_audit_log(settings, self.signing_key)
        self.trail = AuditTrail(self.audit, settings.audit_dir, engine_name, self.signing_key, self.metrics)
        self.backlog = BacklogSampler(self.metrics, self.audit.backlog)
        self.jobs = DecisionThread(settings.async_decisions)
        self.donors = DonorRegistry(
            settings.max_donors_per_scope,
            self.jobs.submit,
            build=None if remote else self._donor_builder(),
            forward=self._forward_registration if remote else None,
            background=settings.async_registration,
        )
        self.local: LocalDecisions | None = None
        self.forwarding: RemoteDecisions | None = None
        self.remote: DecisionProcess | None = None
        self.warmups: list[Warmed] = []  # every warm-up's outcome, in order (tests, stats)
        self.jobs.start(self._start_process(tokenizer_path) if remote else self._decide_here())
        self.warm("start")

    def _decide_here(self) -> LocalDecisions:
        """The decision thread's jobs run in this process (the provider is here)."""
        assert self.provider is not None
        self.local = LocalDecisions(
            self.settings,
            self.context_key,
            policies=self.policies,
            provider=self.provider,
            donors=self.donors,
            trail=self.trail,
            clock=self._now,
            lifecycle=self,
            warm=self._warm_here,
        )
        return self.local

    def _warm_here(self, reason: str) -> Warmed:
        assert self.provider is not None
        return warm_decision_path(
            self.policies,
            self.provider,
            settings=self.settings,
            signing_key=self.signing_key,
            detokenize=self.detokenize,
            reason=reason,
        )

    def _start_process(self, tokenizer_path: str | None) -> RemoteDecisions:
        """The decision thread's jobs go to the decision process, started here."""
        self.forwarding = RemoteDecisions(
            self.settings, self.context_key, donors=self.donors, trail=self.trail, lifecycle=self
        )
        self.remote = self.forwarding.process = DecisionProcess(
            self.settings,
            tokenizer_path,
            on_message=self.forwarding.on_message,
            on_broken=self.forwarding.failed,
            engine_name=self.engine_name,
        )
        return self.forwarding

    def _now(self) -> datetime:
        return self.clock()  # NOTE: read at each call: whoever holds the governor may replace ``clock``

    def _donor_builder(self) -> DonorBuilder:
        """Donors built in this process (the registration thread, or the caller without one)."""
        return DonorBuilder(
            self.context_key,
            self.policies,
            self.detokenize,
            self.signing_key,
            self.settings.donor_ttl_s,
            self._now,
        )

    # ---- the live policy --------------------------------------------------------------------

    @property
    def policy(self) -> PolicySource:
        """The live policy this process loaded (with the decision process, the one at start)."""
        return self.policies.live.source

    @property
    def evaluator(self) -> Evaluator:
        """The live evaluator of this process (it decides without the decision process)."""
        return self.policies.live.evaluator

    @property
    def policy_version(self) -> str:
        return self.policies.live.version

    def _forward_registration(self, spec: DonorSpec) -> None:
        """A registration for the decision process: queued in order with the other jobs."""
        self.jobs.submit(Register(spec))

    # ---- contexts --------------------------------------------------------------------------

    def context_of(self, extra_key: object, lora_id: object = None) -> RequestContext | None:
        """The verified context in ``extra_key``, bound to the request's server-side ``lora_id``, or
        None (no semantic reuse for that request). Never raises, whatever the client sent."""
        return self.verdict_of(extra_key, lora_id).context

    def verdict_of(self, token: object, lora_id: object = None, *, dedicated: bool = False) -> Verdict:
        """:func:`~engine_hooks.core.tokens.verify_context` with this deployment's one key set."""
        return verify_context(self.context_keys, token, lora_id, dedicated=dedicated)

    # ---- donors ----------------------------------------------------------------------------

    def submit_donor(self, spec: DonorSpec) -> None:
        """Queue a finished request for registration: in the decision process when there is one,
        else on the registration thread (synchronous when async registration is off: then the
        call also waits for the decision process, for tests that step the cache by hand)."""
        self.donors.submit(spec)

    def drain_donors(self) -> int:
        """Scheduler thread: make registered donors visible to the provider. Returns how many."""
        return self.donors.drain()

    def registrations_in_flight(self) -> int:
        """Donors submitted whose registration is not done yet (never waits)."""
        return self.donors.in_flight()

    def wait_registrations(self, timeout: float = 30.0) -> bool:
        """Block until queued registrations are done (tests and shutdown); False on timeout."""
        return self.donors.wait_registrations(timeout)

    def donor(self, donor_id: str) -> LiveDonor | None:
        return self.donors.get(donor_id)

    def drop_donor(self, donor_id: str) -> None:
        """Forget a donor (its KV is gone, or newer donors replaced it)."""
        self.donors.drop(donor_id)

    def has_donors(self, ctx: RequestContext, cache_salt: str | None) -> bool:
        """Scheduler thread: whether the registry holds any donor of this request's scope."""
        return self.donors.has_scope(ctx.scope(self.context_key, cache_salt))

    def release_scope(self, ctx: RequestContext, cache_salt: str | None) -> int:
        """Scheduler thread: a calibration run released this request's scope: its donors are dropped
        (also those still registering), audited as ``calibration_released``; how many."""
        n = self.donors.release_scope(ctx.scope(self.context_key, cache_salt))
        run = ctx.calibration.run if ctx.calibration is not None else "-"
        self.event("calibration_released", detail=f"calibration run {run}: {n} donor(s) dropped")
        return n

    def forget_all_donors(self) -> None:
        """The tree was flushed: no donor's KV is left."""
        self.donors.forget_all()

    def donor_count(self) -> int:
        return self.donors.count()

    # ---- decisions -------------------------------------------------------------------------

    def decide_later(
        self, request_id: str, ctx: RequestContext, cache_salt: str | None, token_ids: Sequence[int]
    ) -> PendingDecision:
        """Queue candidate search and the decision for the decision thread (run at once without
        one); the caller polls ``done``."""
        job = PendingDecision(request_id, ctx, cache_salt, token_ids, None, queued_at=time.monotonic())
        self.jobs.submit(job)
        return job

    def decision_durable(self, decision_id: str, timeout: float) -> bool:
        """Whether an allow decision's record is durable in the audit log (waits up to ``timeout``)."""
        return self.trail.decision_durable(decision_id, timeout)

    # ---- audit -----------------------------------------------------------------------------

    @property
    def audit_broken(self) -> str | None:
        """Why the audit log failed (then semantic reuse is off), or None."""
        return self.trail.broken

    @property
    def audit_failures(self) -> int:
        return self.trail.failures

    def event(
        self,
        kind: str,
        *,
        request_id: str | None = None,
        decision_id: str | None = None,
        donor_id: str | None = None,
        materialized_tokens: int = 0,
        slots: Sequence[int] = (),
        spans: Sequence[dict[str, Any]] = (),
        detail: str = "",
    ) -> None:
        """Queue an engine event; the decision thread builds, signs and appends it (never raises).

        NOTE: only the time is taken here; the event's fields are plain values the caller no longer
        changes (lists of ints, span dicts built for it, strings).
        """
        fields = {
            "request_id": request_id,
            "decision_id": decision_id,
            "donor_id": donor_id,
            "materialized_tokens": materialized_tokens,
            "slots": slots,
            "spans": spans,
            "detail": detail,
        }
        try:
            self.metrics.event(kind, materialized_tokens, detail)  # NOTE: one inc, the only work here
        except Exception as e:  # noqa: BLE001 - metrics never take the scheduler down
            get_logger().warning("semgov metrics failed", error=describe_error(e))
        try:
            job = EventJob(kind, self.clock(), fields)
        except Exception as e:  # noqa: BLE001 - a broken clock must not take the scheduler down
            self.trail.not_audited(kind, describe_error(e), fields)
            return
        self.jobs.submit(job)

    def not_realized(
        self,
        reason: Reason,
        *,
        request_id: str | None,
        decision_id: str | None,
        donor_id: str | None,
        detail: str = "",
    ) -> None:
        """An allow decision the engine does not act on: a ``realization_failed`` event whose detail
        starts with ``reason`` (counted in ``semgov:allows_not_realized_total``). Never raises."""
        self.event(
            "realization_failed",
            request_id=request_id,
            decision_id=decision_id,
            donor_id=donor_id,
            detail=detail_of(reason, detail),
        )

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until everything queued for the decision thread is done (tests, shutdown)."""
        return self.jobs.wait_idle(timeout)

    # ---- the policy lifecycle ----------------------------------------------------------------

    def request_reload(self, reason: str = "requested") -> None:
        """Reload policies and keyring between two decisions (queued; any thread, a signal handler too).

        NOTE: without the decision thread it runs at once on the calling thread (tests only).
        """
        self.jobs.submit(Reload(reason))

    def watch(self, *, sighup: bool = False) -> None:
        """Reload on a change of the policy files or the keyring (every ``SEMGOV_RELOAD_POLL_MS``)
        and, with ``sighup``, on SIGHUP (the server's main thread only). Needs the decision thread."""
        if not self.settings.async_decisions:
            return
        if sighup and install_sighup(self.request_reload):
            get_logger().info("semgov: SIGHUP reloads the policies and the keyring")
        s = self.settings
        if s.reload_poll_ms > 0 and self.watcher is None:
            paths = [s.policy, s.trust, *((s.shadow_policy,) if s.shadow_policy is not None else ())]
            self.watcher = ReloadWatcher(paths, s.reload_poll_ms / 1000, self.request_reload)
        if (
            s.bundle is not None
            and s.bundle_trust is not None
            and s.bundle_work_dir is not None
            and self.bundles is None
        ):
            from semgov.bundle.jws import read_trust

            self.bundles = BundleWatcher(
                s.bundle,
                read_trust(s.bundle_trust),
                s.bundle_work_dir,
                force=s.bundle_force,
                request=self.request_reload,
                refused=self.bundle_refused,
                poll_s=max(s.reload_poll_ms, 100) / 1000,
            )

    def bundle_refused(self, problem: str) -> None:
        """A bundle the watcher refused (any thread): audited as ``policy_load_failed``, naming it."""
        detail = f"live policy not reloaded: {problem}; still deciding with revision {self.revision}"
        self.event("policy_load_failed", detail=detail[:2000])
        self.metrics.reload("live", False)
        self.reload_failures += 1

    def reloaded(self, outcomes: list[ReloadOutcome], reason: str) -> None:
        """A reload's outcomes (the decision thread, or the decision process's reader): each one is
        audited (``policy_loaded`` / ``policy_load_failed``) and logged; a new live revision is
        announced to ``on_revision``."""
        for o in outcomes:
            self.event(o.kind, detail=f"{o.detail} [{reason}]")
            self.metrics.reload(o.role, o.ok)
            if not o.ok:
                self.reload_failures += 1
                continue
            get_logger().info(
                "semgov policy reloaded", role=o.role, version=o.version, revision=o.revision, reason=reason
            )
            if o.role == "live" and o.bundle is not None:
                self.metrics.bundle(o.bundle)
            if o.role == "live" and o.revision != self.revision:
                self.revision = o.revision
                for listener in self.on_revision:
                    try:
                        listener(o.revision)
                    except Exception as e:  # noqa: BLE001 - a listener bug must not stop the reload
                        get_logger().error("semgov reload listener failed", error=describe_error(e))
            self.reloads += 1  # NOTE: last: who sees the count sees the revision it brought
        if any(o.ok for o in outcomes):
            self.warm("reload")  # NOTE: the new evaluator is cold (its engine, its caches)

    def shadowed(self, records: list[SignedDecision], disagreements: int) -> None:
        """Shadow records were audited (counted; never acted on)."""
        self.metrics.shadow((r.record for r in records), disagreements)
        self.shadow_disagreements += disagreements
        self.shadow_records += len(records)  # NOTE: last: who sees the count sees its disagreements

    def decided(self, job: PendingDecision) -> None:
        """A recipient's decision is done: its latency, when it had candidates; when its adapter
        abandoned it (late, aborted), each of its allows is reported as not realized, here."""
        if job.candidates:
            self.metrics.latency.observe(job.decided_s)
        if job.abandoned is not None:
            text = f"decided in {job.decided_s * 1000:.0f} ms; the engine had stopped waiting"
            if job.abandoned == "late":
                text += f" (SEMGOV_DECISION_TIMEOUT_MS={self.settings.decision_timeout_ms})"
            if job.abandoned_why:
                text = f"{job.abandoned_why}; {text}"
            abandoned_allows(job.decisions, job.abandoned, job.request_id, text, self.not_realized)

    def warm(self, reason: str) -> None:
        """Queue a warm-up of the decision path (``SEMGOV_WARMUP``); never waited for."""
        if self.settings.warmup:
            self.jobs.submit(Warm(reason))

    def warmed(self, outcome: Warmed) -> None:
        """A warm-up's outcome (the decision thread, or the decision process's reader): logged, counted."""
        self.warmups.append(outcome)
        self.metrics.warmup(outcome.error is None)
        ms = round(outcome.seconds * 1000, 1)
        if outcome.error is None:
            get_logger().info("semgov decision path warm", reason=outcome.reason, ms=ms)
        else:
            get_logger().warning(
                "semgov decision path warm-up failed (serving goes on)",
                reason=outcome.reason,
                ms=ms,
                error=outcome.error,
            )

    def close(self) -> None:
        """Stop the registration and decision threads and close the audit log (flushes, checkpoints).

        Queued decisions and events are finished first. Raises the audit log's error if records it
        accepted could not be made durable.
        """
        if self.watcher is not None:
            self.watcher.close()
        if self.bundles is not None:
            self.bundles.close()
        self.backlog.close()
        self.donors.close()
        self.jobs.close()
        if self.forwarding is not None:
            self.forwarding.close()
        if self.policies.capture is not None:
            self.policies.capture.close()
        self.trail.close()
