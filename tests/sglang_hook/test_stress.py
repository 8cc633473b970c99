"""A seeded, randomized scheduler run of the governed radix cache: every step keeps every invariant.

:class:`_Driver` plays SGLang's scheduler against one :class:`~tests.sglang_hook.conftest.Harness`
(real pools, allocator, tree and requests), drawing one event per step: submit a request (donor
layouts, recipients that should be allowed, unrelated evidence, another scope, no context, a
forged context; families of different page-aligned lengths), a matching round over every waiting
request, an admission with its (possibly chunked) prefill, a later chunk, a normal finish, an
abort of a running or a waiting request, an eviction of a random size, or a pool squeeze (the
pool is filled by blind admissions, then a request with an allowed plan is admitted: either the
hook's allocation finds no room and the request falls back cold, or the realization fits and
SGLang's prefill allocation then runs out). One phase in four is a burst (more running requests,
few finishes). After every step the hook's own guard, SGLang's scheduler invariant check fed as
the scheduler feeds it and the pin accounting must hold; every row released (finish or abort)
must hold exactly what a cold prefill writes. At the end everything is released, the tree
evicted and the pool must be whole.

Steps per run: 12,000 in CI (``SEMGOV_STRESS_STEPS`` sets another number; the runs are seeded, so a
longer run repeats these steps first). Measured (2-core CPU machine, otherwise idle, one torch
thread, 2026-12-07): 30,000 steps per run, page size 1 in 101 s (466 realizations, 123k tokens,
137 cold fallbacks, 9,731 decisions), page size 4 in 112 s (495 realizations, 161 fallbacks, 10,407
decisions), no invariant violation. Counts can still move by a few between runs because one
fallback reason depends on time (a realization waits at most SEMGOV_AUDIT_WAIT_MS for its decision
record to be durable).
"""

from __future__ import annotations

import os
import random
import time
import traceback
from collections import Counter
from typing import Any

import pytest
import torch

from engine_hooks.sglang.state import state_of
from tests.sglang_hook.scenario import FALLBACK_REASONS, Layout, assert_every_allow_has_an_outcome, blocks

pytestmark = pytest.mark.stress

STEPS = int(os.environ.get("SEMGOV_STRESS_STEPS", "12000"))
SIZE = 4096  # KV pool slots: about eight requests' worth, so that the pool is often full
SCOPES = [("acme", "ns1"), ("acme", "ns2"), ("globex", "ns1"), ("initech", "ns1")]
# (seed, system length, evidence length): every length is a multiple of 4 (page-aligned for page 4),
# and every evidence run is longer than SEMGOV_MIN_UNMATCHED_TOKENS (128), so recipients ask for donors.
FAMILIES = [(11, 64, 400), (12, 32, 240), (13, 64, 160), (14, 48, 320)]
MAX_WAITING = 6
MAX_RUNNING = 4
BURST_RUNNING = 14
PHASE = 250  # steps per phase; every fourth phase is a burst
CHUNKS = [64, 128, 256]

Scope = tuple[str, str]


class _Driver:
    """Plays a scheduler against one harness: seeded random events, every invariant checked after each."""

    def __init__(self, h: Any, seed: int) -> None:
        self.h = h
        self.rng = random.Random(seed)
        self.fams = [blocks(s, s_len=sl, e_len=el) for s, sl, el in FAMILIES]
        self.n = 0
        self.step_no = 0
        self.chunked: dict[str, int] = {}  # rid -> chunk size, while the request is being prefilled
        self.donors: dict[str, tuple[Scope, int]] = {}  # donor-layout requests not yet finished
        self.recent: list[tuple[Scope, int]] = []  # scope and family of donors that finished, newest first
        self.count: Counter[str] = Counter()

    # ---- requests ----------------------------------------------------------------------------

    def submit(self) -> str:
        """A new waiting request; recipients mostly target a scope and family whose donor finished."""
        rng = self.rng
        if self.recent and rng.random() < 0.85:
            scope, f = rng.choice(self.recent)
        else:
            scope, f = rng.choice(SCOPES), rng.randrange(len(self.fams))
        b = self.fams[f]
        r = rng.random()
        lay: Layout
        if r < 0.30:
            kind, scope, f = "donor", rng.choice(SCOPES), rng.randrange(len(self.fams))
            lay = self.fams[f].donor()
        elif r < 0.70:
            kind, lay = "recipient", b.recipient()
        elif r < 0.78:
            kind, lay = "unrelated", b.other_evidence(rng.randrange(3))
        elif r < 0.86:
            kind, lay = "other_scope", b.recipient()
            scope = rng.choice([s for s in SCOPES if s != scope])
        elif r < 0.94:
            kind, lay = "no_context", rng.choice([b.donor(), b.recipient()])
        else:
            kind, lay = "forged", b.recipient()
        key: str | None = None
        if kind != "no_context":
            key = self.h.context(scope[0], scope[1], lay.segments)
            if kind == "forged":
                key = key.replace("semgov1.", "semgov1.x", 1)
        self.n += 1
        rid = f"r{self.n}"
        self.h.new_req(rid, lay.tokens, key, text=lay.text)
        if kind == "donor":
            self.donors[rid] = (scope, f)
        self.count[f"submit_{kind}"] += 1
        return rid

    # ---- scheduling --------------------------------------------------------------------------

    def _budget(self, req: Any) -> int:
        """Slots an admission could get: free plus evictable, with the request's own prefix locked."""
        h = self.h
        tmp = h.tree.lock(req.last_node)
        try:
            return int(h.allocator.available_size() + h.tree.evictable_size())
        finally:
            h.tree.unlock(tmp)

    def admit(self, req: Any, *, blind: bool = False, chunk: int | None = None) -> str:
        """The prefill adder's admission of one waiting request, then its first prefill.

        The budget checks are SGLang's ``_select_prefill_admission``: the cold part after the
        promised host hit must fit, and again without the host hit when the hook fell back. Its
        load-back check (host hit included) is left out on purpose, so that the hook's own
        allocation meets a full pool now and then; a ``blind`` admission (pool squeezes) skips
        the checks altogether, so that SGLang's own prefill allocation runs out of room too.
        """
        from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams

        h = self.h
        h.match(req)
        total = len(req.full_untruncated_fill_ids)

        def fits(prefix: int) -> bool:
            end = total if chunk is None else min(total, prefix + chunk)
            return blind or self._budget(req) >= end - prefix + h.page_size

        if not fits(req.prefix_len + req.host_hit_length):
            self.count["admit_no_room"] += 1
            return "no_room"
        tmp = h.tree.lock(req.last_node)
        try:
            if req.needs_host_load_back():
                self.count["load_backs"] += 1
                host = h.tree.inc_host_lock_ref(req.best_match_node).to_dec_params()
                try:
                    loaded = h.tree.init_load_back(
                        InitLoadBackParams(
                            best_match_node=req.best_match_node, host_hit_length=req.host_hit_length, req=req
                        )
                    )
                finally:
                    h.tree.dec_host_lock_ref(req.best_match_node, host)
                req.host_loaded_length, req.last_node = loaded
                req.prefix_len += req.host_loaded_length
                if req.host_loaded_length == 0:
                    self.count["admit_cold_after_fallback"] += 1
                    if not fits(req.prefix_len):
                        self.count["admit_no_room"] += 1
                        return "no_room"
            req.extend_end = total if chunk is None else min(total, req.prefix_len + chunk)
            req.lock = h.tree.lock(req.last_node)
        finally:
            h.tree.unlock(tmp)
        try:
            h.prefill([req])
        except RuntimeError as e:
            # SGLang's own prefill allocation (alloc_token_slots / alloc_paged_token_slots_extend in
            # mem_cache/allocation.py) raises when the pool is full. The hook allocates nothing in
            # prefill (it only lists the request's prefix slots), and only that error is caught: the
            # scheduler's budget would not have admitted the request, so the row goes back and the
            # request keeps waiting (one holding realized slots keeps them, private, for its next
            # round: test_deliberate_bugs.py::test_rematch_of_realized_request_keeps_its_copy_private).
            where = traceback.extract_tb(e.__traceback__)[-1].filename
            if "out of memory" not in str(e).lower() or not where.endswith("mem_cache/allocation.py"):
                raise
            if req.kv.holds_kv:
                h.req_pool.free(req)
            h.tree.unlock(req.lock)
            req.lock = None
            st = state_of(req)
            if st is not None and st.private is not None:
                self.count["prefill_oom_realized_waiting"] += 1
            else:
                self.count["prefill_oom"] += 1
            return "oom"
        self.count["admitted"] += 1
        if req.skip_radix_cache_insert:
            self.count["admitted_recipients"] += 1
        if req.extend_end < total:
            assert chunk is not None
            self.chunked[req.rid] = chunk
        return "admitted"

    def admit_one(self) -> None:
        h = self.h
        req = h.waiting[self.rng.choice(list(h.waiting))]
        chunk = self.rng.choice(CHUNKS) if not self.chunked and self.rng.random() < 0.3 else None
        self.admit(req, chunk=chunk)

    def planned(self) -> list[str]:
        """Waiting requests holding an allowed plan that is not realized yet."""
        return [
            rid
            for rid, req in self.h.waiting.items()
            if (st := state_of(req)) is not None and st.chosen is not None and st.private is None
        ]

    def squeeze(self) -> None:
        """Pool pressure: blind admissions fill the pool, then a planned request is admitted blind.

        Either the pool is left with less room than the planned realization (the hook's own
        allocation fails: cold fallback), or, with a chunked filler sized to land there, with
        room for the realization but not for the rest of the prompt (the realization succeeds,
        then SGLang's prefill allocation fails and the request waits with its realized slots).
        """
        h = self.h
        ps = h.page_size
        target = h.waiting[self.rng.choice(self.planned())]
        tight = self.rng.random() < 0.5
        for _ in range(12):
            h.match(target)  # fillers evict: the target's last node from an older round may be gone
            k = int(target.host_hit_length)
            rest = len(target.full_untruncated_fill_ids) - target.prefix_len - k
            budget = self._budget(target)
            chunk = None
            if tight and k:
                if budget < k + rest:
                    break
                room = budget - k - rest // 2
                if room < 400 and not self.chunked:
                    chunk = room // ps * ps
                    if chunk == 0:
                        break
            elif budget < k:
                break
            outcome = self.admit(h.waiting[self.submit()], blind=True, chunk=chunk)
            self.check(f"squeeze filler {outcome}")
            if outcome == "oom":
                break
        before = dict(h.tree.stats)
        self.admit(target, blind=True)
        if h.tree.stats["fallbacks"] > before["fallbacks"]:
            self.count["squeeze_fallbacks"] += 1
        if h.tree.stats["realizations"] > before["realizations"]:
            self.count["squeeze_realizations"] += 1

    def next_chunk(self) -> None:
        h = self.h
        rid = self.rng.choice(list(self.chunked))
        req = h.running[rid]
        chunk = self.chunked[rid]
        if self._budget(req) < chunk + h.page_size:
            self.count["chunk_no_room"] += 1
            return
        h.next_chunk(req, chunk)
        self.count["chunks"] += 1
        if req.extend_end >= len(req.full_untruncated_fill_ids):
            del self.chunked[rid]

    def check_kv(self, req: Any) -> None:
        """Every slot of the request's row holds what a cold prefill writes at that position."""
        h = self.h
        n = int(req.kv.kv_committed_len)
        row = h.row(req)[:n]
        toks = torch.as_tensor(list(req.origin_input_ids[:n]))
        for layer in h.model.layers:
            k, v = h.model.expected(toks, torch.arange(n), layer)
            assert torch.allclose(h.kv.get_key_buffer(layer)[row], k, atol=2e-5, rtol=1e-5), req.rid
            assert torch.equal(h.kv.get_value_buffer(layer)[row], v), req.rid
        self.count["kv_checked_rows"] += 1
        if req.skip_radix_cache_insert:
            self.count["kv_checked_recipient_rows"] += 1

    def finish(self, abort: bool) -> None:
        h = self.h
        rid = self.rng.choice([r for r in h.running if abort or r not in self.chunked])
        self.check_kv(h.running[rid])
        h.finish(h.running[rid], abort=abort)
        self.chunked.pop(rid, None)
        done = self.donors.pop(rid, None)
        if done is not None and not abort:
            self.recent = ([done] + [x for x in self.recent if x != done])[:6]
        self.count["aborted_running" if abort else "finished"] += 1

    def abort_waiting(self) -> None:
        h = self.h
        rid = self.rng.choice(list(h.waiting))
        h.abort_waiting(h.waiting[rid])
        self.donors.pop(rid, None)
        self.count["aborted_waiting"] += 1

    def evict(self) -> None:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        rng = self.rng
        n = rng.randrange(1, 256) if rng.random() < 0.9 else rng.randrange(1, self.h.size)
        self.h.tree.evict(EvictParams(num_tokens=n))
        self.count["evictions"] += 1

    # ---- the run -----------------------------------------------------------------------------

    def step(self) -> str:
        """One scheduler event, drawn with weights that depend on the phase."""
        h = self.h
        burst = (self.step_no // PHASE) % 4 == 3
        max_running = BURST_RUNNING if burst else MAX_RUNNING
        max_waiting = 2 * MAX_WAITING if burst else MAX_WAITING
        weights = {
            "submit": 20 if len(h.waiting) < max_waiting else 0,
            "match": 15 if h.waiting else 0,
            "admit": 20 if h.waiting and len(h.running) < max_running else 0,
            "chunk": 10 if self.chunked else 0,
            "finish": (2 if burst else 15) if any(r not in self.chunked for r in h.running) else 0,
            "abort_running": 3 if h.running else 0,
            "abort_waiting": 3 if h.waiting else 0,
            "evict": 5,
            "squeeze": 2 if self.planned() else 0,
        }
        what = self.rng.choices(list(weights), weights=list(weights.values()))[0]
        if what == "submit":
            self.submit()
        elif what == "match":
            for req in list(h.waiting.values()):
                h.match(req)
        elif what == "admit":
            self.admit_one()
        elif what == "chunk":
            self.next_chunk()
        elif what in ("finish", "abort_running"):
            self.finish(abort=what == "abort_running")
        elif what == "abort_waiting":
            self.abort_waiting()
        elif what == "squeeze":
            self.squeeze()
        else:
            self.evict()
        self.step_no += 1
        return what

    def check(self, what: str) -> None:
        """The hook's guard, SGLang's scheduler check (harness-fed) and the pin accounting."""
        h = self.h
        t = h.tree
        where = (self.step_no, what)
        assert t.reuse_disabled is None, (where, t.reuse_disabled)
        owners = [r for r in t.reqs.values() if r.kv.holds_kv]
        problem = t.guard.check(owners, t.pending_private())
        assert problem is None, (where, problem)
        ok, msg = h.invariant()
        assert ok, (where, msg)
        assert t.pins == 0, (where, t.pins)  # pins exist only inside a realization

    def drain(self) -> None:
        """Abort every waiting request, finish (or abort, mid-prefill) every running one, evict all."""
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        h = self.h
        for rid in list(h.waiting):
            h.abort_waiting(h.waiting[rid])
        for rid in list(h.running):
            h.finish(h.running[rid], abort=rid in self.chunked)
        self.chunked.clear()
        h.tree.evict(EvictParams(num_tokens=h.size))


@pytest.mark.parametrize("page_size", [1, 4])
def test_randomized_scheduler_run_keeps_every_invariant(
    make_harness: Any, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, page_size: int
) -> None:
    """12,000 seeded scheduler steps with reuse, pressure and aborts: every invariant holds after each."""
    h = make_harness(page_size=page_size, size=SIZE)
    # SGLang prints its whole tree on every prefill out-of-memory (a debugging aid): keep the log short.
    monkeypatch.setattr(h.tree, "pretty_print", lambda: None)
    # The tensors here are tiny: one intra-op thread is faster, and on a busy 2-core machine torch's
    # spinning worker threads would otherwise multiply the run time.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    d = _Driver(h, seed=20240 + page_size)
    t0 = time.perf_counter()
    kinds: Counter[str] = Counter()
    for _ in range(STEPS):
        what = d.step()
        kinds[what] += 1
        d.check(what)
    d.drain()
    d.check("drain")
    h.assert_clean()
    assert h.allocator.available_size() == h.size
    elapsed = time.perf_counter() - t0
    stats = dict(h.tree.stats)
    events = Counter(r.get("kind") for r in h.records() if r["schema"] == "semgov.engine_event/v2")
    print(
        f"\npage_size={page_size} steps={STEPS} seconds={elapsed:.1f} "
        f"realizations={stats['realizations']} realized_tokens={stats['realized_tokens']} "
        f"fallbacks={stats['fallbacks']} decisions={stats['decisions']} allowed={stats['allowed']} "
        f"decided_requests={stats['decided_requests']} donors={stats['donors_registered']} "
        f"guard_checks={stats['guard_checks']} invariant_violations={events['invariant_violation']}"
    )
    print(f"steps by kind: {dict(sorted(kinds.items()))}")
    print(f"counts: {dict(sorted(d.count.items()))}")
    failed = Counter(
        (r["detail"].split(":", 1)[1] if ":" in r["detail"] else r["detail"]).strip()[:32]
        for r in h.records()
        if r.get("kind") == "realization_failed"
    )
    print(f"fallback reasons: {dict(failed)}")
    assert sum(kinds.values()) == STEPS == d.step_no
    assert events["invariant_violation"] == 0 and events["reuse_disabled"] == 0
    assert stats["realizations"] >= 100
    assert events["realization"] == stats["realizations"] == d.count["load_backs"] - stats["fallbacks"]
    # NOTE: every allow has an outcome: a realization, a fallback (tried, failed) or one event saying
    # why it was not acted on (nothing to realize, another donor chosen, aborted, ...)
    reasons = assert_every_allow_has_an_outcome(h.records())
    print(f"allows not realized by reason: {dict(sorted(reasons.items()))}")
    assert events["realization_failed"] == sum(reasons.values())
    assert stats["fallbacks"] >= 1 and sum(reasons[r] for r in FALLBACK_REASONS) >= stats["fallbacks"]
    # (and the decisions abandoned while pending, which the core reports when they finish)
    assert events["realization_failed"] >= stats["fallbacks"] + stats.get("allows_not_realized", 0)
    assert d.count["squeeze_fallbacks"] >= 1 and d.count["squeeze_realizations"] >= 1
    assert d.count["prefill_oom"] >= 1 and d.count["prefill_oom_realized_waiting"] >= 1
    assert stats["decisions"] >= stats["allowed"] >= stats["realizations"]
    assert d.count["kv_checked_recipient_rows"] >= 50
