"""A request's identity: its server-side state and the exact tree's key, and session binding.

A request seen for the first time gets its state (:class:`~.state.ReqState`, kept on SGLang's
``Req`` object itself), and ``req.extra_key`` is replaced with the key derived from the request's
verified context (:mod:`semgov.context`: tenant, namespace, LoRA adapter and cache
salt), so tenants and namespaces never share exact-prefix nodes.
"""

from __future__ import annotations

from typing import Any

from engine_hooks.core.plan import request_label
from engine_hooks.sglang.checks import Checks
from engine_hooks.sglang.state import STATE_ATTR, Hook, ReqState, log_fields, state_of
from semgov.context import KEY_PREFIX, RequestContext, anonymous_cache_key
from semgov.log import get_logger

SESSION_ATTR = "_semgov_session_key"  # NOTE: on SGLang's Session: the tree key its first request had


class Identity:
    """Gives each request its state and tree key (total: whatever the client sent, it gets one)."""

    def __init__(self, hook: Hook, checks: Checks) -> None:
        self.hook = hook
        self.checks = checks

    def state(self, req: Any) -> ReqState:
        """The request's state, created (and its tree key set) on first sight."""
        st = state_of(req)
        if st is not None:
            return st
        hook = self.hook
        serial = next(hook.serials)
        ctx, derived, salt, canary = self._key(req, serial)
        st = ReqState(serial, request_label(req.rid), ctx, derived, salt, canary=canary)
        if canary:
            req.skip_radix_cache_insert = True  # NOTE: a replay's KV is nobody's prefix
        elif ctx is not None and ctx.calibration is not None:
            self._calibration(req, st, ctx)
        if getattr(req, "session", None) is not None:
            try:
                self.session_check(req, st)
            except Exception as e:  # noqa: BLE001 - any doubt: nothing shared, no reuse
                self.checks.hook_error("session", None, e)
                st.context, st.cache_key = None, f"{KEY_PREFIX}anon:isolated:{hook.boot}-{serial}"
        setattr(req, STATE_ATTR, st)
        hook.reqs[serial] = req
        # NOTE: isolation by the cache key: whatever the caller sent, the exact tree is keyed
        # server-side by tenant, namespace, adapter and salt (or by a keyed hash of what it sent).
        req.extra_key = st.cache_key
        return st

    def _key(self, req: Any, serial: int) -> tuple[RequestContext | None, str, str | None, bool]:
        """(verified context, derived tree key, cache salt, is a canary replay) of a new request."""
        hook = self.hook
        ctx: RequestContext | None = None
        salt: str | None = None
        canary = False
        try:
            sent, lora = req.extra_key, getattr(req, "lora_id", None)
            raw_salt = getattr(req, "cache_salt", None) or None
            salt = raw_salt if isinstance(raw_salt, str) else None
            key = hook.gov.context_key
            if hook.canaries is not None and hook.canaries.marker.verify(sent):
                # NOTE: this hook's own cold replay: a tree key of its own (no exact-prefix hit, nothing
                # shared), no context (no semantic reuse, never a donor).
                canary, derived = True, f"{KEY_PREFIX}canary:{hook.boot}-{serial}"
            else:
                verdict = hook.gov.verdict_of(sent, lora)
                ctx = verdict.context
                if ctx is not None:
                    derived = ctx.cache_key(key, salt)
                elif verdict.refused is not None:
                    # NOTE: a token that was sent and does not verify (expired, another audience, a
                    # key this server does not hold) never lands in a shared bucket: a key of its own.
                    derived = f"{KEY_PREFIX}anon:refused:{hook.boot}-{serial}"
                else:
                    derived = anonymous_cache_key(key, sent, lora, salt)
        except Exception as e:  # noqa: BLE001 - a key that cannot be derived shares nothing
            self.checks.hook_error("context", None, e)
            ctx, derived = None, f"{KEY_PREFIX}anon:isolated:{hook.boot}-{serial}"
        return ctx, derived, salt, canary

    def _calibration(self, req: Any, st: ReqState, ctx: RequestContext) -> None:
        """A ``semgov calibrate`` request (its namespace is its run's): the role's treatment.

        ``cold`` and ``release`` lose their context (no decision, no reuse, never a donor) and get a
        tree key of their own; ``release`` first drops the run's donors (the calibration is done
        with the pair); only a ``donor``'s KV enters the tree."""
        assert ctx.calibration is not None
        role = st.calibration = ctx.calibration.role
        if role == "donor":
            return
        req.skip_radix_cache_insert = True  # NOTE: a measured answer's KV is nobody's prefix
        if role == "recipient":
            return
        if role == "release":
            try:
                self.hook.gov.release_scope(ctx, st.cache_salt)
            except Exception as e:  # noqa: BLE001 - a registry problem costs the release, never the scheduler
                self.checks.hook_error("calibration_release", None, e)
        st.context, st.cache_key = None, f"{KEY_PREFIX}calibration:{self.hook.boot}-{st.serial}"

    def session_check(self, req: Any, st: ReqState) -> None:
        """An SGLang session request continues another request's tokens (and, streaming, its KV)
        under this request's own ``extra_key``: it is served only within the tree key the session's
        first request had, and never from a streaming session (its KV bypasses the tree's keys).
        Otherwise the request is refused as SGLang refuses a bad session request (its prompt cut to
        one token, aborted before any prefill when seen in ``hold_back``), with a key of its own.
        """
        session = req.session
        why: str | None = None
        if req.to_finish is not None:
            return  # NOTE: SGLang refused it already (a bad session request): nothing runs, nothing binds
        if getattr(session, "streaming", False):
            why = "streaming sessions are not served with semgov (their KV bypasses the tree's keys)"
        else:
            bound = getattr(session, SESSION_ATTR, None)
            if bound is None:
                setattr(session, SESSION_ATTR, st.cache_key)
            elif bound != st.cache_key:
                why = "this session belongs to another tenant, namespace, adapter or cache salt"
        if why is None:
            return
        self.hook.count("session_refused")
        get_logger().warning("semgov refused a session request", reason=why, **log_fields(st))
        st.context, st.cache_key = None, f"{KEY_PREFIX}anon:session-refused:{self.hook.boot}-{st.serial}"
        req.set_finish_with_abort(f"semgov: {why}")

    def donor_id(self, st: ReqState) -> str:
        """A donor's id: this process's boot id and the request's serial (never the client's rid)."""
        return f"sglang-{self.hook.boot}-{st.serial}"
