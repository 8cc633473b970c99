"""The semgov side of the hook: contexts, donors, decisions and audit, with no SGLang import.

:class:`Governor` is the thin adapter between an engine and semgov's core data path
(``captured request -> facts -> policy input -> decision -> signed record -> audit log``):

- a request's context comes from a gateway-signed token (:mod:`engine_hooks.sglang.context`);
- a finished request becomes a donor through :meth:`Governor.submit_donor`: its PII scan and the
  signing of its provenance run on a background thread (off the scheduler), and the finished
  entry reaches the candidate provider when the scheduler thread next calls
  :meth:`Governor.drain_donors`;
- :meth:`Governor.decide` builds the ``CapturedRequest`` for one recipient and its candidates and
  runs :class:`semgov.decide.Evaluator` (every gate, every time; any error is a signed deny);
  :meth:`Governor.decide_later` queues the same work for the decision thread (``semgov-decide``)
  and returns a :class:`PendingDecision` the scheduler thread polls, never waits on; with the
  decision process (:mod:`engine_hooks.sglang.decider`, the default) that thread only forwards
  requests and donors to it and audits the decisions it answers with;
- :meth:`Governor.event` only queues a plain event: the decision thread builds and signs it, in
  order after the decisions queued before it (the vLLM ``take_events`` pattern: no signing on the
  scheduler thread);
- every decision record and engine event is appended to the audit log, which only queues it:
  its own writer thread makes it durable (group commit), never the scheduler.

NOTE: invariants:
- Only the scheduler thread changes the donor registry; the registration thread only builds
  immutable :class:`DonorEntry` objects and hands them over by queue. Only one thread touches the
  candidate provider: the decision thread (the scheduler thread queues its ``add``/``remove``
  there, in order with the queries), or the calling thread without one.
- A donor is registered only from a request with a verified context that finished normally
  and never received reused KV itself.
- A :class:`PendingDecision` is written only by the decision thread and read by the scheduler
  thread only once ``done`` is set, which is set last.
"""

from __future__ import annotations

import queue
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from engine_hooks.sglang.context import ContextError, RequestContext, parse_context_token
from engine_hooks.sglang.decider import DecisionProcess, candidate_entries
from engine_hooks.sglang.provider import CandidateProvider, load_provider
from engine_hooks.sglang.settings import HookConfigError, HookSettings, read_context_key
from semgov._internal.log import get_logger
from semgov.audit.keyring import AuditKeyring
from semgov.audit.store import AuditLog, Ticket
from semgov.decide import Evaluator, SignedDecision
from semgov.engine import PolicySource
from semgov.engine_events import SignedEvent, engine_event, sign_engine_event
from semgov.errors import SemgovError
from semgov.keys import Keyring, SigningKey, load_signing_key
from semgov.models import CAPTURED_REQUEST_SCHEMA, Candidate, CapturedRequest, Prompt
from semgov.policy_source import load_policy_source, make_engine
from semgov.provenance import provenance_payload, sign_provenance

Clock = Callable[[], datetime]
Detokenize = Callable[[Sequence[int]], str]


def _import_factory(spec: str, what: str) -> Any:
    import importlib

    mod, _, attr = spec.partition(":")
    if not mod or not attr:
        raise HookConfigError(f"{what}={spec!r}: expected 'module.path:callable'")
    try:
        return getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as e:
        raise HookConfigError(f"{what}={spec!r}: cannot import ({e})") from e


class _ModelDetokenizer:
    """The served model's tokenizer, loaded from local files on first use (the registration thread)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._tok: Any = None

    def __call__(self, token_ids: Sequence[int]) -> str:
        if self._tok is None:
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(self.path, local_files_only=True)
        return str(self._tok.decode(list(token_ids), skip_special_tokens=False))


def load_detokenizer(spec: str, tokenizer_path: str | None) -> Detokenize | None:
    """``auto`` (needs ``tokenizer_path``), ``none`` or ``module:callable`` (gives ``f(tokens) -> str``)."""
    if spec == "none":
        return None
    if spec == "auto":
        return _ModelDetokenizer(tokenizer_path) if tokenizer_path else None
    made = _import_factory(spec, "SEMGOV_DETOKENIZER")()
    if not callable(made):
        raise HookConfigError(f"SEMGOV_DETOKENIZER={spec!r}: the factory did not return a callable")
    return made  # type: ignore[no-any-return]


def _utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class DonorSpec:
    """What the engine knows about a finished request that may become a donor."""

    donor_id: str  # server-generated: the engine's own id of the request, never the client's rid
    context: RequestContext
    cache_key: str
    cache_salt: str | None
    token_ids: tuple[int, ...]
    text: str | None


@dataclass(frozen=True, slots=True)
class DonorEntry:
    """A registered donor: its prompt, signed provenance and where its KV lives in the tree."""

    donor_id: str
    scope: str
    cache_key: str
    cache_salt: str | None
    token_ids: Sequence[int]  # an array('q') built once at registration (SGLang's own token type)
    prompt: Prompt
    provenance: dict[str, Any]
    registered_at: datetime


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
    candidates: list[tuple[DonorEntry, float]] = field(default_factory=list)
    decisions: list[SignedDecision] = field(default_factory=list)
    decided_s: float = 0.0  # seconds the decision thread spent on it
    done: bool = False


@dataclass(frozen=True, slots=True)
class _ProviderOp:
    """A provider ``add`` (entry) or ``remove`` (donor id), applied on the decision thread in order."""

    add: DonorEntry | None
    remove: str | None


@dataclass(frozen=True, slots=True)
class _EventJob:
    """An engine event as the scheduler thread queued it: built and signed on the decision thread."""

    kind: str
    at: datetime
    fields: dict[str, Any]


_Job = PendingDecision | _EventJob | _ProviderOp | threading.Event  # Event: a wait_idle marker


def prompt_of(token_ids: Sequence[int], text: str | None, ctx: RequestContext) -> Prompt:
    """The prompt semgov sees: the context's segments, or one ``other`` segment when it has none."""
    n = len(token_ids)
    segs = ctx.segments if ctx.segments is not None else (("other", 0, n),)
    return Prompt.model_validate(
        {
            "token_ids": list(token_ids),
            "text": text or None,
            "segments": [{"role": r, "start": s, "end": e} for r, s, e in segs],
        }
    )


def build_evaluator(
    settings: HookSettings, policy: PolicySource, keyring: Keyring, key: SigningKey
) -> Evaluator:
    """The evaluator the hook decides with (the same in the scheduler process and the decision process)."""
    return Evaluator(
        policy,
        keyring,
        key,
        engine=make_engine(policy, settings.engine or "auto"),
        engine_timeout=settings.decision_timeout_ms / 1000,
    )


def evaluate_request(
    evaluator: Evaluator,
    now: datetime,
    request_id: str,
    ctx: RequestContext,
    token_ids: Sequence[int],
    text: str | None,
    candidates: Sequence[tuple[DonorEntry, float]],
) -> list[SignedDecision]:
    """One signed decision per candidate (the evaluator denies on any error of a candidate's).

    Raises only when the request itself cannot be built (the caller then decides nothing).
    """
    req = CapturedRequest.model_validate(
        {
            "schema": CAPTURED_REQUEST_SCHEMA,
            "request_id": request_id,
            "received_at": now,
            "tenant": ctx.tenant,
            "namespace": ctx.namespace,
            "task": ctx.task,
            "response_contract": ctx.response_contract,
            "prompt": prompt_of(token_ids, text, ctx),
            "candidates": [
                Candidate.model_validate(
                    {
                        "donor_id": d.donor_id,
                        "similarity": sim,
                        "prompt": d.prompt,
                        "provenance": d.provenance,
                    }
                )
                for d, sim in candidates
            ],
        }
    )
    return evaluator.evaluate(req, now=now)


class Governor:
    """Decides reuse for one engine process and audits what it decides and does."""

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
        self.policy: PolicySource = load_policy_source(settings.policy)
        self.signing_key: SigningKey = load_signing_key(settings.signing_key)
        self.keyring = Keyring.load(settings.trust)
        if self.keyring.get(self.signing_key.key_id) is None:
            raise HookConfigError(
                f"SEMGOV_TRUST={settings.trust} does not hold the hook's own key {self.signing_key.key_id} "
                f"(SEMGOV_SIGNING_KEY): donors the hook registers could never be verified"
            )
        self.context_key = read_context_key(settings.context_key)
        self.previous_context_keys: tuple[bytes, ...] = ()
        if settings.context_key_previous is not None:
            previous = read_context_key(settings.context_key_previous, "SEMGOV_CONTEXT_KEY_PREVIOUS")
            if previous == self.context_key:
                raise HookConfigError(
                    f"SEMGOV_CONTEXT_KEY_PREVIOUS={settings.context_key_previous}: the same key as "
                    "SEMGOV_CONTEXT_KEY (a rotation's previous key must be the old one)"
                )
            self.previous_context_keys = (previous,)
        self.evaluator = build_evaluator(settings, self.policy, self.keyring, self.signing_key)
        remote = settings.async_decisions and settings.decision_process
        if remote and provider is not None:
            raise HookConfigError(
                "a provider object cannot cross into the decision process: name it in SEMGOV_PROVIDER, "
                "or set SEMGOV_DECISION_PROCESS=0"
            )
        # NOTE: with the decision process, the provider lives there only (loading it here too would
        # load an embedding model twice and index every donor twice).
        self.provider: CandidateProvider | None = (
            None
            if remote
            else provider
            if provider is not None
            else load_provider(settings.provider, max_donors_per_scope=settings.max_donors_per_scope)
        )
        self.detokenize = load_detokenizer(settings.detokenizer, tokenizer_path)
        if self.detokenize is None:
            get_logger().warning(
                "semgov hook has no donor text: donors are registered without a PII scan",
                detokenizer=settings.detokenizer,
            )
        self.policy_version = f"{self.policy.name}@{self.policy.version}"
        try:
            audit_keyring = AuditKeyring.load(settings.audit_keyring) if settings.audit_keyring else None
            self.audit = AuditLog.open(
                settings.audit_dir, signing_key=self.signing_key, origin="semgov-hook", keyring=audit_keyring
            )
        except (OSError, SemgovError) as e:
            raise HookConfigError(
                f"SEMGOV_AUDIT_DIR={settings.audit_dir}: cannot open the audit log: {e}"
            ) from e
        self.audit_broken: str | None = None
        self._tickets: OrderedDict[str, Ticket] = OrderedDict()
        self._tickets_lock = threading.Lock()
        self._donors: dict[str, DonorEntry] = {}
        self._by_scope: dict[str, OrderedDict[str, None]] = {}
        self._ready: queue.SimpleQueue[DonorEntry] = queue.SimpleQueue()
        self._todo: queue.SimpleQueue[DonorSpec | None] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._pending = 0
        self._pending_cv = threading.Condition()
        if settings.async_registration:
            self._worker = threading.Thread(target=self._register_loop, name="semgov-donors", daemon=True)
            self._worker.start()
        self.audit_failures = 0
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._decider: threading.Thread | None = None
        self.decision_batches = 0
        self.remote: DecisionProcess | None = None
        self.remote_broken_logged = False
        if settings.async_decisions and settings.decision_process:
            self.remote = DecisionProcess(settings)
        if settings.async_decisions:
            self._decider = threading.Thread(target=self._decide_loop, name="semgov-decide", daemon=True)
            self._decider.start()

    # ---- contexts --------------------------------------------------------------------------

    def context_of(self, extra_key: object, lora_id: object = None) -> RequestContext | None:
        """The verified context in ``extra_key``, bound to the request's server-side ``lora_id``, or
        None (no semantic reuse for that request). Never raises, whatever the client sent."""
        from engine_hooks.sglang.context import bounded_repr, has_token_prefix

        try:
            try:
                return parse_context_token(self.context_key, extra_key, lora_id=lora_id)
            except ContextError:
                # NOTE: a key rotation's grace period: a token MACed with the gateway's previous key
                # still verifies (the whole parse is repeated, bounded like the first); scopes and
                # tree keys are derived from the current key only, whichever key verified the MAC.
                for key in self.previous_context_keys:
                    try:
                        return parse_context_token(key, extra_key, lora_id=lora_id)
                    except ContextError:
                        pass
                raise
        except ContextError as e:
            if has_token_prefix(extra_key):
                get_logger().warning("semgov context token refused", reason=str(e)[:200])
            return None
        except Exception as e:  # noqa: BLE001 - a parser bug must not take the scheduler loop down
            get_logger().warning(
                "semgov context token parser failed",
                error=type(e).__name__,
                extra_key=bounded_repr(extra_key),
                lora_id=bounded_repr(lora_id),
            )
            return None

    # ---- donors ----------------------------------------------------------------------------

    def submit_donor(self, spec: DonorSpec) -> None:
        """Queue a finished request for registration (synchronous when async registration is off)."""
        if self._worker is None:
            self._register(spec)
            return
        with self._pending_cv:
            self._pending += 1
        self._todo.put(spec)

    def _register_loop(self) -> None:
        while True:
            spec = self._todo.get()
            if spec is None:
                return
            try:
                self._register(spec)
            finally:
                with self._pending_cv:
                    self._pending -= 1
                    self._pending_cv.notify_all()

    def _register(self, spec: DonorSpec) -> None:
        try:
            text = spec.text
            if text is None and self.detokenize is not None:
                text = self.detokenize(spec.token_ids)
            prompt = prompt_of(spec.token_ids, text, spec.context)
            found = self.evaluator.register_donor(prompt)
            now = self.clock()
            payload = provenance_payload(
                donor_id=spec.donor_id,
                tenant=spec.context.tenant,
                namespace=spec.context.namespace,
                task=spec.context.task,
                response_contract=spec.context.response_contract,
                created_at=now,
                expires_at=now + timedelta(seconds=self.settings.donor_ttl_s),
                policy_version=self.policy_version,
                token_ids=spec.token_ids,
                segments=prompt.segments,
                text=prompt.text,
                pii_entities=sorted(found) if found is not None else (),
                pii_scanned=found is not None,
            )
            entry = DonorEntry(
                donor_id=spec.donor_id,
                scope=spec.context.scope(self.context_key, spec.cache_salt),
                cache_key=spec.cache_key,
                cache_salt=spec.cache_salt,
                token_ids=array("q", spec.token_ids),
                prompt=prompt,
                provenance=sign_provenance(payload, self.signing_key),
                registered_at=now,
            )
        except Exception as e:  # noqa: BLE001 - a donor that cannot be registered is simply not a donor
            get_logger().warning(
                "donor registration failed", donor_id=spec.donor_id, error=f"{type(e).__name__}: {e}"
            )
            return
        self._ready.put(entry)

    def drain_donors(self) -> int:
        """Scheduler thread: make registered donors visible to the provider. Returns how many."""
        n = 0
        while True:
            try:
                entry = self._ready.get_nowait()
            except queue.Empty:
                return n
            self.drop_donor(entry.donor_id)
            scope = self._by_scope.setdefault(entry.scope, OrderedDict())
            # NOTE: the registry keeps what the provider keeps: the newest max_donors_per_scope.
            while len(scope) >= self.settings.max_donors_per_scope:
                self.drop_donor(next(iter(scope)))
            self._donors[entry.donor_id] = entry
            scope[entry.donor_id] = None
            self._provider_op(_ProviderOp(entry, None))
            n += 1

    def wait_registrations(self, timeout: float = 30.0) -> bool:
        """Block until queued registrations are done (tests and shutdown); False on timeout."""
        with self._pending_cv:
            return self._pending_cv.wait_for(lambda: self._pending == 0, timeout)

    def donor(self, donor_id: str) -> DonorEntry | None:
        return self._donors.get(donor_id)

    def drop_donor(self, donor_id: str) -> None:
        """Forget a donor (its KV is gone, or newer donors replaced it)."""
        entry = self._donors.pop(donor_id, None)
        if entry is not None:
            scope = self._by_scope.get(entry.scope)
            if scope is not None:
                scope.pop(donor_id, None)
                if not scope:
                    del self._by_scope[entry.scope]
            self._provider_op(_ProviderOp(None, donor_id))

    def _provider_op(self, op: _ProviderOp) -> None:
        if self._decider is not None:
            self._jobs.put(op)
        else:
            self._apply(op)

    def _apply(self, op: _ProviderOp) -> None:
        """Decision thread (or the caller without one): the one place the provider is changed."""
        if self.remote is not None:
            self.remote.tell(("add", op.add) if op.add is not None else ("remove", op.remove))
            return
        assert self.provider is not None
        try:
            if op.add is not None:
                e = op.add
                self.provider.add(e.donor_id, e.scope, e.token_ids, e.prompt.text)
            elif op.remove is not None:
                self.provider.remove(op.remove)
        except Exception as e:  # noqa: BLE001 - a provider bug costs candidates, never the hook
            get_logger().warning("semgov candidate provider failed", error=f"{type(e).__name__}: {e}")

    def has_donors(self, ctx: RequestContext, cache_salt: str | None) -> bool:
        """Scheduler thread: whether the registry holds any donor of this request's scope."""
        return bool(self._by_scope.get(ctx.scope(self.context_key, cache_salt)))

    def forget_all_donors(self) -> None:
        """The tree was flushed: no donor's KV is left."""
        for donor_id in list(self._donors):
            self.drop_donor(donor_id)

    def donor_count(self) -> int:
        return len(self._donors)

    def candidates(
        self, ctx: RequestContext, cache_salt: str | None, token_ids: Sequence[int], text: str | None
    ) -> list[tuple[DonorEntry, float]]:
        """Donors of the same scope (tenant, namespace, adapter, cache salt), best first (at most
        ``max_candidates``). The provider's thread only (the decision thread, when there is one).

        NOTE: the registry is read without a lock (single dict reads): a donor dropped meanwhile
        may still be proposed; its KV is measured on the scheduler thread before any plan."""
        assert self.provider is not None
        scope = ctx.scope(self.context_key, cache_salt)
        matches = self.provider.query(scope, token_ids, text, limit=self.settings.max_candidates)
        return candidate_entries(self._donors, scope, matches)

    # ---- decisions -------------------------------------------------------------------------

    def decide(
        self,
        request_id: str,
        ctx: RequestContext,
        token_ids: Sequence[int],
        text: str | None,
        candidates: Sequence[tuple[DonorEntry, float]],
    ) -> list[SignedDecision]:
        """One signed decision per candidate (all denied on any error); each is audited.

        NOTE: with a broken audit log nothing is decided: no decision, no reuse (cold).
        """
        if self.audit_broken is not None:
            return []
        try:
            decisions = evaluate_request(
                self.evaluator, self.clock(), request_id, ctx, token_ids, text, candidates
            )
        except Exception as e:  # noqa: BLE001 - fail closed: no decision means no reuse
            get_logger().warning(
                "semgov decision failed", request_id=request_id, error=f"{type(e).__name__}: {e}"
            )
            return []
        return self.record_decisions(decisions)

    def record_decisions(self, decisions: list[SignedDecision]) -> list[SignedDecision]:
        """Queue each decision record for the audit log; keep the allows' tickets (durability)."""
        for d in decisions:
            ticket = self._append(d.canonical)
            if ticket is not None and d.decision == "allow":
                with self._tickets_lock:
                    self._tickets[str(d.record["decision_id"])] = ticket
                    while len(self._tickets) > 4096:
                        self._tickets.popitem(last=False)
        return decisions

    def decide_later(
        self, request_id: str, ctx: RequestContext, cache_salt: str | None, token_ids: Sequence[int]
    ) -> PendingDecision:
        """Queue candidate search and :meth:`decide` for the decision thread (run at once without
        one); the caller polls ``done``."""
        job = PendingDecision(request_id, ctx, cache_salt, token_ids, None, queued_at=time.monotonic())
        if self._decider is None:
            self._run_decision(job)
        else:
            self._jobs.put(job)
        return job

    def _run_decision(self, job: PendingDecision) -> None:
        t0 = time.perf_counter()
        try:
            if self.remote is not None:
                self._run_remote(job)
                return
            job.candidates = self.candidates(job.context, job.cache_salt, job.token_ids, job.text)
            if job.candidates:
                job.decisions = self.decide(
                    job.request_id, job.context, job.token_ids, job.text, job.candidates
                )
        except Exception as e:  # noqa: BLE001 - no candidates, no decision: the request runs cold
            job.candidates, job.decisions = [], []
            get_logger().warning(
                "semgov candidate search failed", request_id=job.request_id, error=f"{type(e).__name__}: {e}"
            )
        finally:
            job.decided_s = time.perf_counter() - t0
            job.done = True  # NOTE: last: the scheduler thread reads the job only after this

    def _run_remote(self, job: PendingDecision) -> None:
        """Decide ``job`` in the decision process; audit and keep what it answered."""
        assert self.remote is not None
        if self.audit_broken is not None:
            return
        scope = job.context.scope(self.context_key, job.cache_salt)
        tokens = job.token_ids if isinstance(job.token_ids, array) else array("q", job.token_ids)
        msg = ("decide", job.request_id, job.context, scope, tokens, job.text, self.settings.max_candidates)
        answer = self.remote.ask(msg)
        if answer is None:
            if not self.remote_broken_logged:
                self.remote_broken_logged = True
                get_logger().error(
                    "semgov decision process failed: semantic reuse is off, serving cold",
                    error=self.remote.broken,
                )
            return
        _, found, decisions, error = answer
        if error is not None:
            get_logger().warning("semgov decision failed", request_id=job.request_id, error=error)
        self.record_decisions(decisions)
        # NOTE: every decision is audited; only those whose donor is still registered are acted on.
        kept = [
            ((entry, sim), d)
            for (donor_id, sim), d in zip(found, decisions, strict=False)
            if (entry := self._donors.get(donor_id)) is not None and d.donor_id == donor_id
        ]
        job.candidates = [c for c, _ in kept]
        job.decisions = [d for _, d in kept]

    def _decide_loop(self) -> None:
        """The decision thread: take everything queued at once (a batch), in order, then wait again."""
        while True:
            batch = [self._jobs.get()]
            while True:
                try:
                    batch.append(self._jobs.get_nowait())
                except queue.Empty:
                    break
            self.decision_batches += 1
            for job in batch:
                if job is None:
                    return
                try:
                    if isinstance(job, PendingDecision):
                        self._run_decision(job)
                    elif isinstance(job, _ProviderOp):
                        self._apply(job)
                    elif isinstance(job, _EventJob):
                        self._sign_event(job)
                    else:
                        job.set()  # wait_idle: everything queued before it is done
                except Exception as e:  # noqa: BLE001 - both fail closed themselves; this is a bug
                    get_logger().error("semgov decision thread error", error=f"{type(e).__name__}: {e}")

    def decision_durable(self, decision_id: str, timeout: float) -> bool:
        """Whether an allow decision's record is durable in the audit log (waits up to ``timeout``).

        NOTE: a realization happens only after the record that allowed it is durable: a reuse
        whose decision could be lost in a crash or a full disk is not made.
        """
        with self._tickets_lock:
            ticket = self._tickets.get(decision_id)
        if ticket is None or self.audit_broken is not None:
            return False
        try:
            done = ticket.done() or ticket.wait(timeout)  # wait(0) polls, and raises if the writer failed
        except Exception as e:  # noqa: BLE001 - the writer failed: the log is broken
            self._broken(e)
            return False
        if done:
            with self._tickets_lock:
                self._tickets.pop(decision_id, None)
        return bool(done)

    # ---- audit -----------------------------------------------------------------------------

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
            job = _EventJob(kind, self.clock(), fields)
        except Exception as e:  # noqa: BLE001 - a broken clock must not take the scheduler down
            self.audit_failures += 1
            get_logger().error("semgov engine event not audited", kind=kind, error=f"{type(e).__name__}: {e}")
            return
        if self._decider is None:
            self._sign_event(job)
        else:
            self._jobs.put(job)

    def _sign_event(self, job: _EventJob) -> SignedEvent | None:
        try:
            f = job.fields
            signed = sign_engine_event(
                engine_event(
                    job.kind,
                    engine=self.engine_name,
                    request_id=f["request_id"],
                    decision_id=f["decision_id"],
                    donor_id=f["donor_id"],
                    materialized_tokens=f["materialized_tokens"],
                    slots=list(f["slots"]),
                    spans=list(f["spans"]),
                    detail=f["detail"],
                    at=job.at,
                ),
                self.signing_key,
            )
        except Exception as e:  # noqa: BLE001 - auditing must not take the scheduler down
            self.audit_failures += 1
            get_logger().error(
                "semgov engine event not audited", kind=job.kind, error=f"{type(e).__name__}: {e}"
            )
            return None
        self._append(signed.canonical)
        return signed

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Block until everything queued for the decision thread is done (tests, shutdown)."""
        if self._decider is None:
            return True
        done = threading.Event()
        self._jobs.put(done)
        return done.wait(timeout)

    def _append(self, record: bytes) -> Ticket | None:
        try:
            return self.audit.append(record)  # queues only; the log's writer thread does the I/O
        except Exception as e:  # noqa: BLE001 - loud, counted, and the engine keeps serving cold
            self._broken(e)
            return None

    def _broken(self, e: BaseException) -> None:
        self.audit_failures += 1
        if self.audit_broken is None:
            self.audit_broken = f"{type(e).__name__}: {e}"
            get_logger().error(
                "semgov audit log failed: semantic reuse is off, serving cold",
                audit_dir=str(self.settings.audit_dir),
                error=self.audit_broken,
            )

    def close(self) -> None:
        """Stop the registration and decision threads and close the audit log (flushes, checkpoints).

        Queued decisions and events are finished first. Raises the audit log's error if records it
        accepted could not be made durable.
        """
        if self._worker is not None:
            self._todo.put(None)
            self._worker.join(timeout=30)
            self._worker = None
        if self._decider is not None:
            self._jobs.put(None)
            self._decider.join(timeout=30)
            self._decider = None
        if self.remote is not None:
            self.remote.close()
        self.audit.close()
