"""Merkle tree speed on a large audit log: roots, appends, proofs.

Usage: python benchmarks/audit_proofs.py [--leaves 1000000] [--repeat 3] [--smoke]

Measures root() over all leaf hashes, Frontier.append throughput, and the generation and
verification time and size of an inclusion proof and a consistency proof on a tree of
``--leaves`` leaves. Pinned to one core; prints the best of ``--repeat`` runs for each figure.
``--smoke``: 1,000 leaves, one run (every figure, in about a second; they mean nothing).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from functools import partial
from typing import TypeVar

from semgov.audit.merkle import (
    Frontier,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    root,
    verify_consistency,
    verify_inclusion,
)

T = TypeVar("T")


def best(repeat: int, fn: Callable[[], T]) -> tuple[float, T]:
    """Best wall time of ``repeat`` calls, and the last call's result."""
    t0 = time.perf_counter()
    out = fn()
    fastest = time.perf_counter() - t0
    for _ in range(repeat - 1):
        t0 = time.perf_counter()
        out = fn()
        fastest = min(fastest, time.perf_counter() - t0)
    return fastest, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--leaves", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--smoke", action="store_true", help="1,000 leaves, one run: every figure, in seconds")
    args = ap.parse_args()
    if args.smoke:
        args.leaves, args.repeat = 1000, 1
    os.sched_setaffinity(0, {0})
    n, rep = args.leaves, args.repeat

    t0 = time.perf_counter()
    leaves = [leaf_hash(b"record %d" % i) for i in range(n)]
    print(f"leaves: {n:,} (leaf_hash of each: {time.perf_counter() - t0:.2f} s)")

    t, rt = best(rep, lambda: root(leaves))
    print(f"root() over {n:,} leaf hashes: {t:.3f} s")

    def appends() -> Frontier:
        f = Frontier()
        for lh in leaves:
            f.append(lh)
        return f

    t, f = best(rep, appends)
    assert f.root() == rt
    print(f"Frontier.append: {n / t:,.0f} appends/s ({t / n * 1e6:.2f} us each); root(): ", end="")
    t, _ = best(rep, f.root)
    print(f"{t * 1e6:.1f} us")

    for index in (0, n // 3, n - 1):
        t, proof = best(rep, partial(inclusion_proof, index, leaves))
        tv, _ = best(rep, partial(verify_inclusion, index, n, leaves[index], proof, rt))
        print(
            f"inclusion proof, leaf {index:,}: generate {t:.3f} s, verify {tv * 1e6:.0f} us, "
            f"{len(proof)} hashes = {32 * len(proof)} bytes"
        )

    for old in (1, n // 3, n - 1):
        old_root = root(leaves[:old])
        t, proof = best(rep, partial(consistency_proof, old, n, leaves))
        tv, _ = best(rep, partial(verify_consistency, old, n, old_root, rt, proof))
        print(
            f"consistency proof, {old:,} -> {n:,}: generate {t:.3f} s, verify {tv * 1e6:.0f} us, "
            f"{len(proof)} hashes = {32 * len(proof)} bytes"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
