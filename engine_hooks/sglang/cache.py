"""The governed radix cache: SGLang's ``UnifiedRadixCache`` plus semgov-decided semantic reuse.

How a request flows through it (SGLang 0.5.23's scheduler calls, in order):

1. ``match_prefix`` (every waiting request, every scheduling round). The first call replaces
   ``req.extra_key`` with the server-side key derived from the request's verified context
   (:mod:`engine_hooks.sglang.context`), so tenants and namespaces never share exact-prefix
   nodes. The exact match runs as usual. When at least ``min_unmatched_tokens`` stay unmatched
   and the request has a verified context, the candidate provider is asked for donors of the
   same tenant and namespace and semgov decides each candidate, once per request: decisions
   are cached in the request's state, and later rounds only re-plan from them. The chosen
   donor (the allowed one covering most tokens) is pinned with a tree lock. The reusable run
   (approved spans contiguous from the exact-match end, inside the donor's live KV,
   page-aligned) is reported as a *host hit*: nothing is allocated here.
2. ``init_load_back`` (admission, inside the scheduler's prefill adder, only when that request
   is admitted): re-match the donor and check the pinned node and token identity against the
   live donor slots, allocate fresh slots, copy the donor's K/V into them (keys re-rotated by
   the position shift for shifted spans), unpin the donor, emit an audited engine event and run
   the invariant guard. Any problem frees what was taken and returns 0: the request runs cold.
3. ``prefix_device_indices`` (row allocation): the exact-match path followed by the realized
   slots, which from then on are rows of the request above ``cache_protected_len``
   (request-private, counted by SGLang as ``uncached``, freed with the row).
4. ``on_release`` / ``release_aborted_request``: drop the request's state, unpin, free realized
   slots that never reached a row, register a normally finished, never-reusing request with a
   verified context as a donor, and run the guard.

NOTE: invariants:
- Reused KV is only ever *copied* into slots the recipient owns; donor slots are never adopted,
  shared or written.
- ``cache_protected_len`` stays at the exact-match length (``load_back_is_cache_owned`` is
  False), a recipient is flagged ``skip_radix_cache_insert`` (reuse-derived KV never enters the
  exact tree) and a recipient never becomes a donor.
- ``match_prefix`` allocates nothing; the only thing it may take is the donor pin, and every
  pin is released on realization, fallback, release, abort, reset or reuse being disabled.
- Any error or doubt means no reuse for that request (cold prefill); an invariant violation
  disables semantic reuse for the process (audited; raised when ``strict``).
"""

from __future__ import annotations

import bisect
from array import array
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from sglang.srt.managers.schedule_batch import FINISH_ABORT
from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams, MatchPrefixParams, MatchResult
from sglang.srt.mem_cache.common import evict_from_tree_cache
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from engine_hooks.sglang.context import RequestContext, anonymous_cache_key
from engine_hooks.sglang.governor import DonorEntry, DonorSpec, Governor
from engine_hooks.sglang.guard import InvariantGuard, InvariantViolation
from engine_hooks.sglang.kv_copy import RopeSpec, copy_kv
from semgov._internal.log import get_logger
from semgov.decide import SignedDecision

_IDENT_ATTR = "_semgov_ident"
_RECIPIENT_ATTR = "_semgov_recipient"


class RealizationError(RuntimeError):
    """Why an allowed reuse was not realized (the request then runs cold)."""


@dataclass(frozen=True, slots=True)
class Piece:
    """A run of recipient positions realized from donor positions (shift = recipient - donor)."""

    recipient_start: int
    donor_start: int
    length: int
    kind: str


def plan_pieces(
    spans: list[dict[str, Any]], start: int, limit: int, donor_len: int, page_size: int
) -> list[Piece]:
    """The approved spans' positions contiguous from ``start``, cut at ``limit`` and at the donor's
    live KV, and trimmed so that ``start + total`` stays page-aligned (pure)."""
    ordered = sorted(spans, key=lambda s: int(s["recipient_start"]))
    starts = [int(s["recipient_start"]) for s in ordered]
    pieces: list[Piece] = []
    p = start
    while p < limit:
        i = bisect.bisect_right(starts, p) - 1
        if i < 0:
            break
        s = ordered[i]
        rs, ds, n = int(s["recipient_start"]), int(s["donor_start"]), int(s["length"])
        if not rs <= p < rs + n:
            break
        d = ds + (p - rs)
        end = min(rs + n, limit, p + max(0, donor_len - d))
        if end <= p:
            break
        pieces.append(Piece(p, d, end - p, str(s["kind"])))
        p = end
    keep = ((p - start) // page_size) * page_size
    out: list[Piece] = []
    for pc in pieces:
        if keep <= 0:
            break
        n = min(pc.length, keep)
        out.append(Piece(pc.recipient_start, pc.donor_start, n, pc.kind))
        keep -= n
    return out


@dataclass(slots=True)
class _Ident:
    context: RequestContext | None
    cache_key: str


@dataclass(slots=True)
class _State:
    """Per-request semantic-reuse state (keyed by request id)."""

    req: Any
    decided: bool = False
    decisions: list[SignedDecision] = field(default_factory=list)
    chosen: SignedDecision | None = None
    donor: DonorEntry | None = None
    donor_node: Any = None
    donor_len: int = 0
    pin: Any = None
    private: torch.Tensor | None = None
    private_base: int = 0
    pieces: tuple[Piece, ...] = ()

    def pending(self) -> int:
        """Realized slots the hook still holds (not yet written into the request's row)."""
        if self.private is None or self.req.kv.holds_kv:
            return 0
        return int(self.private.numel())


class GovernedRadixCache(UnifiedRadixCache):  # type: ignore[misc]
    """``UnifiedRadixCache`` whose semantic reuse is decided by semgov (see the module docstring)."""

    gov: Governor | None = None

    def attach(
        self, governor: Governor, *, rope: RopeSpec | None, strict: bool, copy_stream: Any = None
    ) -> None:
        """Turn governance on (called once by the backend factory, after SGLang built the tree).

        ``copy_stream``: the CUDA stream the model's forward passes run on. Realization copies are
        enqueued on it, so they run after every forward already enqueued (which may still write
        slots just freed and reallocated) and before the forward that reads them.
        """
        self.gov = governor
        self.copy_stream = copy_stream
        self.rope = rope
        self.strict = strict
        self.states: dict[str, _State] = {}
        self.live: dict[str, Any] = {}
        self.pins = 0
        self.reuse_disabled: str | None = None
        self.guard = InvariantGuard(self)
        self.kv_pool = self.token_to_kv_pool_allocator.get_kvcache()
        self.stats: dict[str, int] = {
            "decided_requests": 0,
            "decisions": 0,
            "allowed": 0,
            "realizations": 0,
            "realized_tokens": 0,
            "fallbacks": 0,
            "donors_registered": 0,
            "guard_checks": 0,
        }

    # ---- identity --------------------------------------------------------------------------

    def _ident(self, req: Any) -> _Ident:
        ident: _Ident | None = getattr(req, _IDENT_ATTR, None)
        if ident is None:
            assert self.gov is not None
            ctx = self.gov.context_of(req.extra_key)
            key = self.gov.context_key
            derived = ctx.cache_key(key) if ctx is not None else anonymous_cache_key(key, req.extra_key)
            ident = _Ident(ctx, derived)
            setattr(req, _IDENT_ATTR, ident)
            # NOTE: isolation by the cache key: whatever the caller sent, the exact tree is keyed
            # server-side by tenant and namespace (or by an anonymous hash of what it sent).
            req.extra_key = derived
        return ident

    # ---- SGLang's calls ----------------------------------------------------------------------

    def reset(self) -> None:
        super().reset()
        if self.gov is None:
            return
        for st in list(self.states.values()):
            st.pin = None  # the tree that held the lock is gone
            st.chosen = None
            st.private = None
        self.pins = 0
        self.states.clear()
        self.gov.forget_all_donors()

    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        req = params.req
        if self.gov is None or req is None:
            return super().match_prefix(params)
        self.gov.drain_donors()
        ident = self._ident(req)
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
        self.live[req.rid] = req
        if self.reuse_disabled is not None or ident.context is None or req.kv.holds_kv:
            return result
        st = self.states.get(req.rid)
        if st is None:
            st = self.states[req.rid] = _State(req)
        m = int(result.device_prefix_len)
        limit = min(len(key), len(req.origin_input_ids))
        if st.private is not None:
            if m == st.private_base:
                # NOTE: the realized run stays the request's own: protected only up to the exact match.
                return result._replace(device_prefix_len=m + int(st.private.numel()), cache_protected_len=m)
            self._release_private(st)  # the exact match moved: the realized run no longer fits
            return result
        if not st.decided:
            if limit - m < self.gov.settings.min_unmatched_tokens:
                return result
            st.decided = True
            self._decide(st, ident.context, req, m, limit)
        if st.chosen is None:
            return result
        k = sum(
            p.length for p in plan_pieces(st.chosen.approved_spans, m, limit, st.donor_len, self.page_size)
        )
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
        st = self.states.get(req.rid) if self.gov is not None else None
        if st is None or st.chosen is None or st.private is not None or self.reuse_disabled is not None:
            # NOTE: host hits only ever come from this hook (hierarchical caching is refused at build).
            return 0, req.last_node
        return self._realize(st, req)

    def load_back_is_cache_owned(self) -> bool:
        # NOTE: realized slots are the request's own: cache_protected_len stays at the exact match.
        return False

    def prefix_device_indices(self, req: Any) -> torch.Tensor:
        st = self.states.get(req.rid) if self.gov is not None else None
        if st is None or st.private is None or req.kv.holds_kv:
            base: torch.Tensor = super().prefix_device_indices(req)
            return base
        root = self.root_node_handle(req.extra_key)
        path = self.tree_core.collect_full_device_indices(req.last_node, root)[: st.private_base]
        out = torch.cat([path.to(torch.int64), st.private.to(torch.int64)])
        assert len(out) == req.prefix_len, (req.rid, len(out), req.prefix_len)
        return out

    def on_release(self, req: Any, *, checkpointed: bool) -> None:
        super().on_release(req, checkpointed=checkpointed)
        if self.gov is None:
            return
        st = self.states.pop(req.rid, None)
        self.live.pop(req.rid, None)
        if st is not None:
            # The row held the realized slots and release_kv_cache just freed it.
            st.private = None
            self._unpin(st)
        ident: _Ident | None = getattr(req, _IDENT_ATTR, None)
        if (
            checkpointed
            and ident is not None
            and ident.context is not None
            and not getattr(req, _RECIPIENT_ATTR, False)
            and not isinstance(req.finished_reason, FINISH_ABORT)
            and self.reuse_disabled is None
        ):
            self.gov.submit_donor(
                DonorSpec(
                    request_id=str(req.rid),
                    context=ident.context,
                    cache_key=ident.cache_key,
                    token_ids=tuple(int(t) for t in req.origin_input_ids),
                    text=None,
                )
            )
            self.stats["donors_registered"] += 1
        self._check("release", req.rid)

    def release_aborted_request(self, request: Any) -> None:
        super().release_aborted_request(request)
        if self.gov is None:
            return
        st = self.states.pop(request.rid, None)
        req = self.live.get(request.rid)
        if req is not None and not req.kv.holds_kv:
            self.live.pop(request.rid, None)
        if st is not None:
            self._release_private(st)
            self._unpin(st)
        self._check("abort", request.rid)

    # ---- decisions ---------------------------------------------------------------------------

    def _donor_path(self, entry: DonorEntry) -> tuple[int, Any]:
        key = RadixKey(array("q", entry.token_ids), entry.cache_key)
        r = UnifiedRadixCache._match_tree(self, MatchPrefixParams(key=key))
        return int(r.device_prefix_len), r.last_device_node

    def _decide(self, st: _State, ctx: RequestContext, req: Any, m: int, limit: int) -> None:
        assert self.gov is not None
        tokens = req.origin_input_ids
        text = None  # SGLang keeps no prompt text; donors get theirs from the detokenizer
        live: list[tuple[DonorEntry, float, int, Any]] = []
        for entry, sim in self.gov.candidates(ctx, tokens, text):
            d_len, node = self._donor_path(entry)
            if d_len == 0:
                self.gov.drop_donor(entry.donor_id)  # evicted: nothing left to reuse
                continue
            live.append((entry, sim, d_len, node))
        if not live:
            return
        self.stats["decided_requests"] += 1
        st.decisions = self.gov.decide(str(req.rid), ctx, tokens, text, [(e, s) for e, s, _, _ in live])
        self.stats["decisions"] += len(st.decisions)
        best = 0
        for dec, (entry, _, d_len, node) in zip(st.decisions, live, strict=False):
            if dec.decision != "allow":
                continue
            self.stats["allowed"] += 1
            k = sum(p.length for p in plan_pieces(dec.approved_spans, m, limit, d_len, self.page_size))
            if k > best:
                best, st.chosen, st.donor, st.donor_len, st.donor_node = k, dec, entry, d_len, node
        if st.chosen is not None:
            st.pin = self.lock(st.donor_node)
            self.pins += 1

    def _unpin(self, st: _State) -> None:
        if st.pin is not None:
            self.unlock(st.pin)
            st.pin = None
            self.pins -= 1

    def _release_private(self, st: _State) -> None:
        if st.private is not None and not st.req.kv.holds_kv:
            self.token_to_kv_pool_allocator.free(st.private)
        st.private = None

    # ---- realization -------------------------------------------------------------------------

    def _realize(self, st: _State, req: Any) -> tuple[int, Any]:
        assert self.gov is not None and st.chosen is not None and st.donor is not None
        m = int(req.prefix_len)
        limit = min(
            req._compute_max_prefix_len(len(req.full_untruncated_fill_ids)), len(req.origin_input_ids)
        )
        pieces = plan_pieces(st.chosen.approved_spans, m, limit, st.donor_len, self.page_size)
        k = sum(p.length for p in pieces)
        decision_id = str(st.chosen.record["decision_id"])
        slots: torch.Tensor | None = None
        try:
            if k == 0 or k != req.host_hit_length:
                raise RealizationError(f"planned {k} tokens, admission promised {req.host_hit_length}")
            if not self.gov.decision_durable(decision_id, self.gov.settings.audit_wait_ms / 1000):
                why = self.gov.audit_broken or "not yet"
                raise RealizationError(f"the allow decision is not durable in the audit log ({why})")
            d_len, node = self._donor_path(st.donor)
            if node != st.donor_node or d_len < st.donor_len:
                raise RealizationError("the donor's KV changed since the decision")
            root = self.root_node_handle(st.donor.cache_key)
            donor_slots = self.tree_core.collect_full_device_indices(node, root)[:d_len].to(torch.int64)
            rt = np.asarray(req.origin_input_ids, dtype=np.int64)
            dt = np.asarray(st.donor.token_ids, dtype=np.int64)
            for p in pieces:
                r0, d0, n = p.recipient_start, p.donor_start, p.length
                # NOTE: token identity is re-verified against the live donor (its tree path
                # holds exactly st.donor.token_ids) right before the copy.
                if d0 + n > d_len or not np.array_equal(rt[r0 : r0 + n], dt[d0 : d0 + n]):
                    raise RealizationError(f"tokens differ at recipient {r0}..{r0 + n}")
            src = torch.cat([donor_slots[p.donor_start : p.donor_start + p.length] for p in pieces])
            shift = torch.cat(
                [
                    torch.full((p.length,), p.recipient_start - p.donor_start, dtype=torch.int64)
                    for p in pieces
                ]
            )
            slots = self._alloc(k)
            delta = shift if bool(shift.any()) else None
            if self.copy_stream is not None:
                # NOTE: untested on a GPU here (no device in CI); see docs/sglang.md.
                with torch.cuda.stream(self.copy_stream):
                    copy_kv(self.kv_pool, src, slots, delta, self.rope)
            else:
                copy_kv(self.kv_pool, src, slots, delta, self.rope)
        except Exception as e:  # noqa: BLE001 - any doubt: run cold
            if slots is not None:
                self.token_to_kv_pool_allocator.free(slots)
            self._unpin(st)
            st.chosen = None
            self.stats["fallbacks"] += 1
            self.gov.event(
                "realization_failed",
                request_id=str(req.rid),
                decision_id=decision_id,
                donor_id=st.donor.donor_id,
                detail=f"{type(e).__name__}: {e}",
            )
            self._check("realization_failed", req.rid)
            return 0, req.last_node
        st.private, st.private_base, st.pieces = slots, m, tuple(pieces)
        setattr(req, _RECIPIENT_ATTR, True)
        req.skip_radix_cache_insert = True
        self._unpin(st)
        self.stats["realizations"] += 1
        self.stats["realized_tokens"] += k
        self.gov.event(
            "realization",
            request_id=str(req.rid),
            decision_id=decision_id,
            donor_id=st.donor.donor_id,
            materialized_tokens=k,
            slots=slots.tolist(),
            spans=[
                {
                    "recipient_start": p.recipient_start,
                    "donor_start": p.donor_start,
                    "length": p.length,
                    "kind": p.kind,
                }
                for p in pieces
            ],
        )
        self._check("realization", req.rid)
        return k, req.last_node

    def _alloc(self, n: int) -> torch.Tensor:
        evict_from_tree_cache(self, n)
        out: torch.Tensor | None = self.token_to_kv_pool_allocator.alloc(n)
        if out is None:
            raise RealizationError(f"no room for {n} realized tokens")
        return out.to(torch.int64)

    # ---- the guard ---------------------------------------------------------------------------

    def pending_private(self) -> int:
        return sum(st.pending() for st in self.states.values())

    def _check(self, where: str, rid: Any) -> None:
        assert self.gov is not None
        self.stats["guard_checks"] += 1
        problem = self.guard.check(self.live.values(), self.pending_private())
        held = sum(1 for st in self.states.values() if st.pin is not None)
        if problem is None and held != self.pins:
            problem = f"donor pins: {self.pins} taken, {held} held by live plans"
        if problem is None and not self.live and self.pins == 0 and self.protected_size() != 0:
            problem = f"nothing live but {self.protected_size()} tokens still protected"
        if problem is None:
            return
        self._disable(f"after {where} of request {rid}: {problem}")

    def _disable(self, reason: str) -> None:
        assert self.gov is not None
        first = self.reuse_disabled is None
        self.reuse_disabled = reason
        get_logger().error("semgov invariant violation: semantic reuse disabled", reason=reason)
        self.gov.event("invariant_violation", detail=reason)
        if first:
            for st in self.states.values():
                self._unpin(st)
                st.chosen = None
            self.gov.event("reuse_disabled", detail=reason)
        if self.strict:
            raise InvariantViolation(reason)
