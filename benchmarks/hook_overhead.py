"""What the SGLang hook adds to the scheduler thread, on CPU with real SGLang objects.

Measures, per request, with the test harness's real pools, allocator and tree (tests/sglang_hook),
each stage as the scheduler thread runs it (candidate search, the decision, record signing and
audit I/O run on the decision and writer threads):

- ``exact``: ``match_prefix`` of a request without a context (SGLang's exact match plus the key
  derivation): the floor;
- ``first``: the recipient's first ``match_prefix``: SGLang's match, plus its state and key (the
  context token's MAC) and queueing the candidate search and decision;
- ``poll``: each later round's hook while the decision is made (reads two flags; the one that
  finds it done also measures the allowed donor's live KV in the tree and plans);
- ``match``: the ``match_prefix`` once decided (SGLang's match plus planning the reusable run);
- ``realize``: admission (``init_load_back``): re-match and verify the donor, allocate, copy and
  re-rotate the evidence K/V (a tiny 2-layer, 2-head pool on CPU: the copy cost on a GPU pool is
  not measured here), queue the audit event, invariant guard; ``copy`` is the K/V copy alone;
- ``sched``: semgov's own scheduler-thread time for the whole request as the cache records it
  (``GovernedRadixCache.sched_ns``: every hook call, SGLang's match and the K/V copy excluded);
- ``decided`` (off the scheduler thread, ms): from queueing the decision to its allow record
  being durable, the time a request is held back.

``--round K``: also admits recipients K at a time, as one prefill round admits them, twice: with
the guard checking after each realization (``per-real``) and once at the round's end
(``per-round``, what the plugin's round hook does); per request, semgov's scheduler-thread time
(``sched``, K/V copy excluded) and the guard checks run.

``--process``: decide in the decision process, as the server does (``SEMGOV_DECISION_PROCESS=1``);
by default the harness decides on a thread of its own process (what the hook's tests step by
hand), whose Python then competes with the scheduler thread's for the interpreter lock.

``--floor``: the scheduler-thread operations of one realized recipient, each timed alone and hot
(the minimum of five repeats of many calls, one core, decisions in the decision process): the
work's own cost, without what shares the scheduler's cores and caches in a server (SGLang's
other processes, a CPU forward pass, semgov's decision process, other threads). Their sum is the
lower bound of semgov's scheduler-thread time per realized recipient; the other modes measure it
in place.

``--smoke``: n=7 (5 of them warm-up), 400 evidence tokens, rounds of 2, then ``--floor`` with 10
calls per operation and its decision on the harness's thread, all in one process (seconds after
SGLang's import; the figures mean nothing; ``--process``, the decision process, is not run).

Usage: ``python benchmarks/hook_overhead.py [--n 200] [--evidence 400,3000] [--round 8] [--process]
[--floor] [--smoke]``. Prints p50/p99 µs.
Donors are registered synchronously (their PII scan is not on any recipient's path).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _q(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _env(process: bool) -> dict[str, str]:
    """Harness settings: decisions in the decision process (``--process``) or on an in-process thread."""
    return {"SEMGOV_DECISION_PROCESS": "1"} if process else {}


def run(n: int, evidence: int, process: bool = False) -> dict[str, list[float]]:
    import torch

    torch.set_num_threads(1)
    import tests.sglang_hook.conftest as hc
    from tests.sglang_hook.scenario import blocks

    tmp = Path(tempfile.mkdtemp(prefix="semgov-hook-bench-"))
    files = hc.make_hook_files(tmp)
    rt = hc.publish_runtime()
    h = hc.Harness(rt, files, size=1 << 16, **_env(process))
    stages = ("exact", "first", "poll", "match", "realize", "copy", "sched", "decided")
    out: dict[str, list[float]] = {k: [] for k in stages}
    from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams

    from engine_hooks.sglang.state import state_of

    try:
        for i in range(n):
            b = blocks(seed=1000 + i, e_len=evidence)
            lay = b.donor()
            d = h.new_req(f"d{i}", lay.tokens, h.context(segments=lay.segments))
            h.run(d)
            h.finish(d)
            anon = h.new_req(f"a{i}", b.recipient().tokens, None)
            r = h.new_req(f"r{i}", b.recipient().tokens, h.context(segments=b.recipient().segments))
            gc.disable()
            t0 = time.perf_counter()
            h.match(anon)
            t1 = time.perf_counter()
            r.init_next_round_input(h.tree)
            t2 = time.perf_counter()
            polls: list[float] = []
            held = h.tree.holds(r)
            while held:
                time.sleep(0.0005)
                tp = time.perf_counter()
                held = bool(h.tree.hold_back([r]))
                polls.append(time.perf_counter() - tp)
            t3 = time.perf_counter()
            r.init_next_round_input(h.tree)
            t4 = time.perf_counter()
            tmp_lock = h.tree.lock(r.last_node)
            t5 = time.perf_counter()
            loaded = h.tree.init_load_back(
                InitLoadBackParams(
                    best_match_node=r.best_match_node, host_hit_length=r.host_hit_length, req=r
                )
            )
            t6 = time.perf_counter()
            gc.enable()
            assert loaded[0] == r.host_hit_length > evidence - 8, (loaded, r.host_hit_length)
            r.host_loaded_length, r.last_node = loaded
            r.prefix_len += loaded[0]
            r.extend_end = len(r.full_untruncated_fill_ids)
            r.lock = h.tree.lock(r.last_node)
            h.tree.unlock(tmp_lock)
            h.prefill([r])
            st = state_of(r)
            assert st is not None
            h.finish(r)
            h.abort_waiting(anon)
            if i >= 5:  # warm-up
                out["exact"].append((t1 - t0) * 1e6)
                out["first"].append((t2 - t1) * 1e6)
                out["poll"] += [p * 1e6 for p in polls]
                out["match"].append((t4 - t3) * 1e6)
                out["realize"].append((t6 - t5) * 1e6)
                out["copy"].append(st.copy_ns / 1e3)
                out["sched"].append(st.sched_ns / 1e3)
                out["decided"].append((t3 - t1) * 1e3)
    finally:
        h.close()
    return out


def run_rounds(
    rounds: int, k: int, evidence: int, in_round: bool, process: bool = False
) -> tuple[list[float], float]:
    """``rounds`` rounds of ``k`` decided recipients admitted together: semgov's scheduler-thread
    µs per recipient, and guard checks per recipient."""
    import torch

    torch.set_num_threads(1)
    import tests.sglang_hook.conftest as hc
    from engine_hooks.sglang.state import state_of
    from tests.sglang_hook.scenario import blocks

    tmp = Path(tempfile.mkdtemp(prefix="semgov-hook-bench-"))
    rt = hc.publish_runtime()
    h = hc.Harness(rt, hc.make_hook_files(tmp), size=1 << 17, **_env(process))
    sched: list[float] = []
    checks = 0
    try:
        for i in range(rounds + 1):  # NOTE: the first round warms up
            recips = []
            for j in range(k):
                b = blocks(seed=5000 + i * k + j, e_len=evidence)
                lay = b.donor()
                d = h.new_req(f"d{i}-{j}", lay.tokens, h.context(segments=lay.segments))
                h.run(d)
                h.finish(d)
                r = h.new_req(f"r{i}-{j}", b.recipient().tokens, h.context(segments=b.recipient().segments))
                h.match(r)
                recips.append(r)
            before = [state_of(r).sched_ns for r in recips]  # type: ignore[union-attr]
            c0 = h.tree.stats["guard_checks"]
            gc.disable()
            if in_round:
                h.tree.begin_round()
            for r in recips:
                h.admit(r)
            if in_round:
                h.tree.end_round()
            gc.enable()
            if i:
                checks += h.tree.stats["guard_checks"] - c0
                for r, t0 in zip(recips, before, strict=True):
                    st = state_of(r)
                    assert st is not None and st.realizations == 1
                    sched.append((st.sched_ns - t0) / 1e3)
            h.prefill(recips)
            for r in recips:
                h.finish(r)
    finally:
        h.close()
    return sched, checks / (rounds * k)


def floor(
    evidence: int, number: int = 200, repeat: int = 5, process: bool = True
) -> list[tuple[str, float, int]]:
    """``(operation, hot µs per call, calls per realized recipient)`` for one realized recipient:
    the best of ``repeat`` timings of ``number`` calls each (decisions in the decision process, or
    with ``process`` False on the harness's thread)."""
    import timeit

    import numpy as np
    import torch

    torch.set_num_threads(1)
    import tests.sglang_hook.conftest as hc
    from engine_hooks.sglang.state import int64, state_of
    from tests.sglang_hook.scenario import blocks

    tmp = Path(tempfile.mkdtemp(prefix="semgov-hook-bench-"))
    h = hc.Harness(hc.publish_runtime(), hc.make_hook_files(tmp), size=1 << 17, **_env(process))
    tree = h.tree
    try:
        b = blocks(seed=1, e_len=evidence)
        lay = b.donor()
        d = h.new_req("d", lay.tokens, h.context(segments=lay.segments))
        h.run(d)
        h.finish(d)
        rlay = b.recipient()
        r = h.new_req("r", rlay.tokens, h.context(segments=rlay.segments))
        h.match(r)
        st = state_of(r)
        assert st is not None and st.donor is not None and st.chosen is not None, "no allowed donor"
        token = h.context(segments=rlay.segments)
        d_len, node = tree.donor_path(st.donor)
        root = tree.root_node_handle(st.donor.cache_key)
        pieces = __import__("engine_hooks.core.plan", fromlist=["plan_pieces"]).plan_pieces(
            st.spans, st.m0, st.limit0, d_len, tree.page_size
        )
        k = sum(p.length for p in pieces)
        rt, dt = int64(r.origin_input_ids), int64(st.donor.token_ids)

        def alloc_free() -> None:
            tree.token_to_kv_pool_allocator.free(tree.alloc(k))

        def event() -> None:
            # NOTE: as on an accelerator's pool: slot ids are listed only for a host pool (see
            # Realizer.realized), where listing 3,000 of them costs tens of µs more.
            spans = [p.as_span() for p in pieces]
            tree.gov.event("realization", request_id="x", decision_id="y", donor_id="z", spans=spans)

        ops: list[tuple[str, Any, int]] = [
            ("context token: verify, derive the tree key", lambda: tree.gov.context_of(token, None), 1),
            ("has donors of its scope (scope key)", lambda: tree.gov.has_donors(st.context, None), 1),
            ("donor liveness: SGLang's match of the donor", lambda: tree.donor_path(st.donor), 2),
            (
                "plan the reusable run",
                lambda: tree.decisions.copyable(st.chosen, tree.decisions.shifted_ok(st)),
                1,
            ),
            ("hold-back poll of a waiting request", lambda: tree.hold_back([r]), 5),
            ("pin and unpin the donor", lambda: tree.unlock(tree.lock(node)), 1),
            ("token check", lambda: np.array_equal(rt[: len(dt)], dt[: len(rt)]), 1),
            (
                "SGLang: donor slots (collect_full_device_indices)",
                lambda: tree.tree_core.collect_full_device_indices(node, root),
                1,
            ),  # fmt: skip
            ("SGLang: allocate the realized slots (and free)", alloc_free, 1),
            ("queue the realization event", event, 1),
            ("invariant guard (round end, release)", lambda: tree.guard.check([], 0), 2),
        ]
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

        key = RadixKey(r.origin_input_ids, r.extra_key)
        reference = [
            (
                "reference: SGLang's own exact match of the recipient",
                lambda: UnifiedRadixCache._match_tree(tree, MatchPrefixParams(key=key)),
                0,
            ),  # fmt: skip
        ]
        out = []
        for label, fn, calls in ops + reference:
            for _ in range(20):
                fn()
            best = min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6
            out.append((label, best, calls))
        return out
    finally:
        h.close()


def print_floor(evidence: list[int], number: int = 200, repeat: int = 5, process: bool = True) -> None:
    """``--floor``: each scheduler-thread operation of one realized recipient, hot and alone."""
    for ev in evidence:
        ops = floor(ev, number, repeat, process)
        print(f"evidence {ev}: one realized recipient, each operation hot and alone (min of {repeat} runs)")
        for label, us, calls in ops:
            print(f"  {us:8.1f} us x {calls}  {label}" if calls else f"  {us:8.1f} us      ({label})")
        total = sum(us * calls for _, us, calls in ops)
        alloc = next(us for label, us, _ in ops if "allocate" in label)
        print(f"  {total:8.1f} us   sum; {total - alloc:.1f} us without the allocation SGLang makes anyway")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="recipients per evidence size (default 200)")
    ap.add_argument("--evidence", default="400,3000", help="evidence tokens, comma-separated")
    ap.add_argument("--round", type=int, default=0, help="also admit K recipients per round (0: no)")
    ap.add_argument("--process", action="store_true", help="decide in the decision process (as a server)")
    ap.add_argument("--floor", action="store_true", help="each operation timed alone and hot, summed")
    ap.add_argument("--smoke", action="store_true", help="n=7, 400 tokens, rounds of 2, then a short --floor")
    args = ap.parse_args(argv)
    if args.smoke:
        args.n, args.evidence, args.round, args.floor = 7, "400", 2, False
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    evidence = [int(x) for x in args.evidence.split(",")]
    if args.floor:
        os.sched_setaffinity(0, {0})
        print_floor(evidence)
        return 0
    print(f"{'evidence':>8} {'stage':<8} {'p50':>9} {'p99':>9}       n  (us; 'decided' in ms, off-thread)")
    for ev in evidence:
        res = run(args.n, ev, args.process)
        for stage, xs in res.items():
            print(f"{ev:>8} {stage:<8} {_q(xs, 0.5):>9.0f} {_q(xs, 0.99):>9.0f} {len(xs):>7}")
    if args.round:
        k, rounds = args.round, max(1, args.n // args.round)
        print(f"admission in rounds of {k} ({rounds} rounds): semgov scheduler-thread us per recipient")
        print(f"{'evidence':>8} {'guard':<10} {'p50':>9} {'p99':>9} {'checks/req':>10}       n")
        for ev in evidence:
            for in_round, label in ((False, "per-real"), (True, "per-round")):
                xs, per = run_rounds(rounds, k, ev, in_round, args.process)
                p50, p99 = _q(xs, 0.5), _q(xs, 0.99)
                print(f"{ev:>8} {label:<10} {p50:>9.0f} {p99:>9.0f} {per:>10.2f} {len(xs):>7}")
    if args.smoke:
        print_floor(evidence, number=10, repeat=1, process=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
