"""Decisions: candidate search and policy evaluation for one recipient, off the scheduler thread.

- :class:`~engine_hooks.core.policies.HookPolicies` decides (in either process): the live
  policy's signed decisions, then the shadow policy's records and the capture; a :class:`Reload`
  job reloads the policies between two decisions.
- :class:`DecisionThread` is the decision thread (``semgov-decide``): the scheduler thread queues
  a :class:`PendingDecision` (polled, never waited on), provider changes, engine events and
  registrations; the thread takes everything queued at once and runs it in order.
- :class:`LocalDecisions` runs those jobs in this process: the provider's queries and changes,
  the decisions (each audited), the events' signing.
- :class:`RemoteDecisions` forwards them to the decision process
  (:mod:`engine_hooks.core.decider`, the default) without waiting for its answers, which its
  reader thread takes (:meth:`RemoteDecisions.on_message`) and audits.

NOTE: invariants:
- In this process only one thread touches the candidate provider: the decision thread (the
  scheduler thread queues its ``add``/``remove`` there, in order with the queries), or the calling
  thread without one; with the decision process, the provider lives there only.
- A :class:`PendingDecision` is written only by the decision thread (or the decision process's
  reader thread) and read by the scheduler thread only once ``done`` is set, which is set last.
- A :class:`PendingDecision` has exactly one outcome: the scheduler takes it (``done`` was set
  first), or the adapter abandoned it first (:meth:`PendingDecision.abandon`: late, aborted) and
  the core reports each of its allows as not realized when it finishes
  (:meth:`~engine_hooks.core.governor.Governor.decided`); both sides decide under the job's lock.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine_hooks.core.decider import DecisionProcess
from engine_hooks.core.donors import (
    Clock,
    DonorEntry,
    DonorRegistry,
    DonorSpec,
    LiveDonor,
    ProviderOp,
)
from engine_hooks.core.events import AuditTrail, EventJob
from engine_hooks.core.policies import HookPolicies, LiveDecided, ReloadOutcome
from engine_hooks.core.settings import HookSettings
from engine_hooks.core.warmup import Warm, Warmed
from semgov.context import RequestContext
from semgov.decide import SignedDecision
from semgov.log import bound, describe_error, get_logger
from semgov.typing import CandidateProvider


@dataclass(slots=True, eq=False)
class PendingDecision:
    """One recipient's candidates and decisions, found and made on the decision thread; read once
    ``done`` is True (``decisions[i]`` decides ``candidates[i]``)."""

    request_id: str
    context: RequestContext
    cache_salt: str | None
    token_ids: Sequence[int]
    text: str | None
    queued_at: float = 0.0  # time.monotonic() when queued
    candidates: list[tuple[LiveDonor, float]] = field(default_factory=list)
    decisions: list[SignedDecision] = field(default_factory=list)
    decided_s: float = 0.0  # seconds the decision thread spent on it
    done: bool = False
    abandoned: str | None = None  # why the adapter stopped waiting (a not-realized reason code)
    abandoned_why: str = ""  # and in words (the event's detail after the code)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def abandon(self, reason: str, why: str = "") -> bool:
        """Scheduler thread: stop waiting for this decision (``reason``: ``late``, ``aborted``, ...).

        True: abandoned; its allows, when it finishes, are reported as not realized with ``reason``
        and the adapter never reads it. False: it finished first; the adapter takes it as usual.
        """
        with self._lock:
            if self.done:
                return False
            if self.abandoned is None:
                self.abandoned, self.abandoned_why = reason, why
            return True

    def finish(self) -> str | None:
        """Decision side: mark it done (last); returns why it was abandoned, or None (the adapter
        will take it). NOTE: ``abandoned`` no longer changes once ``done`` is set."""
        with self._lock:
            self.done = True
            return self.abandoned


@dataclass(frozen=True, slots=True)
class Register:
    """A finished request to register as a donor in the decision process."""

    spec: DonorSpec


@dataclass(frozen=True, slots=True)
class Reload:
    """Reload the policies and the keyring (SIGHUP, a file change), between two decisions."""

    reason: str


Job = PendingDecision | EventJob | ProviderOp | Register | Reload | Warm | threading.Event  # Event: wait_idle


class LifecycleSink(Protocol):
    """Where the policy lifecycle's outcomes go (the governor): reloads and shadow records."""

    def reloaded(self, outcomes: list[ReloadOutcome], reason: str) -> None: ...

    def shadowed(self, records: list[SignedDecision], disagreements: int) -> None: ...

    def decided(self, job: PendingDecision) -> None: ...

    def warmed(self, outcome: Warmed) -> None: ...


def disagreements(records: Sequence[SignedDecision]) -> int:
    """Shadow records whose decision differs from the live one's (none made counts as a deny)."""
    return sum(1 for r in records if r.record["decision"] != (r.record.get("live_decision") or "deny"))


class JobHandler(Protocol):
    """Runs one queued job (:class:`LocalDecisions` or :class:`RemoteDecisions`)."""

    def handle(self, job: Job) -> None: ...


class DecisionThread:
    """The decision thread (``semgov-decide``): runs queued jobs in order, each by the handler given
    to :meth:`start`; without the thread (``threaded`` False) :meth:`submit` runs a job at once."""

    def __init__(self, threaded: bool) -> None:
        self.batches = 0
        self._handler: JobHandler | None = None
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        if threaded:
            self._thread = threading.Thread(target=self._loop, name="semgov-decide", daemon=True)

    def start(self, handler: JobHandler) -> None:
        self._handler = handler
        if self._thread is not None:
            self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue a job for the decision thread (run at once on the calling thread without one)."""
        if self._thread is None:
            assert self._handler is not None
            self._handler.handle(job)
        else:
            self._jobs.put(job)

    def _loop(self) -> None:
        """The decision thread: take everything queued at once (a batch), in order, then wait again."""
        assert self._handler is not None
        while True:
            batch = [self._jobs.get()]
            while True:
                try:
                    batch.append(self._jobs.get_nowait())
                except queue.Empty:
                    break
            self.batches += 1
            for job in batch:
                if job is None:
                    return
                try:
                    self._handler.handle(job)
                except Exception as e:  # noqa: BLE001 - both fail closed themselves; this is a bug
                    get_logger().error("semgov decision thread error", error=describe_error(e))

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until everything queued for the decision thread is done (tests, shutdown)."""
        if self._thread is None:
            return True
        done = threading.Event()
        self._jobs.put(done)
        return done.wait(timeout)

    def close(self) -> None:
        """Stop the thread once the jobs queued before are done."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout=30)
            self._thread = None


class LocalDecisions:
    """The jobs run in this process: candidate search with the provider, decisions with the
    evaluator (each audited), provider changes and event signing."""

    def __init__(
        self,
        settings: HookSettings,
        context_key: bytes,
        *,
        policies: HookPolicies,
        provider: CandidateProvider,
        donors: DonorRegistry,
        trail: AuditTrail,
        clock: Clock,
        lifecycle: LifecycleSink,
        warm: Callable[[str], Warmed] | None = None,
    ) -> None:
        self.settings = settings
        self.context_key = context_key
        self.warm = warm
        self.policies = policies
        self.provider = provider
        self.donors = donors
        self.trail = trail
        self.clock = clock
        self.lifecycle = lifecycle

    def handle(self, job: Job) -> None:
        if isinstance(job, PendingDecision):
            self.run(job)
        elif isinstance(job, ProviderOp):
            self.apply(job)
        elif isinstance(job, EventJob):
            self.trail.sign(job)
        elif isinstance(job, Reload):
            self.lifecycle.reloaded(self.policies.reload(), job.reason)
        elif isinstance(job, Warm):
            if self.warm is not None:
                self.lifecycle.warmed(self.warm(job.reason))
        elif isinstance(job, threading.Event):
            job.set()  # wait_idle: everything queued before it is done

    def apply(self, op: ProviderOp) -> None:
        """Decision thread (or the caller without one): the one place the provider is changed."""
        try:
            if op.add is not None:
                e = op.add
                self.provider.add(e.donor_id, e.scope, e.token_ids, e.prompt.text)
            elif op.remove is not None:
                self.provider.remove(op.remove)
        except Exception as e:  # noqa: BLE001 - a provider bug costs candidates, never the hook
            get_logger().warning("semgov candidate provider failed", error=describe_error(e))

    def candidates(
        self, ctx: RequestContext, cache_salt: str | None, token_ids: Sequence[int], text: str | None
    ) -> list[tuple[DonorEntry, float]]:
        """Donors of the same scope (tenant, namespace, adapter, cache salt), best first (at most
        ``max_candidates``). The provider's thread only (the decision thread, when there is one).

        NOTE: the registry is read without a lock (single dict reads): a donor dropped meanwhile
        may still be proposed; its KV is measured on the scheduler thread before any plan."""
        scope = ctx.scope(self.context_key, cache_salt)
        matches = self.provider.query(scope, token_ids, text, limit=self.settings.max_candidates)
        return [(e, sim) for e, sim in self.donors.entries(scope, matches) if isinstance(e, DonorEntry)]

    def decide(
        self,
        request_id: str,
        ctx: RequestContext,
        token_ids: Sequence[int],
        text: str | None,
        candidates: Sequence[tuple[DonorEntry, float]],
    ) -> LiveDecided | None:
        """One signed live decision per candidate (all denied on any error); each is audited.

        NOTE: with a broken audit log nothing is decided: no decision, no reuse (cold).
        """
        if self.trail.broken is not None:
            return None
        try:
            live = self.policies.decide_live(self.clock(), request_id, ctx, token_ids, text, candidates)
        except Exception as e:  # noqa: BLE001 - fail closed: no decision means no reuse
            get_logger().warning("semgov decision failed", request_id=request_id, error=describe_error(e))
            return None
        self.trail.record_decisions(live.decisions)
        return live

    def run(self, job: PendingDecision) -> None:
        """Candidate search and :meth:`decide` for one queued recipient; then, once the scheduler
        may act on the job, the shadow policy's records and the capture. Every line logged
        meanwhile names the request and its tenant (and, once decided, the decision ids)."""
        with bound(request_id=job.request_id, tenant=job.context.tenant, namespace=job.context.namespace):
            self._run(job)

    def _run(self, job: PendingDecision) -> None:
        t0 = time.perf_counter()
        live: LiveDecided | None = None
        try:
            job.candidates = list(self.candidates(job.context, job.cache_salt, job.token_ids, job.text))
            if job.candidates:
                live = self.decide(
                    job.request_id,
                    job.context,
                    job.token_ids,
                    job.text,
                    [(e, sim) for e, sim in job.candidates if isinstance(e, DonorEntry)],
                )
                job.decisions = live.decisions if live is not None else []
        except Exception as e:  # noqa: BLE001 - no candidates, no decision: the request runs cold
            job.candidates, job.decisions = [], []
            get_logger().warning("semgov candidate search failed", error=describe_error(e))
        finally:
            job.decided_s = time.perf_counter() - t0
            job.finish()  # NOTE: last: the scheduler thread reads the job only after this
        with bound(decision_ids=[str(d.record["decision_id"]) for d in job.decisions] or None):
            self.lifecycle.decided(job)
        if live is not None:
            shadow = self.policies.decide_shadow(live)  # NOTE: never raises; after `done`
            if shadow:
                self.trail.record_shadow(shadow)
                self.lifecycle.shadowed(shadow, disagreements(shadow))


class RemoteDecisions:
    """The jobs forwarded to the decision process: the decision thread sends each one
    (:meth:`handle`), the process's reader thread takes each answer (:meth:`on_message`), and
    :meth:`failed` finishes whatever a dead process still owed. ``process`` is set once started."""

    def __init__(
        self,
        settings: HookSettings,
        context_key: bytes,
        *,
        donors: DonorRegistry,
        trail: AuditTrail,
        lifecycle: LifecycleSink,
    ) -> None:
        self.settings = settings
        self.context_key = context_key
        self.donors = donors
        self.trail = trail
        self.lifecycle = lifecycle
        self.process: DecisionProcess | None = None
        self.broken_logged = False
        self._inflight: dict[int, PendingDecision] = {}
        self._registering: dict[str, tuple[DonorSpec, str]] = {}
        self._pings: dict[int, threading.Event] = {}
        self._events: dict[int, EventJob] = {}
        self._lock = threading.Lock()  # NOTE: guards the four tables above
        self._seq = itertools.count(1)

    def handle(self, job: Job) -> None:
        """Decision thread: hand one job to the decision process without waiting for its answer.

        NOTE: each job is entered in its table before it is sent, so its answer always finds it;
        a job the process can no longer answer is finished here or by :meth:`failed`.
        """
        if isinstance(job, ProviderOp):
            if job.remove is not None:
                self._tell(("remove", job.remove))
        elif isinstance(job, EventJob):
            seq = self._enter(self._events, job)
            self._tell(("event", seq, job))
        elif isinstance(job, Register):
            spec = job.spec
            scope = spec.context.scope(self.context_key, spec.cache_salt)
            with self._lock:
                self._registering[spec.donor_id] = (spec, scope)
            self._tell(("register", spec, scope))
        elif isinstance(job, Reload):
            self._tell(("reload", job.reason))
        elif isinstance(job, Warm):
            self._tell(("warm", job.reason))
        elif isinstance(job, threading.Event):
            seq = self._enter(self._pings, job)
            self._tell(("ping", seq))
        elif isinstance(job, PendingDecision):
            self._forward_decision(job)

    def _enter(self, table: dict[int, Any], job: Any) -> int:
        seq = next(self._seq)
        with self._lock:
            table[seq] = job
        return seq

    def _forward_decision(self, job: PendingDecision) -> None:
        if self.trail.broken is not None:
            job.decided_s = time.monotonic() - job.queued_at
            job.finish()
            return
        seq = next(self._seq)
        ids = job.token_ids
        tokens = ids if isinstance(ids, array) and ids.typecode == "q" else array("q", ids)
        scope = job.context.scope(self.context_key, job.cache_salt)
        with self._lock:
            self._inflight[seq] = job
        self._tell(
            (
                "decide",
                seq,
                job.request_id,
                job.context,
                scope,
                tokens,
                job.text,
                self.settings.max_candidates,
            )
        )

    def _tell(self, msg: tuple[Any, ...]) -> None:
        assert self.process is not None
        if not self.process.tell(msg):
            self.failed()

    def on_message(self, msg: tuple[Any, ...]) -> None:
        """The decision process's reader thread: one answer (in the order the process made them)."""
        kind = msg[0]
        if kind == "decided":
            self._decided(*msg[1:])
        elif kind == "registered":
            _, donor_id, error = msg
            with self._lock:
                pending = self._registering.pop(donor_id, None)
            if pending is not None:
                self.donors.registered(*pending, error)
        elif kind == "event":
            _, seq, record, error = msg
            with self._lock:
                event = self._events.pop(seq, None)
            if record is not None:
                self.trail.append(record)
            else:
                self.trail.not_audited(getattr(event, "kind", None), error, getattr(event, "fields", None))
        elif kind == "pong":
            with self._lock:
                ping = self._pings.pop(msg[1], None)
            if ping is not None:
                ping.set()
        elif kind == "shadow":
            _, records = msg
            self.trail.record_shadow(records)
            self.lifecycle.shadowed(records, disagreements(records))
        elif kind == "reloaded":
            _, outcomes, reason = msg
            self.lifecycle.reloaded(outcomes, reason)
        elif kind == "warmed":
            self.lifecycle.warmed(Warmed(*msg[1:]))

    def _decided(
        self, seq: int, found: list[tuple[str, float]], decisions: list[SignedDecision], error: str | None
    ) -> None:
        with self._lock:
            job = self._inflight.pop(seq, None)
        if error is not None:
            ctx = getattr(job, "context", None)
            get_logger().warning(
                "semgov decision failed",
                request_id=getattr(job, "request_id", None),
                tenant=getattr(ctx, "tenant", None),
                namespace=getattr(ctx, "namespace", None),
                error=error,
            )
        self.trail.record_decisions(decisions)
        if job is None:
            return
        # NOTE: every decision is audited; only those whose donor is still registered are acted on.
        kept = [
            ((entry, sim), d)
            for (donor_id, sim), d in zip(found, decisions, strict=False)
            if (entry := self.donors.get(donor_id)) is not None and d.donor_id == donor_id
        ]
        job.candidates = [c for c, _ in kept]
        job.decisions = [d for _, d in kept]
        job.decided_s = time.monotonic() - job.queued_at
        if job.finish() is not None:  # NOTE: last for the scheduler; abandoned, nobody else reads it
            job.decisions = list(decisions)  # every allow made is reported, its donor kept or not
        self.lifecycle.decided(job)

    def failed(self) -> None:
        """The decision process is gone (either thread): finish everything it still owed, once logged.

        NOTE: its requests are done with no decision (they run cold), its registrations fail, the
        engine events it had not signed are signed here; nothing waits on a dead process.
        """
        with self._lock:
            jobs, self._inflight = list(self._inflight.values()), {}
            regs, self._registering = list(self._registering), {}
            pings, self._pings = list(self._pings.values()), {}
            events, self._events = list(self._events.values()), {}
            first = not self.broken_logged
            self.broken_logged = True
        if first:
            get_logger().error(
                "semgov decision process failed: semantic reuse is off, serving cold",
                error=self.process.broken if self.process is not None else "failed at start",
            )
        for event in events:
            self.trail.sign(event)  # NOTE: engine events are never lost with the process: signed here
        for job in jobs:
            job.decided_s = time.monotonic() - job.queued_at
            job.finish()
        for donor_id in regs:
            self.donors.registration_done(donor_id, False)
        for ping in pings:
            ping.set()

    def close(self) -> None:
        """Stop the decision process (after its last answer is read); finish what it still owed."""
        if self.process is not None:
            self.process.close()  # NOTE: after the child's last answer has been read
            with self._lock:
                owed = bool(self._inflight or self._registering or self._pings or self._events)
            if owed:
                self.failed()
