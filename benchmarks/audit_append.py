"""Durable append throughput and append-to-durable latency of the audit log (group commit).

Usage: python benchmarks/audit_append.py [--n 200000] [--size 600] [--rate 10000] [--core 0]
                                         [--dir DIR] [--repeat 1] [--smoke]

For each writer setting (commit_interval 2 ms, and 0, the default: commit as soon as the
writer is free) two runs on a fresh log:

- saturated: one producer appends --n records of --size bytes as fast as it can, then flushes;
  records/s = n / (first append .. flush returned), i.e. every record fsynced. Latency is
  sampled on every 64th ticket by a waiter thread; under saturation it is mostly queueing.
- paced: the producer offers --rate records/s (in 1 ms bursts) for --paced-n records; p50/p99
  of append -> ticket durable on every 16th record: the latency a caller sees at that load.

The process (both threads) is pinned to one core; the log directory defaults to a temporary one
next to the working directory (same file system as a real ./audit/log). Every batch ends with a
seal (one Ed25519 signature by the writer thread, written with the batch, in the same fsync).
A machine baseline (fsync, Ed25519, SHA-256, load) is printed before and after the runs.
``--smoke``: 2,000 saturated and 500 paced records, a quick baseline (every row, in seconds; the
figures mean nothing).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._machine import baseline  # noqa: E402
from semgov.audit.store import AuditLog, Ticket  # noqa: E402
from semgov.signing.keys import SigningKey  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


class Sampler:
    """Waits on sampled tickets in order in its own thread; records append -> durable latency."""

    def __init__(self) -> None:
        self.lat: list[float] = []
        self._q: list[tuple[Ticket, float]] = []
        self._cv = threading.Condition()
        self._done = False
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def add(self, ticket: Ticket, t0: float) -> None:
        with self._cv:
            self._q.append((ticket, t0))
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._q and not self._done:
                    self._cv.wait()
                if not self._q:
                    return
                items, self._q = self._q, []
            for ticket, t0 in items:
                ticket.wait()
                self.lat.append(time.perf_counter() - t0)

    def finish(self) -> list[float]:
        with self._cv:
            self._done = True
            self._cv.notify()
        self._t.join()
        return self.lat


def run_saturated(directory: Path, key: SigningKey, n: int, size: int, commit_interval: float) -> str:
    records = [os.urandom(size) for _ in range(256)]
    with AuditLog.open(directory, signing_key=key, origin="bench", commit_interval=commit_interval) as log:
        sampler = Sampler()
        append, perf = log.append, time.perf_counter
        t0 = perf()
        for i in range(n):
            if i & 63:
                append(records[i & 255])
            else:
                sampler.add(append(records[i & 255]), perf())
        log.flush()
        dt = perf() - t0
        lat = sampler.finish()
    return (
        f"{n / dt:>10,.0f} rec/s  {n * (size + 36) / dt / 1e6:6.1f} MB/s"
        f"   latency p50 {pct(lat, 0.5) * 1e3:7.2f} ms  p99 {pct(lat, 0.99) * 1e3:7.2f} ms (queueing)"
    )


def run_paced(directory: Path, key: SigningKey, n: int, size: int, rate: int, commit_interval: float) -> str:
    records = [os.urandom(size) for _ in range(256)]
    per_ms = max(1, rate // 1000)
    with AuditLog.open(directory, signing_key=key, origin="bench", commit_interval=commit_interval) as log:
        sampler = Sampler()
        append, perf = log.append, time.perf_counter
        start = perf()
        i = 0
        while i < n:
            due = start + (i // per_ms) / 1000
            now = perf()
            if now < due:
                time.sleep(due - now)
            for _ in range(min(per_ms, n - i)):
                if i & 15:
                    append(records[i & 255])
                else:
                    sampler.add(append(records[i & 255]), perf())
                i += 1
        log.flush()
        dt = perf() - start
        lat = sampler.finish()
    return (
        f"{n / dt:>10,.0f} rec/s offered {rate:,}/s"
        f"   latency p50 {pct(lat, 0.5) * 1e3:7.2f} ms  p99 {pct(lat, 0.99) * 1e3:7.2f} ms"
        f"  max {max(lat) * 1e3:7.2f} ms"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200_000, help="records in the saturated run")
    ap.add_argument("--paced-n", type=int, default=30_000, help="records in the paced run")
    ap.add_argument("--size", type=int, default=600, help="record size in bytes")
    ap.add_argument("--rate", type=int, default=10_000, help="offered records/s in the paced run")
    ap.add_argument("--core", type=int, default=0, help="CPU core to pin to (-1: no pinning)")
    ap.add_argument("--dir", type=Path, default=None, help="parent directory for the logs")
    ap.add_argument("--repeat", type=int, default=1, help="runs per row")
    ap.add_argument("--smoke", action="store_true", help="2,000 + 500 records: every row, in seconds")
    args = ap.parse_args()
    if args.smoke:
        args.n, args.paced_n, args.repeat = 2000, 500, 1
    if args.core >= 0:
        os.sched_setaffinity(0, {args.core})  # before any thread starts: they inherit it
    key = SigningKey.from_private(Ed25519PrivateKey.generate())
    parent = Path(tempfile.mkdtemp(prefix="audit-bench-", dir=args.dir or Path.cwd()))
    try:
        print(f"{args.size}-byte records, pinned to core {args.core}, logs under {parent}")
        print(baseline(parent, quick=args.smoke), flush=True)
        k = 0
        for ci in (0.002, 0.0):
            label = f"commit_interval={ci * 1e3:g} ms"
            for _ in range(args.repeat):
                k += 1
                res = run_saturated(parent / f"s{k}", key, args.n, args.size, ci)
                print(f"{label:22} saturated n={args.n:<8}{res}", flush=True)
                k += 1
                res = run_paced(parent / f"p{k}", key, args.paced_n, args.size, args.rate, ci)
                print(f"{label:22} paced     n={args.paced_n:<8}{res}", flush=True)
        print(baseline(parent, quick=args.smoke))
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
