"""Realization: copying an allowed donor's K/V into slots the recipient owns.

At admission (``init_load_back``, only when that request is admitted) the allow record must already
be durable (never waited for here); the donor is re-matched, pinned for the duration of this call
only, its tokens checked against the live donor's, fresh slots allocated (evicting if needed: the
donor is pinned), the donor's K/V copied into them on the scheduler's current stream (keys
re-rotated for shifted spans), the donor unpinned, the realization audited and the pool checked.
Any problem frees what was taken: the request runs cold. The realized slots are then rows of the
request above ``cache_protected_len`` (request-private, counted by SGLang as ``uncached``, freed
with the row). With tensor parallelism a realization stands only if every rank's copy did.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from engine_hooks.core.plan import Piece, plan_pieces
from engine_hooks.core.unrealized import Reason
from engine_hooks.sglang.checks import Checks
from engine_hooks.sglang.kv_copy import copy_kv
from engine_hooks.sglang.state import Hook, RealizationError, ReqState, Tree, int64
from semgov.log import describe_error


class Realizer:
    """Copies donor K/V into a recipient's own slots, and owns those slots until its row does."""

    def __init__(self, hook: Hook, tree: Tree, checks: Checks) -> None:
        self.hook = hook
        self.tree = tree
        self.checks = checks

    def realize(self, st: ReqState, req: Any) -> tuple[int, Any]:
        """The front: the reusable run right after the exact match, promised by the match as a host
        hit. Returns ``init_load_back``'s answer (0: the request runs cold)."""
        assert st.chosen is not None and st.donor is not None
        m = int(req.prefix_len)
        limit = min(
            req._compute_max_prefix_len(len(req.full_untruncated_fill_ids)), len(req.origin_input_ids)
        )
        decision_id = st.decision_id()
        slots: torch.Tensor | None = None
        err: BaseException | None = None
        pieces: list[Piece] = []
        try:
            pieces = plan_pieces(st.spans, m, limit, st.donor_len, self.tree.page_size)
            k = sum(p.length for p in pieces)
            if k == 0 or k != req.host_hit_length:
                raise RealizationError(f"planned {k} tokens, admission promised {req.host_hit_length}")
            slots, _ = self.copy_from_donor(st, pieces, decision_id)
        except Exception as e:  # noqa: BLE001 - any doubt: run cold
            err = e
        err = self.agree(slots, err)
        if err is not None or slots is None:
            self.fallback(st, decision_id, err or RealizationError("nothing copied"))
            return 0, req.last_node
        k = int(slots.numel())
        st.private, st.private_base, st.pieces = slots, m, tuple(pieces)
        self.realized(st, req, slots, pieces, decision_id, "front")
        return k, req.last_node

    def copy_from_donor(
        self, st: ReqState, pieces: list[Piece], decision_id: str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh slots holding the donor's K/V for ``pieces`` (keys re-rotated): the allow record
        durable, the donor re-matched live, pinned only for this call, its tokens checked against
        the recipient's. Raises :class:`RealizationError` (or any error) having freed what it took."""
        hook, tree = self.hook, self.tree
        assert st.donor is not None
        req = hook.reqs.get(st.serial)
        if req is None:
            raise RealizationError("the request is no longer tracked")
        if not st.durable and hook.tp is None:
            st.durable = hook.gov.decision_durable(decision_id, 0)  # NOTE: polled, never waited for
        if not st.durable:
            why = hook.audit_broken() or "not yet"
            raise RealizationError(
                f"the allow decision is not durable in the audit log ({why})", "not_durable"
            )
        self._shifted_still_ok(st, req, pieces)
        d_len, node = tree.donor_path(st.donor)
        need = max(p.donor_start + p.length for p in pieces)
        if d_len < need:
            raise RealizationError(
                f"the donor's live KV covers {d_len} tokens, {need} needed", "donor_evicted"
            )
        # NOTE: the donor is pinned only while this call copies from it: eviction for the
        # allocation below must not take it, and nothing else ever holds a pin.
        pin = tree.lock(node)
        hook.pins += 1
        slots: torch.Tensor | None = None
        try:
            rt = int64(req.origin_input_ids)
            dt = int64(st.donor.token_ids)
            for p in pieces:
                r0, d0, n = p.recipient_start, p.donor_start, p.length
                # NOTE: token identity against the donor's tokens, whose tree path the re-match
                # above just found live (the match itself compares them token by token).
                if not np.array_equal(rt[r0 : r0 + n], dt[d0 : d0 + n]):
                    raise RealizationError(f"tokens differ at recipient {r0}..{r0 + n}")
            root = tree.root_node_handle(st.donor.cache_key)
            donor_slots = tree.tree_core.collect_full_device_indices(node, root)[:d_len].to(torch.int64)
            src = torch.cat([donor_slots[p.donor_start : p.donor_start + p.length] for p in pieces])
            slots = tree.alloc(sum(p.length for p in pieces))
            st.copy_ns += self._copy(src, slots, pieces)
            st.src_slots = src
            return slots, src
        except BaseException:
            if slots is not None:
                tree.token_to_kv_pool_allocator.free(slots)
            raise
        finally:
            self._unpin(pin)

    def _shifted_still_ok(self, st: ReqState, req: Any, pieces: list[Piece]) -> None:
        """NOTE: the spans were filtered by the canaries once, when the decision was taken
        (:meth:`~.admission.Admission.take`); a scope's shifted reuse may have been turned off (or
        put on probation) since. One boolean check, only for a plan with shifted pieces, keeps a
        turned-off scope from receiving shifted KV: such a realization runs cold."""
        can = self.hook.canaries
        if can is None or st.context is None or not any(p.shift for p in pieces):
            return
        if not can.shifted_ok(st.context, req):
            raise RealizationError(
                "shifted reuse was turned off for its scope since its decision was taken", "canary_off"
            )

    def agree(self, slots: torch.Tensor | None, err: BaseException | None) -> BaseException | None:
        """With TP, a realization stands only if every rank's copy of its shard succeeded (one
        ``all_reduce``; every rank reaches it at the same call); otherwise this rank's slots are
        freed and the request runs cold on every rank. Without TP: ``err`` unchanged."""
        tp = self.hook.tp
        if tp is None or tp.all(err is None):
            return err
        if slots is not None:
            self.tree.token_to_kv_pool_allocator.free(slots)
        return err or RealizationError("another tensor-parallel rank could not copy its KV shard")

    def _copy(self, src: torch.Tensor, dst: torch.Tensor, pieces: list[Piece]) -> int:
        """Copy on the scheduler's current stream (the next forward runs on it or waits on it);
        returns the copy's nanoseconds."""
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
        copy_kv(self.tree.kv_pool, src, dst, delta, self.hook.rope, check=dst.device.type == "cpu")
        return time.perf_counter_ns() - t0

    def _unpin(self, pin: Any) -> None:
        if pin is not None:
            self.tree.unlock(pin)
            self.hook.pins -= 1

    def fallback(self, st: ReqState, decision_id: str, e: BaseException) -> None:
        """An allowed reuse was not made: audited, and the request runs cold from here."""
        hook = self.hook
        st.chosen, st.regions = None, ()
        hook.stats["fallbacks"] += 1
        st.reported.add(decision_id)
        hook.gov.not_realized(
            e.reason if isinstance(e, RealizationError) else "copy_failed",
            request_id=st.label,
            decision_id=decision_id,
            donor_id=st.donor.donor_id if st.donor is not None else None,
            detail=describe_error(e),
        )
        self.checks.check("realization_failed", st)

    def realized(
        self, st: ReqState, req: Any, slots: torch.Tensor, pieces: list[Piece], decision_id: str, where: str
    ) -> None:
        """A realization was made: the request is a recipient from now on; audited, pool checked."""
        hook = self.hook
        assert st.donor is not None
        k = int(slots.numel())
        st.recipient = True
        st.shifted = st.shifted or any(p.shift for p in pieces)
        st.realizations += 1
        req.skip_radix_cache_insert = True
        hook.stats["realizations"] += 1
        hook.stats["realized_tokens"] += k
        hook.gov.event(
            "realization",
            request_id=st.label,
            decision_id=decision_id,
            donor_id=st.donor.donor_id,
            materialized_tokens=k,
            # NOTE: slot ids are read back only from a host pool: on an accelerator that would be
            # a device-to-host sync on the scheduler thread.
            slots=slots.tolist() if slots.device.type == "cpu" else (),
            spans=[p.as_span() for p in pieces],
            detail=f"serial {hook.boot}-{st.serial}; realization {st.realizations}; {where}",
        )
        self.checks.check("realization", st)

    def drop_plan(self, st: ReqState, reason: Reason = "hook_error", why: str = "the hook failed") -> None:
        """The request runs cold from here: its realized slots (if not yet in its row) go back, and
        its allow, if nothing of it was realized, says why."""
        self.release_private(st)
        self.hook.not_realized(st, reason, why)
        st.chosen = None

    def release_private(self, st: ReqState) -> None:
        """Free the realized slots the hook holds for ``st`` unless its row holds them already."""
        req = self.hook.reqs.get(st.serial)
        if st.private is not None and (req is None or not req.kv.holds_kv):
            self.tree.token_to_kv_pool_allocator.free(st.private)
        st.private = None
