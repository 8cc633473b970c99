"""Does governance stall decoding? Inter-token latency of a steady stream while governed requests arrive.

Usage: ``python benchmarks/sglang_itl.py [--model tiny|smollm2-arch] [--burst 8] [--rounds 3]
[--evidence 2048] [--stream-tokens 300] [--backends stock,semgov] [--tp 2] [--smoke]``

For each backend, one real SGLang 0.5.23 server on CPU (the rig's ``page1-overlap`` configuration;
``--tp 2``: its ``tp2`` configuration, two tensor-parallel ranks, one core each, where semgov's
time per request includes its share of each round's rank-0 message,
dummy weights, SGLang's strict pool checks on): ``stock`` is SGLang's own radix cache,
``semgov`` the governed backend. Both get the same traffic: ``rounds x burst`` donors
``[S][I][E][Q1]`` (each in its own namespace, so each recipient has exactly one candidate; the
stock server gets no context token, so its exact keys are the plain tokens),
then per round one background stream (``--stream-tokens`` tokens, ``ignore_eos``) and, once it
is decoding, a burst of ``--burst`` recipients ``[S][E][Q2]`` sent at once (8 new tokens each).
With semgov each recipient is decided off the scheduler thread and realized (E reused, shifted);
with the stock cache it prefills E cold (its exact match ends after S either way).

Prints, per backend: inter-token latency (gap between streamed chunks with new tokens) of the
streams while a burst is in flight (p50, p99, n), the same for a stream with no burst in the
same run (the machine baseline), the bursts' TTFT p50/p99, realizations (semgov), and semgov's
scheduler-thread time per governed request (p50/p99, from the cache's own counter written by
the rig's plugin; SGLang's match and the K/V copy excluded). The ratio line compares burst-time
ITL p99 semgov/stock. Figures depend on the machine: compare only within one run.

``--smoke``: no server. The traffic's prompts are built (2 rounds of 2, 128 evidence tokens), and
synthetic streams (a chunk every 10 ms, 12 ms while a burst is in flight), TTFTs and semgov's
per-request log lines (in the plugin's format) go through the same gap, log-line and summary code
into the table (seconds). Not run: the servers, the requests, the audit log.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.sglang_server.rig import (  # noqa: E402 - the checkout on sys.path first
    SMOLLM2_ARCH,
    TINY_MODEL,
    Result,
    Server,
    block,
    launch,
    pair_prompts,
    read_audit,
    run_concurrently,
    server_configs,
    settle,
    summarize,
    wait_idle,
)


def _q(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def _gaps(res: Result, start: float, end: float) -> list[float]:
    """Milliseconds between consecutive new-token chunks whose later chunk falls in [start, end]."""
    t = res.chunk_s
    return [(b - a) * 1e3 for a, b in zip(t, t[1:], strict=False) if start <= b <= end]


def _stream(server: Server, seed: str, n: int, box: list[Result]) -> threading.Thread:
    def go() -> None:
        box.append(server.generate(block(seed, 512), max_new_tokens=n, timeout=600))

    th = threading.Thread(target=go, daemon=True)
    th.start()
    return th


def run_backend(backend: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    base = server_configs()["page1-overlap" if args.tp == 1 else "tp2"]
    model = TINY_MODEL if args.model == "tiny" else SMOLLM2_ARCH
    cfg = replace(
        base,
        model=model,
        backend=None if backend == "stock" else "semgov",
        kv_dump=False,
        chunked_prefill_size=4096,
        hook_env={**base.hook_env, "SEMGOV_DECISION_TIMEOUT_MS": "500", "SEMGOV_AUDIT_WAIT_MS": "200"},
    )
    out: dict[str, Any] = {"burst_itl": [], "idle_itl": [], "ttft": [], "failed": 0}
    with launch(cfg, work / backend) as server:
        gw = server.gateway
        pairs = [pair_prompts(f"itl-{i}", e_len=args.evidence) for i in range(args.burst * args.rounds)]
        governed = backend != "stock"  # the stock cache has no use for a context: plain exact keys

        def key(i: int, segs: Any) -> str | None:
            return gw.token("acme", f"ns{i}", segs) if governed else None

        for i, p in enumerate(pairs):
            r = server.generate(p.donor, extra_key=key(i, p.donor_segs), max_new_tokens=2)
            out["failed"] += not r.ok
        settle(server)
        # Machine baseline: a stream with nothing else running.
        box: list[Result] = []
        th = _stream(server, "itl-idle", args.stream_tokens, box)
        th.join()
        if box and box[0].ok:
            out["idle_itl"] = _gaps(box[0], 0.0, float("inf"))[1:]
        for rnd in range(args.rounds):
            box = []
            th = _stream(server, f"itl-stream-{rnd}", args.stream_tokens, box)
            time.sleep(args.lead_s)  # the stream is admitted and decoding
            first = rnd * args.burst
            jobs = [
                (lambda p=pairs[i], i=i: server.generate(
                    p.recipient, extra_key=key(i, p.recipient_segs), max_new_tokens=8, timeout=600))
                for i in range(first, first + args.burst)
            ]  # fmt: skip
            t0 = time.perf_counter()
            results = run_concurrently(jobs, workers=len(jobs))
            t1 = time.perf_counter()
            th.join()
            out["failed"] += sum(not r.ok for r in results)
            out["ttft"] += [r.ttft_ms for r in results if r.ok and r.ttft_ms is not None]
            if box and box[0].ok:
                out["burst_itl"] += _gaps(box[0], t0, t1)
            else:
                out["failed"] += 1
        wait_idle(server)
        if backend != "stock":
            audit = summarize(read_audit(server.files.audit_dir))
            out["realizations"] = len(audit.realizations)
            out["fallbacks"] = len(audit.failed)
            out.update(_sched(server.sched_log.read_text() if server.sched_log.exists() else ""))
        out["fatal"] = server.fatal_lines()
    return out


def _sched(text: str) -> dict[str, list[float]]:
    """The rig plugin's per-request lines (scheduler-thread ns, decided s, held s): us and ms."""
    rows = [ln.split() for ln in text.splitlines()]
    return {
        "sched_us": [int(r[0]) / 1e3 for r in rows],
        "decided_ms": [float(r[1]) * 1e3 for r in rows if float(r[1]) > 0],
        "held_ms": [float(r[2]) * 1e3 for r in rows if float(r[2]) > 0],
    }


def synthetic(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    """``--smoke``: what :func:`run_backend` returns, without a server: the same prompts, a stream
    chunk every 10 ms (12 ms while the burst is in flight), made-up TTFTs and plugin lines."""
    pairs = [pair_prompts(f"itl-{i}", e_len=args.evidence) for i in range(args.burst * args.rounds)]
    for p in pairs:  # NOTE: the recipient's evidence is the donor's, moved: what semgov realizes
        [(ds, de)] = [(s, e) for role, s, e in p.donor_segs if role == "evidence"]
        assert p.recipient[p.evidence_start : p.evidence_start + p.evidence_len] == p.donor[ds:de]
    idle = Result("idle", True, chunk_s=[i * 0.010 for i in range(args.stream_tokens)])
    burst = Result("stream", True, chunk_s=[i * 0.012 for i in range(args.stream_tokens)])
    end = burst.chunk_s[-1]
    out: dict[str, Any] = {"failed": 0, "fatal": [], "idle_itl": _gaps(idle, 0.0, float("inf"))[1:]}
    out["burst_itl"] = _gaps(burst, 0.0, end / 2) * args.rounds
    out["ttft"] = [60.0 + i for i in range(len(pairs))]
    if backend != "stock":
        out.update(realizations=len(pairs), fallbacks=0)
        out.update(_sched("".join(f"{400_000 + 1000 * i} 0.004 0.006\n" for i in range(len(pairs)))))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=("tiny", "smollm2-arch"), default="tiny")
    ap.add_argument("--burst", type=int, default=8, help="governed recipients sent at once (default 8)")
    ap.add_argument("--rounds", type=int, default=3, help="bursts, each under its own stream (default 3)")
    ap.add_argument("--evidence", type=int, default=2048, help="evidence tokens per prompt (default 2048)")
    ap.add_argument("--stream-tokens", type=int, default=300, help="tokens of each stream (default 300)")
    ap.add_argument("--lead-s", type=float, default=1.5, help="seconds the stream decodes before a burst")
    ap.add_argument("--backends", default="stock,semgov")
    ap.add_argument(
        "--tp", type=int, choices=(1, 2), default=1, help="tensor-parallel ranks (2: the rig's tp2 server)"
    )
    ap.add_argument(
        "--smoke", action="store_true", help="no server: the prompts, synthetic streams, the table"
    )
    args = ap.parse_args(argv)
    if args.smoke:
        args.burst, args.rounds, args.evidence, args.stream_tokens = 2, 2, 128, 40
        res = {b: synthetic(b, args) for b in args.backends.split(",")}
        where = "smoke: no server, a synthetic result"
    else:
        work = Path(tempfile.mkdtemp(prefix="semgov-itl-"))
        res = {b: run_backend(b, args, work) for b in args.backends.split(",")}
        where = f"work dir {work}"
    print(
        f"model {args.model}; {args.rounds} bursts of {args.burst} recipients ({args.evidence}-token "
        f"evidence) under a {args.stream_tokens}-token stream; tp {args.tp}; {where}"
    )
    return 0 if report(res) else 1


def report(res: dict[str, dict[str, Any]]) -> bool:
    """The table per backend and the semgov/stock ratios; False when a request failed."""
    print(f"{'backend':<8} {'ITL burst p50':>13} {'p99':>7} {'n':>5}   {'ITL idle p50':>12} {'p99':>7}"
          f" {'n':>5}   {'TTFT p50':>8} {'p99':>7}  realized  sched us p50/p99 (n)")  # fmt: skip
    ok = True
    for b, r in res.items():
        sched = r.get("sched_us", [])
        extra = (
            f"{r.get('realizations', '-'):>8}  {_q(sched, 0.5):.0f}/{_q(sched, 0.99):.0f} ({len(sched)})"
            if b != "stock" else f"{'-':>8}  -"
        )  # fmt: skip
        bi, ii, tt = r["burst_itl"], r["idle_itl"], r["ttft"]
        print(
            f"{b:<8} {_q(bi, 0.5):>13.1f} {_q(bi, 0.99):>7.1f} {len(bi):>5}   {_q(ii, 0.5):>12.1f} "
            f"{_q(ii, 0.99):>7.1f} {len(ii):>5}   {_q(tt, 0.5):>8.0f} {_q(tt, 0.99):>7.0f}  {extra}"
        )
        if r["failed"] or r["fatal"]:
            ok = False
            print(f"  {b}: {r['failed']} failed requests; fatal log lines: {r['fatal'][:3]}")
    if "semgov" in res:
        g = res["semgov"]
        print(
            f"semgov, governed recipients: decision taken after p50 {_q(g['decided_ms'], 0.5):.1f} / p99 "
            f"{_q(g['decided_ms'], 0.99):.1f} ms, held back p50 {_q(g['held_ms'], 0.5):.1f} / p99 "
            f"{_q(g['held_ms'], 0.99):.1f} ms (n={len(g['held_ms'])})"
        )
    if "stock" in res and "semgov" in res and res["stock"]["burst_itl"] and res["semgov"]["burst_itl"]:
        s99, g99 = _q(res["stock"]["burst_itl"], 0.99), _q(res["semgov"]["burst_itl"], 0.99)
        s50, g50 = (statistics.median(res[k]["burst_itl"]) for k in ("stock", "semgov"))
        print(f"burst ITL semgov/stock: p50 {g50 / s50:.2f}x, p99 {g99 / s99:.2f}x")
    return ok


if __name__ == "__main__":
    raise SystemExit(main())
