"""Token verification on adversarial layouts: is the span search O(n log n) in the worst case?

Usage: python benchmarks/token_adversarial.py [--sizes 8192,16384,33000,65536,131072,262144]
                                              [--n 30] [--budget 20] [--layouts a,b] [--check]
                                              [--json FILE] [--smoke]

Layouts (each at every size n; both prompts n tokens; ``min_span`` 32 unless named):
  blocks_seps        one 32-token block repeated, each copy followed by a distinct separator,
                     the donor's separators differing from the recipient's (issue 12, item 4);
  blocks_periods     the same block, period 33 in the recipient and 34 in the donor;
  blocks_seg1        blocks_seps with one segment per token in both prompts (every run is cut);
  periodic7          a 7-token cycle, the recipient one token ahead (every diagonal one long run);
  short_matches      two-token alphabet, min_span 4 (thousands of short runs per diagonal);
  identical_seg1     identical random prompts, one segment per token (n prefix spans);
  one_token          one repeated token, recipient one token longer.
Each row: p50/p99 of up to --n calls (fewer once --budget seconds are spent on a row), the
work counters (runs found, runs considered, coverage searches of the greedy pass, spans), the
ratio of p50 to the machine baseline, and the growth exponent k in t ~ n^k from the previous
size (1: linear; 2: quadratic).

Machine baseline, measured in the same run: p50 of the span search on a normal 20,480-token
pair (the `shifted wrapper` case of benchmarks/token_verification.py).

--check also times `semgov check` end to end (process start included) on one captured request
whose single candidate is the blocks_seps layout at --check-tokens, signed by an untrusted
key, next to the same command on a normal request of the same size (shifted evidence).
Pinned to one core.

``--smoke``: every layout at 512 and 1,024 tokens, n=2, a baseline of 5 calls, and ``--check``
once at 1,024 tokens (seconds; the figures mean nothing, and the sizes are far from where the
growth exponent says anything).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from semgov.facts.tokens import SegmentTable, SpanWork, find_spans

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"
Roles = list[tuple[str, int, int]]


@dataclass(frozen=True)
class Layout:
    """One (recipient, donor) pair and the min_span to search it with."""

    r: np.ndarray
    rseg: Roles
    d: np.ndarray
    dseg: Roles
    min_span: int = 32

    def tables(self) -> tuple[SegmentTable, SegmentTable]:
        return SegmentTable.from_triples(self.rseg), SegmentTable.from_triples(self.dseg)  # type: ignore[arg-type]


def one_segment(n: int) -> Roles:
    return [("evidence", 0, n)]


def per_token(n: int) -> Roles:
    return [("evidence", i, i + 1) for i in range(n)]


def blocks(n: int, period: int, sep_base: int, seed: int = 0) -> np.ndarray:
    """A fixed 32-token block repeated; the rest of each period is distinct separators."""
    block = np.random.default_rng(seed).integers(0, 40_000, 32).astype(np.uint32)
    k = -(-n // period)
    out = np.empty((k, period), np.uint32)
    out[:, :32] = block
    out[:, 32:] = (sep_base + np.arange(k * (period - 32))).reshape(k, period - 32)
    return out.reshape(-1)[:n]


def _blocks_seps(n: int) -> Layout:
    return Layout(blocks(n, 33, 100_000), one_segment(n), blocks(n, 33, 1_000_000), one_segment(n))


def _blocks_periods(n: int) -> Layout:
    return Layout(blocks(n, 33, 100_000), one_segment(n), blocks(n, 34, 1_000_000), one_segment(n))


def _blocks_seg1(n: int) -> Layout:
    return Layout(blocks(n, 33, 100_000), per_token(n), blocks(n, 33, 1_000_000), per_token(n))


def _periodic7(n: int) -> Layout:
    cyc = (np.arange(n + 1) % 7).astype(np.uint32)
    return Layout(cyc[1:], one_segment(n), cyc[:n], one_segment(n))


def _short_matches(n: int) -> Layout:
    rng = np.random.default_rng(1)
    r, d = rng.integers(0, 2, n).astype(np.uint32), rng.integers(0, 2, n).astype(np.uint32)
    d[0] = 1 - r[0]  # NOTE: no common prefix: everything goes through the shifted search
    return Layout(r, one_segment(n), d, one_segment(n), min_span=4)


def _identical_seg1(n: int) -> Layout:
    t = np.random.default_rng(2).integers(0, 49_152, n).astype(np.uint32)
    return Layout(t, per_token(n), t.copy(), per_token(n))


def _one_token(n: int) -> Layout:
    return Layout(np.full(n + 1, 7, np.uint32), one_segment(n + 1), np.full(n, 7, np.uint32), one_segment(n))


LAYOUTS: dict[str, Callable[[int], Layout]] = {
    "blocks_seps": _blocks_seps,
    "blocks_periods": _blocks_periods,
    "blocks_seg1": _blocks_seg1,
    "periodic7": _periodic7,
    "short_matches": _short_matches,
    "identical_seg1": _identical_seg1,
    "one_token": _one_token,
}


def normal_pair(n: int, seed: int = 0) -> Layout:
    """A realistic shifted pair: new 52-token wrapper before the same evidence and question."""
    rng = np.random.default_rng(seed)

    def t(k: int) -> np.ndarray:
        return rng.integers(0, 49_152, k).astype(np.uint32)

    ev_n = n - 100
    sys_, w1, w2, q, ev = t(30), t(40), t(52), t(30), t(ev_n)
    d = np.concatenate([sys_, w1, ev, q])
    r = np.concatenate([sys_, w2, ev, q])

    def seg(parts: list[tuple[str, int]]) -> Roles:
        out, pos = [], 0
        for role, k in parts:
            out.append((role, pos, pos + k))
            pos += k
        return out

    return Layout(
        r,
        seg([("system", 30), ("instruction", 52), ("evidence", ev_n), ("question", 30)]),
        d,
        seg([("system", 30), ("instruction", 40), ("evidence", ev_n), ("question", 30)]),
    )


def time_layout(lay: Layout, n: int, budget: float) -> tuple[list[float], SpanWork, int]:
    """Per-call seconds (at least one call, at most ``n``, stopping once ``budget`` s are spent)."""
    rseg, dseg = lay.tables()
    ts: list[float] = []
    spent = 0.0
    work = SpanWork()
    spans = 0
    while len(ts) < n and (not ts or spent < budget):
        work = SpanWork()
        t0 = time.perf_counter()
        _, found = find_spans(lay.r, rseg, lay.d, dseg, min_span=lay.min_span, work=work)
        ts.append(time.perf_counter() - t0)
        spent += ts[-1]
        spans = len(found)
    ts.sort()
    return ts, work, spans


def pct(ts: list[float], q: float) -> float:
    return ts[min(len(ts) - 1, int(len(ts) * q))]


def fmt_s(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def search_table(
    sizes: list[int], names: list[str], n: int, budget: float, base_n: int = 200
) -> dict[str, Any]:
    base_ts, _, _ = time_layout(normal_pair(20_480), base_n, 10.0)
    base = pct(base_ts, 0.5)
    print(f"machine baseline: normal shifted 20,480-token pair, p50 {base * 1e6:.0f} us (n={len(base_ts)})")
    print(
        f"{'layout':<16}{'tokens':>8}{'n':>5}{'p50':>11}{'p99':>11}{'x base':>9}{'k':>6}"
        f"{'runs':>9}{'considered':>11}{'steps':>9}{'spans':>8}"
    )
    rows = []
    for name in names:
        prev: tuple[int, float] | None = None
        for size in sizes:
            ts, work, spans = time_layout(LAYOUTS[name](size), n, budget)
            p50 = pct(ts, 0.5)
            k = math.log(p50 / prev[1]) / math.log(size / prev[0]) if prev else float("nan")
            prev = (size, p50)
            print(
                f"{name:<16}{size:>8}{len(ts):>5}{fmt_s(p50):>11}{fmt_s(pct(ts, 0.99)):>11}"
                f"{p50 / base:>9.1f}{k:>6.2f}{work.runs:>9}{work.considered:>11}{work.steps:>9}{spans:>8}"
            )
            rows.append(
                {"layout": name, "tokens": size, "n": len(ts), "p50_s": p50, "p99_s": pct(ts, 0.99),
                 "ratio": p50 / base, "k": k, "runs": work.runs, "considered": work.considered,
                 "steps": work.steps, "spans": spans}
            )  # fmt: skip
    return {"baseline_s": base, "rows": rows}


def captured_line(lay: Layout, request_id: str) -> str:
    """One captured request whose single candidate is ``lay``'s donor, signed by an untrusted key."""
    from semgov import load_signing_key, provenance_payload, sign_provenance

    def prompt(t: np.ndarray, segs: Roles) -> dict[str, Any]:
        return {"token_ids": t.tolist(), "segments": [{"role": r, "start": s, "end": e} for r, s, e in segs]}

    task = {"id": "extract_financials", "version": "1"}
    contract = {"id": "financials", "schema_sha256": "ab" * 32}
    payload = provenance_payload(
        donor_id="d-1", tenant="acme", namespace="research/entity-001", task=task, response_contract=contract,
        created_at=datetime(2026, 11, 28, 10, tzinfo=UTC), expires_at=datetime(2026, 12, 5, 10, tzinfo=UTC),
        policy_version="default@1", token_ids=lay.d.tolist(), segments=lay.dseg,
    )  # fmt: skip
    rogue = load_signing_key(EX / "keys" / "provenance-rogue.pem")
    req = {
        "schema": "semgov.captured_request/v1", "request_id": request_id,
        "received_at": "2026-11-29T10:00:00Z", "tenant": "acme", "namespace": "research/entity-001",
        "task": task, "response_contract": contract, "prompt": prompt(lay.r, lay.rseg),
        "candidates": [{"donor_id": "d-1", "similarity": 0.9, "prompt": prompt(lay.d, lay.dseg),
                        "provenance": sign_provenance(payload, rogue)}],
    }  # fmt: skip
    return json.dumps(req, separators=(",", ":"))


def check_table(tokens: list[int], repeat: int) -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from benchmarks.check_throughput import time_check

    print(
        f"semgov check, one captured request, one candidate, 1 core, {repeat} runs each (process start incl.)"
    )
    print(f"{'request':<30}{'tokens':>8}{'line KB':>9}{'min':>10}{'p50':>10}{'max':>10}{'x normal':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        for size in tokens:
            base = None
            for name, lay in (
                ("normal (shifted evidence)", normal_pair(size)),
                ("blocks_seps", _blocks_seps(size)),
            ):
                path = Path(tmp) / f"{name[:6]}-{size}.jsonl"
                line = captured_line(lay, f"r-{size}")
                path.write_text(line + "\n")
                ts = time_check(path, repeat)
                base = base if base is not None else ts[len(ts) // 2]
                p50 = ts[len(ts) // 2]
                print(
                    f"{name:<30}{size:>8}{len(line) / 1000:>9.0f}{fmt_s(ts[0]):>10}{fmt_s(p50):>10}"
                    f"{fmt_s(ts[-1]):>10}{p50 / base:>10.1f}"
                )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="8192,16384,33000,65536,131072,262144")
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--n", type=int, default=30, help="calls per row at most (default 30)")
    ap.add_argument("--budget", type=float, default=20.0, help="seconds per row before it stops repeating")
    ap.add_argument("--check", action="store_true", help="also time `semgov check` end to end")
    ap.add_argument("--check-tokens", default="33000,40000")
    ap.add_argument("--check-repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, metavar="FILE", help="also write the search table as JSON")
    ap.add_argument("--smoke", action="store_true", help="512 and 1,024 tokens, n=2, --check once: seconds")
    args = ap.parse_args()
    if args.smoke:
        args.sizes, args.n, args.budget = "512,1024", 2, 1.0
        args.check, args.check_tokens, args.check_repeat = True, "1024", 1
    os.sched_setaffinity(0, {0})
    sizes = [int(s) for s in args.sizes.split(",")]
    result = search_table(sizes, args.layouts.split(","), args.n, args.budget, 5 if args.smoke else 200)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=1))
    if args.check:
        check_table([int(s) for s in args.check_tokens.split(",")], args.check_repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
