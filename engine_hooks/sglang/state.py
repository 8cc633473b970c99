"""The hook's state: one object per request (:class:`ReqState`, kept on SGLang's ``Req``) and one
hook-wide object (:class:`Hook`) that every piece of the governed cache receives explicitly.

The pieces (:mod:`.identity`, :mod:`.admission`, :mod:`.realize`, :mod:`.chunked`, :mod:`.rounds`,
:mod:`.checks`, :mod:`.release`) pass a request's :class:`ReqState` along; the tree operations they
need go through the narrow :class:`Tree` interface (the :class:`~.cache.GovernedRadixCache` itself).
"""

from __future__ import annotations

import collections
import itertools
import secrets
import time
import weakref
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from engine_hooks.core.canary import Canaries
from engine_hooks.core.decisions import PendingDecision
from engine_hooks.core.donors import LiveDonor
from engine_hooks.core.governor import Governor
from engine_hooks.core.plan import Piece, Region
from engine_hooks.core.rope import RopeSpec
from engine_hooks.core.settings import HookSettings
from engine_hooks.core.unrealized import Reason, allows
from engine_hooks.sglang.tp import FollowerGovernor, PendingDonors, TpLink
from semgov.context import RequestContext
from semgov.decide import SignedDecision

STATE_ATTR = "_semgov_state"


class RealizationError(RuntimeError):
    """Why an allowed reuse was not realized (the request then runs cold), with its reason code."""

    def __init__(self, message: str, reason: Reason = "copy_failed") -> None:
        super().__init__(message)
        self.reason: Reason = reason


@dataclass(slots=True)
class ReqState:
    """Semantic-reuse state of one request, kept on its SGLang ``Req`` (server-side identity)."""

    serial: int
    label: str
    context: RequestContext | None
    cache_key: str
    cache_salt: str | None
    decided: bool = False
    decisions: list[SignedDecision] = field(default_factory=list)
    chosen: SignedDecision | None = None
    # NOTE: what of the chosen decision's approved spans is copied (canary filter and planned
    # recompute applied), computed once when the decision is taken; match, regions and realization
    # all plan from it (see engine_hooks.sglang.admission).
    spans: list[dict[str, Any]] = field(default_factory=list)
    donor: LiveDonor | None = None
    donor_len: int = 0
    durable: bool = False
    recipient: bool = False
    private: torch.Tensor | None = None
    private_base: int = 0
    pieces: tuple[Piece, ...] = ()
    src_slots: torch.Tensor | None = None
    realizations: int = 0
    retractions: int = 0
    pending: PendingDecision | None = None
    m0: int = 0  # exact match and prompt length when the decision was queued
    limit0: int = 0
    deadline: float = 0.0  # time.monotonic() past which the request is no longer held back
    sched_ns: int = 0  # scheduler-thread time spent in semgov's code for this request
    queued_at: float = 0.0  # time.monotonic() when its decision was queued (0: never)
    held_s: float = 0.0  # from then until it was first let through to admission
    decided_s: float = 0.0  # from then until its decision was taken (done on the decision thread)
    copy_ns: int = 0  # of which not counted there: the realizations' K/V copies (the reuse itself)
    regions: tuple[Region, ...] = ()  # approved runs past the front, still to realize (in order)
    region_deadline: float = 0.0  # past it, a request kept waiting for a chunk boundary gives them up
    regions_realized: int = 0
    shifted: bool = False  # it received shifted KV (a canary may replay it cold)
    canary: bool = False  # a canary's cold replay (engine_hooks.core.canary): no reuse, never a donor
    # NOTE: a ``semgov calibrate`` request's role (semgov.context.CalibrationClaim): a ``donor`` is
    # never decided; ``cold`` and ``release`` have no context (no reuse) and a key of their own; a
    # ``recipient`` is decided under the run's plan; only a donor ever becomes one or enters the tree.
    calibration: str | None = None
    # NOTE: allow decisions of this request that already have their "not realized" event (each
    # allow gets one outcome: a realization, or one such event; engine_hooks.core.unrealized).
    reported: set[str] = field(default_factory=set)

    def decision_id(self) -> str:
        """The chosen decision's id (a chosen decision is required)."""
        assert self.chosen is not None
        return str(self.chosen.record["decision_id"])


def state_of(req: Any) -> ReqState | None:
    """The hook's state of an SGLang request (None before its first ``match_prefix``)."""
    st: ReqState | None = getattr(req, STATE_ATTR, None)
    return st


def log_fields(st: ReqState | None) -> dict[str, Any]:
    """What a log line about a request names: its id (the records' label), tenant, namespace and
    the decision it acts on, when known; never its prompt or tokens."""
    if st is None:
        return {}
    out: dict[str, Any] = {"request_id": st.label}
    if st.context is not None:
        out["tenant"], out["namespace"] = st.context.tenant, st.context.namespace
    if st.chosen is not None:
        out["decision_id"] = str(st.chosen.record.get("decision_id"))
    return out


def int64(tokens: Any) -> np.ndarray[Any, np.dtype[np.int64]]:
    """Token ids as an int64 array: a zero-copy view of an ``array('q')`` (SGLang's own type)."""
    if isinstance(tokens, array) and tokens.typecode == "q":
        return np.frombuffer(tokens, dtype=np.int64)
    return np.asarray(tokens, dtype=np.int64)


def _stats() -> dict[str, int]:
    keys = (
        "decided_requests",
        "decisions",
        "allowed",
        "realizations",
        "realized_tokens",
        "fallbacks",
        "retractions",
        "donors_registered",
        "guard_checks",
        "hook_errors",
        "held",
        "late_decisions",
        "not_durable_in_time",
    )
    return dict.fromkeys(keys, 0)


@dataclass(eq=False)
class Hook:
    """Hook-wide state, one per governed cache: the governor and canaries, the settings, the TP
    link, the boot id, the clock, the counters, and the requests the hook tracks."""

    gov: Governor | FollowerGovernor
    rope: RopeSpec | None
    strict: bool
    tp: TpLink | None = None
    canaries: Canaries | None = None
    boot: str = field(default_factory=lambda: secrets.token_hex(4))
    reuse_disabled: str | None = None
    now: float = 0.0  # with TP: the leader's clock at the last round start (see clock)
    audit_seen: str | None = None  # with TP: the leader's audit state at that round start
    disable_pending: str | None = None  # with TP: reuse goes off at the next round start
    # NOTE: with TP, the donors every rank submitted and rank 0 has not settled, bounded per
    # tenant the same way on every rank (a follower's copies; rank 0's mirror of them), and the
    # donors rank 0 added in this round's message (used only from the next round on).
    tp_pending: PendingDonors | None = None
    fresh: frozenset[str] = frozenset()
    pins: int = 0
    # NOTE: requests the hook has state for, by server-side serial; weak, so a request SGLang
    # drops without telling the cache cannot keep its state (or the guard's view) alive.
    reqs: weakref.WeakValueDictionary[int, Any] = field(default_factory=weakref.WeakValueDictionary)
    serials: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    # NOTE: per finished request, semgov's scheduler-thread nanoseconds (hold, match share,
    # realization, release), newest last; plus what no single request can be charged with.
    sched_ns: collections.deque[int] = field(default_factory=lambda: collections.deque(maxlen=4096))
    sched_ns_unattributed: int = 0
    stats: dict[str, int] = field(default_factory=_stats)

    @property
    def settings(self) -> HookSettings:
        return self.gov.settings

    def count(self, key: str, n: int = 1) -> None:
        """Add to a counter that exists only once it happened (``session_refused``, ...)."""
        self.stats[key] = self.stats.get(key, 0) + n

    def clock(self) -> float:
        """``time.monotonic()``; with TP, the leader's at the round start (every rank the same)."""
        return self.now if self.tp is not None else time.monotonic()

    def audit_broken(self) -> str | None:
        return self.audit_seen if self.tp is not None else self.gov.audit_broken

    def not_realized(self, st: ReqState, reason: Reason, why: str, dec: SignedDecision | None = None) -> None:
        """Say why an allow of ``st`` (by default its chosen one) is not acted on: once per allow,
        and for the chosen one only while nothing of it was realized (a follower rank writes none)."""
        dec = dec if dec is not None else st.chosen
        if dec is None or dec.decision != "allow":
            return
        decision_id = str(dec.record["decision_id"])
        if decision_id in st.reported or (dec is st.chosen and st.realizations):
            return
        st.reported.add(decision_id)
        self.count("allows_not_realized")
        self.gov.not_realized(
            reason, request_id=st.label, decision_id=decision_id, donor_id=dec.donor_id, detail=why
        )

    def abandon(self, st: ReqState, reason: Reason, why: str) -> None:
        """Stop waiting for the request's pending decision: the core reports its allows when it
        finishes; one that finished just now is not acted on either, and is reported here."""
        job, st.pending = st.pending, None
        if job is not None and not job.abandon(reason, why):
            for dec in allows(job.decisions):
                self.not_realized(st, reason, why, dec)

    def live(self) -> Iterator[tuple[Any, ReqState]]:
        """The requests the hook still tracks (waiting, running or retracted), with their state."""
        for req in list(self.reqs.values()):
            st = state_of(req)
            if st is not None:
                yield req, st


class Tree(Protocol):
    """What the pieces use of the radix cache (the :class:`~.cache.GovernedRadixCache` itself)."""

    page_size: int
    kv_pool: Any
    token_to_kv_pool_allocator: Any
    req_to_token_pool: Any
    tree_core: Any

    def donor_path(self, entry: LiveDonor) -> tuple[int, Any]: ...

    def alloc(self, n: int) -> torch.Tensor: ...

    def lock(self, node: Any) -> Any: ...

    def unlock(self, node: Any) -> Any: ...

    def root_node_handle(self, extra_key: Any) -> Any: ...
