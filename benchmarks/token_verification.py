"""Token verification speed on long prompts (the vectorised span finder alone).

Usage: python benchmarks/token_verification.py [--tokens 20480] [--n 300] [--smoke]

Cases: exact repeat, shifted evidence (new leading wrapper), question variant
(common prefix), interleaved (evidence split in 4 blocks reordered), unrelated,
and a degenerate prompt of one repeated token. Pinned to one core; prints
p50/p99 per case and the spans found. ``--smoke``: 512 tokens, n=5 (seconds; every case runs, the
figures mean nothing).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from semgov.facts.tokens import SegmentTable, find_spans


def seg(parts: list[tuple[str, int]]) -> SegmentTable:
    out, pos = [], 0
    for role, n in parts:
        out.append((role, pos, pos + n))
        pos += n
    return SegmentTable.from_triples(out)  # type: ignore[arg-type]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=20480)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--smoke", action="store_true", help="512 tokens, n=5: every case runs, in seconds")
    args = ap.parse_args()
    if args.smoke:
        args.tokens, args.n = 512, 5
    os.sched_setaffinity(0, {0})
    rng = np.random.default_rng(0)

    def t(n: int) -> np.ndarray:
        return rng.integers(0, 49152, n).astype(np.uint32)

    ev_n = args.tokens - 100
    sys_, w1, w2, q1, q2, ev = t(30), t(40), t(52), t(30), t(30), t(ev_n)
    blocks = np.array_split(ev, 4)
    donor = np.concatenate([sys_, w1, ev, q1])
    dseg = seg([("system", 30), ("instruction", 40), ("evidence", ev_n), ("question", 30)])
    cases = {
        "exact": (donor, dseg),
        "shifted wrapper": (
            np.concatenate([sys_, w2, ev, q1]),
            seg([("system", 30), ("instruction", 52), ("evidence", ev_n), ("question", 30)]),
        ),
        "question variant": (np.concatenate([sys_, w1, ev, q2]), dseg),
        "interleaved 4 blocks": (
            np.concatenate([sys_, w1, blocks[2], blocks[0], blocks[3], blocks[1], q1]),
            dseg,
        ),
        "unrelated": (t(len(donor)), dseg),
        "one repeated token": (np.full(len(donor), 7, np.uint32), dseg),
    }
    print(f"token verification, {len(donor)}-token donor, min_span 32, 1 core, n={args.n} per case")
    print(f"{'case':<22}{'p50 us':>8}{'p99 us':>8}  spans (kind:tokens)")
    for name, (recip, rseg) in cases.items():
        d = donor if name != "one repeated token" else np.full(len(donor), 7, np.uint32)
        ts = []
        for _ in range(args.n):
            t0 = time.perf_counter()
            _, spans = find_spans(recip, rseg, d, dseg, min_span=32)
            ts.append((time.perf_counter() - t0) * 1e6)
        ts.sort()
        summary = ", ".join(f"{s.kind}:{s.length}" for s in spans[:4]) + (" ..." if len(spans) > 4 else "")
        print(f"{name:<22}{ts[len(ts) // 2]:>8.0f}{ts[int(len(ts) * 0.99)]:>8.0f}  {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
