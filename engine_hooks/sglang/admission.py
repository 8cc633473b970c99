"""Admission: requests held out of a prefill round until decided, and what a match reports.

Before every prefill round (the plugin's AROUND hook on ``Scheduler.get_new_batch_prefill``) a
waiting request whose decision is queued is held out of the round (not blocking it) until its
decision is done and, for an allow, its record durable, or until its deadline
(``decision_timeout_ms``, then ``audit_wait_ms``), after which it is admitted and runs cold.

In ``match_prefix`` (every waiting request, every scheduling round) the exact match runs as usual;
once the decision is done, the reusable run of the best allowed donor (approved spans contiguous
from the exact-match end, inside the donor's live KV, page-aligned) is reported as a *host hit*.
Nothing is allocated, pinned, decided or waited for there.
"""

from __future__ import annotations

import time
from typing import Any

from sglang.srt.mem_cache.base_prefix_cache import MatchResult

from engine_hooks.core.plan import planned_tokens
from engine_hooks.sglang.checks import Checks
from engine_hooks.sglang.decisions import Decisions
from engine_hooks.sglang.guard import InvariantViolation
from engine_hooks.sglang.identity import Identity
from engine_hooks.sglang.realize import Realizer
from engine_hooks.sglang.state import Hook, ReqState, Tree, state_of


class Admission:
    """Holds undecided requests back, and turns a taken decision into a match's host hit."""

    def __init__(
        self,
        hook: Hook,
        tree: Tree,
        checks: Checks,
        identity: Identity,
        decisions: Decisions,
        realizer: Realizer,
    ) -> None:
        self.hook = hook
        self.tree = tree
        self.checks = checks
        self.identity = identity
        self.decisions = decisions
        self.realizer = realizer

    def hold_back(self, waiting: list[Any]) -> list[Any]:
        """Scheduler thread, before a prefill round: the waiting requests to keep out of it.

        Those whose decision, or whose allow record's durability, is not ready before their
        deadline. The caller takes them out of the round and puts them back after it. A request
        not seen yet is not held here: its first ``match_prefix`` in the round queues its decision
        and :meth:`holds` keeps it out of that round's batch. Never waits, never raises.
        """
        hook = self.hook
        t0 = time.perf_counter_ns()
        for req in waiting:
            if getattr(req, "session", None) is not None and state_of(req) is None:
                self.identity.state(req)  # NOTE: a session request is checked before any round matches it
        if hook.reuse_disabled is not None:
            hook.sched_ns_unattributed += time.perf_counter_ns() - t0
            return []
        if hook.canaries is not None and waiting:
            hook.canaries.busy()  # NOTE: requests are waiting: no canary replay for a while
        if hook.tp is None:
            try:
                hook.gov.drain_donors()
            except Exception as e:  # noqa: BLE001 - a registry problem costs reuse, never the scheduler
                self.checks.hook_error("drain_donors", None, e)
        held = [req for req in waiting if self.held(req)]
        hook.stats["held"] += len(held)
        hook.sched_ns_unattributed += time.perf_counter_ns() - t0
        return held

    def holds(self, req: Any) -> bool:
        """Scheduler thread, at admission (the prefill adder's ``add_one_req``): keep ``req`` out of
        this batch (its decision or durable allow record is not ready yet)? Never raises."""
        if self.hook.reuse_disabled is not None:
            return False
        held = self.held(req)
        self.hook.stats["held"] += held
        return held

    def held(self, req: Any) -> bool:
        st = state_of(req)
        if st is None or req.kv.holds_kv:
            return False  # NOTE: never seen (no decision queued) or already admitted
        t0 = time.perf_counter_ns()
        try:
            now = self.hook.clock()
            held = self._wait(st, now)
            if not held and st.queued_at and not st.held_s:
                st.held_s = now - st.queued_at
            return held
        except InvariantViolation:
            raise
        except Exception as e:  # noqa: BLE001 - any doubt: admit it, it runs cold
            self.checks.hook_error("hold", req, e)
            self.hook.abandon(st, "hook_error", f"holding the request failed: {type(e).__name__}")
            self.hook.not_realized(st, "hook_error", f"holding the request failed: {type(e).__name__}")
            st.chosen = None
            return False
        finally:
            st.sched_ns += time.perf_counter_ns() - t0

    def _wait(self, st: ReqState, now: float) -> bool:
        hook = self.hook
        self.decisions.collect(st)
        if st.pending is not None:
            if now < st.deadline:
                return True
            # NOTE: late: the decision thread still finishes and audits it; it is never acted on
            # (one that finished since the collect above neither: every rank decides lateness alike).
            why = f"not decided within SEMGOV_DECISION_TIMEOUT_MS ({hook.settings.decision_timeout_ms} ms)"
            hook.abandon(st, "late", why)
            hook.stats["late_decisions"] += 1
            return False
        if st.chosen is None or st.durable:
            return False
        if hook.tp is None:  # NOTE: with TP, durability arrives at round starts (sync_round)
            st.durable = hook.gov.decision_durable(st.decision_id(), 0)
        if st.durable or hook.audit_broken() is not None:
            return False
        if now < st.deadline:
            return True
        hook.stats["not_durable_in_time"] += 1
        return False  # admitted; init_load_back finds the record not durable and audits the fallback

    def report(self, req: Any, st: ReqState, key_len: int, result: MatchResult) -> MatchResult:
        """What ``match_prefix`` reports for ``req`` beyond the exact match ``result``: the realized
        run, or the planned run of its taken decision as a host hit (and its regions planned)."""
        if self.hook.reuse_disabled is not None or st.context is None or req.kv.holds_kv:
            return result
        m = int(result.device_prefix_len)
        limit = min(key_len, len(req.origin_input_ids))
        if st.private is not None:
            if m == st.private_base:
                # NOTE: the realized run stays the request's own: protected only up to the exact match.
                return result._replace(device_prefix_len=m + int(st.private.numel()), cache_protected_len=m)
            self.realizer.release_private(st)  # the exact match moved: the realized run no longer fits
            return result
        if not st.decided:
            self.decisions.begin(st, req, m, limit)
        self.decisions.collect(st)
        if st.chosen is None:
            return result
        k = planned_tokens(st.spans, m, limit, st.donor_len, self.tree.page_size)
        st.regions = self.decisions.regions(st.spans, m + k, limit, st.donor_len)
        if k == 0:
            return result
        return result._replace(
            host_hit_length=k,
            last_host_node=result.last_device_node,
            best_match_node=result.last_device_node,
            full_kv_hit_length=max(int(result.full_kv_hit_length), m + k),
        )
