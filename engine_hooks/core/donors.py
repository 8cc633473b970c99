"""Donors: finished requests whose KV another request may reuse, and the registry the scheduler keeps.

- :class:`DonorSpec` is what the engine knows of a finished request; :class:`LiveDonor` what the
  scheduler side keeps of a registered donor (its identity and where its KV lives in the tree);
  :class:`DonorEntry` adds its prompt and signed provenance, as the deciding side holds it.
- :func:`build_donor_entry` makes a donor of a finished request (its text, PII scan and signed
  provenance), off the scheduler: on the registration thread, or in the decision process.
  :class:`DonorBuilder` holds what it needs in this process; :func:`load_detokenizer` gives the
  donor text; :func:`prompt_of` is the prompt semgov sees of a request (donor or recipient).
- :class:`DonorRegistry` is the scheduler side's registry (by id and by scope, the newest
  ``max_donors_per_scope`` of each), the registration thread (``semgov-donors``) and the queue
  that hands registered donors to the scheduler thread (:meth:`DonorRegistry.drain`); each
  change it makes is handed on as a :class:`ProviderOp` for the candidate provider.

NOTE: invariants:
- Only the scheduler thread changes the registry; the registration thread (or the decision
  process's reader thread) only builds immutable donor objects and hands them over by queue.
- A donor is registered only from a request with a verified context that finished normally
  and never received reused KV itself.
"""

from __future__ import annotations

import importlib
import queue
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from engine_hooks.core.candidates import candidate_entries
from engine_hooks.core.settings import HookConfigError
from semgov.context import RequestContext
from semgov.decide import Evaluator
from semgov.facts.compute import prompt_from_tokens
from semgov.log import describe_error, get_logger
from semgov.signing.keys import SigningKey
from semgov.signing.provenance import provenance_payload, sign_provenance
from semgov.wire.models import Prompt, Provenance

Clock = Callable[[], datetime]
MAX_RELEASED = 4096  # released calibration scopes remembered (each is one measured pair's)
Detokenize = Callable[[Sequence[int]], str]


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


@dataclass(frozen=True, slots=True)
class ProviderOp:
    """A provider ``add`` (entry) or ``remove`` (donor id), applied on the decision thread in order."""

    add: DonorEntry | None
    remove: str | None


# ---- donor text --------------------------------------------------------------------------------


def _import_factory(spec: str, what: str) -> Any:
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


# ---- making a donor ------------------------------------------------------------------------------


def prompt_of(token_ids: Sequence[int], text: str | None, ctx: RequestContext) -> Prompt:
    """The prompt semgov sees: the context's segments, or one ``other`` segment when it has none."""
    n = len(token_ids)
    segs = ctx.segments if ctx.segments is not None else (("other", 0, n),)
    # NOTE: validated as one array (SGLang's array('q')), and its uint32 form kept for the
    # decision: converting and validating 18k ids one by one cost about 1 ms per request.
    return prompt_from_tokens(token_ids, text or None, segs)


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
    )


class LivePolicy(Protocol):
    """The live policy in force (:class:`engine_hooks.core.policies.LoadedPolicy`)."""

    @property
    def evaluator(self) -> Evaluator: ...

    @property
    def version(self) -> str: ...


class LivePolicyHolder(Protocol):
    """Whatever holds the live policy, which a reload replaces (``HookPolicies``)."""

    @property
    def live(self) -> LivePolicy: ...


@dataclass(frozen=True, slots=True)
class DonorBuilder:
    """:func:`build_donor_entry` in this process: everything it needs but the donor (``clock`` is
    called at each registration, for the provenance's creation time)."""

    context_key: bytes
    policies: LivePolicyHolder
    detokenize: Detokenize | None
    signing_key: SigningKey
    ttl_s: int
    clock: Clock

    def __call__(self, spec: DonorSpec) -> DonorEntry:
        live = self.policies.live  # NOTE: read once: a reload may swap it meanwhile
        return build_donor_entry(
            spec,
            spec.context.scope(self.context_key, spec.cache_salt),
            evaluator=live.evaluator,
            detokenize=self.detokenize,
            signing_key=self.signing_key,
            policy_version=live.version,
            ttl_s=self.ttl_s,
            now=self.clock(),
        )


# ---- the registry --------------------------------------------------------------------------------


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


class DonorRegistry:
    """The scheduler side's donors: the registered ones by id and by scope (the newest
    ``max_per_scope`` of each), the registrations still running, and the queue that hands the
    finished ones to the scheduler thread. Each registry change is passed to ``on_change``.

    A registration is made in this process by ``build`` (on the registration thread when
    ``background``, else at once), or handed by ``forward`` to the decision process, whose answer
    comes back through :meth:`registered` (without ``background``, :meth:`submit` then waits for
    it, for tests that step the cache by hand).
    """

    def __init__(
        self,
        max_per_scope: int,
        on_change: Callable[[ProviderOp], None],
        *,
        build: Callable[[DonorSpec], DonorEntry] | None = None,
        forward: Callable[[DonorSpec], None] | None = None,
        background: bool = True,
    ) -> None:
        if (build is None) == (forward is None):
            raise ValueError("a donor registry either builds its donors or forwards them, not both")
        self.max_per_scope = max_per_scope
        self._on_change = on_change
        self._build = build
        self._forward = forward
        self._background = background
        self._donors: dict[str, LiveDonor] = {}
        self._by_scope: dict[str, OrderedDict[str, None]] = {}
        # NOTE: scopes a calibration run released (the newest MAX_RELEASED): a donor of one that
        # was still registering when it was released is dropped when it arrives, never made visible.
        self._released: OrderedDict[str, None] = OrderedDict()
        self._ready: queue.SimpleQueue[LiveDonor] = queue.SimpleQueue()
        # NOTE: with tensor parallelism (set by the cache on rank 0), every registry change in
        # order, for the next round's message to the other ranks (engine_hooks.sglang.tp).
        self.donor_log: list[tuple[str, LiveDonor]] | None = None
        self.unregistered: queue.SimpleQueue[str] = queue.SimpleQueue()  # NOTE: filled only then
        self._todo: queue.SimpleQueue[DonorSpec | None] = queue.SimpleQueue()
        self._pending = 0
        self._pending_cv = threading.Condition()
        self._worker: threading.Thread | None = None
        if build is not None and background:
            self._worker = threading.Thread(target=self._register_loop, name="semgov-donors", daemon=True)
            self._worker.start()

    # ---- registrations ---------------------------------------------------------------------

    def submit(self, spec: DonorSpec) -> None:
        """Queue a finished request for registration (see the class docstring for where it runs)."""
        with self._pending_cv:
            self._pending += 1
        if self._forward is not None:
            self._forward(spec)
            if not self._background:
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
        assert self._build is not None
        try:
            entry = self._build(spec)
        except Exception as e:  # noqa: BLE001 - a donor that cannot be registered is simply not a donor
            get_logger().warning("donor registration failed", error=describe_error(e), **_donor_fields(spec))
            self.registration_done(spec.donor_id, False)
            return
        self._ready.put(entry)
        self.registration_done(spec.donor_id, True)

    def registered(self, spec: DonorSpec, scope: str, error: str | None) -> None:
        """The decision process's answer to a forwarded registration (its reader thread)."""
        if error is None:
            self._ready.put(LiveDonor(spec.donor_id, scope, spec.cache_key, spec.cache_salt, spec.token_ids))
        else:
            get_logger().warning("donor registration failed", error=error, **_donor_fields(spec))
        self.registration_done(spec.donor_id, error is None)

    def registration_done(self, donor_id: str, registered: bool) -> None:
        """One registration finished (the donor is drained on the scheduler's next round, if
        ``registered``): in either mode, the one place that says so."""
        if not registered and self.donor_log is not None:
            self.unregistered.put(donor_id)  # NOTE: the other ranks can forget their copy
        with self._pending_cv:
            self._pending -= 1
            self._pending_cv.notify_all()

    def in_flight(self) -> int:
        """Registrations submitted and not yet done (a read of one int: any thread, no lock)."""
        return self._pending

    def wait_registrations(self, timeout: float = 30.0) -> bool:
        """Block until queued registrations are done (tests and shutdown); False on timeout."""
        with self._pending_cv:
            return self._pending_cv.wait_for(lambda: self._pending == 0, timeout)

    def close(self) -> None:
        """Stop the registration thread (after the registrations queued before)."""
        if self._worker is not None:
            self._todo.put(None)
            self._worker.join(timeout=30)
            self._worker = None

    # ---- the registry (scheduler thread) -----------------------------------------------------

    def drain(self) -> int:
        """Scheduler thread: make registered donors visible to the provider. Returns how many."""
        n = 0
        while True:
            try:
                entry = self._ready.get_nowait()
            except queue.Empty:
                return n
            self.drop(entry.donor_id)
            if entry.scope in self._released:
                self._on_change(ProviderOp(None, entry.donor_id))  # NOTE: the provider may hold it
                if self.donor_log is not None:
                    self.unregistered.put(entry.donor_id)  # NOTE: the other ranks forget their copy
                continue
            scope = self._by_scope.setdefault(entry.scope, OrderedDict())
            # NOTE: the registry keeps what the provider keeps: the newest max_donors_per_scope.
            while len(scope) >= self.max_per_scope:
                self.drop(next(iter(scope)))
            self._donors[entry.donor_id] = entry
            scope[entry.donor_id] = None
            if self.donor_log is not None:
                self.donor_log.append(("add", entry))
            if isinstance(entry, DonorEntry):  # NOTE: the decision process added its own already
                self._on_change(ProviderOp(entry, None))
            n += 1

    def get(self, donor_id: str) -> LiveDonor | None:
        return self._donors.get(donor_id)

    def drop(self, donor_id: str) -> None:
        """Forget a donor (its KV is gone, or newer donors replaced it)."""
        entry = pop_donor(self._donors, self._by_scope, donor_id)
        if entry is not None:
            if self.donor_log is not None:
                self.donor_log.append(("drop", entry))
            self._on_change(ProviderOp(None, donor_id))

    def forget_all(self) -> None:
        """The tree was flushed: no donor's KV is left."""
        for donor_id in list(self._donors):
            self.drop(donor_id)

    def release_scope(self, scope: str) -> int:
        """Scheduler thread: drop every donor of ``scope`` and any still registering (a calibration
        run is done with it); how many were dropped."""
        ids = list(self._by_scope.get(scope, ()))
        for donor_id in ids:
            self.drop(donor_id)
        self._released[scope] = None
        self._released.move_to_end(scope)
        while len(self._released) > MAX_RELEASED:
            self._released.popitem(last=False)
        return len(ids)

    def has_scope(self, scope: str) -> bool:
        """Whether the registry holds any donor of this scope."""
        return bool(self._by_scope.get(scope))

    def count(self) -> int:
        return len(self._donors)

    def entries(self, scope: str, matches: Sequence[Any]) -> list[tuple[LiveDonor, float]]:
        """The provider's matches that are registered donors of exactly ``scope``, in order (read
        from the provider's thread: see :meth:`~engine_hooks.core.decisions.LocalDecisions.candidates`)."""
        return candidate_entries(self._donors, scope, matches)


def _donor_fields(spec: DonorSpec) -> dict[str, str]:
    """What a log line about a donor names: its server-side id, tenant and namespace."""
    return {"donor_id": spec.donor_id, "tenant": spec.context.tenant, "namespace": spec.context.namespace}
