"""A request released by SGLang: retracted (keeps its decisions) or finished (a donor, perhaps).

A retracted request keeps its decisions (and may be realized again, under the same decision, when
it is re-admitted); a finished one drops its state, and if it finished normally with a verified
context and never received reused KV, it is registered as a donor under a server-generated id. A
finished request that received shifted KV is offered to the canaries for a cold replay.
"""

from __future__ import annotations

import time
from array import array
from typing import Any

from sglang.srt.managers.schedule_batch import FINISH_ABORT

from engine_hooks.core.donors import DonorSpec
from engine_hooks.sglang.checks import Checks
from engine_hooks.sglang.guard import InvariantViolation
from engine_hooks.sglang.identity import Identity
from engine_hooks.sglang.realize import Realizer
from engine_hooks.sglang.state import Hook, ReqState, state_of
from engine_hooks.sglang.tp import FollowerGovernor
from semgov.log import describe_error


class Release:
    """What a release means for the hook: retraction bookkeeping, canary offers, new donors."""

    def __init__(self, hook: Hook, checks: Checks, identity: Identity, realizer: Realizer) -> None:
        self.hook = hook
        self.checks = checks
        self.identity = identity
        self.realizer = realizer

    def on_release(self, req: Any, checkpointed: bool) -> None:
        """SGLang released ``req`` (``on_release``, after SGLang's own). Raises only
        :class:`InvariantViolation` (``strict``)."""
        st = state_of(req)
        t0 = time.perf_counter_ns()
        try:
            if st is None:
                return
            touched = st.recipient or st.private is not None
            self.released(req, st, checkpointed)
            # NOTE: the guard runs where the hook changed the pool: after every realization, and
            # at the release of every request that received (or holds) realized slots. A release
            # of a request the hook never gave KV is SGLang's own accounting, not re-checked here.
            if touched:
                self.checks.check("release", st, exclude=req)
        except InvariantViolation:
            raise
        except Exception as e:  # noqa: BLE001 - bookkeeping failed: stop reusing, keep serving
            self.checks.hook_error("on_release", req, e)
            self.checks.disable(
                f"on_release of request {st.label if st else '?'} failed: {describe_error(e)}", st
            )
        finally:
            if st is not None:
                st.sched_ns += time.perf_counter_ns() - t0
                if req.finished():
                    self.hook.sched_ns.append(st.sched_ns)

    def aborted(self, request: Any) -> None:
        """SGLang aborted the request whose cache handle is ``request`` (``release_aborted_request``).
        Raises only :class:`InvariantViolation` (``strict``)."""
        try:
            touched = False
            for req, st in self.hook.live():
                # NOTE: SGLang hands over the request's own handle object: identity, not its rid.
                if getattr(req, "cache_request_handle", None) is not request:
                    continue
                touched = touched or st.recipient or st.private is not None
                self.realizer.release_private(st)
                if not req.kv.holds_kv:
                    self.hook.reqs.pop(st.serial, None)  # aborted while waiting: no release follows
                    self.unrealized_at_end(st, aborted=True)
            if touched:
                self.checks.check("abort", None)
        except InvariantViolation:
            raise
        except Exception as e:  # noqa: BLE001
            self.checks.hook_error("release_aborted_request", None, e)

    def released(self, req: Any, st: ReqState, checkpointed: bool) -> None:
        """``req`` was released by SGLang (its row, if any, already freed)."""
        hook = self.hook
        st.private = None  # the row held the realized slots and release_kv_cache just freed them
        if not req.finished():
            # NOTE: a retracted request comes back with the same Req: it keeps its decisions (one
            # request, one set of signed decisions) and may be realized again under them.
            st.retractions += 1
            hook.stats["retractions"] += 1
            return
        hook.reqs.pop(st.serial, None)
        aborted = isinstance(req.finished_reason, FINISH_ABORT)
        self.unrealized_at_end(st, aborted)
        if (
            hook.canaries is not None
            and st.shifted
            and st.context is not None
            and st.calibration is None
            and not aborted
        ):
            dec = st.chosen
            hook.canaries.offer(
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
            and st.calibration in (None, "donor")
            and not aborted
            and hook.reuse_disabled is None
        ):
            self.submit_donor(
                DonorSpec(
                    donor_id=self.identity.donor_id(st),
                    context=st.context,
                    cache_key=st.cache_key,
                    cache_salt=st.cache_salt,
                    token_ids=array("q", req.origin_input_ids),
                    text=None,
                )
            )

    def unrealized_at_end(self, st: ReqState, aborted: bool) -> None:
        """The request is gone: a decision still pending is abandoned, and an allow it never
        realized says why (aborted; otherwise nothing of its plan was copied before it finished)."""
        hook = self.hook
        if aborted:
            hook.abandon(st, "aborted", "the request was aborted before its decision was acted on")
            hook.not_realized(st, "aborted", "the request was aborted before its allow was realized")
        else:
            hook.abandon(st, "late", "the request finished before its decision was taken")
            hook.not_realized(
                st,
                "unrealizable_plan",
                "the request finished with nothing of its plan realized (no run planned at admission, "
                "or its regions were given up)",
            )

    def submit_donor(self, spec: DonorSpec) -> None:
        """Hand a finished request over for registration; with TP, only within its tenant's quota of
        donors not yet settled (the same on every rank: a follower keeps its copy there)."""
        hook = self.hook
        if isinstance(hook.gov, FollowerGovernor):
            admitted = bool(hook.gov.submit_donor(spec))  # NOTE: its copy, kept in hook.tp_pending
        elif hook.tp_pending is not None and not hook.tp_pending.admit(spec):
            admitted = False
        else:
            hook.gov.submit_donor(spec)
            admitted = True
        if not admitted:
            hook.count("donors_refused")
            return
        hook.stats["donors_registered"] += 1
