"""Soak: a real SGLang server with the semgov backend under mixed traffic for a long while.

Usage: ``python benchmarks/sglang_soak.py [--minutes 10] [--workers 6] [--seed 1] [--server
page1-overlap] [--out FILE] [--smoke]``

One real SGLang 0.5.23 server on CPU (a configuration of ``tests/sglang_server/rig.py``,
SGLang's strict KV-pool checks and ``SEMGOV_STRICT=1`` on) takes ``--workers`` client threads
of seeded random traffic for ``--minutes``: donor/recipient pairs in fresh namespaces (the
recipient should be realized), another tenant's look-alike of an earlier pair and unrelated
evidence in an earlier pair's namespace (both must stay cold), plain requests without a
context, clients that hang up while waiting, prefilling or decoding, hostile ``extra_key``
values; a side thread calls ``/flush_cache`` every 45 s (refused under load, accepted idle).

At the end it waits for the server to go idle, flushes the cache, and checks: the server is up
and answers ``/health``; its log has no leak, crash or invariant line (SGLang's idle check asserts
``available + evictable + ... == total`` whenever the scheduler idles, so a leaked slot kills
it); the audit log holds no ``invariant_violation`` and no realization of a request that must
stay cold, and verifies with ``semgov audit verify``. After the final flush the tree is empty, so
SGLang's idle check (run on every idle scheduler iteration, raising under
``SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE=1``) asserts ``available == total`` and the request
pool full: the server still being up with no leak line after several idle seconds is the pool
back to its idle identity. From outside, ``GET /v1/loads`` must say the same: its
``num_used_tokens`` is ``max_total_num_tokens - (available + evictable)``, computed live, so at
idle any slot neither free nor in the tree (a leak) counts there.

Prints requests and outcomes per kind, realizations and failed realizations with their
reasons, TTFT p50/p99 per kind, and a machine baseline measured in the same run (cold TTFT of
fresh 2,304-token prompts at the start and at the end), and exits 1 when a check failed.

``--smoke``: no server. The seeded traffic generator makes 40 requests against a stand-in that
answers every ``/generate`` at once (each recipient then counted realized in a synthetic audit
log), and the checks on the audit log, the table and the summary run on that (seconds). Not run:
the server, its idle and leak checks, ``/flush_cache``, ``/v1/loads``, ``semgov audit verify``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.sglang_server.rig import (  # noqa: E402 - the checkout on sys.path first
    Result,
    Server,
    block,
    launch,
    loads,
    pair_prompts,
    read_audit,
    server_configs,
    summarize,
    verify_audit,
    wait_idle,
)

HOSTILE = ("semgov1.caf\u00e9", "x" * 50_000, "semgov1." + "A" * 30_000, "not-a-token")


class Soak:
    """Seeded random traffic from several client threads; what each request was and did."""

    def __init__(self, server: Server, seed: int, settle_s: float = 0.4) -> None:
        self.server = server
        self.seed = seed
        self.settle_s = settle_s  # NOTE: between a donor and its recipient: the donor registers
        self.lock = threading.Lock()
        self.kinds: dict[str, str] = {}  # rid -> kind
        self.results: dict[str, list[Result]] = defaultdict(list)
        self.pairs: list[tuple[str, Any]] = []  # (namespace, prompts) of finished pairs
        self.n = 0

    def _rid(self, kind: str) -> str:
        with self.lock:
            self.n += 1
            rid = f"soak-{kind}-{self.n}"
            self.kinds[rid] = kind
            return rid

    def _record(self, kind: str, res: Result) -> None:
        with self.lock:
            self.results[kind].append(res)

    def step(self, rng: random.Random) -> None:
        gw = self.server.gateway
        op = rng.choices(
            ["pair", "other_tenant", "unrelated", "plain", "abort", "hostile"], weights=[5, 2, 2, 3, 2, 1]
        )[0]
        with self.lock:
            old = rng.choice(self.pairs) if self.pairs else None
        if op == "pair" or (op in ("other_tenant", "unrelated") and old is None):
            e_len = rng.choice((512, 1024, 2048))
            rid = self._rid("donor")
            p = pair_prompts(rid, e_len=e_len)
            ns = f"ns-{rid}"
            self._record(
                "donor", self.server.generate(p.donor, rid=rid, extra_key=gw.token("acme", ns, p.donor_segs))
            )
            time.sleep(self.settle_s)
            rid = self._rid("recipient")
            res = self.server.generate(p.recipient, rid=rid, extra_key=gw.token("acme", ns, p.recipient_segs),
                                       max_new_tokens=rng.randint(1, 32))  # fmt: skip
            self._record("recipient", res)
            with self.lock:
                self.pairs.append((ns, p))
        elif op == "other_tenant":
            assert old is not None
            ns, p = old
            rid = self._rid("other_tenant")
            self._record(
                op,
                self.server.generate(
                    p.recipient, rid=rid, extra_key=gw.token("globex", ns, p.recipient_segs)
                ),
            )
        elif op == "unrelated":
            assert old is not None
            ns, p = old
            q = pair_prompts(f"{ns}-unrelated-{rng.random()}", e_len=p.evidence_len, unrelated=True)
            rid = self._rid("unrelated")
            self._record(
                op,
                self.server.generate(q.recipient, rid=rid, extra_key=gw.token("acme", ns, q.recipient_segs)),
            )
        elif op == "plain":
            rid = self._rid("plain")
            toks = block(rid, rng.randint(200, 3000))
            self._record(op, self.server.generate(toks, rid=rid, max_new_tokens=rng.randint(1, 64)))
        elif op == "abort":
            rid = self._rid("abort")
            toks = block(rid, rng.randint(500, 3000))
            cut = rng.choice((0, 1, 3))
            self._record(op, self.server.generate(toks, rid=rid, max_new_tokens=64, abort_after_chunks=cut))
        else:
            rid = self._rid("hostile")
            self._record(op, self.server.generate(block(rid, 600), rid=rid, extra_key=rng.choice(HOSTILE)))

    def worker(self, i: int, deadline: float) -> None:
        rng = random.Random(f"{self.seed}-{i}")
        while time.monotonic() < deadline:
            self.step(rng)


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def baseline(server: Server, tag: str, n: int = 3) -> list[float]:
    """Cold TTFT (ms) of fresh 2,304-token prompts: this machine, right now."""
    out = []
    for i in range(n):
        r = server.generate(block(f"baseline-{tag}-{i}", 2304), rid=f"baseline-{tag}-{i}", max_new_tokens=1)
        if r.ok and r.ttft_ms is not None:
            out.append(r.ttft_ms)
    return out


class SmokeServer:
    """``--smoke``'s stand-in for a server: the rig's gateway, every ``/generate`` answered at once."""

    def __init__(self) -> None:
        from tests.sglang_server.rig import CONTEXT_SECRET, Gateway

        self.gateway = Gateway(CONTEXT_SECRET)

    def generate(self, toks: list[int], rid: str = "", extra_key: str | None = None, **kw: Any) -> Result:
        return Result(
            rid, True, ttft_ms=40.0 + len(toks) / 100, output_ids=[1] * int(kw.get("max_new_tokens", 1))
        )


def smoke(args: argparse.Namespace) -> int:
    """The traffic generator against :class:`SmokeServer`, then the checks and the report."""
    soak = Soak(SmokeServer(), args.seed, settle_s=0.0)  # type: ignore[arg-type]
    rng = random.Random(args.seed)
    while soak.n < 40:
        soak.step(rng)
    records = [
        {
            "schema": "semgov.engine_event/v1",
            "kind": "realization",
            "request_id": rid,
            "materialized_tokens": 512,
        }
        for rid, kind in soak.kinds.items()
        if kind == "recipient"
    ]
    run = {"soaked_s": 0.0, "flushes": {200: 1}, "log_text": "", "used": [(0, 131072)], "base": ([], [])}
    return report(args, soak, records, run, [])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--server", default="page1-overlap", choices=sorted(server_configs()))
    ap.add_argument("--out", type=Path, default=None, help="write the summary as JSON")
    ap.add_argument("--smoke", action="store_true", help="no server: the traffic, the checks, the report")
    args = ap.parse_args()
    if args.smoke:
        return smoke(args)
    work = Path(tempfile.mkdtemp(prefix="semgov-soak-"))
    problems: list[str] = []
    t_start = time.monotonic()
    with launch(server_configs()[args.server], work / "server") as srv:
        print(f"server {args.server} up after {srv.started_s:.0f}s (log: {srv.log_path})", flush=True)
        base_before = baseline(srv, "before")
        soak = Soak(srv, args.seed)
        stop = threading.Event()
        flushes: Counter[int] = Counter()

        def flusher() -> None:
            while not stop.wait(45.0):
                try:
                    flushes[srv.flush_cache()] += 1
                except OSError:
                    flushes[-1] += 1

        deadline = time.monotonic() + args.minutes * 60
        threads = [threading.Thread(target=soak.worker, args=(i, deadline)) for i in range(args.workers)]
        ft = threading.Thread(target=flusher)
        for t in threads + [ft]:
            t.start()
        for t in threads:
            t.join()
        stop.set()
        ft.join()
        soaked = time.monotonic() - t_start
        base_after = baseline(srv, "after")
        if not wait_idle(srv):
            problems.append("the server never went idle after the traffic stopped")
        time.sleep(2.0)
        if srv.flush_cache() != 200:
            problems.append("/flush_cache refused at the end on an idle server")
        time.sleep(5.0)  # idle iterations after the flush: SGLang's idle check runs on each
        # NOTE: read before /health, which runs a one-token generation and caches it.
        used = [(int(x["num_used_tokens"]), int(x["max_total_num_tokens"])) for x in loads(srv)]
        if any(u != 0 for u, _ in used):
            problems.append(f"KV slots neither free nor cached at idle: {used} (used, total)")
        if not srv.alive() or not srv.healthy(60):
            problems.append("the server is not up at the end")
        fatal = srv.fatal_lines()
        if fatal:
            problems.append(f"{len(fatal)} leak/crash/violation line(s) in the server log: {fatal[0][:200]}")
        records = read_audit(srv.files.audit_dir, wait_s=60)
        files = srv.files
        log_text = srv.log_text()
    why = verify_audit(files)
    if why is not None:
        problems.append(f"semgov audit verify: {why}")
    run = {
        "soaked_s": soaked, "flushes": dict(flushes), "log_text": log_text, "used": used,
        "base": (base_before, base_after),
    }  # fmt: skip
    return report(args, soak, records, run, problems)


def report(
    args: argparse.Namespace,
    soak: Soak,
    records: list[dict[str, Any]],
    run: dict[str, Any],
    problems: list[str],
) -> int:
    """The audit log's checks, the table per kind and the summary; exit status 1 when a check failed."""
    audit = summarize(records)
    if audit.violations:
        problems.append(f"{len(audit.violations)} invariant_violation/reuse_disabled events")
    must_be_cold = {"other_tenant", "unrelated", "plain", "abort", "hostile", "donor"}
    wrong = [rid for rid in audit.realized if soak.kinds.get(rid) in must_be_cold]
    if wrong:
        problems.append(f"realized requests that must stay cold: {wrong[:5]}")
    kinds = sorted(soak.results)
    total = sum(len(v) for v in soak.results.values())
    soaked, used, (base_before, base_after) = run["soaked_s"], run["used"], run["base"]
    print(f"\nsoak: {soaked / 60:.1f} min, {args.workers} client threads, {total} requests, seed {args.seed}")
    print(f"{'kind':<13} {'requests':>8} {'ok':>6} {'realized':>8} {'p50 TTFT ms':>12} {'p99 TTFT ms':>12}")
    for k in kinds:
        rs = soak.results[k]
        ok = [r for r in rs if r.ok]
        ttft = [r.ttft_ms for r in ok if r.ttft_ms is not None]
        realized = sum(1 for r in rs if audit.realized.get(r.rid))
        p50 = f"{_pct(ttft, 0.5):.0f}" if ttft else "-"
        p99 = f"{_pct(ttft, 0.99):.0f}" if ttft else "-"
        print(f"{k:<13} {len(rs):>8} {len(ok):>6} {realized:>8} {p50:>12} {p99:>12}")
    reasons = Counter(str(f.get("detail", ""))[:70] for f in audit.failed)
    print(f"\nrealizations {len(audit.realizations)} ({sum(audit.realized.values())} tokens); "
          f"failed realizations {len(audit.failed)}: {dict(reasons) or '-'}")  # fmt: skip
    allow, deny = audit.counts.get("decision:allow", 0), audit.counts.get("decision:deny", 0)
    print(f"decisions: {allow} allow, {deny} deny; audit records {len(records)}")
    print(f"flush_cache during the soak: {run['flushes']} (HTTP status: count)")
    print(f"retraction rounds in the server log: {run['log_text'].count('Retract requests')}")
    med = statistics.median
    if base_before and base_after:
        print(f"machine baseline: cold TTFT of a fresh 2,304-token prompt {med(base_before):.0f} ms "
              f"at the start, {med(base_after):.0f} ms at the end (n={len(base_before)} each)")  # fmt: skip
    print(
        f"idle after the final flush: /v1/loads num_used_tokens {[u for u, _ in used]} "
        f"of {[t for _, t in used]}"
    )
    if args.smoke:
        print("smoke: no server (a stand-in answered every request); its checks did not run")
    else:
        print("server up, no leak line after 5 s idle (SGLang's strict idle check)")
    summary = {
        "minutes": soaked / 60, "workers": args.workers, "seed": args.seed, "requests": total,
        "by_kind": {k: len(v) for k, v in soak.results.items()},
        "realizations": len(audit.realizations), "failed_realizations": len(audit.failed),
        "violations": len(audit.violations), "problems": problems,
        "baseline_ms": {"before": base_before, "after": base_after}, "smoke": args.smoke,
    }  # fmt: skip
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2))
    if problems:
        print("\nsoak FAILED:")
        for p in problems:
            print(f"  - {p}")
        return 1
    if args.smoke:
        print("\nsoak smoke OK: the traffic, the audit log's checks and the report ran")
        return 0
    print("\nsoak OK: 0 violations, nothing leaked (pool free after the final flush), audit log verifies")
    return 0


if __name__ == "__main__":
    sys.exit(main())
