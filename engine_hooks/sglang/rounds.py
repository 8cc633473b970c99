"""Tensor parallelism: every rank applies rank 0's round (see :mod:`engine_hooks.sglang.tp`).

With tensor parallelism every rank runs the governed cache over its own KV shard: rank 0 decides
and audits, and at the start of each prefill round every rank applies rank 0's message
(:meth:`Rounds.sync`: finished decisions, durable records, registry changes, its clock), so holds,
host hits, chunk caps and realizations are the same on every rank; a realization stands only if
every rank's copy did (:meth:`~.realize.Realizer.agree`).
"""

from __future__ import annotations

import queue
import time
from typing import Any

from engine_hooks.core.governor import Governor
from engine_hooks.sglang.checks import Checks
from engine_hooks.sglang.decisions import Decisions, Spans
from engine_hooks.sglang.realize import Realizer
from engine_hooks.sglang.state import Hook, Tree, state_of
from engine_hooks.sglang.tp import Choice, DonorOp, FollowerGovernor, RoundSync
from semgov.decide import SignedDecision
from semgov.log import get_logger


class Rounds:
    """Leads (rank 0) and applies (every rank) the round message that keeps ranks on one plan."""

    def __init__(
        self, hook: Hook, tree: Tree, checks: Checks, decisions: Decisions, realizer: Realizer
    ) -> None:
        self.hook = hook
        self.tree = tree
        self.checks = checks
        self.decisions = decisions
        self.realizer = realizer
        # NOTE: rank 0's own decisions and copyable spans of the choices in the message it leads,
        # by request serial: applied with the message, like every rank's.
        self.taken: dict[int, tuple[list[SignedDecision], dict[str, Spans]]] = {}

    def sync(self, waiting: list[Any], chunked: Any) -> None:
        """Scheduler thread, every rank, first thing in a prefill round with work: rank 0 sends
        what changed (finished decisions, durable records, registry changes, its clock), every
        rank applies it, and any rank that could not makes every rank turn reuse off.

        NOTE: the collectives run on every rank in the same order: whether this runs depends only
        on state every rank shares (the waiting queue, the chunked request, ``reuse_disabled``).
        """
        hook, tp = self.hook, self.hook.tp
        if tp is None or hook.reuse_disabled is not None:
            return
        if not waiting and chunked is None:
            return
        t0 = time.perf_counter_ns()
        msg = self.lead() if tp.leader else None
        try:
            msg = tp.broadcast(msg)
        except Exception as e:  # noqa: BLE001 - e.g. a message this rank cannot unpickle
            msg = RoundSync(time.monotonic(), None, disabled=f"the round message: {type(e).__name__}: {e}")
        try:
            problems = self.apply(msg)
        except Exception as e:  # noqa: BLE001 - a round this rank cannot apply turns reuse off
            problems = [f"applying the round failed: {type(e).__name__}: {e}"]
        if problems:
            get_logger().error("semgov TP round not applied", rank=tp.rank, problems=problems[:5])
        missed = isinstance(hook.gov, FollowerGovernor) and bool(hook.gov.missed)
        off, forget = tp.any_each((bool(problems) or hook.disable_pending is not None, missed))
        if forget and not off:
            self.forget_fresh(msg)
        if off:
            why = hook.disable_pending or (problems[0] if problems else None)
            hook.disable_pending = None
            where = f"rank {tp.rank}: {why}" if why else f"a rank other than {tp.rank}"
            self.checks.turn_off(f"tensor-parallel ranks cannot follow one plan ({where})")
            for _, st in hook.live():
                self.realizer.drop_plan(st, "reuse_disabled", "tensor-parallel ranks cannot follow one plan")
        # NOTE: the round's cost is charged to the waiting requests it was for (shared evenly).
        cost = time.perf_counter_ns() - t0
        charged = [st for st in (state_of(r) for r in waiting) if st is not None]
        for st in charged:
            st.sched_ns += cost // len(charged)
        if not charged:
            hook.sched_ns_unattributed += cost

    def forget_fresh(self, msg: RoundSync) -> None:
        """Every rank: a rank held no copy of a donor this round added: forget every donor the round
        added (none is used yet: a donor is chosen only from the round after its add), and keep
        reusing everything else."""
        hook = self.hook
        added = [op.donor_id for op in msg.donor_ops if op.kind == "add"]
        for donor_id in added:
            hook.gov.drop_donor(donor_id)  # NOTE: on rank 0 also the provider's; sent as drops next round
        if isinstance(hook.gov, FollowerGovernor):
            hook.gov.missed.clear()
        hook.count("tp_donors_forgotten", len(added))
        if hook.tp is not None and hook.tp.leader:
            get_logger().warning("semgov TP: a rank missed a new donor; this round's new donors forgotten",
                                 donors=len(added))  # fmt: skip

    def lead(self) -> RoundSync:
        """Rank 0: the round's message (never raises: a failure is itself the message)."""
        gov = self.hook.gov
        assert isinstance(gov, Governor)
        now = time.monotonic()
        try:
            ops = self._donor_ops(gov)
            choices: list[Choice] = []
            durable: list[int] = []
            self.taken = {}
            for _, st in self.hook.live():
                job = st.pending
                if job is not None and job.done:
                    choice, _, plans = self.decisions.choose(st, job)
                    choices.append(choice)
                    self.taken[st.serial] = (job.decisions, plans)
                elif st.chosen is not None and not st.durable:
                    if gov.decision_durable(st.decision_id(), 0):
                        durable.append(st.serial)
            if gov.donors.donor_log is not None:
                # NOTE: the drops of evicted donors: every rank finds them in its own probes
                gov.donors.donor_log.clear()
            return RoundSync(now, gov.audit_broken, ops, tuple(choices), tuple(durable))
        except Exception as e:  # noqa: BLE001 - every rank turns reuse off, audited
            return RoundSync(now, gov.audit_broken, disabled=f"rank 0: {type(e).__name__}: {e}")

    def _donor_ops(self, gov: Governor) -> tuple[DonorOp, ...]:
        """Rank 0: the registry changes since the last round (settled in the pending donors, as
        every follower does with this message); this round's adds are fresh."""
        gov.drain_donors()
        log = gov.donors.donor_log if gov.donors.donor_log is not None else []
        ops = tuple(
            DonorOp("add", e.donor_id, e.scope, e.cache_key, len(e.token_ids))
            if kind == "add"
            else DonorOp("drop", e.donor_id)
            for kind, e in log
        )
        log.clear()
        while True:
            try:
                ops += (DonorOp("forget", gov.donors.unregistered.get_nowait()),)
            except queue.Empty:
                break
        assert self.hook.tp_pending is not None
        for op in ops:
            if op.kind != "drop":
                self.hook.tp_pending.settle(op.donor_id)  # NOTE: as every follower does with this message
        self.hook.fresh = frozenset(op.donor_id for op in ops if op.kind == "add")
        return ops

    def apply(self, msg: RoundSync) -> list[str]:
        """Every rank: apply rank 0's message. Returns what did not fit this rank's state."""
        hook = self.hook
        hook.now, hook.audit_seen = msg.now, msg.audit_broken
        problems = [msg.disabled] if msg.disabled else []
        if isinstance(hook.gov, FollowerGovernor):
            hook.gov.audit_broken = msg.audit_broken
            problems += hook.gov.replay(msg.donor_ops)
        live = {st.serial: st for _, st in hook.live()}
        taken, self.taken = self.taken, {}
        for c in msg.choices:
            st = live.get(c.serial)
            if st is None or st.label != c.rid:
                problems.append(f"request serial {c.serial} ({c.rid}) is not this rank's")
                continue
            if isinstance(hook.gov, FollowerGovernor):
                problems += self.probe_as_leader(c)
            donor = hook.gov.donor(c.donor_id) if c.donor_id is not None else None
            if c.chosen is not None and donor is None:
                problems.append(f"donor {c.donor_id} is not registered on this rank")
                continue
            decisions, plans = taken.get(c.serial, ([c.chosen] if c.chosen else [], None))
            self.decisions.take(st, c, donor, decisions, plans)
        for serial in msg.durable:
            st = live.get(serial)
            if st is None:
                problems.append(f"request serial {serial} is not this rank's")
            elif st.chosen is not None:
                st.durable = True
        return problems

    def probe_as_leader(self, c: Choice) -> list[str]:
        """A follower walks its tree to the donors rank 0 measured, in the same order (a walk can
        split nodes), drops those rank 0 found evicted, and reports a length rank 0 did not see."""
        gov = self.hook.gov
        assert isinstance(gov, FollowerGovernor)
        problems = []
        for donor_id, leader_len in c.probed:
            entry = gov.donor(donor_id)
            if entry is None:
                problems.append(f"donor {donor_id} is not registered on this rank")
                continue
            d_len, _ = self.tree.donor_path(entry)
            if d_len != leader_len:
                problems.append(f"donor {donor_id}: {d_len} live tokens here, {leader_len} on rank 0")
            if d_len == 0:
                gov.drop_donor(donor_id)
        return problems
