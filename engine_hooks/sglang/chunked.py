"""Regions: approved runs after fresh tokens (:func:`~engine_hooks.core.plan.plan_regions`).

The plugin's admission hooks make SGLang's chunked prefill end a chunk where the next region starts
(:meth:`Chunked.chunk_cap`, :meth:`Chunked.chunk_limit`); before the next round,
:meth:`Chunked.advance` copies the region's K/V into fresh slots (the same checks as at admission,
:meth:`~.realize.Realizer.copy_from_donor`), writes them into the request's row and moves its prefix
past them, so the next chunk starts after the region.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from engine_hooks.sglang.checks import Checks
from engine_hooks.sglang.guard import InvariantViolation
from engine_hooks.sglang.realize import Realizer
from engine_hooks.sglang.state import Hook, RealizationError, ReqState, Tree, state_of


class Chunked:
    """Ends chunks where regions start, and realizes each region when its chunk boundary comes."""

    def __init__(self, hook: Hook, tree: Tree, checks: Checks, realizer: Realizer) -> None:
        self.hook = hook
        self.tree = tree
        self.checks = checks
        self.realizer = realizer

    def chunk_cap(self, req: Any, has_chunked_req: bool) -> int | None:
        """Scheduler thread, before the prefill adder admits ``req``: the most tokens its first
        chunk may extend so that it ends where its first region starts (None: no cap; 0: keep it
        out of this round, another request is mid-chunk and SGLang tracks one). Never raises."""
        st = state_of(req)
        if st is None or not st.regions or req.kv.holds_kv or self.hook.reuse_disabled is not None:
            return None
        try:
            cap = st.regions[0].start - int(req.prefix_len) - int(req.host_hit_length)
            if cap <= 0:
                st.regions = ()
                return None
            if has_chunked_req:
                now = self.hook.clock()
                if not st.region_deadline:
                    st.region_deadline = now + self.hook.settings.decision_timeout_ms / 1000
                if now < st.region_deadline:
                    return 0
                st.regions = ()  # NOTE: waited long enough for a free chunk slot: computed instead
                return None
            return cap
        except Exception as e:  # noqa: BLE001 - any doubt: no regions, the request is computed
            self.checks.hook_error("chunk_cap", req, e)
            st.regions = ()
            return None

    def chunk_limit(self, req: Any) -> int | None:
        """Scheduler thread, before a chunked request's next chunk: its most tokens (ending at its
        next region), or None. Never raises."""
        st = state_of(req)
        if st is None or not st.regions or self.hook.reuse_disabled is not None:
            return None
        try:
            cap = st.regions[0].start - int(req.prefix_len)
            if cap <= 0:
                st.regions = tuple(r for r in st.regions if r.start > int(req.prefix_len))
                return None
            return cap
        except Exception as e:  # noqa: BLE001 - any doubt: no regions, the request is computed
            self.checks.hook_error("chunk_limit", req, e)
            st.regions = ()
            return None

    def advance(self, req: Any) -> int:
        """Scheduler thread, before a prefill round, for SGLang's chunked request: if its computed
        prefix ends where its next region starts, copy the region's K/V into fresh slots and append
        them to the request's row (its prefix then ends after the region, so the next chunk starts
        there). Returns the tokens realized (0: nothing to do, or any doubt: computed). Never raises.

        NOTE: the region's slots are the request's own from the moment they are in its row:
        between ``cache_protected_len`` and ``kv_allocated_len``, freed with the row, counted by
        SGLang as ``uncached``; this runs before the round's prefill adder measures free space.
        """
        st = state_of(req)
        if st is None or not st.regions or self.hook.reuse_disabled is not None or not req.kv.holds_kv:
            return 0
        t0, copy0 = time.perf_counter_ns(), st.copy_ns
        try:
            return self._advance(st, req)
        except InvariantViolation:
            raise
        except Exception as e:  # noqa: BLE001 - _advance handles its own failures; this is a bug
            self.checks.hook_error("advance_chunked", req, e)
            st.regions = ()
            return 0
        finally:
            st.sched_ns += time.perf_counter_ns() - t0 - (st.copy_ns - copy0)

    def _advance(self, st: ReqState, req: Any) -> int:
        region, at = st.regions[0], int(req.prefix_len)
        if at != region.start:
            if at > region.start:  # NOTE: a chunk went past it (SGLang aligned it otherwise): computed
                st.regions = tuple(r for r in st.regions if r.start > at)
            return 0
        if st.chosen is None or st.donor is None:
            st.regions = ()
            return 0
        decision_id = st.decision_id()
        kv = req.kv
        slots: torch.Tensor | None = None
        err: BaseException | None = None
        try:
            if int(kv.kv_allocated_len) != at or region.end >= len(req.full_untruncated_fill_ids):
                raise RealizationError(
                    f"row holds {kv.kv_allocated_len} tokens, region {region.start}..{region.end} "
                    f"of a {len(req.full_untruncated_fill_ids)}-token prompt"
                )
            slots, _ = self.realizer.copy_from_donor(st, list(region.pieces), decision_id)
        except Exception as e:  # noqa: BLE001 - any doubt: run cold from here
            err = e
        err = self.realizer.agree(slots, err)
        if err is not None or slots is None:
            self.realizer.fallback(st, decision_id, err or RealizationError("nothing copied"))
            return 0
        pool = self.tree.req_to_token_pool
        pool.write((kv.req_pool_idx, slice(at, region.end)), slots.to(pool.req_to_token.dtype))
        kv.kv_allocated_len = region.end
        kv.kv_committed_len = region.end
        req.prefix_len = region.end
        req.extend_end = region.end
        st.regions = st.regions[1:]
        st.regions_realized += 1
        self.realizer.realized(st, req, slots, list(region.pieces), decision_id, f"region at {at}")
        return region.length
