"""Guard checks of the hook's changes to the pool, hook errors, and turning semantic reuse off.

The invariant guard (:mod:`.guard`) checks the pool after every realization (or failed one; inside
a prefill round, once when the round ends) and at the release or abort of every request that
received realized slots: wherever the hook changed the pool. A problem it finds is an invariant
violation: semantic reuse goes off for the process (audited; raised when ``strict``).
"""

from __future__ import annotations

import time
from typing import Any

from engine_hooks.sglang.guard import InvariantGuard, InvariantViolation
from engine_hooks.sglang.state import Hook, ReqState, log_fields, state_of
from semgov.log import describe_error, get_logger


class Checks:
    """The guard's checks (deferred per prefill round), hook errors, disabling reuse."""

    def __init__(self, hook: Hook, guard: InvariantGuard) -> None:
        self.hook = hook
        self.guard = guard
        # NOTE: inside a prefill round (begin_round .. end_round, the plugin's AROUND hook) the
        # guard checks of the hook's changes run once, at the round's end (see check).
        self.round_open = False
        self.deferred: list[tuple[str, ReqState | None]] = []

    def pending_private(self) -> int:
        """Realized slots the hook holds that are not yet in a request's row."""
        n = 0
        for req, st in self.hook.live():
            if st.private is not None and not req.kv.holds_kv:
                n += int(st.private.numel())
        return n

    def begin_round(self) -> None:
        """A prefill round starts: defer guard checks to its end."""
        self.round_open = True

    def end_round(self) -> None:
        """The prefill round ended (its batch built, before its forward): one guard check for every
        realization or failed one in it, its cost shared among their requests. Raises only
        :class:`InvariantViolation` (``strict``)."""
        self.round_open = False
        if not self.deferred:
            return
        pending, self.deferred = self.deferred, []
        t0 = time.perf_counter_ns()
        try:
            parts = [w + (f" of request {st.label}" if st is not None else "") for w, st in pending[:8]]
            more = f" and {len(pending) - 8} more" if len(pending) > 8 else ""
            self.check_now(", ".join(parts) + more, None)
        finally:
            share = (time.perf_counter_ns() - t0) // len(pending)
            for _, st in pending:
                if st is not None:
                    st.sched_ns += share

    def check(self, where: str, st: ReqState | None, *, exclude: Any = None) -> None:
        """Check the pool now, or, inside a prefill round, once at its end (:meth:`end_round`).

        NOTE: the check reads the tree's evictable size, which SGLang's tree core recomputes after
        the tree changed (up to about 1.3 ms measured): once per round instead of once per
        realization. The round's batch is checked before its forward runs; a release
        (``exclude``) is checked at once.
        """
        if self.round_open and exclude is None:
            self.deferred.append((where, st))
            return
        self.check_now(where, st, exclude=exclude)

    def check_now(self, where: str, st: ReqState | None, *, exclude: Any = None) -> None:
        hook = self.hook
        hook.stats["guard_checks"] += 1
        owners = [r for r, _ in hook.live() if r is not exclude]
        problem = self.guard.check(owners, self.pending_private())
        if problem is None and hook.pins != 0:
            problem = f"donor pins: {hook.pins} still held outside a realization"
        if problem is None:
            return
        who = f" of request {st.label}" if st is not None else ""
        self.disable(f"after {where}{who}: {problem}", st)

    def hook_error(self, where: str, req: Any, e: BaseException) -> None:
        """A hook error: logged and counted; the caller makes the request run cold."""
        self.hook.stats["hook_errors"] += 1
        st = state_of(req) if req is not None else None
        get_logger().error(
            "semgov hook error: the request runs without semantic reuse",
            where=where,
            error=describe_error(e),
            **log_fields(st),
        )

    def disable(self, reason: str, st: ReqState | None = None) -> None:
        """An invariant violation: semantic reuse off for the process (audited; raised when strict)."""
        hook = self.hook
        get_logger().error(
            "semgov invariant violation: semantic reuse disabled", reason=reason, **log_fields(st)
        )
        hook.gov.event("invariant_violation", detail=reason)
        if hook.tp is not None:
            # NOTE: ranks must change course together: reuse goes off on every rank at the next
            # round start (sync_round); a strict rank stops the server below in any case.
            hook.disable_pending = hook.disable_pending or reason
        else:
            self.turn_off(reason)
        if hook.strict:
            raise InvariantViolation(reason)

    def turn_off(self, reason: str) -> None:
        """Semantic reuse off from now on (every live request drops its plan; audited once)."""
        hook = self.hook
        first = hook.reuse_disabled is None
        hook.reuse_disabled = reason
        if first:
            hook.gov.event("reuse_disabled", detail=reason)
            why = f"semantic reuse was turned off: {reason}"
            for _, st in hook.live():
                hook.abandon(st, "reuse_disabled", why)
                hook.not_realized(st, "reuse_disabled", why)
                st.chosen, st.regions = None, ()
