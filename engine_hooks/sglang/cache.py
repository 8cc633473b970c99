"""The governed radix cache: SGLang's ``UnifiedRadixCache`` plus semgov-decided semantic reuse.

How a request flows through it (SGLang 0.5.23's scheduler calls, in order):

0. :meth:`GovernedRadixCache.hold_back` (before every prefill round, from the plugin's AROUND
   hook on ``Scheduler.get_new_batch_prefill``): a request seen for the first time gets its
   server-side state (:class:`_State`, kept on SGLang's ``Req`` object itself), and ``req.extra_key``
   is replaced with the key derived from the request's verified context
   (:mod:`engine_hooks.core.context`: tenant, namespace, LoRA adapter and cache salt), so
   tenants and namespaces never share exact-prefix nodes. When at least ``min_unmatched_tokens``
   stay unmatched by the exact tree and the request has a verified context, the candidate
   provider is asked for donors of the same scope, their live KV is measured in the tree, and
   the decision is queued for the decision thread (:meth:`Governor.decide_later`), once per
   request (retraction included). The request is then held out of the round (not blocking it)
   until its decision is done and, for an allow, its record durable, or until its deadline
   (``decision_timeout_ms``, then ``audit_wait_ms``), after which it is admitted and runs cold.
1. ``match_prefix`` (every waiting request, every scheduling round): the exact match runs as
   usual (a request the round hook has not seen is given its state and decision here). Once the
   decision is done, the reusable run of the best allowed donor (approved spans contiguous from
   the exact-match end, inside the donor's live KV, page-aligned) is reported as a *host hit*.
   Nothing is allocated, pinned, decided or waited for here.
2. ``init_load_back`` (admission, inside the scheduler's prefill adder, only when that request
   is admitted): the allow record must already be durable (never waited for here); re-match the
   donor, pin it for the duration of this call only, check token
   identity against the live donor, allocate fresh slots (evicting if needed: the donor is
   pinned), copy the donor's K/V into them on the scheduler's current stream (keys re-rotated
   for shifted spans), unpin, audit, check the pool. Any problem frees what was taken and
   returns 0: the request runs cold.
3. ``prefix_device_indices`` (row allocation): the exact-match path followed by the realized
   slots, which from then on are rows of the request above ``cache_protected_len``
   (request-private, counted by SGLang as ``uncached``, freed with the row).
3b. regions (approved runs after fresh tokens, :func:`~engine_hooks.core.plan.plan_regions`):
   the plugin's admission hooks make SGLang's chunked prefill end a chunk where the next region
   starts (:meth:`GovernedRadixCache.chunk_cap`, :meth:`GovernedRadixCache.chunk_limit`); before
   the next round, :meth:`GovernedRadixCache.advance_chunked` copies the region's K/V into fresh
   slots (the same checks as at admission), writes them into the request's row and moves its
   prefix past them, so the next chunk starts after the region.
4. ``on_release`` / ``release_aborted_request``: a retracted request keeps its decisions (and may
   be realized again, under the same decision, when it is re-admitted); a finished one drops its
   state, and if it finished normally with a verified context and never received reused KV, it
   is registered as a donor under a server-generated id. The invariant guard checks the pool
   after every realization (or failed one; inside a prefill round, once when the round ends) and
   at the release or abort of every request that received realized slots: wherever the hook
   changed the pool.

With tensor parallelism (:mod:`engine_hooks.sglang.tp`) every rank runs this cache over its own
KV shard: rank 0 decides and audits, and at the start of each prefill round every rank applies
rank 0's message (:meth:`GovernedRadixCache.sync_round`: finished decisions, durable records,
registry changes, its clock), so holds, host hits, chunk caps and realizations are the same on
every rank; a realization stands only if every rank's copy did.

NOTE: invariants:
- Reused KV is only ever *copied* into slots the recipient owns; donor slots are never adopted,
  shared or written.
- ``cache_protected_len`` stays at the exact-match length (``load_back_is_cache_owned`` is
  False), a recipient is flagged ``skip_radix_cache_insert`` (reuse-derived KV never enters the
  exact tree) and a recipient never becomes a donor.
- Nothing is keyed by the client's ``rid``: per-request state lives on the ``Req`` object, donors
  have server-generated ids, and ``rid`` only labels records (:func:`request_label`).
- ``match_prefix`` allocates and pins nothing; the one donor pin exists only inside
  ``init_load_back``.
- The scheduler thread never waits for semgov: policy evaluation, record signing and audit I/O
  run on other threads; it only polls (``PendingDecision.done``, ``Ticket.done``).
- Any error or doubt means no reuse for that request (cold prefill); no exception of the hook's
  own leaves an SGLang entry point; an invariant violation disables semantic reuse for the
  process (audited; raised when ``strict``).
"""

from __future__ import annotations

import collections
import itertools
import queue
import secrets
import time
import weakref
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from sglang.srt.managers.schedule_batch import FINISH_ABORT
from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams, MatchPrefixParams, MatchResult
from sglang.srt.mem_cache.common import evict_from_tree_cache
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from engine_hooks.core.canary import Canaries
from engine_hooks.core.context import KEY_PREFIX, RequestContext, anonymous_cache_key
from engine_hooks.core.decisions import PendingDecision
from engine_hooks.core.donors import DonorSpec, LiveDonor
from engine_hooks.core.governor import Governor
from engine_hooks.core.plan import (
    Piece,
    Region,
    plan_pieces,
    plan_regions,
    planned_tokens,
    recompute_leading,
    request_label,
    unrealizable_reason,
)
from engine_hooks.core.rope import RopeSpec
from engine_hooks.sglang.guard import InvariantGuard, InvariantViolation
from engine_hooks.sglang.kv_copy import copy_kv
from engine_hooks.sglang.tp import Choice, DonorOp, FollowerGovernor, PendingDonors, RoundSync, TpLink
from semgov.decide import SignedDecision
from semgov.log import describe_error, get_logger

__all__ = ["GovernedRadixCache", "Piece", "RealizationError", "plan_pieces", "state_of"]

_STATE_ATTR = "_semgov_state"
_SESSION_ATTR = "_semgov_session_key"  # NOTE: on SGLang's Session: the tree key its first request had


class RealizationError(RuntimeError):
    """Why an allowed reuse was not realized (the request then runs cold)."""


@dataclass(slots=True)
class _State:
    """Semantic-reuse state of one request, kept on its SGLang ``Req`` (server-side identity)."""

    serial: int
    label: str
    context: RequestContext | None
    cache_key: str
    cache_salt: str | None
    decided: bool = False
    decisions: list[SignedDecision] = field(default_factory=list)
    chosen: SignedDecision | None = None
    donor: LiveDonor | None = None
    donor_len: int = 0
    durable: bool = False
    recipient: bool = False
    private: torch.Tensor | None = None
    private_base: int = 0
    pieces: tuple[Piece, ...] = ()
    src_slots: torch.Tensor | None = None
    realizations: int = 0
    retractions: int = 0
    pending: PendingDecision | None = None
    m0: int = 0  # exact match and prompt length when the decision was queued
    limit0: int = 0
    deadline: float = 0.0  # time.monotonic() past which the request is no longer held back
    sched_ns: int = 0  # scheduler-thread time spent in semgov's code for this request
    queued_at: float = 0.0  # time.monotonic() when its decision was queued (0: never)
    held_s: float = 0.0  # from then until it was first let through to admission
    decided_s: float = 0.0  # from then until its decision was taken (done on the decision thread)
    copy_ns: int = 0  # of which not counted there: the realizations' K/V copies (the reuse itself)
    regions: tuple[Region, ...] = ()  # approved runs past the front, still to realize (in order)
    region_deadline: float = 0.0  # past it, a request kept waiting for a chunk boundary gives them up
    regions_realized: int = 0
    shifted: bool = False  # it received shifted KV (a canary may replay it cold)
    canary: bool = False  # a canary's cold replay (engine_hooks.core.canary): no reuse, never a donor


def _int64(tokens: Any) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Token ids as an int64 array: a zero-copy view of an ``array('q')`` (SGLang's own type)."""
    if isinstance(tokens, array) and tokens.typecode == "q":
        return np.frombuffer(tokens, dtype=np.int64)
    return np.asarray(tokens, dtype=np.int64)


def log_fields(st: _State | None) -> dict[str, Any]:
    """What a log line about a request names: its id (the records' label), tenant, namespace and
    the decision it acts on, when known; never its prompt or tokens."""
    if st is None:
        return {}
    out: dict[str, Any] = {"request_id": st.label}
    if st.context is not None:
        out["tenant"], out["namespace"] = st.context.tenant, st.context.namespace
    if st.chosen is not None:
        out["decision_id"] = str(st.chosen.record.get("decision_id"))
    return out


def state_of(req: Any) -> _State | None:
    """The hook's state of an SGLang request (None before its first ``match_prefix``)."""
    st: _State | None = getattr(req, _STATE_ATTR, None)
    return st


class GovernedRadixCache(UnifiedRadixCache):  # type: ignore[misc]
    """``UnifiedRadixCache`` whose semantic reuse is decided by semgov (see the module docstring)."""

    gov: Governor | FollowerGovernor | None = None
    canaries: Canaries | None = None

    def attach(
        self,
        governor: Governor | FollowerGovernor,
        *,
        rope: RopeSpec | None,
        strict: bool,
        tp: TpLink | None = None,
        canaries: Canaries | None = None,
    ) -> None:
        """Turn governance on (called once by the backend factory, after SGLang built the tree; with
        tensor parallelism on every rank, rank 0 with the :class:`Governor`, see :mod:`.tp`)."""
        self.gov = governor
        self.canaries = canaries
        self.rope = rope
        self.strict = strict
        self.tp = tp
        self.boot = secrets.token_hex(4)
        self._now = 0.0  # with TP: the leader's clock at the last round start (see _clock)
        self._audit_seen: str | None = None  # with TP: the leader's audit state at that round start
        self._disable_pending: str | None = None  # with TP: reuse goes off at the next round start
        self._round_decisions: dict[int, list[SignedDecision]] = {}
        # NOTE: inside a prefill round (begin_round .. end_round, the plugin's AROUND hook) the
        # guard checks of the hook's changes run once, at the round's end (see _check).
        self._round_open = False
        self._deferred: list[tuple[str, _State | None]] = []
        # NOTE: with TP, the donors every rank submitted and rank 0 has not settled, bounded per
        # tenant the same way on every rank (a follower's copies; rank 0's mirror of them), and the
        # donors rank 0 added in this round's message (used only from the next round on).
        self.tp_pending: PendingDonors | None = None
        self._fresh: frozenset[str] = frozenset()
        if tp is not None:
            # NOTE: donor ids and isolated tree keys embed the boot id: the same on every rank.
            self.boot = str(tp.broadcast(self.boot))
            if isinstance(governor, Governor):
                governor.donors.donor_log = []
                self.tp_pending = PendingDonors(governor.settings.tp_pending_donors_per_tenant)
            else:
                self.tp_pending = governor.pending
        self._serials = itertools.count(1)
        # NOTE: requests the hook has state for, by server-side serial; weak, so a request SGLang
        # drops without telling the cache cannot keep its state (or the guard's view) alive.
        self.reqs: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self.pins = 0
        self.reuse_disabled: str | None = None
        self.guard = InvariantGuard(self)
        self.kv_pool = self.token_to_kv_pool_allocator.get_kvcache()
        # NOTE: per finished request, semgov's scheduler-thread nanoseconds (hold, match share,
        # realization, release), newest last; plus what no single request can be charged with.
        self.sched_ns: collections.deque[int] = collections.deque(maxlen=4096)
        self.sched_ns_unattributed = 0
        self._copy_ns = 0
        self.stats: dict[str, int] = {
            "decided_requests": 0,
            "decisions": 0,
            "allowed": 0,
            "realizations": 0,
            "realized_tokens": 0,
            "fallbacks": 0,
            "retractions": 0,
            "donors_registered": 0,
            "guard_checks": 0,
            "hook_errors": 0,
            "held": 0,
            "late_decisions": 0,
            "not_durable_in_time": 0,
        }

    # ---- identity --------------------------------------------------------------------------

    def _state(self, req: Any) -> _State:
        st = state_of(req)
        if st is not None:
            return st
        assert self.gov is not None
        serial = next(self._serials)
        ctx: RequestContext | None = None
        salt: str | None = None
        canary = False
        try:
            sent, lora = req.extra_key, getattr(req, "lora_id", None)
            raw_salt = getattr(req, "cache_salt", None) or None
            salt = raw_salt if isinstance(raw_salt, str) else None
            key = self.gov.context_key
            if self.canaries is not None and self.canaries.marker.verify(sent):
                # NOTE: this hook's own cold replay: a tree key of its own (no exact-prefix hit, nothing
                # shared), no context (no semantic reuse, never a donor).
                canary, derived = True, f"{KEY_PREFIX}canary:{self.boot}-{serial}"
            else:
                verdict = self.gov.verdict_of(sent, lora)
                ctx = verdict.context
                if ctx is not None:
                    derived = ctx.cache_key(key, salt)
                elif verdict.refused is not None:
                    # NOTE: a token that was sent and does not verify (expired, another audience, a
                    # key this server does not hold) never lands in a shared bucket: a key of its own.
                    derived = f"{KEY_PREFIX}anon:refused:{self.boot}-{serial}"
                else:
                    derived = anonymous_cache_key(key, sent, lora, salt)
        except Exception as e:  # noqa: BLE001 - a key that cannot be derived shares nothing
            self._hook_error("context", None, e)
            ctx, derived = None, f"{KEY_PREFIX}anon:isolated:{self.boot}-{serial}"
        st = _State(serial, request_label(req.rid), ctx, derived, salt, canary=canary)
        if canary:
            req.skip_radix_cache_insert = True  # NOTE: a replay's KV is nobody's prefix
        if getattr(req, "session", None) is not None:
            try:
                self._session_check(req, st)
            except Exception as e:  # noqa: BLE001 - any doubt: nothing shared, no reuse
                self._hook_error("session", None, e)
                st.context, st.cache_key = None, f"{KEY_PREFIX}anon:isolated:{self.boot}-{serial}"
        setattr(req, _STATE_ATTR, st)
        self.reqs[serial] = req
        # NOTE: isolation by the cache key: whatever the caller sent, the exact tree is keyed
        # server-side by tenant, namespace, adapter and salt (or by a keyed hash of what it sent).
        req.extra_key = st.cache_key
        return st

    def _session_check(self, req: Any, st: _State) -> None:
        """An SGLang session request continues another request's tokens (and, streaming, its KV)
        under this request's own ``extra_key``: it is served only within the tree key the session's
        first request had, and never from a streaming session (its KV bypasses the tree's keys).
        Otherwise the request is refused as SGLang refuses a bad session request (its prompt cut to
        one token, aborted before any prefill when seen in :meth:`hold_back`), with a key of its own.
        """
        session = req.session
        why: str | None = None
        if req.to_finish is not None:
            return  # NOTE: SGLang refused it already (a bad session request): nothing runs, nothing binds
        if getattr(session, "streaming", False):
            why = "streaming sessions are not served with semgov (their KV bypasses the tree's keys)"
        else:
            bound = getattr(session, _SESSION_ATTR, None)
            if bound is None:
                setattr(session, _SESSION_ATTR, st.cache_key)
            elif bound != st.cache_key:
                why = "this session belongs to another tenant, namespace, adapter or cache salt"
        if why is None:
            return
        self.stats["session_refused"] = self.stats.get("session_refused", 0) + 1
        get_logger().warning("semgov refused a session request", reason=why, **log_fields(st))
        st.context, st.cache_key = None, f"{KEY_PREFIX}anon:session-refused:{self.boot}-{st.serial}"
        req.set_finish_with_abort(f"semgov: {why}")

    def donor_id(self, st: _State) -> str:
        """A donor's id: this process's boot id and the request's serial (never the client's rid)."""
        return f"sglang-{self.boot}-{st.serial}"

    def live_states(self) -> list[_State]:
        """States of the requests the hook still tracks (waiting, running or retracted)."""
        return [st for _, st in self._live()]

    def _live(self) -> Iterator[tuple[Any, _State]]:
        for req in list(self.reqs.values()):
            st = state_of(req)
            if st is not None:
                yield req, st

    # ---- SGLang's calls ----------------------------------------------------------------------

    def reset(self) -> None:
        super().reset()
        if self.gov is None:
            return
        for _, st in self._live():
            st.chosen = None  # the donors' KV is gone
            st.private = None  # SGLang clears the allocator with the tree
        self.gov.forget_all_donors()

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        req = params.req
        if self.gov is None or req is None:
            return super().match_prefix(params)
        t0 = time.perf_counter_ns()
        if self.tp is None:  # NOTE: with TP the registry changes only at round starts (sync_round)
            try:
                self.gov.drain_donors()
            except Exception as e:  # noqa: BLE001 - a registry problem costs reuse, never the scheduler
                self._hook_error("drain_donors", req, e)
        st = self._state(req)  # NOTE: total: whatever the client sent, the request gets a key
        t1 = time.perf_counter_ns()
        key = params.key
        if key.extra_key != req.extra_key:
            key = RadixKey(
                key.token_ids,
                req.extra_key,
                is_bigram=key.is_bigram,
                limit=key.limit,
                cache_salt=key.cache_salt,
            )
            params = MatchPrefixParams(key=key, cow_mamba=params.cow_mamba, req=req)
        result = super().match_prefix(params)
        t2 = time.perf_counter_ns()
        try:
            return self._govern_match(req, st, key, result)
        except InvariantViolation:
            raise
        except Exception as e:  # noqa: BLE001 - any doubt: this request runs cold
            self._hook_error("match_prefix", req, e)
            self._drop_plan(st)
            return result
        finally:
            st.sched_ns += t1 - t0 + time.perf_counter_ns() - t2  # semgov's share, not SGLang's match

    def _govern_match(self, req: Any, st: _State, key: RadixKey, result: MatchResult) -> MatchResult:
        assert self.gov is not None
        if self.reuse_disabled is not None or st.context is None or req.kv.holds_kv:
            return result
        m = int(result.device_prefix_len)
        limit = min(len(key), len(req.origin_input_ids))
        if st.private is not None:
            if m == st.private_base:
                # NOTE: the realized run stays the request's own: protected only up to the exact match.
                return result._replace(device_prefix_len=m + int(st.private.numel()), cache_protected_len=m)
            self._release_private(st)  # the exact match moved: the realized run no longer fits
            return result
        if not st.decided:
            self._begin(st, req, m, limit)
        self._collect(st)
        if st.chosen is None:
            return result
        k = planned_tokens(self._spans(st.chosen, st), m, limit, st.donor_len, self.page_size)
        st.regions = self._regions(st.chosen, st, m + k, limit, st.donor_len)
        if k == 0:
            return result
        return result._replace(
            host_hit_length=k,
            last_host_node=result.last_device_node,
            best_match_node=result.last_device_node,
            full_kv_hit_length=max(int(result.full_kv_hit_length), m + k),
        )

    def init_load_back(self, params: InitLoadBackParams) -> tuple[int, Any]:
        req = params.req
        assert req is not None
        st = state_of(req) if self.gov is not None else None
        if st is None or st.chosen is None or st.private is not None or self.reuse_disabled is not None:
            # NOTE: host hits only ever come from this hook (hierarchical caching is refused at build).
            return 0, req.last_node
        t0, copy0 = time.perf_counter_ns(), st.copy_ns
        try:
            return self._realize(st, req)
        except InvariantViolation:
            raise
        except Exception as e:  # noqa: BLE001 - _realize handles its own failures; this is a bug
            self._hook_error("init_load_back", req, e)
            self._drop_plan(st)
            return 0, req.last_node
        finally:
            st.sched_ns += time.perf_counter_ns() - t0 - (st.copy_ns - copy0)  # the copy is counted apart

    def load_back_is_cache_owned(self) -> bool:
        # NOTE: realized slots are the request's own: cache_protected_len stays at the exact match.
        return False

    def prefix_device_indices(self, req: Any) -> torch.Tensor:
        st = state_of(req) if self.gov is not None else None
        if st is None or st.private is None or req.kv.holds_kv:
            base: torch.Tensor = super().prefix_device_indices(req)
            return base
        root = self.root_node_handle(req.extra_key)
        path = self.tree_core.collect_full_device_indices(req.last_node, root)[: st.private_base]
        out = torch.cat([path.to(torch.int64), st.private.to(torch.int64)])
        assert len(out) == req.prefix_len, (st.label, len(out), req.prefix_len)
        return out

    def on_release(self, req: Any, *, checkpointed: bool) -> None:
        super().on_release(req, checkpointed=checkpointed)
        if self.gov is None:
            return
        st = state_of(req)
        t0 = time.perf_counter_ns()
        try:
            if st is None:
                return
            touched = st.recipient or st.private is not None
            self._release_state(req, st, checkpointed)
            # NOTE: the guard runs where the hook changed the pool: after every realization, and
            # at the release of every request that received (or holds) realized slots. A release
            # of a request the hook never gave KV is SGLang's own accounting, not re-checked here.
            if touched:
                self._check("release", st, exclude=req)
        except InvariantViolation:
            raise
        except Exception as e:  # noqa: BLE001 - bookkeeping failed: stop reusing, keep serving
            self._hook_error("on_release", req, e)
            self._disable(f"on_release of request {st.label if st else '?'} failed: {describe_error(e)}", st)
        finally:
            if st is not None:
                st.sched_ns += time.perf_counter_ns() - t0
                if req.finished():
                    self.sched_ns.append(st.sched_ns)

    def _release_state(self, req: Any, st: _State, checkpointed: bool) -> None:
        assert self.gov is not None
        st.private = None  # the row held the realized slots and release_kv_cache just freed them
        if not req.finished():
            # NOTE: a retracted request comes back with the same Req: it keeps its decisions (one
            # request, one set of signed decisions) and may be realized again under them.
            st.retractions += 1
            self.stats["retractions"] += 1
            return
        self.reqs.pop(st.serial, None)
        aborted = isinstance(req.finished_reason, FINISH_ABORT)
        if self.canaries is not None and st.shifted and st.context is not None and not aborted:
            dec = st.chosen
            self.canaries.offer(
                req,
                request_id=st.label,
                decision_id=str(dec.record["decision_id"]) if dec is not None else None,
                donor_id=st.donor.donor_id if st.donor is not None else None,
                ctx=st.context,
            )
        if (
            checkpointed
            and st.context is not None
            and not st.recipient
            and not aborted
            and self.reuse_disabled is None
        ):
            self._submit_donor(
                DonorSpec(
                    donor_id=self.donor_id(st),
                    context=st.context,
                    cache_key=st.cache_key,
                    cache_salt=st.cache_salt,
                    token_ids=array("q", req.origin_input_ids),
                    text=None,
                )
            )

    def _submit_donor(self, spec: DonorSpec) -> None:
        """Hand a finished request over for registration; with TP, only within its tenant's quota of
        donors not yet settled (the same on every rank: a follower keeps its copy there)."""
        assert self.gov is not None
        if isinstance(self.gov, FollowerGovernor):
            admitted = bool(self.gov.submit_donor(spec))  # NOTE: its copy, kept in self.tp_pending
        elif self.tp_pending is not None and not self.tp_pending.admit(spec):
            admitted = False
        else:
            self.gov.submit_donor(spec)
            admitted = True
        if not admitted:
            self.stats["donors_refused"] = self.stats.get("donors_refused", 0) + 1
            return
        self.stats["donors_registered"] += 1

    def release_aborted_request(self, request: Any) -> None:
        super().release_aborted_request(request)
        if self.gov is None:
            return
        try:
            touched = False
            for req, st in self._live():
                # NOTE: SGLang hands over the request's own handle object: identity, not its rid.
                if getattr(req, "cache_request_handle", None) is not request:
                    continue
                touched = touched or st.recipient or st.private is not None
                self._release_private(st)
                if not req.kv.holds_kv:
                    self.reqs.pop(st.serial, None)  # aborted while waiting: no release follows
            if touched:
                self._check("abort", None)
        except InvariantViolation:
            raise
        except Exception as e:  # noqa: BLE001
            self._hook_error("release_aborted_request", None, e)

    # ---- decisions ---------------------------------------------------------------------------

    def _donor_path(self, entry: LiveDonor) -> tuple[int, Any]:
        ids = entry.token_ids
        toks = ids if isinstance(ids, array) and ids.typecode == "q" else array("q", ids)
        key = RadixKey(toks, entry.cache_key, cache_salt=entry.cache_salt)
        r = UnifiedRadixCache._match_tree(self, MatchPrefixParams(key=key))
        return int(r.device_prefix_len), r.last_device_node

    def _begin(self, st: _State, req: Any, m: int, limit: int) -> None:
        """Queue the request's candidate search and decision (once), if it has donors to look at."""
        assert self.gov is not None
        st.decided = True
        if st.context is None or limit - m < self.gov.settings.min_unmatched_tokens:
            return
        if not self.gov.has_donors(st.context, st.cache_salt):
            return  # NOTE: nothing of its scope is registered: no decision, nothing to wait for
        st.m0, st.limit0 = m, limit
        st.queued_at = self._clock()
        st.deadline = st.queued_at + self.gov.settings.decision_timeout_ms / 1000
        st.pending = self.gov.decide_later(st.label, st.context, st.cache_salt, req.origin_input_ids)

    def _clock(self) -> float:
        """``time.monotonic()``; with TP, the leader's at the round start (every rank the same)."""
        return self._now if self.tp is not None else time.monotonic()

    def _audit_broken(self) -> str | None:
        assert self.gov is not None
        return self._audit_seen if self.tp is not None else self.gov.audit_broken

    def _collect(self, st: _State) -> None:
        """Take a finished decision: the allowed donor with live KV whose plan realizes the most.

        NOTE: with TP this happens only at round starts (:meth:`sync_round`), on every rank alike.
        """
        job = st.pending
        if self.tp is not None or job is None or not job.done:
            return
        choice, donor = self._choose(st, job)
        self._take(st, choice, donor, job.decisions)

    def _choose(self, st: _State, job: PendingDecision) -> tuple[Choice, LiveDonor | None]:
        """The best allowed donor of a finished decision (changes nothing of ``st``)."""
        assert self.gov is not None
        best, chosen, donor, donor_len, allowed = 0, None, None, 0, 0
        probed: list[tuple[str, int]] = []
        for dec, (entry, _) in zip(job.decisions, job.candidates, strict=False):
            if dec.decision != "allow":
                continue
            allowed += 1
            if self.tp is not None and (
                self.gov.donor(entry.donor_id) is None or entry.donor_id in self._fresh
            ):
                continue  # NOTE: the other ranks know only donors added in an earlier round
            # NOTE: liveness is measured here, on the scheduler thread, and only for allowed donors.
            d_len, _ = self._donor_path(entry)
            probed.append((entry.donor_id, d_len))
            if d_len == 0:
                self.gov.drop_donor(entry.donor_id)  # evicted: nothing left to reuse
                continue
            k = planned_tokens(self._spans(dec, st), st.m0, st.limit0, d_len, self.page_size)
            k += sum(r.length for r in self._regions(dec, st, st.m0 + k, st.limit0, d_len))
            if k > best:
                best, chosen, donor, donor_len = k, dec, entry, d_len
        durable = (
            chosen is not None
            and self.tp is not None
            and self.gov.decision_durable(str(chosen.record["decision_id"]), 0)
        )
        choice = Choice(
            st.serial,
            st.label,
            len(job.decisions),
            bool(job.candidates),
            allowed,
            chosen,
            donor.donor_id if donor is not None else None,
            donor_len,
            durable,
            tuple(probed),
        )
        return choice, donor

    def _take(self, st: _State, c: Choice, donor: LiveDonor | None, decisions: list[SignedDecision]) -> None:
        assert self.gov is not None
        st.pending = None
        st.decided_s = self._clock() - st.queued_at
        st.decisions = decisions
        self.stats["decided_requests"] += c.had_candidates
        self.stats["decisions"] += c.decisions
        self.stats["allowed"] += c.allowed
        st.chosen, st.donor, st.donor_len = c.chosen, donor, c.donor_len
        if st.chosen is None and c.allowed:
            self._unrealized(st, c, decisions)
        if st.chosen is not None:
            st.durable = st.durable or c.durable
            st.deadline = self._clock() + self.gov.settings.audit_wait_ms / 1000

    def _unrealized(self, st: _State, c: Choice, decisions: list[SignedDecision]) -> None:
        """An allow that is not acted on says why (an engine event; a follower rank writes none)."""
        assert self.gov is not None
        live = dict(c.probed)
        for dec in decisions:
            if dec.decision != "allow":
                continue
            donor_id = str(dec.record["donor_id"])
            if live.get(donor_id, 0) == 0:
                why: str | None = "the donor's KV was evicted before its decision could be acted on"
            else:
                cfg = self.gov.settings
                why = unrealizable_reason(
                    dec.approved_spans,
                    self._spans(dec, st),
                    st.m0,
                    max_regions=cfg.max_regions,
                    min_region_tokens=cfg.min_region_tokens,
                    page_size=self.page_size,
                )
            if why is not None:
                self.stats["unrealizable"] = self.stats.get("unrealizable", 0) + 1
                self.gov.event(
                    "realization_failed",
                    request_id=st.label,
                    decision_id=str(dec.record["decision_id"]),
                    donor_id=donor_id,
                    detail=why,
                )
            return

    def _spans(self, dec: SignedDecision, st: _State) -> list[Any]:
        """What of a decision's approved spans is copied: all of it, less each span's leading tokens
        the record plans to recompute and, of shifted spans, at least the share the settings
        recompute (``SEMGOV_SHIFTED_RECOMPUTE_PCT``); no shifted span where canaries turned shifted
        reuse off for the request's scope, nor, while its scope is on probation, for a request no
        canary can replay (:meth:`~engine_hooks.core.canary.Canaries.shifted_ok`)."""
        assert self.gov is not None
        spans = dec.approved_spans
        ctx = st.context
        if (
            self.canaries is not None
            and ctx is not None
            and not self.canaries.shifted_ok(ctx, self.reqs.get(st.serial))
        ):
            spans = [s for s in spans if s["kind"] != "shifted"]
        return recompute_leading(spans, self.gov.settings.shifted_recompute_pct / 100)

    def _regions(
        self, dec: SignedDecision, st: _State, start: int, limit: int, donor_len: int
    ) -> tuple[Region, ...]:
        assert self.gov is not None
        cfg = self.gov.settings
        if cfg.max_regions == 0:
            return ()
        return tuple(
            plan_regions(
                self._spans(dec, st),
                start,
                limit,
                donor_len,
                self.page_size,
                max_regions=cfg.max_regions,
                min_tokens=cfg.min_region_tokens,
            )
        )

    # ---- admission: held back until decided ---------------------------------------------------

    def hold_back(self, waiting: list[Any]) -> list[Any]:
        """Scheduler thread, before a prefill round: the waiting requests to keep out of it.

        Those whose decision, or whose allow record's durability, is not ready before their
        deadline. The caller takes them out of the round and puts them back after it. A request
        not seen yet is not held here: its first ``match_prefix`` in the round queues its decision
        and :meth:`holds` keeps it out of that round's batch. Never waits, never raises.
        """
        if self.gov is None:
            return []
        t0 = time.perf_counter_ns()
        for req in waiting:
            if getattr(req, "session", None) is not None and state_of(req) is None:
                self._state(req)  # NOTE: a session request is checked before any round matches it
        if self.reuse_disabled is not None:
            self.sched_ns_unattributed += time.perf_counter_ns() - t0
            return []
        if self.canaries is not None and waiting:
            self.canaries.busy()  # NOTE: requests are waiting: no canary replay for a while
        if self.tp is None:
            try:
                self.gov.drain_donors()
            except Exception as e:  # noqa: BLE001 - a registry problem costs reuse, never the scheduler
                self._hook_error("drain_donors", None, e)
        held = [req for req in waiting if self._held(req)]
        self.stats["held"] += len(held)
        self.sched_ns_unattributed += time.perf_counter_ns() - t0
        return held

    def holds(self, req: Any) -> bool:
        """Scheduler thread, at admission (the prefill adder's ``add_one_req``): keep ``req`` out of
        this batch (its decision or durable allow record is not ready yet)? Never raises."""
        if self.gov is None or self.reuse_disabled is not None:
            return False
        held = self._held(req)
        self.stats["held"] += held
        return held

    def _held(self, req: Any) -> bool:
        st = state_of(req)
        if st is None or req.kv.holds_kv:
            return False  # NOTE: never seen (no decision queued) or already admitted
        t0 = time.perf_counter_ns()
        try:
            return self._must_wait(st, self._clock())
        except InvariantViolation:
            raise
        except Exception as e:  # noqa: BLE001 - any doubt: admit it, it runs cold
            self._hook_error("hold", req, e)
            st.pending, st.chosen = None, None
            return False
        finally:
            st.sched_ns += time.perf_counter_ns() - t0

    def _must_wait(self, st: _State, now: float) -> bool:
        held = self._wait(st, now)
        if not held and st.queued_at and not st.held_s:
            st.held_s = now - st.queued_at
        return held

    def _wait(self, st: _State, now: float) -> bool:
        assert self.gov is not None
        self._collect(st)
        if st.pending is not None:
            if now < st.deadline:
                return True
            # NOTE: late: the decision thread still finishes and audits it; it is never acted on.
            st.pending = None
            self.stats["late_decisions"] += 1
            return False
        if st.chosen is None or st.durable:
            return False
        if self.tp is None:  # NOTE: with TP, durability arrives at round starts (sync_round)
            st.durable = self.gov.decision_durable(str(st.chosen.record["decision_id"]), 0)
        if st.durable or self._audit_broken() is not None:
            return False
        if now < st.deadline:
            return True
        self.stats["not_durable_in_time"] += 1
        return False  # admitted; init_load_back finds the record not durable and audits the fallback

    def _drop_plan(self, st: _State) -> None:
        self._release_private(st)
        st.chosen = None

    def _release_private(self, st: _State) -> None:
        req = self.reqs.get(st.serial)
        if st.private is not None and (req is None or not req.kv.holds_kv):
            self.token_to_kv_pool_allocator.free(st.private)
        st.private = None

    # ---- realization -------------------------------------------------------------------------

    def _realize(self, st: _State, req: Any) -> tuple[int, Any]:
        assert self.gov is not None and st.chosen is not None and st.donor is not None
        m = int(req.prefix_len)
        limit = min(
            req._compute_max_prefix_len(len(req.full_untruncated_fill_ids)), len(req.origin_input_ids)
        )
        decision_id = str(st.chosen.record["decision_id"])
        slots: torch.Tensor | None = None
        err: BaseException | None = None
        pieces: list[Piece] = []
        try:
            pieces = plan_pieces(self._spans(st.chosen, st), m, limit, st.donor_len, self.page_size)
            k = sum(p.length for p in pieces)
            if k == 0 or k != req.host_hit_length:
                raise RealizationError(f"planned {k} tokens, admission promised {req.host_hit_length}")
            slots, _ = self._copy_from_donor(st, pieces, decision_id)
        except Exception as e:  # noqa: BLE001 - any doubt: run cold
            err = e
        err = self._agree(slots, err)
        if err is not None or slots is None:
            self._fallback(st, decision_id, err or RealizationError("nothing copied"))
            return 0, req.last_node
        k = int(slots.numel())
        st.private, st.private_base, st.pieces = slots, m, tuple(pieces)
        self._realized(st, req, slots, pieces, decision_id, "front")
        return k, req.last_node

    def _copy_from_donor(
        self, st: _State, pieces: list[Piece], decision_id: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh slots holding the donor's K/V for ``pieces`` (keys re-rotated): the allow record
        durable, the donor re-matched live, pinned only for this call, its tokens checked against
        the recipient's. Raises :class:`RealizationError` (or any error) having freed what it took."""
        assert self.gov is not None and st.donor is not None
        req = self.reqs.get(st.serial)
        if req is None:
            raise RealizationError("the request is no longer tracked")
        if not st.durable and self.tp is None:
            st.durable = self.gov.decision_durable(decision_id, 0)  # NOTE: polled, never waited for
        if not st.durable:
            why = self._audit_broken() or "not yet"
            raise RealizationError(f"the allow decision is not durable in the audit log ({why})")
        d_len, node = self._donor_path(st.donor)
        need = max(p.donor_start + p.length for p in pieces)
        if d_len < need:
            raise RealizationError(f"the donor's live KV covers {d_len} tokens, {need} needed")
        # NOTE: the donor is pinned only while this call copies from it: eviction for the
        # allocation below must not take it, and nothing else ever holds a pin.
        pin = self.lock(node)
        self.pins += 1
        slots: torch.Tensor | None = None
        try:
            rt = _int64(req.origin_input_ids)
            dt = _int64(st.donor.token_ids)
            for p in pieces:
                r0, d0, n = p.recipient_start, p.donor_start, p.length
                # NOTE: token identity against the donor's tokens, whose tree path the re-match
                # above just found live (the match itself compares them token by token).
                if not np.array_equal(rt[r0 : r0 + n], dt[d0 : d0 + n]):
                    raise RealizationError(f"tokens differ at recipient {r0}..{r0 + n}")
            root = self.root_node_handle(st.donor.cache_key)
            donor_slots = self.tree_core.collect_full_device_indices(node, root)[:d_len].to(torch.int64)
            src = torch.cat([donor_slots[p.donor_start : p.donor_start + p.length] for p in pieces])
            slots = self._alloc(sum(p.length for p in pieces))
            self._copy(src, slots, pieces)
            st.copy_ns += self._copy_ns
            st.src_slots = src
            return slots, src
        except BaseException:
            if slots is not None:
                self.token_to_kv_pool_allocator.free(slots)
            raise
        finally:
            self._unpin(pin)

    def _fallback(self, st: _State, decision_id: str, e: BaseException) -> None:
        """An allowed reuse was not made: audited, and the request runs cold from here."""
        assert self.gov is not None
        st.chosen, st.regions = None, ()
        self.stats["fallbacks"] += 1
        self.gov.event(
            "realization_failed",
            request_id=st.label,
            decision_id=decision_id,
            donor_id=st.donor.donor_id if st.donor is not None else None,
            detail=describe_error(e),
        )
        self._check("realization_failed", st)

    def _realized(
        self, st: _State, req: Any, slots: torch.Tensor, pieces: list[Piece], decision_id: str, where: str
    ) -> None:
        assert self.gov is not None and st.donor is not None
        k = int(slots.numel())
        st.recipient = True
        st.shifted = st.shifted or any(p.shift for p in pieces)
        st.realizations += 1
        req.skip_radix_cache_insert = True
        self.stats["realizations"] += 1
        self.stats["realized_tokens"] += k
        self.gov.event(
            "realization",
            request_id=st.label,
            decision_id=decision_id,
            donor_id=st.donor.donor_id,
            materialized_tokens=k,
            # NOTE: slot ids are read back only from a host pool: on an accelerator that would be
            # a device-to-host sync on the scheduler thread.
            slots=slots.tolist() if slots.device.type == "cpu" else (),
            spans=[p.as_span() for p in pieces],
            detail=f"serial {self.boot}-{st.serial}; realization {st.realizations}; {where}",
        )
        self._check("realization", st)

    # ---- regions: approved runs after fresh tokens (a chunk ends where each starts) ----------

    def chunk_cap(self, req: Any, has_chunked_req: bool) -> int | None:
        """Scheduler thread, before the prefill adder admits ``req``: the most tokens its first
        chunk may extend so that it ends where its first region starts (None: no cap; 0: keep it
        out of this round, another request is mid-chunk and SGLang tracks one). Never raises."""
        st = state_of(req) if self.gov is not None else None
        if st is None or not st.regions or req.kv.holds_kv or self.reuse_disabled is not None:
            return None
        try:
            assert self.gov is not None
            cap = st.regions[0].start - int(req.prefix_len) - int(req.host_hit_length)
            if cap <= 0:
                st.regions = ()
                return None
            if has_chunked_req:
                now = self._clock()
                if not st.region_deadline:
                    st.region_deadline = now + self.gov.settings.decision_timeout_ms / 1000
                if now < st.region_deadline:
                    return 0
                st.regions = ()  # NOTE: waited long enough for a free chunk slot: computed instead
                return None
            return cap
        except Exception as e:  # noqa: BLE001 - any doubt: no regions, the request is computed
            self._hook_error("chunk_cap", req, e)
            st.regions = ()
            return None

    def chunk_limit(self, req: Any) -> int | None:
        """Scheduler thread, before a chunked request's next chunk: its most tokens (ending at its
        next region), or None. Never raises."""
        st = state_of(req) if self.gov is not None else None
        if st is None or not st.regions or self.reuse_disabled is not None:
            return None
        try:
            cap = st.regions[0].start - int(req.prefix_len)
            if cap <= 0:
                st.regions = tuple(r for r in st.regions if r.start > int(req.prefix_len))
                return None
            return cap
        except Exception as e:  # noqa: BLE001 - any doubt: no regions, the request is computed
            self._hook_error("chunk_limit", req, e)
            st.regions = ()
            return None

    def advance_chunked(self, req: Any) -> int:
        """Scheduler thread, before a prefill round, for SGLang's chunked request: if its computed
        prefix ends where its next region starts, copy the region's K/V into fresh slots and append
        them to the request's row (its prefix then ends after the region, so the next chunk starts
        there). Returns the tokens realized (0: nothing to do, or any doubt: computed). Never raises.

        NOTE: the region's slots are the request's own from the moment they are in its row:
        between ``cache_protected_len`` and ``kv_allocated_len``, freed with the row, counted by
        SGLang as ``uncached``; this runs before the round's prefill adder measures free space.
        """
        st = state_of(req) if self.gov is not None else None
        if st is None or not st.regions or self.reuse_disabled is not None or not req.kv.holds_kv:
            return 0
        t0, copy0 = time.perf_counter_ns(), st.copy_ns
        try:
            return self._advance(st, req)
        except InvariantViolation:
            raise
        except Exception as e:  # noqa: BLE001 - _advance handles its own failures; this is a bug
            self._hook_error("advance_chunked", req, e)
            st.regions = ()
            return 0
        finally:
            st.sched_ns += time.perf_counter_ns() - t0 - (st.copy_ns - copy0)

    def _advance(self, st: _State, req: Any) -> int:
        assert self.gov is not None
        region, at = st.regions[0], int(req.prefix_len)
        if at != region.start:
            if at > region.start:  # NOTE: a chunk went past it (SGLang aligned it otherwise): computed
                st.regions = tuple(r for r in st.regions if r.start > at)
            return 0
        if st.chosen is None or st.donor is None:
            st.regions = ()
            return 0
        decision_id = str(st.chosen.record["decision_id"])
        kv = req.kv
        slots: torch.Tensor | None = None
        err: BaseException | None = None
        try:
            if int(kv.kv_allocated_len) != at or region.end >= len(req.full_untruncated_fill_ids):
                raise RealizationError(
                    f"row holds {kv.kv_allocated_len} tokens, region {region.start}..{region.end} "
                    f"of a {len(req.full_untruncated_fill_ids)}-token prompt"
                )
            slots, _ = self._copy_from_donor(st, list(region.pieces), decision_id)
        except Exception as e:  # noqa: BLE001 - any doubt: run cold from here
            err = e
        err = self._agree(slots, err)
        if err is not None or slots is None:
            self._fallback(st, decision_id, err or RealizationError("nothing copied"))
            return 0
        pool = self.req_to_token_pool
        pool.write((kv.req_pool_idx, slice(at, region.end)), slots.to(pool.req_to_token.dtype))
        kv.kv_allocated_len = region.end
        kv.kv_committed_len = region.end
        req.prefix_len = region.end
        req.extend_end = region.end
        st.regions = st.regions[1:]
        st.regions_realized += 1
        self._realized(st, req, slots, list(region.pieces), decision_id, f"region at {at}")
        return region.length

    def _agree(self, slots: torch.Tensor | None, err: BaseException | None) -> BaseException | None:
        """With TP, a realization stands only if every rank's copy of its shard succeeded (one
        ``all_reduce``; every rank reaches it at the same call); otherwise this rank's slots are
        freed and the request runs cold on every rank. Without TP: ``err`` unchanged."""
        if self.tp is None or self.tp.all(err is None):
            return err
        if slots is not None:
            self.token_to_kv_pool_allocator.free(slots)
        return err or RealizationError("another tensor-parallel rank could not copy its KV shard")

    def _copy(self, src: torch.Tensor, dst: torch.Tensor, pieces: list[Piece]) -> None:
        """Copy on the scheduler's current stream: the next forward runs on it or waits on it."""
        shifted = any(p.shift for p in pieces)
        delta: torch.Tensor | None = None
        if shifted:
            host = np.concatenate([np.full(p.length, p.shift, dtype=np.int64) for p in pieces])
            delta = torch.from_numpy(host)
            if dst.device.type != "cpu":
                delta = delta.pin_memory().to(dst.device, non_blocking=True)
        # NOTE: src comes from the tree's live path and dst from the allocator, so they are in
        # range, unique and disjoint by construction; the device-side checks (host syncs on an
        # accelerator) run only on a host pool.
        t0 = time.perf_counter_ns()
        copy_kv(self.kv_pool, src, dst, delta, self.rope, check=dst.device.type == "cpu")
        self._copy_ns = time.perf_counter_ns() - t0

    def _alloc(self, n: int) -> torch.Tensor:
        evict_from_tree_cache(self, n)
        out: torch.Tensor | None = self.token_to_kv_pool_allocator.alloc(n)
        if out is None:
            raise RealizationError(f"no room for {n} realized tokens")
        return out.to(torch.int64)

    def _unpin(self, pin: Any) -> None:
        if pin is not None:
            self.unlock(pin)
            self.pins -= 1

    # ---- the guard ---------------------------------------------------------------------------

    def pending_private(self) -> int:
        """Realized slots the hook holds that are not yet in a request's row."""
        n = 0
        for req, st in self._live():
            if st.private is not None and not req.kv.holds_kv:
                n += int(st.private.numel())
        return n

    def begin_round(self) -> None:
        """Scheduler thread, a prefill round starts (the plugin's hook): defer guard checks."""
        self._round_open = True

    def end_round(self) -> None:
        """Scheduler thread, the prefill round ended (its batch built, before its forward): one
        guard check for every realization or failed one in it, its cost shared among their
        requests. Raises only :class:`InvariantViolation` (``strict``)."""
        self._round_open = False
        if not self._deferred or self.gov is None:
            self._deferred = []
            return
        pending, self._deferred = self._deferred, []
        t0 = time.perf_counter_ns()
        try:
            parts = [w + (f" of request {st.label}" if st is not None else "") for w, st in pending[:8]]
            more = f" and {len(pending) - 8} more" if len(pending) > 8 else ""
            self._check_now(", ".join(parts) + more, None)
        finally:
            share = (time.perf_counter_ns() - t0) // len(pending)
            for _, st in pending:
                if st is not None:
                    st.sched_ns += share

    def _check(self, where: str, st: _State | None, *, exclude: Any = None) -> None:
        """Check the pool now, or, inside a prefill round, once at its end (:meth:`end_round`).

        NOTE: the check reads the tree's evictable size, which SGLang's tree core recomputes after
        the tree changed (up to about 1.3 ms measured): once per round instead of once per
        realization. The round's batch is checked before its forward runs; a release
        (``exclude``) is checked at once.
        """
        if self._round_open and exclude is None:
            self._deferred.append((where, st))
            return
        self._check_now(where, st, exclude=exclude)

    def _check_now(self, where: str, st: _State | None, *, exclude: Any = None) -> None:
        assert self.gov is not None
        self.stats["guard_checks"] += 1
        owners = [r for r, _ in self._live() if r is not exclude]
        problem = self.guard.check(owners, self.pending_private())
        if problem is None and self.pins != 0:
            problem = f"donor pins: {self.pins} still held outside a realization"
        if problem is None:
            return
        who = f" of request {st.label}" if st is not None else ""
        self._disable(f"after {where}{who}: {problem}", st)

    def _hook_error(self, where: str, req: Any, e: BaseException) -> None:
        self.stats["hook_errors"] += 1
        st = state_of(req) if req is not None else None
        get_logger().error(
            "semgov hook error: the request runs without semantic reuse",
            where=where,
            error=describe_error(e),
            **log_fields(st),
        )

    def _disable(self, reason: str, st: _State | None = None) -> None:
        assert self.gov is not None
        get_logger().error(
            "semgov invariant violation: semantic reuse disabled", reason=reason, **log_fields(st)
        )
        self.gov.event("invariant_violation", detail=reason)
        if self.tp is not None:
            # NOTE: ranks must change course together: reuse goes off on every rank at the next
            # round start (sync_round); a strict rank stops the server below in any case.
            self._disable_pending = self._disable_pending or reason
        else:
            self._turn_off(reason)
        if self.strict:
            raise InvariantViolation(reason)

    def _turn_off(self, reason: str) -> None:
        assert self.gov is not None
        first = self.reuse_disabled is None
        self.reuse_disabled = reason
        if first:
            for _, st in self._live():
                st.chosen, st.regions = None, ()
            self.gov.event("reuse_disabled", detail=reason)

    # ---- tensor parallelism: every rank applies rank 0's round (see engine_hooks.sglang.tp) ----

    def sync_round(self, waiting: list[Any], chunked: Any) -> None:
        """Scheduler thread, every rank, first thing in a prefill round with work: rank 0 sends
        what changed (finished decisions, durable records, registry changes, its clock), every
        rank applies it, and any rank that could not makes every rank turn reuse off.

        NOTE: the collectives run on every rank in the same order: whether this runs depends only
        on state every rank shares (the waiting queue, the chunked request, ``reuse_disabled``).
        """
        if self.tp is None or self.gov is None or self.reuse_disabled is not None:
            return
        if not waiting and chunked is None:
            return
        t0 = time.perf_counter_ns()
        msg = self._lead_round() if self.tp.leader else None
        try:
            msg = self.tp.broadcast(msg)
        except Exception as e:  # noqa: BLE001 - e.g. a message this rank cannot unpickle
            msg = RoundSync(time.monotonic(), None, disabled=f"the round message: {type(e).__name__}: {e}")
        try:
            problems = self._apply_round(msg)
        except Exception as e:  # noqa: BLE001 - a round this rank cannot apply turns reuse off
            problems = [f"applying the round failed: {type(e).__name__}: {e}"]
        if problems:
            get_logger().error("semgov TP round not applied", rank=self.tp.rank, problems=problems[:5])
        missed = isinstance(self.gov, FollowerGovernor) and bool(self.gov.missed)
        off, forget = self.tp.any_each((bool(problems) or self._disable_pending is not None, missed))
        if forget and not off:
            self._forget_fresh(msg)
        if off:
            why = self._disable_pending or (problems[0] if problems else None)
            self._disable_pending = None
            where = f"rank {self.tp.rank}: {why}" if why else f"a rank other than {self.tp.rank}"
            self._turn_off(f"tensor-parallel ranks cannot follow one plan ({where})")
            for _, st in self._live():
                self._drop_plan(st)
        # NOTE: the round's cost is charged to the waiting requests it was for (shared evenly).
        cost = time.perf_counter_ns() - t0
        charged = [st for st in (state_of(r) for r in waiting) if st is not None]
        for st in charged:
            st.sched_ns += cost // len(charged)
        if not charged:
            self.sched_ns_unattributed += cost

    def _forget_fresh(self, msg: RoundSync) -> None:
        """Every rank: a rank held no copy of a donor this round added: forget every donor the round
        added (none is used yet: a donor is chosen only from the round after its add), and keep
        reusing everything else."""
        assert self.gov is not None
        added = [op.donor_id for op in msg.donor_ops if op.kind == "add"]
        for donor_id in added:
            self.gov.drop_donor(donor_id)  # NOTE: on rank 0 also the provider's; sent as drops next round
        if isinstance(self.gov, FollowerGovernor):
            self.gov.missed.clear()
        self.stats["tp_donors_forgotten"] = self.stats.get("tp_donors_forgotten", 0) + len(added)
        if self.tp is not None and self.tp.leader:
            get_logger().warning("semgov TP: a rank missed a new donor; this round's new donors forgotten",
                                 donors=len(added))  # fmt: skip

    def _lead_round(self) -> RoundSync:
        """Rank 0: the round's message (never raises: a failure is itself the message)."""
        assert isinstance(self.gov, Governor)
        now = time.monotonic()
        try:
            self.gov.drain_donors()
            log = self.gov.donors.donor_log if self.gov.donors.donor_log is not None else []
            ops = tuple(
                DonorOp("add", e.donor_id, e.scope, e.cache_key, len(e.token_ids))
                if kind == "add"
                else DonorOp("drop", e.donor_id)
                for kind, e in log
            )
            log.clear()
            while True:
                try:
                    ops += (DonorOp("forget", self.gov.donors.unregistered.get_nowait()),)
                except queue.Empty:
                    break
            assert self.tp_pending is not None
            for op in ops:
                if op.kind != "drop":
                    self.tp_pending.settle(op.donor_id)  # NOTE: as every follower does with this message
            self._fresh = frozenset(op.donor_id for op in ops if op.kind == "add")
            choices: list[Choice] = []
            durable: list[int] = []
            self._round_decisions = {}
            for _, st in self._live():
                job = st.pending
                if job is not None and job.done:
                    choice, _ = self._choose(st, job)
                    choices.append(choice)
                    self._round_decisions[st.serial] = job.decisions
                elif st.chosen is not None and not st.durable:
                    if self.gov.decision_durable(str(st.chosen.record["decision_id"]), 0):
                        durable.append(st.serial)
            log.clear()  # NOTE: the drops of evicted donors: every rank finds them in its own probes
            return RoundSync(now, self.gov.audit_broken, ops, tuple(choices), tuple(durable))
        except Exception as e:  # noqa: BLE001 - every rank turns reuse off, audited
            return RoundSync(now, self.gov.audit_broken, disabled=f"rank 0: {type(e).__name__}: {e}")

    def _apply_round(self, msg: RoundSync) -> list[str]:
        """Every rank: apply rank 0's message. Returns what did not fit this rank's state."""
        assert self.gov is not None
        self._now, self._audit_seen = msg.now, msg.audit_broken
        problems = [msg.disabled] if msg.disabled else []
        if isinstance(self.gov, FollowerGovernor):
            self.gov.audit_broken = msg.audit_broken
            problems += self.gov.replay(msg.donor_ops)
        live = {st.serial: st for _, st in self._live()}
        decisions, self._round_decisions = self._round_decisions, {}
        for c in msg.choices:
            st = live.get(c.serial)
            if st is None or st.label != c.rid:
                problems.append(f"request serial {c.serial} ({c.rid}) is not this rank's")
                continue
            if isinstance(self.gov, FollowerGovernor):
                problems += self._probe_as_leader(c)
            donor = self.gov.donor(c.donor_id) if c.donor_id is not None else None
            if c.chosen is not None and donor is None:
                problems.append(f"donor {c.donor_id} is not registered on this rank")
                continue
            self._take(st, c, donor, decisions.get(c.serial, [c.chosen] if c.chosen else []))
        for serial in msg.durable:
            st = live.get(serial)
            if st is None:
                problems.append(f"request serial {serial} is not this rank's")
            elif st.chosen is not None:
                st.durable = True
        return problems

    def _probe_as_leader(self, c: Choice) -> list[str]:
        """A follower walks its tree to the donors rank 0 measured, in the same order (a walk can
        split nodes), drops those rank 0 found evicted, and reports a length rank 0 did not see."""
        assert isinstance(self.gov, FollowerGovernor)
        problems = []
        for donor_id, leader_len in c.probed:
            entry = self.gov.donor(donor_id)
            if entry is None:
                problems.append(f"donor {donor_id} is not registered on this rank")
                continue
            d_len, _ = self._donor_path(entry)
            if d_len != leader_len:
                problems.append(f"donor {donor_id}: {d_len} live tokens here, {leader_len} on rank 0")
            if d_len == 0:
                self.gov.drop_donor(donor_id)
        return problems
