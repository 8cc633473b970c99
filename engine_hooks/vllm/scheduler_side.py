"""The scheduler side of semgov's vLLM connector: decisions, the load plan, donors, the audit trail.

vLLM's scheduler calls these methods on its own thread; each only reads vLLM's objects, queues
work for semgov's decision thread (:class:`~engine_hooks.core.governor.Governor`, the same core
and audit log as the SGLang backend) and answers from what is ready, never waiting:

- ``get_num_new_matched_tokens``: a request with a verified context token (in
  ``kv_transfer_params.semgov_context``) and donors of its scope has its candidate search and
  decision queued once; the scheduler is answered ``None`` (ask again next step) until the
  decision, and the durability of an allow record, are in, or ``SEMGOV_DECISION_TIMEOUT_MS`` /
  ``SEMGOV_AUDIT_WAIT_MS`` pass (then 0: cold). On allow the answer is the approved,
  token-verified run contiguous from vLLM's own prefix hit, cut to whole blocks, that the store
  still holds; on deny, no context, or any error, 0.
- ``update_state_after_alloc`` turns that answer into a load of the recipient's new blocks;
  ``build_connector_meta`` sends loads, donor saves and store drops to the worker
  (:class:`~engine_hooks.vllm.meta.StepPlan`); ``update_connector_output`` audits each load the
  worker reports (``realization`` / ``realization_failed``; vLLM recomputes failed blocks).
- every allow it does not load says why, through the core
  (:meth:`~engine_hooks.core.governor.Governor.not_realized`, :mod:`engine_hooks.core.unrealized`):
  ``late`` (abandoned past the deadline; reported by the core when it finishes), ``not_durable``,
  ``donor_evicted`` (its KV left the store), ``unrealizable_plan`` (a run that does not continue
  vLLM's hit, a leading recompute), ``prefix_cached`` (vLLM's own hit covers it),
  ``another_donor_chosen``, ``unsealed``, ``discarded_by_engine`` (vLLM dropped the answered load:
  a request that skips reading the prefix cache, e.g. prompt logprobs or echo with logprobs),
  ``copy_failed`` (the worker's load failed), ``hook_error``, ``aborted`` (finished first).
- ``request_finished`` registers a fully saved request that finished normally, never received
  reused KV, and had a verified context, as a donor (signed provenance, off this thread), once
  every worker reported its store entry saved (:class:`~engine_hooks.vllm.book.StoreBook`; on a
  GPU that report may come steps later, and a recipient waits for it within the decision deadline);
- a worker that refused its KV cache at start (``WorkerReport.reuse_off``: an attention backend
  or cache layout the connector cannot read) turns governed reuse off for the server: one
  ``reuse_disabled`` event (gauge ``semgov:reuse_disabled``), no decisions, no saves from then on.

NOTE: invariants:
- state is keyed by vLLM's internal request id, which vLLM makes unique (the client's id plus a
  random suffix); records name requests by :func:`request_label` of it;
- a request that received reused KV never becomes a donor; a donor is registered only from a
  store entry holding every prompt position, its copies complete on every worker;
- reused KV never enters vLLM's prefix cache: a recipient's blocks from its load on are sealed
  (:func:`seal_blocks`) before vLLM allocates them, or nothing is loaded;
- nothing a client sends raises out of these methods: any error costs reuse (0 tokens), never
  the scheduler.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import secrets
import time
from array import array
from dataclasses import dataclass, field
from typing import Any

from engine_hooks.core.decisions import PendingDecision
from engine_hooks.core.donors import DonorSpec, LiveDonor
from engine_hooks.core.governor import Governor
from engine_hooks.core.plan import plan_pieces, recompute_leading, request_label
from engine_hooks.core.settings import HookSettings
from engine_hooks.core.unrealized import Reason
from engine_hooks.vllm.blocks import block_ids, scheduled, seal_blocks, trim, unloadable_reason
from engine_hooks.vllm.book import StoreBook, store_budget_tokens, store_mb
from engine_hooks.vllm.meta import LoadOp, LoadPiece, SaveOp, StepPlan, WorkerReport
from engine_hooks.vllm.scope import issued_salt
from semgov.context import RequestContext
from semgov.decide import SignedDecision
from semgov.log import describe_error, get_logger

TOKEN_FIELD = "semgov_context"
_FINISHED_OK = {"FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED"}


@dataclass(slots=True, eq=False)
class _Req:
    """What the connector keeps of one live request (dropped at ``request_finished``)."""

    label: str
    context: RequestContext | None
    cache_salt: str | None
    tokens: array[int]
    decided: bool = False
    first_seen: float = 0.0
    pending: PendingDecision | None = None
    deadline: float = 0.0
    chosen: SignedDecision | None = None
    durable: bool = False
    donor: LiveDonor | None = None
    plan: tuple[int, tuple[LoadPiece, ...]] | None = None  # (start, pieces) last answered
    recipient: bool = False  # received (or was promised) reused KV: never a donor
    save_key: str | None = None
    saved_upto: int = 0
    stats: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Sent:
    """A load sent to the worker, kept to audit its outcome."""

    label: str
    decision_id: str
    donor_id: str
    pieces: tuple[LoadPiece, ...]


class SchedulerSide:
    """semgov on vLLM's scheduler thread (one per engine core)."""

    def __init__(self, vllm_config: Any, governor: Governor | None = None) -> None:
        env = dict(os.environ)
        self.settings = HookSettings.from_env(env)
        self.block_size = int(vllm_config.cache_config.block_size)
        self.gov = governor or Governor(
            self.settings, engine_name="vllm", tokenizer_path=vllm_config.model_config.tokenizer
        )
        workers = int(getattr(vllm_config.parallel_config, "world_size", 1) or 1)
        self.book: StoreBook[DonorSpec] = StoreBook(store_budget_tokens(vllm_config, store_mb(env)), workers)
        self.reuse_off: str | None = None  # NOTE: a worker's register_kv_caches refused its cache
        self.boot = secrets.token_hex(4)
        self._serial = itertools.count(1)
        self.reqs: dict[str, _Req] = {}
        self._loads: list[LoadOp] = []
        self._sent: dict[str, _Sent] = {}
        self.stats: dict[str, int] = dict.fromkeys(
            (
                "decided",
                "allowed",
                "calibration_refused",
                "loads",
                "realized_tokens",
                "failed_loads",
                "late",
                "donors",
                "evictions",
                "unscoped",
            ),
            0,
        )
        self.gov.watch()
        get_logger().info(
            "semgov vLLM connector (scheduler) ready",
            policy=self.gov.policy_version,
            store_tokens=self.book.budget,
            block_size=self.block_size,
        )

    # ---- requests --------------------------------------------------------------------------

    def _state(self, request: Any) -> _Req:
        rid = str(request.request_id)
        st = self.reqs.get(rid)
        if st is None:
            params = request.kv_transfer_params
            token = params.get(TOKEN_FIELD) if isinstance(params, dict) else None
            lora = request.lora_request.lora_name if request.lora_request is not None else None
            salt = request.cache_salt if isinstance(request.cache_salt, str) else None
            ctx = None
            if self._scoped(rid, salt):
                # NOTE: vLLM carries the token in a field of its own (SGLang appends the adapter to
                # extra_key): the token is verified alone, then bound to vLLM's resolved adapter, so
                # a LoRA request's candidates and donors are those of its adapter only.
                ctx = self.gov.verdict_of(token, None, dedicated=True).context
                if ctx is not None and ctx.calibration is not None:
                    # NOTE: calibration runs against SGLang only (docs/vllm.md "What it realizes"):
                    # here its requests are served cold, decided for nothing and never donors.
                    self.stats["calibration_refused"] += 1
                    ctx = None
                if ctx is not None:
                    ctx = dataclasses.replace(ctx, lora_id=lora if isinstance(lora, str) else None)
            st = _Req(request_label(rid), ctx, salt, array("q", request.prompt_token_ids or ()))
            self.reqs[rid] = st
        return st

    def _scoped(self, rid: str, salt: str | None) -> bool:
        """Whether the request's salt is one the scope middleware issued (checked here, where every
        route converges). NOTE: one that is not reached the engine past the middleware: it gets no
        governed reuse, never becomes a donor, and is counted and logged."""
        if salt is not None and issued_salt(self.gov.context_key, salt):
            return True
        reason = "no_salt" if salt is None else "foreign_salt"
        self.stats["unscoped"] += 1
        self.gov.metrics.unscoped.labels(reason).inc()
        get_logger().warning(
            "semgov vLLM connector: request not scoped by the middleware (no governed reuse)",
            request=request_label(rid),
            reason=reason,
        )
        return False

    def matched(self, request: Any, num_computed: int) -> tuple[int | None, bool]:
        """vLLM's ``get_num_new_matched_tokens``: approved tokens to load after ``num_computed``."""
        try:
            st = self._state(request)
            if getattr(request, "skip_reading_prefix_cache", None) is True and not st.decided:
                return self._skips_cache(st, num_computed), False
            n = self._matched(st, num_computed)
            if n and not seal_blocks(request, num_computed // self.block_size):
                self._not_realized(st, "unsealed", _UNSEALED)
                return 0, False
            return n, False
        except Exception as e:  # noqa: BLE001 - any doubt: no reuse, the request runs cold
            get_logger().error("semgov vLLM connector: matching failed", error=describe_error(e))
            return 0, False

    def _matched(self, st: _Req, m: int) -> int | None:
        now = time.monotonic()
        if st.context is None or self.gov.audit_broken is not None or self.reuse_off is not None:
            return 0
        if not st.decided:
            if len(st.tokens) - m < self.settings.min_unmatched_tokens:
                st.decided = True
                return 0
            self.gov.drain_donors()
            if not self.gov.has_donors(st.context, st.cache_salt):
                # NOTE: a donor that finished just before may still be registering (off this
                # thread), or its worker's copies still completing: wait for it, within the
                # decision deadline, rather than run cold.
                if st.first_seen == 0.0:
                    st.first_seen = now
                if (
                    self.gov.registrations_in_flight() or self.book.waiting()
                ) and now - st.first_seen < self.settings.decision_timeout_ms / 1000:
                    return None
                st.decided = True
                return 0
            st.decided = True
            st.pending = self.gov.decide_later(st.label, st.context, st.cache_salt, st.tokens)
            st.deadline = now + self.settings.decision_timeout_ms / 1000
        if st.pending is not None:
            if not st.pending.done:
                if now < st.deadline:
                    return None
                if st.pending.abandon("late"):
                    # NOTE: still audited by the decision thread, never acted on; its allows are
                    # reported ``late`` by the core when it finishes. Not abandoned: it finished
                    # just now, and is taken below (one outcome either way).
                    st.pending = None
                    self.stats["late"] += 1
                    return 0
            self._take(st, st.pending, m)
            st.pending = None
            st.deadline = now + self.settings.audit_wait_ms / 1000
        if st.chosen is None or st.donor is None:
            return 0
        decision_id = str(st.chosen.record["decision_id"])
        # NOTE: durability is remembered: the trail answers True once (a preempted recipient is
        # planned again from the same decision, long after).
        st.durable = st.durable or self.gov.decision_durable(decision_id, 0)
        if not st.durable:
            if now < st.deadline and self.gov.audit_broken is None:
                return None
            self._not_realized(
                st,
                "not_durable",
                f"the allow decision is not durable in the audit log (SEMGOV_AUDIT_WAIT_MS="
                f"{self.settings.audit_wait_ms})",
            )
            return 0
        pieces = self._plan(st, st.chosen, st.donor, m)
        st.plan = (m, pieces)
        return sum(p.length for p in pieces)

    def _skips_cache(self, st: _Req, m: int) -> int:
        """A request that skips reading the prefix cache (prompt logprobs, or its own setting): vLLM
        zeroes whatever the connector answers, without waiting for a ``None``. Its decision is still
        made and audited, and abandoned at once: each allow is reported ``discarded_by_engine``."""
        if self._matched(st, m) is None and st.pending is not None:  # NOTE: queued (or still waiting)
            self._drop_pending(st, "discarded_by_engine", _SKIPS_CACHE)
        elif st.chosen is not None:
            self._not_realized(st, "discarded_by_engine", _SKIPS_CACHE)
        return 0

    def _drop_pending(self, st: _Req, reason: Reason, why: str) -> None:
        """Stop waiting for the request's decision: abandoned (the core reports its allows when it
        finishes) or, when it finished first, its allows reported here. One outcome either way."""
        job, st.pending = st.pending, None
        if job is None or job.abandon(reason, why):
            return
        for d in job.decisions:
            if d.decision == "allow":
                self.gov.not_realized(
                    reason,
                    request_id=st.label,
                    decision_id=str(d.record["decision_id"]),
                    donor_id=d.donor_id,
                    detail=why,
                )

    def _take(self, st: _Req, job: PendingDecision, m: int) -> None:
        """The allowed donor (still in the store) whose plan from ``m`` loads the most; every other
        allow says why it is not loaded (an allow that is not acted on is never a silent drop)."""
        self.stats["decided"] += 1
        best = 0
        skipped: list[tuple[SignedDecision, LiveDonor, Reason, str]] = []
        for dec, (entry, _) in zip(job.decisions, job.candidates, strict=False):
            if dec.decision != "allow":
                continue
            self.stats["allowed"] += 1
            if self.book.usable(entry.donor_id) == 0:
                self.gov.drop_donor(entry.donor_id)  # NOTE: its KV left the store
                skipped.append((dec, entry, "donor_evicted", "the donor's KV left the connector's store"))
                continue
            k = sum(p.length for p in self._plan(st, dec, entry, m))
            if k > best:
                if st.chosen is not None and st.donor is not None:
                    skipped.append((st.chosen, st.donor, "another_donor_chosen", ""))
                best, st.chosen, st.donor = k, dec, entry
            elif k > 0:
                skipped.append((dec, entry, "another_donor_chosen", ""))
            else:
                why = unloadable_reason(dec.approved_spans, m, self.block_size, self.settings)
                if why is not None:
                    self.stats["unloadable"] = self.stats.get("unloadable", 0) + 1
                    skipped.append((dec, entry, "unrealizable_plan", why))
                else:
                    skipped.append((dec, entry, "prefix_cached", _PREFIX_CACHED.format(m=m)))
        for dec, entry, code, why in skipped:
            if code == "another_donor_chosen" and st.donor is not None:
                why = f"donor {st.donor.donor_id} loads more ({best} tokens)"
            self.gov.not_realized(
                code,
                request_id=st.label,
                decision_id=str(dec.record["decision_id"]),
                donor_id=entry.donor_id,
                detail=why,
            )

    def _plan(self, st: _Req, dec: SignedDecision, donor: LiveDonor, m: int) -> tuple[LoadPiece, ...]:
        """Approved, token-verified positions contiguous from ``m``, whole blocks, leaving the last
        prompt token to compute (vLLM needs one), within the donor's stored KV."""
        n = self.book.usable(donor.donor_id)
        if n == 0:
            return ()
        spans = recompute_leading(dec.approved_spans, self.settings.shifted_recompute_pct / 100)
        pieces = plan_pieces(spans, m, len(st.tokens) - 1, n, self.block_size)
        out: list[LoadPiece] = []
        d = donor.token_ids
        for p in pieces:
            r0, d0, k = p.recipient_start, p.donor_start, p.length
            # NOTE: token identity, position by position, against the donor's own prompt.
            if st.tokens[r0 : r0 + k] != array("q", d[d0 : d0 + k]):
                break
            out.append(LoadPiece(r0, d0, k))
        # NOTE: a piece cut short above may leave a partial block: keep whole blocks only.
        return trim(tuple(out), (sum(p.length for p in out) // self.block_size) * self.block_size)

    def after_alloc(self, request: Any, blocks: Any, num_external: int) -> None:
        """vLLM's ``update_state_after_alloc``: a load of ``num_external`` planned tokens."""
        try:
            st = self.reqs.get(str(request.request_id))
            if st is None:
                return
            if num_external <= 0:
                # NOTE: admitted without the load: a decision still pending can no longer be acted on
                self._drop_pending(st, "discarded_by_engine", "vLLM admitted the request before its decision")
                self._discarded(request, st)
                return
            if st.plan is None or st.chosen is None or st.donor is None:
                raise RuntimeError(f"vLLM allocated {num_external} external tokens semgov did not plan")
            pieces = trim(st.plan[1], num_external)
            if sum(p.length for p in pieces) != num_external:
                raise RuntimeError(
                    f"planned {sum(p.length for p in st.plan[1])} tokens, vLLM took {num_external}"
                )
            st.recipient = True
            ids = tuple(int(b) for b in blocks.get_block_ids()[0])
            rid = str(request.request_id)
            self._loads.append(LoadOp(rid, st.donor.donor_id, ids, pieces))
            self._sent[rid] = _Sent(st.label, str(st.chosen.record["decision_id"]), st.donor.donor_id, pieces)
        except Exception as e:  # noqa: BLE001
            # NOTE: vLLM now counts tokens as computed that nobody loads: the worker fails their
            # blocks (a load with no pieces) and vLLM recomputes them.
            get_logger().error("semgov vLLM connector: load planning failed", error=describe_error(e))
            st = self.reqs.get(str(request.request_id))
            if st is not None and st.chosen is not None and not st.recipient:
                self._not_realized(st, "hook_error", f"load planning failed: {describe_error(e)}")
            m = st.plan[0] if st is not None and st.plan is not None else 0
            ids = block_ids(blocks)[m // self.block_size : -(-(m + num_external) // self.block_size)]
            self._loads.append(LoadOp(str(request.request_id), "", ids, ()))

    def _discarded(self, request: Any, st: _Req) -> None:
        """vLLM allocated the request with no external tokens after semgov answered a load: it
        dropped the load (``skip_reading_prefix_cache``: prompt logprobs, echo with logprobs, or a
        client's own setting; a sub-block local tail it keeps). Said once, unless already realized."""
        planned = sum(p.length for p in st.plan[1]) if st.plan is not None else 0
        if planned <= 0 or st.chosen is None or st.recipient:
            return
        skip = getattr(request, "skip_reading_prefix_cache", None) is True
        self._not_realized(
            st,
            "discarded_by_engine",
            f"vLLM took 0 of the {planned} tokens answered"
            + (
                ": the request skips reading the prefix cache (prompt logprobs, or its own setting)"
                if skip
                else ""
            ),
        )
        st.plan = None

    # ---- each step -------------------------------------------------------------------------

    def build(self, scheduler_output: Any) -> StepPlan:
        """vLLM's ``build_connector_meta``: this step's drops, loads and donor saves."""
        plan = StepPlan(loads=self._loads)
        self._loads = []
        try:
            self.gov.drain_donors()
            self._saves(scheduler_output, plan)
        except Exception as e:  # noqa: BLE001 - donors are best effort; loads already planned go out
            get_logger().error("semgov vLLM connector: planning saves failed", error=describe_error(e))
        plan.drops = self.book.take_drops()
        return plan

    def _saves(self, out: Any, plan: StepPlan) -> None:
        blocks = out.kv_connector_block_state
        if self.reuse_off is not None:
            return
        for rid, n, computed in scheduled(out):
            st = self.reqs.get(rid)
            if st is None or st.context is None or st.recipient or blocks is None:
                continue
            total = len(st.tokens)
            if st.save_key is None:
                if st.saved_upto or not self._start_donor(st, total):
                    continue
            end = min(computed + n, total)
            if end <= st.saved_upto:
                continue
            ids = blocks.get_block_ids(rid)
            assert st.save_key is not None
            plan.saves.append(SaveOp(st.save_key, tuple(ids[0]), st.saved_upto, end, total, st.label))
            st.saved_upto = end

    def _start_donor(self, st: _Req, total: int) -> bool:
        key = f"vllm-{self.boot}-{next(self._serial)}"
        evicted = self.book.reserve(key, total)
        if evicted is None:
            st.saved_upto = -1  # NOTE: never saved (too large for the store, or store off)
            return False
        for old in evicted:
            self.gov.drop_donor(old)
        self.stats["evictions"] = self.book.evictions
        st.save_key = key
        return True

    def output(self, connector_output: Any) -> None:
        """vLLM's ``update_connector_output``: audit the loads and failed saves the worker reports."""
        try:
            rep = connector_output.kv_connector_worker_meta
            if not isinstance(rep, WorkerReport):
                return
            if rep.reuse_off:
                self._turn_off(rep.reuse_off)
            for rid, n in rep.loaded.items():
                sent = self._sent.pop(rid, None)
                if sent is not None:
                    self._realized(sent, n)
            for rid, why in rep.failed.items():
                sent = self._sent.pop(rid, None)
                self.stats["failed_loads"] += 1
                if sent is None:
                    # NOTE: blocks no decision planned (load planning failed: reported there)
                    get_logger().warning("semgov vLLM connector: unplanned blocks failed", error=why[:200])
                    continue
                self.gov.not_realized(
                    "copy_failed",
                    request_id=sent.label,
                    decision_id=sent.decision_id,
                    donor_id=sent.donor_id,
                    detail=why,
                )
            for key, why in rep.save_failed.items():
                self.book.release(key)
                get_logger().warning("semgov vLLM connector: donor save failed", key=key, error=why[:200])
            for key, workers in rep.saved.items():
                spec = self.book.saved(key, workers)
                if spec is not None:
                    self._register(spec)
        except Exception as e:  # noqa: BLE001
            get_logger().error(
                "semgov vLLM connector: reading the worker's report failed", error=describe_error(e)
            )

    def _realized(self, sent: _Sent, n: int) -> None:
        self.stats["loads"] += 1
        self.stats["realized_tokens"] += n
        self.gov.event(
            "realization",
            request_id=sent.label,
            decision_id=sent.decision_id,
            donor_id=sent.donor_id,
            materialized_tokens=n,
            spans=[
                {
                    "recipient_start": p.recipient_start,
                    "donor_start": p.donor_start,
                    "length": p.length,
                    "kind": "prefix" if p.shift == 0 else "shifted",
                }
                for p in sent.pieces
            ],
            detail="vllm connector load",
        )

    def _not_realized(self, st: _Req, reason: Reason, why: str) -> None:
        """The chosen allow is not loaded (once: the request then has no chosen decision)."""
        if st.chosen is not None:
            self.gov.not_realized(
                reason,
                request_id=st.label,
                decision_id=str(st.chosen.record["decision_id"]),
                donor_id=st.donor.donor_id if st.donor else None,
                detail=why,
            )
        st.chosen = st.donor = None

    def finished(self, request: Any) -> tuple[bool, dict[str, Any] | None]:
        """vLLM's ``request_finished``: register a complete donor, or drop its store entry."""
        try:
            # NOTE: a load sent this step is audited when the step's report comes, which vLLM
            # hands over after finishing the step's requests: ``_sent`` outlives the request.
            st = self.reqs.pop(str(request.request_id), None)
            if st is not None:
                self._unfinished(st, request)
            if st is None or st.save_key is None:
                return False, None
            ok = getattr(request.status, "name", "") in _FINISHED_OK
            if ok and st.saved_upto == len(st.tokens) and not st.recipient and st.context is not None:
                spec = DonorSpec(st.save_key, st.context, st.cache_salt or "", st.cache_salt, st.tokens, None)
                ready = self.book.finish(st.save_key, spec)
                if ready is not None:
                    self._register(ready)
                # NOTE: else held until the workers report the entry saved (output), or evicted
                return False, None
            self.book.release(st.save_key)
        except Exception as e:  # noqa: BLE001
            get_logger().error("semgov vLLM connector: request_finished failed", error=describe_error(e))
        return False, None

    def _register(self, spec: DonorSpec) -> None:
        """A complete store entry (finished as a donor, saved by every worker) becomes a donor."""
        self.gov.submit_donor(spec)
        self.stats["donors"] += 1

    def _turn_off(self, why: str) -> None:
        """A worker cannot reuse KV (its cache layout or attention backend was refused at start):
        governed reuse is off for this server from now on, audited once (``reuse_disabled``, the
        ``semgov:reuse_disabled`` gauge); pending decisions and chosen allows say why."""
        if self.reuse_off is not None:
            return
        self.reuse_off = why
        get_logger().error("semgov vLLM connector: governed KV reuse off for this server", reason=why)
        self.gov.event("reuse_disabled", detail=why)
        text = f"semantic reuse was turned off: {why}"
        for st in self.reqs.values():
            self._drop_pending(st, "reuse_disabled", text)
            if not st.recipient:
                self._not_realized(st, "reuse_disabled", text)

    def _unfinished(self, st: _Req, request: Any) -> None:
        """A request that finishes with a decision pending, or an allow chosen and never loaded."""
        status = getattr(request.status, "name", "?")
        self._drop_pending(st, "aborted", f"the request finished ({status}) before its decision")
        if st.chosen is not None and not st.recipient:
            self._not_realized(st, "aborted", f"the request finished ({status}) before the load")

    def reset(self) -> bool:
        """vLLM's ``reset_cache`` (``POST /reset_prefix_cache?reset_external=true``): every donor
        is forgotten and its store entry dropped; requests being saved stop being donors."""
        try:
            for st in self.reqs.values():
                if st.save_key is not None:
                    self.book.release(st.save_key)
                    st.save_key, st.saved_upto = None, -1
            for key in list(self.book.keys()):
                self.book.release(key)
            self.gov.forget_all_donors()
            return True
        except Exception as e:  # noqa: BLE001
            get_logger().error("semgov vLLM connector: reset failed", error=describe_error(e))
            return False

    def close(self) -> None:
        self.gov.close()


_UNSEALED = "vLLM's request has no block hashes to seal: reused KV would enter its prefix cache"
_SKIPS_CACHE = "the request skips reading the prefix cache (prompt logprobs, or its own setting)"
_PREFIX_CACHED = "vLLM's own prefix hit ({m} tokens) already holds every approved position"
