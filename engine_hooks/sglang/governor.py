"""The semgov side of the hook: contexts, donors, decisions and audit, with no SGLang import.

:class:`Governor` is the thin adapter between an engine and semgov's core data path
(``captured request -> facts -> policy input -> decision -> signed record -> audit log``):

- a request's context comes from a gateway-signed token (:mod:`engine_hooks.sglang.context`);
- a finished request becomes a donor through :meth:`Governor.submit_donor`: its PII scan and the
  signing of its provenance run off the scheduler (in the decision process, or on the
  registration thread without it), and the scheduler sees the donor (:class:`LiveDonor`) when it
  next calls :meth:`Governor.drain_donors`;
- :meth:`Governor.decide` builds the ``CapturedRequest`` for one recipient and its candidates and
  runs :class:`semgov.decide.Evaluator` (every gate, every time; any error is a signed deny);
  :meth:`Governor.decide_later` queues the same work for the decision thread (``semgov-decide``)
  and returns a :class:`PendingDecision` the scheduler thread polls, never waits on; with the
  decision process (:mod:`engine_hooks.sglang.decider`, the default) that thread only forwards
  jobs to it and a reader thread audits the decisions it answers with;
- :meth:`Governor.event` only queues a plain event: it is built and signed off the scheduler
  thread (decision process or decision thread), in order after the decisions queued before it
  (the vLLM ``take_events`` pattern: no signing on the scheduler thread);
- every decision record and engine event is appended to the audit log, which only queues it:
  its own writer thread makes it durable (group commit), never the scheduler.

NOTE: invariants:
- Only the scheduler thread changes the donor registry; the registration thread (or the decision
  process's reader thread) only builds immutable donor objects and hands them over by queue. In
  this process only one thread touches the candidate provider: the decision thread (the scheduler
  thread queues its ``add``/``remove`` there, in order with the queries), or the calling thread
  without one; with the decision process, the provider lives there only.
- A donor is registered only from a request with a verified context that finished normally
  and never received reused KV itself.
- A :class:`PendingDecision` is written only by the decision thread and read by the scheduler
  thread only once ``done`` is set, which is set last.
"""

from __future__ import annotations

import itertools
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
from semgov.facts import prompt_from_tokens
from semgov.keys import Keyring, SigningKey, load_signing_key
from semgov.models import CAPTURED_REQUEST_SCHEMA, Candidate, CapturedRequest, Prompt, Provenance
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
    token_ids: Sequence[int]  # an array('q'): copied once from SGLang's prompt, never changed
    text: str | None


@dataclass(frozen=True, slots=True)
class LiveDonor:
    """What the scheduler side keeps of a registered donor: its identity and where its KV lives
    in the tree (with the decision process, its prompt and provenance live only there)."""

    donor_id: str
    scope: str
    cache_key: str
    cache_salt: str | None
    token_ids: Sequence[int]  # an array('q') built once at registration (SGLang's own token type)


@dataclass(frozen=True, slots=True)
class DonorEntry(LiveDonor):
    """A registered donor as the deciding side holds it: plus its prompt and signed provenance."""

    prompt: Prompt
    provenance: Provenance  # NOTE: validated once, at registration: every decision reuses the object
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
    candidates: list[tuple[LiveDonor, float]] = field(default_factory=list)
    decisions: list[SignedDecision] = field(default_factory=list)
    decided_s: float = 0.0  # seconds the decision thread spent on it
    done: bool = False


@dataclass(frozen=True, slots=True)
class _ProviderOp:
    """A provider ``add`` (entry) or ``remove`` (donor id), applied on the decision thread in order."""

    add: DonorEntry | None
    remove: str | None


@dataclass(frozen=True, slots=True)
class _Register:
    """A finished request to register as a donor in the decision process."""

    spec: DonorSpec


@dataclass(frozen=True, slots=True)
class _EventJob:
    """An engine event as the scheduler thread queued it: built and signed on the decision thread."""

    kind: str
    at: datetime
    fields: dict[str, Any]


_Job = PendingDecision | _EventJob | _ProviderOp | _Register | threading.Event  # Event: a wait_idle marker


def sign_event_job(job: _EventJob, engine_name: str, key: SigningKey) -> SignedEvent:
    """Build and sign one queued engine event (the decision thread, or the decision process)."""
    f = job.fields
    return sign_engine_event(
        engine_event(
            job.kind,
            engine=engine_name,
            request_id=f["request_id"],
            decision_id=f["decision_id"],
            donor_id=f["donor_id"],
            materialized_tokens=f["materialized_tokens"],
            slots=list(f["slots"]),
            spans=list(f["spans"]),
            detail=f["detail"],
            at=job.at,
        ),
        key,
    )


def prompt_of(token_ids: Sequence[int], text: str | None, ctx: RequestContext) -> Prompt:
    """The prompt semgov sees: the context's segments, or one ``other`` segment when it has none."""
    n = len(token_ids)
    segs = ctx.segments if ctx.segments is not None else (("other", 0, n),)
    # NOTE: validated as one array (SGLang's array('q')), and its uint32 form kept for the
    # decision: converting and validating 18k ids one by one cost about 1 ms per request.
    return prompt_from_tokens(token_ids, text or None, segs)


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


def build_donor_entry(
    spec: DonorSpec,
    scope: str,
    *,
    evaluator: Evaluator,
    detokenize: Detokenize | None,
    signing_key: SigningKey,
    policy_version: str,
    ttl_s: int,
    now: datetime,
) -> DonorEntry:
    """A finished request as a donor: its text (detokenized), PII scan and signed provenance.

    Runs off the scheduler (the registration thread, or the decision process). Raises when the
    donor cannot be registered (it is then simply not a donor).
    """
    text = spec.text
    if text is None and detokenize is not None:
        text = detokenize(spec.token_ids)
    prompt = prompt_of(spec.token_ids, text, spec.context)
    found = evaluator.register_donor(prompt)
    payload = provenance_payload(
        donor_id=spec.donor_id,
        tenant=spec.context.tenant,
        namespace=spec.context.namespace,
        task=spec.context.task,
        response_contract=spec.context.response_contract,
        created_at=now,
        expires_at=now + timedelta(seconds=ttl_s),
        policy_version=policy_version,
        token_ids=prompt.token_ids,  # NOTE: the same ids, already one array
        segments=prompt.segments,
        text=prompt.text,
        pii_entities=sorted(found) if found is not None else (),
        pii_scanned=found is not None,
    )
    provenance = Provenance.model_validate(sign_provenance(payload, signing_key))
    evaluator.register_provenance(provenance)  # NOTE: its first decision then finds it verified
    ids = spec.token_ids
    return DonorEntry(
        donor_id=spec.donor_id,
        scope=scope,
        cache_key=spec.cache_key,
        cache_salt=spec.cache_salt,
        token_ids=ids if isinstance(ids, array) and ids.typecode == "q" else array("q", ids),
        prompt=prompt,
        provenance=provenance,
        registered_at=now,
    )


def pop_donor(
    donors: dict[str, LiveDonor], by_scope: dict[str, OrderedDict[str, None]], donor_id: str
) -> LiveDonor | None:
    """Remove a donor from a registry (by id, and from its scope's index); the entry, or None."""
    entry = donors.pop(donor_id, None)
    if entry is not None:
        scope = by_scope.get(entry.scope)
        if scope is not None:
            scope.pop(donor_id, None)
            if not scope:
                del by_scope[entry.scope]
    return entry


def verified_context(
    key: bytes, previous: Sequence[bytes], extra_key: object, lora_id: object = None
) -> RequestContext | None:
    """The context token in ``extra_key`` verified with ``key`` (or, during a rotation, one of the
    ``previous`` keys), bound to ``lora_id``; None when it does not verify. Never raises."""
    from engine_hooks.sglang.context import bounded_repr, has_token_prefix

    try:
        try:
            return parse_context_token(key, extra_key, lora_id=lora_id)
        except ContextError:
            # NOTE: a key rotation's grace period: a token MACed with the gateway's previous key
            # still verifies (the whole parse is repeated, bounded like the first); scopes and
            # tree keys are derived from the current key only, whichever key verified the MAC.
            for old in previous:
                try:
                    return parse_context_token(old, extra_key, lora_id=lora_id)
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
        self._donors: dict[str, LiveDonor] = {}
        self._by_scope: dict[str, OrderedDict[str, None]] = {}
        self._ready: queue.SimpleQueue[LiveDonor] = queue.SimpleQueue()
        # NOTE: with tensor parallelism (set by the cache on rank 0), every registry change in
        # order, for the next round's message to the other ranks (engine_hooks.sglang.tp).
        self.donor_log: list[tuple[str, LiveDonor]] | None = None
        self.unregistered: queue.SimpleQueue[str] = queue.SimpleQueue()  # NOTE: filled only then
        self._todo: queue.SimpleQueue[DonorSpec | None] = queue.SimpleQueue()
        self._worker: threading.Thread | None = None
        self._pending = 0
        self._pending_cv = threading.Condition()
        self.audit_failures = 0
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._decider: threading.Thread | None = None
        self.decision_batches = 0
        self.remote: DecisionProcess | None = None
        self.remote_broken_logged = False
        self._inflight: dict[int, PendingDecision] = {}
        self._registering: dict[str, tuple[DonorSpec, str]] = {}
        self._pings: dict[int, threading.Event] = {}
        self._events: dict[int, _EventJob] = {}
        self._remote_lock = threading.Lock()  # NOTE: guards the four tables above
        self._seq = itertools.count(1)
        if remote:
            self.remote = DecisionProcess(
                settings,
                tokenizer_path,
                on_message=self._on_remote,
                on_broken=self._remote_failed,
                engine_name=engine_name,
            )
        elif settings.async_registration:
            self._worker = threading.Thread(target=self._register_loop, name="semgov-donors", daemon=True)
            self._worker.start()
        if settings.async_decisions:
            self._decider = threading.Thread(target=self._decide_loop, name="semgov-decide", daemon=True)
            self._decider.start()

    # ---- contexts --------------------------------------------------------------------------

    def context_of(self, extra_key: object, lora_id: object = None) -> RequestContext | None:
        """The verified context in ``extra_key``, bound to the request's server-side ``lora_id``, or
        None (no semantic reuse for that request). Never raises, whatever the client sent."""
        return verified_context(self.context_key, self.previous_context_keys, extra_key, lora_id)

    # ---- donors ----------------------------------------------------------------------------

    def submit_donor(self, spec: DonorSpec) -> None:
        """Queue a finished request for registration: in the decision process when there is one,
        else on the registration thread (synchronous when async registration is off: then the
        call also waits for the decision process, for tests that step the cache by hand)."""
        with self._pending_cv:
            self._pending += 1
        if self.remote is not None:
            self._jobs.put(_Register(spec))
            if not self.settings.async_registration:
                self.wait_registrations()
        elif self._worker is None:
            self._register(spec)
        else:
            self._todo.put(spec)

    def _register_loop(self) -> None:
        while True:
            spec = self._todo.get()
            if spec is None:
                return
            self._register(spec)

    def _register(self, spec: DonorSpec) -> None:
        try:
            entry = build_donor_entry(
                spec,
                spec.context.scope(self.context_key, spec.cache_salt),
                evaluator=self.evaluator,
                detokenize=self.detokenize,
                signing_key=self.signing_key,
                policy_version=self.policy_version,
                ttl_s=self.settings.donor_ttl_s,
                now=self.clock(),
            )
        except Exception as e:  # noqa: BLE001 - a donor that cannot be registered is simply not a donor
            get_logger().warning(
                "donor registration failed", donor_id=spec.donor_id, error=f"{type(e).__name__}: {e}"
            )
            self._registration_done(spec.donor_id, False)
            return
        self._ready.put(entry)
        self._registration_done(spec.donor_id, True)

    def _registration_done(self, donor_id: str, registered: bool) -> None:
        """One registration finished (the donor is drained on the scheduler's next round, if
        ``registered``): in either mode, the one place that says so."""
        if not registered and self.donor_log is not None:
            self.unregistered.put(donor_id)  # NOTE: the other ranks can forget their copy
        with self._pending_cv:
            self._pending -= 1
            self._pending_cv.notify_all()

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
            if self.donor_log is not None:
                self.donor_log.append(("add", entry))
            if isinstance(entry, DonorEntry):  # NOTE: the decision process added its own already
                self._provider_op(_ProviderOp(entry, None))
            n += 1

    def wait_registrations(self, timeout: float = 30.0) -> bool:
        """Block until queued registrations are done (tests and shutdown); False on timeout."""
        with self._pending_cv:
            return self._pending_cv.wait_for(lambda: self._pending == 0, timeout)

    def donor(self, donor_id: str) -> LiveDonor | None:
        return self._donors.get(donor_id)

    def drop_donor(self, donor_id: str) -> None:
        """Forget a donor (its KV is gone, or newer donors replaced it)."""
        entry = pop_donor(self._donors, self._by_scope, donor_id)
        if entry is not None:
            if self.donor_log is not None:
                self.donor_log.append(("drop", entry))
            self._provider_op(_ProviderOp(None, donor_id))

    def _provider_op(self, op: _ProviderOp) -> None:
        if self._decider is not None:
            self._jobs.put(op)
        else:
            self._apply(op)

    def _apply(self, op: _ProviderOp) -> None:
        """Decision thread (or the caller without one): the one place the provider is changed."""
        if self.remote is not None:
            if op.remove is not None:
                self._tell(("remove", op.remove))
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
        return [
            (e, sim)
            for e, sim in candidate_entries(self._donors, scope, matches)
            if isinstance(e, DonorEntry)
        ]

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
            job.candidates = list(self.candidates(job.context, job.cache_salt, job.token_ids, job.text))
            if job.candidates:
                job.decisions = self.decide(
                    job.request_id,
                    job.context,
                    job.token_ids,
                    job.text,
                    [(e, sim) for e, sim in job.candidates if isinstance(e, DonorEntry)],
                )
        except Exception as e:  # noqa: BLE001 - no candidates, no decision: the request runs cold
            job.candidates, job.decisions = [], []
            get_logger().warning(
                "semgov candidate search failed", request_id=job.request_id, error=f"{type(e).__name__}: {e}"
            )
        finally:
            job.decided_s = time.perf_counter() - t0
            job.done = True  # NOTE: last: the scheduler thread reads the job only after this

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
                    if self.remote is not None:
                        self._forward(job)
                    elif isinstance(job, PendingDecision):
                        self._run_decision(job)
                    elif isinstance(job, _ProviderOp):
                        self._apply(job)
                    elif isinstance(job, _EventJob):
                        self._sign_event(job)
                    elif isinstance(job, threading.Event):
                        job.set()  # wait_idle: everything queued before it is done
                except Exception as e:  # noqa: BLE001 - both fail closed themselves; this is a bug
                    get_logger().error("semgov decision thread error", error=f"{type(e).__name__}: {e}")

    # ---- the decision process (decision thread sends, its reader thread receives) -----------

    def _forward(self, job: _Job) -> None:
        """Decision thread: hand one job to the decision process without waiting for its answer.

        NOTE: each job is entered in its table before it is sent, so its answer always finds it;
        a job the process can no longer answer is finished here or by :meth:`_remote_failed`.
        """
        if isinstance(job, _ProviderOp):
            self._apply(job)
        elif isinstance(job, _EventJob):
            seq = next(self._seq)
            with self._remote_lock:
                self._events[seq] = job
            self._tell(("event", seq, job))
        elif isinstance(job, _Register):
            spec = job.spec
            scope = spec.context.scope(self.context_key, spec.cache_salt)
            with self._remote_lock:
                self._registering[spec.donor_id] = (spec, scope)
            self._tell(("register", spec, scope))
        elif isinstance(job, threading.Event):
            seq = next(self._seq)
            with self._remote_lock:
                self._pings[seq] = job
            self._tell(("ping", seq))
        elif isinstance(job, PendingDecision):
            if self.audit_broken is not None:
                job.decided_s, job.done = time.monotonic() - job.queued_at, True
                return
            seq = next(self._seq)
            ids = job.token_ids
            tokens = ids if isinstance(ids, array) and ids.typecode == "q" else array("q", ids)
            scope = job.context.scope(self.context_key, job.cache_salt)
            with self._remote_lock:
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
        assert self.remote is not None
        if not self.remote.tell(msg):
            self._remote_failed()

    def _on_remote(self, msg: tuple[Any, ...]) -> None:
        """The decision process's reader thread: one answer (in the order the process made them)."""
        kind = msg[0]
        if kind == "decided":
            _, seq, found, decisions, error = msg
            with self._remote_lock:
                job = self._inflight.pop(seq, None)
            if error is not None:
                get_logger().warning(
                    "semgov decision failed", request_id=getattr(job, "request_id", None), error=error
                )
            self.record_decisions(decisions)
            if job is None:
                return
            # NOTE: every decision is audited; only those whose donor is still registered are acted on.
            kept = [
                ((entry, sim), d)
                for (donor_id, sim), d in zip(found, decisions, strict=False)
                if (entry := self._donors.get(donor_id)) is not None and d.donor_id == donor_id
            ]
            job.candidates = [c for c, _ in kept]
            job.decisions = [d for _, d in kept]
            job.decided_s = time.monotonic() - job.queued_at
            job.done = True  # NOTE: last
        elif kind == "registered":
            _, donor_id, error = msg
            with self._remote_lock:
                pending = self._registering.pop(donor_id, None)
            if pending is None:
                return
            spec, scope = pending
            if error is None:
                self._ready.put(LiveDonor(donor_id, scope, spec.cache_key, spec.cache_salt, spec.token_ids))
            else:
                get_logger().warning("donor registration failed", donor_id=donor_id, error=error)
            self._registration_done(donor_id, error is None)
        elif kind == "event":
            _, seq, record, error = msg
            with self._remote_lock:
                event = self._events.pop(seq, None)
            if record is not None:
                self._append(record)
            else:
                self.audit_failures += 1
                get_logger().error(
                    "semgov engine event not audited", kind=getattr(event, "kind", None), error=error
                )
        elif kind == "pong":
            with self._remote_lock:
                ping = self._pings.pop(msg[1], None)
            if ping is not None:
                ping.set()

    def _remote_failed(self) -> None:
        """The decision process is gone (either thread): finish everything it still owed, once logged.

        NOTE: its requests are done with no decision (they run cold), its registrations fail, the
        engine events it had not signed are signed here; nothing waits on a dead process.
        """
        with self._remote_lock:
            jobs, self._inflight = list(self._inflight.values()), {}
            regs, self._registering = list(self._registering), {}
            pings, self._pings = list(self._pings.values()), {}
            events, self._events = list(self._events.values()), {}
            first = not self.remote_broken_logged
            self.remote_broken_logged = True
        if first:
            get_logger().error(
                "semgov decision process failed: semantic reuse is off, serving cold",
                error=self.remote.broken if self.remote is not None else "failed at start",
            )
        for event in events:
            self._sign_event(event)  # NOTE: engine events are never lost with the process: signed here
        for job in jobs:
            job.decided_s, job.done = time.monotonic() - job.queued_at, True
        for donor_id in regs:
            self._registration_done(donor_id, False)
        for ping in pings:
            ping.set()

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
            signed = sign_event_job(job, self.engine_name, self.signing_key)
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
            self.remote.close()  # NOTE: after the child's last answer has been read
            with self._remote_lock:
                owed = bool(self._inflight or self._registering or self._pings or self._events)
            if owed:
                self._remote_failed()
        self.audit.close()
