"""The governed radix cache: SGLang's ``UnifiedRadixCache`` plus semgov-decided semantic reuse.

How a request flows through it (SGLang 0.5.23's scheduler calls, in order), and which piece does
the work (each piece receives the hook-wide :class:`~.state.Hook` and passes the request's
:class:`~.state.ReqState`, kept on SGLang's ``Req`` object itself, along):

0. :meth:`GovernedRadixCache.hold_back` (before every prefill round, from the plugin's AROUND
   hook on ``Scheduler.get_new_batch_prefill``): a request seen for the first time gets its
   server-side state, and ``req.extra_key`` is replaced with the key derived from its verified
   context (:mod:`.identity`), so tenants and namespaces never share exact-prefix nodes. When at
   least ``min_unmatched_tokens`` stay unmatched by the exact tree and the request has a verified
   context, its decision is queued for the decision thread, once per request (retraction
   included; :mod:`.decisions`). The request is then held out of the round (not blocking it) until
   its decision is done and, for an allow, its record durable, or until its deadline
   (``decision_timeout_ms``, then ``audit_wait_ms``), after which it is admitted and runs cold
   (:mod:`.admission`).
1. ``match_prefix`` (every waiting request, every scheduling round): the exact match runs as
   usual (a request the round hook has not seen is given its state and decision here). Once the
   decision is taken (its copyable spans computed once, :mod:`.decisions`), the reusable run of the
   best allowed donor (approved spans contiguous from the exact-match end, inside the donor's live
   KV, page-aligned) is reported as a *host hit* (:mod:`.admission`). Nothing is allocated,
   pinned, decided or waited for here.
2. ``init_load_back`` (admission, only when that request is admitted): the allow record must
   already be durable (never waited for here); the donor is re-matched and pinned for this call
   only, tokens checked, fresh slots allocated and the donor's K/V copied into them (keys
   re-rotated for shifted spans), audited, the pool checked; any problem frees what was taken and
   returns 0: the request runs cold (:mod:`.realize`).
3. ``prefix_device_indices`` (row allocation): the exact-match path followed by the realized
   slots, which from then on are rows of the request above ``cache_protected_len``
   (request-private, counted by SGLang as ``uncached``, freed with the row).
3b. regions (approved runs after fresh tokens): SGLang's chunked prefill is made to end a chunk
   where the next region starts, and before the next round the region's K/V is copied into the
   request's row, its prefix moved past it (:mod:`.chunked`).
4. ``on_release`` / ``release_aborted_request``: a retracted request keeps its decisions; a
   finished one drops its state, and if it finished normally with a verified context and never
   received reused KV, it is registered as a donor under a server-generated id (:mod:`.release`).
   The invariant guard checks the pool wherever the hook changed it (:mod:`.checks`).

With tensor parallelism (:mod:`engine_hooks.sglang.tp`) every rank runs this cache over its own
KV shard: rank 0 decides and audits, and at the start of each prefill round every rank applies
rank 0's message (:meth:`GovernedRadixCache.sync_round`, :mod:`.rounds`), so holds, host hits,
chunk caps and realizations are the same on every rank; a realization stands only if every
rank's copy did.

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
import time
import weakref
from array import array
from typing import Any

import torch
from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams, MatchPrefixParams, MatchResult
from sglang.srt.mem_cache.common import evict_from_tree_cache
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from engine_hooks.core.canary import Canaries
from engine_hooks.core.donors import LiveDonor
from engine_hooks.core.governor import Governor
from engine_hooks.core.rope import RopeSpec
from engine_hooks.sglang.admission import Admission
from engine_hooks.sglang.checks import Checks
from engine_hooks.sglang.chunked import Chunked
from engine_hooks.sglang.decisions import Decisions
from engine_hooks.sglang.guard import InvariantGuard, InvariantViolation
from engine_hooks.sglang.identity import Identity
from engine_hooks.sglang.realize import Realizer
from engine_hooks.sglang.release import Release
from engine_hooks.sglang.rounds import Rounds
from engine_hooks.sglang.state import Hook, RealizationError, ReqState, state_of
from engine_hooks.sglang.tp import FollowerGovernor, PendingDonors, TpLink

__all__ = ["GovernedRadixCache"]


class GovernedRadixCache(UnifiedRadixCache):  # type: ignore[misc]
    """``UnifiedRadixCache`` whose semantic reuse is decided by semgov (see the module docstring)."""

    hook: Hook | None = None

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
        hook = Hook(governor, rope, strict, tp, canaries)
        if tp is not None:
            # NOTE: donor ids and isolated tree keys embed the boot id: the same on every rank.
            hook.boot = str(tp.broadcast(hook.boot))
            if isinstance(governor, Governor):
                governor.donors.donor_log = []
                hook.tp_pending = PendingDonors(governor.settings.tp_pending_donors_per_tenant)
            else:
                hook.tp_pending = governor.pending
        self.hook = hook
        self.guard = InvariantGuard(self)
        self.kv_pool = self.token_to_kv_pool_allocator.get_kvcache()
        self.checks = Checks(hook, self.guard)
        self.identity = Identity(hook, self.checks)
        self.realizer = Realizer(hook, self, self.checks)
        self.decisions = Decisions(hook, self)
        self.admission = Admission(hook, self, self.checks, self.identity, self.decisions, self.realizer)
        self.chunked = Chunked(hook, self, self.checks, self.realizer)
        self.rounds = Rounds(hook, self, self.checks, self.decisions, self.realizer)
        self.release = Release(hook, self.checks, self.identity, self.realizer)

    # ---- the hook-wide state, as the backend, tests and benchmarks read it ---------------------

    @property
    def gov(self) -> Governor | FollowerGovernor | None:
        return self.hook.gov if self.hook is not None else None

    @property
    def canaries(self) -> Canaries | None:
        return self.hook.canaries if self.hook is not None else None

    @property
    def stats(self) -> dict[str, int]:
        return self.hook.stats if self.hook is not None else {}

    @property
    def reuse_disabled(self) -> str | None:
        return self.hook.reuse_disabled if self.hook is not None else None

    @property
    def pins(self) -> int:
        return self.hook.pins if self.hook is not None else 0

    @property
    def rope(self) -> RopeSpec | None:
        return self.hook.rope if self.hook is not None else None

    @property
    def tp(self) -> TpLink | None:
        return self.hook.tp if self.hook is not None else None

    @property
    def tp_pending(self) -> PendingDonors | None:
        return self.hook.tp_pending if self.hook is not None else None

    @property
    def reqs(self) -> weakref.WeakValueDictionary[int, Any]:
        return self.hook.reqs if self.hook is not None else weakref.WeakValueDictionary()

    @property
    def sched_ns(self) -> collections.deque[int]:
        return self.hook.sched_ns if self.hook is not None else collections.deque()

    # ---- tree operations the pieces use (state.Tree) ---------------------------------------------

    def donor_path(self, entry: LiveDonor) -> tuple[int, Any]:
        """The donor's live run in the tree: (its length, the node that ends it)."""
        ids = entry.token_ids
        toks = ids if isinstance(ids, array) and ids.typecode == "q" else array("q", ids)
        key = RadixKey(toks, entry.cache_key, cache_salt=entry.cache_salt)
        r = UnifiedRadixCache._match_tree(self, MatchPrefixParams(key=key))
        return int(r.device_prefix_len), r.last_device_node

    def alloc(self, n: int) -> torch.Tensor:
        """``n`` fresh slots (evicting from the tree if needed); :class:`RealizationError` if none."""
        evict_from_tree_cache(self, n)
        out: torch.Tensor | None = self.token_to_kv_pool_allocator.alloc(n)
        if out is None:
            raise RealizationError(f"no room for {n} realized tokens")
        return out.to(torch.int64)

    def donor_id(self, st: ReqState) -> str:
        """A donor's id: this process's boot id and the request's serial (never the client's rid)."""
        assert self.hook is not None
        return self.identity.donor_id(st)

    def live_states(self) -> list[ReqState]:
        """States of the requests the hook still tracks (waiting, running or retracted)."""
        return [st for _, st in self.hook.live()] if self.hook is not None else []

    # ---- SGLang's calls ----------------------------------------------------------------------

    def reset(self) -> None:
        super().reset()
        if self.hook is None:
            return
        for _, st in self.hook.live():
            self.hook.not_realized(st, "donor_evicted", "the tree was flushed before it was realized")
            st.chosen = None  # the donors' KV is gone
            st.private = None  # SGLang clears the allocator with the tree
        self.hook.gov.forget_all_donors()

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        req, hook = params.req, self.hook
        if hook is None or req is None:
            return super().match_prefix(params)
        t0 = time.perf_counter_ns()
        if hook.tp is None:  # NOTE: with TP the registry changes only at round starts (sync_round)
            try:
                hook.gov.drain_donors()
            except Exception as e:  # noqa: BLE001 - a registry problem costs reuse, never the scheduler
                self.checks.hook_error("drain_donors", req, e)
        st = self.identity.state(req)  # NOTE: total: whatever the client sent, the request gets a key
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
            return self.admission.report(req, st, len(key), result)
        except InvariantViolation:
            raise
        except Exception as e:  # noqa: BLE001 - any doubt: this request runs cold
            self.checks.hook_error("match_prefix", req, e)
            self.realizer.drop_plan(st)
            return result
        finally:
            st.sched_ns += t1 - t0 + time.perf_counter_ns() - t2  # semgov's share, not SGLang's match

    def init_load_back(self, params: InitLoadBackParams) -> tuple[int, Any]:
        req = params.req
        assert req is not None
        st = state_of(req) if self.hook is not None else None
        if st is None or st.chosen is None or st.private is not None or self.reuse_disabled is not None:
            # NOTE: host hits only ever come from this hook (hierarchical caching is refused at build).
            return 0, req.last_node
        t0, copy0 = time.perf_counter_ns(), st.copy_ns
        try:
            return self.realizer.realize(st, req)
        except InvariantViolation:
            raise
        except Exception as e:  # noqa: BLE001 - realize handles its own failures; this is a bug
            self.checks.hook_error("init_load_back", req, e)
            self.realizer.drop_plan(st)
            return 0, req.last_node
        finally:
            st.sched_ns += time.perf_counter_ns() - t0 - (st.copy_ns - copy0)  # the copy is counted apart

    def load_back_is_cache_owned(self) -> bool:
        # NOTE: realized slots are the request's own: cache_protected_len stays at the exact match.
        return False

    def prefix_device_indices(self, req: Any) -> torch.Tensor:
        st = state_of(req) if self.hook is not None else None
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
        if self.hook is not None:
            self.release.on_release(req, checkpointed)

    def release_aborted_request(self, request: Any) -> None:
        super().release_aborted_request(request)
        if self.hook is not None:
            self.release.aborted(request)

    # ---- the plugin's calls (engine_hooks.sglang.plugin): thin delegations to the pieces -------

    def hold_back(self, waiting: list[Any]) -> list[Any]:
        """The waiting requests to keep out of this prefill round (:meth:`.Admission.hold_back`)."""
        return self.admission.hold_back(waiting) if self.hook is not None else []

    def holds(self, req: Any) -> bool:
        """Keep ``req`` out of this batch (:meth:`.Admission.holds`)? Never raises."""
        return self.hook is not None and self.admission.holds(req)

    def chunk_cap(self, req: Any, has_chunked_req: bool) -> int | None:
        """The most tokens ``req``'s first chunk may extend (:meth:`.Chunked.chunk_cap`)."""
        return self.chunked.chunk_cap(req, has_chunked_req) if self.hook is not None else None

    def chunk_limit(self, req: Any) -> int | None:
        """A chunked request's most tokens in its next chunk (:meth:`.Chunked.chunk_limit`)."""
        return self.chunked.chunk_limit(req) if self.hook is not None else None

    def advance_chunked(self, req: Any) -> int:
        """Realize the chunked request's region starting where its prefix ends (:meth:`.Chunked.advance`)."""
        return self.chunked.advance(req) if self.hook is not None else 0

    def begin_round(self) -> None:
        """Scheduler thread, a prefill round starts (the plugin's hook): defer guard checks."""
        if self.hook is not None:
            self.checks.begin_round()

    def end_round(self) -> None:
        """The prefill round ended: one guard check for its changes (:meth:`.Checks.end_round`).
        Raises only :class:`InvariantViolation` (``strict``)."""
        if self.hook is not None:
            self.checks.end_round()

    def sync_round(self, waiting: list[Any], chunked: Any) -> None:
        """With TP, every rank applies rank 0's round message (:meth:`.Rounds.sync`)."""
        if self.hook is not None:
            self.rounds.sync(waiting, chunked)

    def pending_private(self) -> int:
        """Realized slots the hook holds that are not yet in a request's row."""
        return self.checks.pending_private() if self.hook is not None else 0
