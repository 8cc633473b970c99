"""A request's decision: queued once, taken once, and what of it can be realized.

When at least ``min_unmatched_tokens`` stay unmatched by the exact tree and the request has a
verified context, the candidate provider is asked for donors of the same scope, and the decision is
queued for the decision thread (:meth:`Governor.decide_later`), once per request (retraction
included). When it is done it is *taken*: the allowed donor with live KV (measured in the tree,
only for allowed donors) whose plan realizes the most is chosen, and its realizable spans
(:meth:`Decisions.copyable`: the canary filter and the planned recompute) are computed once and kept
on the request's state, for its match, its regions and its realization.
"""

from __future__ import annotations

from typing import Any

from engine_hooks.core.decisions import PendingDecision
from engine_hooks.core.donors import LiveDonor
from engine_hooks.core.plan import (
    Region,
    plan_regions,
    planned_tokens,
    recompute_leading,
    unrealizable_reason,
)
from engine_hooks.core.unrealized import Reason
from engine_hooks.sglang.state import Hook, ReqState, Tree
from engine_hooks.sglang.tp import Choice
from semgov.decide import SignedDecision

Spans = list[dict[str, Any]]


class Decisions:
    """Queues a request's decision, takes it when done, and plans what of it can be copied."""

    def __init__(self, hook: Hook, tree: Tree) -> None:
        self.hook = hook
        self.tree = tree

    def begin(self, st: ReqState, req: Any, m: int, limit: int) -> None:
        """Queue the request's candidate search and decision (once), if it has donors to look at."""
        hook = self.hook
        st.decided = True
        if st.context is None or st.calibration == "donor" or limit - m < hook.settings.min_unmatched_tokens:
            return
        if not hook.gov.has_donors(st.context, st.cache_salt):
            return  # NOTE: nothing of its scope is registered: no decision, nothing to wait for
        st.m0, st.limit0 = m, limit
        st.queued_at = hook.clock()
        st.deadline = st.queued_at + hook.settings.decision_timeout_ms / 1000
        st.pending = hook.gov.decide_later(st.label, st.context, st.cache_salt, req.origin_input_ids)

    def collect(self, st: ReqState) -> None:
        """Take a finished decision: the allowed donor with live KV whose plan realizes the most.

        NOTE: with TP this happens only at round starts (``sync_round``), on every rank alike.
        """
        job = st.pending
        if self.hook.tp is not None or job is None or not job.done:
            return
        choice, donor, plans = self.choose(st, job)
        self.take(st, choice, donor, job.decisions, plans)

    def choose(self, st: ReqState, job: PendingDecision) -> tuple[Choice, LiveDonor | None, dict[str, Spans]]:
        """The best allowed donor of a finished decision, and the copyable spans of each allowed
        decision whose donor is live, by decision id (changes nothing of ``st``)."""
        hook = self.hook
        best, chosen, donor, donor_len, allowed = 0, None, None, 0, 0
        probed: list[tuple[str, int]] = []
        plans: dict[str, Spans] = {}
        shifted_ok: bool | None = None
        for dec, (entry, _) in zip(job.decisions, job.candidates, strict=False):
            if dec.decision != "allow":
                continue
            allowed += 1
            if hook.tp is not None and (
                hook.gov.donor(entry.donor_id) is None or entry.donor_id in hook.fresh
            ):
                continue  # NOTE: the other ranks know only donors added in an earlier round
            # NOTE: liveness is measured here, on the scheduler thread, and only for allowed donors.
            d_len, _ = self.tree.donor_path(entry)
            probed.append((entry.donor_id, d_len))
            if d_len == 0:
                hook.gov.drop_donor(entry.donor_id)  # evicted: nothing left to reuse
                continue
            if shifted_ok is None:
                shifted_ok = self.shifted_ok(st)
            spans = plans[str(dec.record["decision_id"])] = self.copyable(dec, shifted_ok)
            k = planned_tokens(spans, st.m0, st.limit0, d_len, self.tree.page_size)
            k += sum(r.length for r in self.regions(spans, st.m0 + k, st.limit0, d_len))
            if k > best:
                best, chosen, donor, donor_len = k, dec, entry, d_len
        durable = (
            chosen is not None
            and hook.tp is not None
            and hook.gov.decision_durable(str(chosen.record["decision_id"]), 0)
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
        return choice, donor, plans

    def take(
        self,
        st: ReqState,
        c: Choice,
        donor: LiveDonor | None,
        decisions: list[SignedDecision],
        plans: dict[str, Spans] | None = None,
    ) -> None:
        """Act on a finished decision (this rank's or, with TP, rank 0's choice): the chosen allow,
        its donor and its copyable spans (``plans``, as :meth:`choose` computed them; computed here
        once when this rank did not choose, as a follower does) go on the request's state."""
        hook = self.hook
        st.pending = None
        st.decided_s = hook.clock() - st.queued_at
        st.decisions = decisions
        hook.stats["decided_requests"] += c.had_candidates
        hook.stats["decisions"] += c.decisions
        hook.stats["allowed"] += c.allowed
        st.chosen, st.donor, st.donor_len = c.chosen, donor, c.donor_len
        st.spans = []
        if c.allowed:
            self.unrealized(st, c, decisions, plans or {})
        if st.chosen is not None:
            known = plans.get(str(st.chosen.record["decision_id"])) if plans is not None else None
            st.spans = known if known is not None else self.copyable(st.chosen, self.shifted_ok(st))
            st.durable = st.durable or c.durable
            st.deadline = hook.clock() + hook.settings.audit_wait_ms / 1000

    def unrealized(
        self, st: ReqState, c: Choice, decisions: list[SignedDecision], plans: dict[str, Spans]
    ) -> None:
        """Every allow of the decision that is not the chosen one says why it is not acted on (an
        engine event with its reason code; a follower rank writes none)."""
        live = dict(c.probed)
        chosen = str(c.chosen.record["decision_id"]) if c.chosen is not None else None
        for dec in decisions:
            decision_id = str(dec.record["decision_id"])
            if dec.decision != "allow" or decision_id == chosen:
                continue
            donor_id = str(dec.record["donor_id"])
            if donor_id not in live:
                reason: Reason = "unrealizable_plan"
                why = "its donor was registered this round: tensor-parallel ranks use it from the next"
            elif live[donor_id] == 0:
                reason, why = (
                    "donor_evicted",
                    "the donor's KV was evicted before its decision could be acted on",
                )
            elif c.chosen is not None:
                reason, why = "another_donor_chosen", f"donor {c.donor_id} realizes more"
            else:
                reason, why = self._why_not(st, dec, plans.get(decision_id))
            self.hook.not_realized(st, reason, why, dec)

    def _why_not(self, st: ReqState, dec: SignedDecision, spans: Spans | None) -> tuple[Reason, str]:
        """Why a live donor's allow realizes nothing from the request's exact match."""
        cfg = self.hook.settings
        shifted_ok = self.shifted_ok(st)
        why = unrealizable_reason(
            dec.approved_spans,
            spans if spans is not None else self.copyable(dec, shifted_ok),
            st.m0,
            max_regions=cfg.max_regions,
            min_region_tokens=cfg.min_region_tokens,
            page_size=self.tree.page_size,
        )
        if why is None:
            return "prefix_cached", "the exact-prefix match already holds every approved position"
        self.hook.count("unrealizable")
        if not shifted_ok and any(s["kind"] == "shifted" for s in dec.approved_spans):
            return (
                "canary_off",
                f"canaries turned shifted reuse off for its scope (or it is on probation): {why}",
            )
        return "unrealizable_plan", why

    def shifted_ok(self, st: ReqState) -> bool:
        """Whether the request may receive shifted KV: not where canaries turned shifted reuse off
        for its scope, nor, while its scope is on probation, if no canary can replay it
        (:meth:`~engine_hooks.core.canary.Canaries.shifted_ok`)."""
        can = self.hook.canaries
        if can is None or st.context is None or st.calibration is not None:
            return (
                True  # NOTE: a calibration recipient measures its plan, whatever production's canaries found
            )
        return can.shifted_ok(st.context, self.hook.reqs.get(st.serial))

    def copyable(self, dec: SignedDecision, shifted_ok: bool) -> Spans:
        """What of a decision's approved spans is copied: all of it, less each span's leading tokens
        the record plans to recompute and, of shifted spans, at least the share the settings
        recompute (``SEMGOV_SHIFTED_RECOMPUTE_PCT``); no shifted span unless ``shifted_ok``."""
        spans = dec.approved_spans
        if not shifted_ok:
            spans = [s for s in spans if s["kind"] != "shifted"]
        return recompute_leading(spans, self.hook.settings.shifted_recompute_pct / 100)

    def regions(self, spans: Spans, start: int, limit: int, donor_len: int) -> tuple[Region, ...]:
        """The approved runs after fresh tokens past ``start`` (:func:`.plan_regions`)."""
        cfg = self.hook.settings
        if cfg.max_regions == 0:
            return ()
        return tuple(
            plan_regions(
                spans,
                start,
                limit,
                donor_len,
                self.tree.page_size,
                max_regions=cfg.max_regions,
                min_tokens=cfg.min_region_tokens,
            )
        )
