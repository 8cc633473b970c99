"""Scenarios against a real SGLang server with the semgov backend, shared by tests, check and soak.

Each scenario drives a running :class:`~tests.sglang_server.rig.Server` over HTTP, reads the
hook's audit log, and returns an :class:`Outcome`: counts for the scenario table (requests,
realizations, fallbacks, violations), TTFTs per cohort, and ``problems`` (empty when every
expectation held). Request ids start with the scenario's tag, so one server can run several
scenarios and each reads only its own records. The tests assert ``not outcome.problems``; the
server check (``server_check.sh``) and the soak benchmark print the same outcomes.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.sglang_server.rig import (
    AuditSummary,
    Result,
    Server,
    block,
    layout,
    pair_prompts,
    read_audit,
    run_concurrently,
    settle,
    summarize,
    wait_idle,
)

COHORTS = ("allowed", "other_tenant", "unrelated", "no_context")


@dataclass
class Outcome:
    """What one scenario did and found."""

    name: str
    requests: int = 0
    failed_requests: int = 0
    realizations: int = 0
    realized_tokens: int = 0
    fallbacks: int = 0
    violations: int = 0
    decisions: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    ttft_ms: dict[str, list[float]] = field(default_factory=dict)
    realized_by: dict[str, int] = field(default_factory=dict)  # realized tokens per cohort (warm arms)

    def expect(self, ok: bool, problem: str) -> None:
        if not ok:
            self.problems.append(problem)

    def ttft(self, cohort: str, res: Result) -> None:
        if res.ok and res.ttft_ms is not None:
            self.ttft_ms.setdefault(cohort, []).append(res.ttft_ms)

    def median(self, cohort: str) -> float | None:
        xs = self.ttft_ms.get(cohort)
        return statistics.median(xs) if xs else None

    def absorb(self, audit: AuditSummary, prefix: str) -> None:
        """Count this scenario's records (labels starting with ``prefix``)."""
        self.decisions = sum(len(v) for k, v in audit.decisions.items() if k.startswith(prefix))
        mine = [r for r in audit.realizations if str(r["request_id"]).startswith(prefix)]
        self.realizations = len(mine)
        self.realized_tokens = sum(int(r["materialized_tokens"]) for r in mine)
        self.fallbacks = sum(1 for r in audit.failed if str(r["request_id"]).startswith(prefix))
        self.violations = len(audit.violations)
        if audit.violations:
            self.problems += [f"{v['kind']}: {v.get('detail')}" for v in audit.violations[:5]]


def _admitted(server: Server, rid: str, timeout: float = 120.0) -> bool:
    """Wait until the audit log holds ``rid``'s realization or failed realization; False on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = summarize(read_audit(server.files.audit_dir, wait_s=0))
        if rid in s.realized or any(f["request_id"] == rid for f in s.failed):
            return True
        time.sleep(0.2)
    return False


def _audit(server: Server) -> AuditSummary:
    return summarize(read_audit(server.files.audit_dir))


def _sent(out: Outcome, results: list[Result], *, failures_ok: bool = False) -> None:
    out.requests += len(results)
    bad = [r for r in results if not r.ok]
    out.failed_requests += len(bad)
    if bad and not failures_ok:
        out.problems += [f"request {r.rid} failed: {r.error}" for r in bad[:5]]


def _server_problems(server: Server, out: Outcome) -> None:
    out.expect(server.alive(), "the server died")
    if server.alive():
        out.expect(server.healthy(timeout=60), "/health failed after the scenario")
    bad = server.fatal_lines()
    out.expect(not bad, "server log: " + " | ".join(bad[:3]))


def _fresh_pair_realizes(server: Server, tag: str, out: Outcome, when: str) -> AuditSummary:
    """A new donor/recipient pair is realized (the server still reuses ``when``); reads the audit."""
    gw = server.gateway
    p = pair_prompts(f"{tag}-after", e_len=1024)
    ns = f"ns-{tag}-after"
    d = server.generate(p.donor, rid=f"{tag}-after-d", extra_key=gw.token("acme", ns, p.donor_segs))
    settle(server)
    w = server.generate(p.recipient, rid=f"{tag}-after-r", extra_key=gw.token("acme", ns, p.recipient_segs))
    _sent(out, [d, w])
    audit = _audit(server)
    out.absorb(audit, f"{tag}-")
    out.expect(audit.realized.get(f"{tag}-after-r") == 1024, f"no realization {when}")
    return audit


# ---- cohorts --------------------------------------------------------------------------------


def cohorts(server: Server, tag: str, pairs: int = 1, e_len: int = 2048) -> Outcome:
    """The paired cohorts (allowed, other tenant, unrelated, no context), ``pairs`` seeds each."""
    out = Outcome(f"cohorts[{tag}]")
    gw = server.gateway
    sent: list[Result] = []
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for seed in range(pairs):
        for cohort in COHORTS:
            p = pair_prompts(f"{tag}-{cohort}-{seed}", e_len=e_len, unrelated=cohort == "unrelated")
            ns, ns_cold = f"ns-{tag}-{cohort}-{seed}", f"ns-{tag}-{cohort}-{seed}-cold"
            tenant = "globex" if cohort == "other_tenant" else "acme"
            ctx = cohort != "no_context"
            rid = f"{tag}-{cohort}-{seed}"

            def key(t: str, n: str, segs: Any, _ctx: bool = ctx, _rid: str = rid) -> str:
                return gw.token(t, n, segs) if _ctx else f"plain-{_rid}-{n}"

            if cohort != "other_tenant":  # the warm arm's exact match covers [S]: give cold the same
                sent.append(
                    server.generate(
                        p.primer, rid=f"{rid}-primer", extra_key=key(tenant, ns_cold, p.primer_segs)
                    )
                )
                settle(server)
            cold = server.generate(
                p.recipient, rid=f"{rid}-cold", extra_key=key(tenant, ns_cold, p.recipient_segs)
            )
            donor = server.generate(p.donor, rid=f"{rid}-donor", extra_key=key("acme", ns, p.donor_segs))
            settle(server)
            warm = server.generate(
                p.recipient, rid=f"{rid}-warm", extra_key=key(tenant, ns, p.recipient_segs)
            )
            sent += [cold, donor, warm]
            out.ttft(f"{cohort} cold", cold)
            out.ttft(f"{cohort} warm", warm)
            rows[(cohort, seed)] = {"rid": rid, "warm": warm, "e_len": p.evidence_len}
    _sent(out, sent)
    audit = _audit(server)
    out.absorb(audit, f"{tag}-")
    for (cohort, _seed), r in rows.items():
        warm_id = f"{r['rid']}-warm"
        realized = audit.realized.get(warm_id, 0)
        out.realized_by[cohort] = out.realized_by.get(cohort, 0) + realized
        if cohort == "allowed":
            out.expect(realized == r["e_len"], f"{warm_id}: realized {realized}, expected {r['e_len']}")
            out.expect(
                r["warm"].cached_host == r["e_len"], f"{warm_id}: SGLang host hit {r['warm'].cached_host}"
            )
            out.expect(audit.allowed(warm_id) == 1, f"{warm_id}: {audit.allowed(warm_id)} allow decisions")
        else:
            out.expect(realized == 0, f"{warm_id} ({cohort}) realized {realized} tokens")
            out.expect(not r["warm"].cached_host, f"{warm_id} ({cohort}) host hit {r['warm'].cached_host}")
        if cohort in ("other_tenant", "no_context"):
            out.expect(warm_id not in audit.decisions, f"{warm_id} ({cohort}) was decided")
        if cohort == "other_tenant":  # the exact tree is keyed by tenant too: not even [S] is shared
            out.expect(r["warm"].cached_tokens == 0, f"{warm_id}: {r['warm'].cached_tokens} cached tokens")
        if cohort == "unrelated":
            out.expect(
                audit.denied(warm_id) >= 1 and audit.allowed(warm_id) == 0,
                f"{warm_id}: unrelated evidence not denied",
            )
    for key in ("allowed", "other_tenant", "unrelated", "no_context"):
        c, w = out.median(f"{key} cold"), out.median(f"{key} warm")
        if c and w:
            out.notes.append(f"{key}: TTFT cold {c:.0f} ms, warm {w:.0f} ms, warm/cold {w / c:.2f}")
    _server_problems(server, out)
    return out


def stock_cohorts(server: Server, tag: str, pairs: int = 1, e_len: int = 2048) -> Outcome:
    """The same cohorts on a stock SGLang server (no semgov backend): TTFT of the cold and the warm
    ("stock") arms, requests sent exactly as :func:`cohorts` sends them, except that each scope's
    cache key is a plain ``tenant:namespace`` string (what an operator isolating tenants with
    ``extra_key`` would send: exact prefixes shared within a scope, as semgov's tree does)."""
    out = Outcome(f"stock-cohorts[{tag}]")
    sent: list[Result] = []
    for seed in range(pairs):
        for cohort in COHORTS:
            p = pair_prompts(f"{tag}-{cohort}-{seed}", e_len=e_len, unrelated=cohort == "unrelated")
            ns, ns_cold = f"ns-{tag}-{cohort}-{seed}", f"ns-{tag}-{cohort}-{seed}-cold"
            tenant = "globex" if cohort == "other_tenant" else "acme"
            rid = f"{tag}-{cohort}-{seed}"

            def key(t: str, n: str, _c: str = cohort, _rid: str = rid) -> str:
                return f"plain-{_rid}-{n}" if _c == "no_context" else f"stock:{t}:{n}"

            if cohort != "other_tenant":
                sent.append(server.generate(p.primer, rid=f"{rid}-primer", extra_key=key(tenant, ns_cold)))
                wait_idle(server)
            cold = server.generate(p.recipient, rid=f"{rid}-cold", extra_key=key(tenant, ns_cold))
            donor = server.generate(p.donor, rid=f"{rid}-donor", extra_key=key("acme", ns))
            wait_idle(server)
            warm = server.generate(p.recipient, rid=f"{rid}-warm", extra_key=key(tenant, ns))
            sent += [cold, donor, warm]
            out.ttft(f"{cohort} cold", cold)
            out.ttft(f"{cohort} stock", warm)
    _sent(out, sent)
    _server_problems(server, out)
    return out


# ---- regions: approved evidence after fresh tokens -------------------------------------------


def _two_region_pair(seed: str) -> tuple[list[int], Any, list[int], Any, int]:
    """Donor ``[S][W][E1][X][E2][Q1]``, recipient ``[S][W'][E1][X'][E2][Q2]`` (new wrapper and a
    new separator: E1 and E2 each follow fresh tokens). Lengths are multiples of 16 (pages)."""
    s, e1, e2 = block(f"{seed}/S", 256), block(f"{seed}/E1", 512), block(f"{seed}/E2", 512)
    donor, dsegs = layout(
        [
            ("system", s),
            ("instruction", block(f"{seed}/W", 64)),
            ("evidence", e1),
            ("other", block(f"{seed}/X", 48)),
            ("evidence", e2),
            ("question", block(f"{seed}/Q1", 32)),
        ]
    )
    rcp, rsegs = layout(
        [
            ("system", s),
            ("instruction", block(f"{seed}/W2", 96)),
            ("evidence", e1),
            ("other", block(f"{seed}/X2", 80)),
            ("evidence", e2),
            ("question", block(f"{seed}/Q2", 32)),
        ]
    )
    return donor, dsegs, rcp, rsegs, len(e1) + len(e2)


def regions(server: Server, tag: str, burst: int = 4) -> Outcome:
    """Evidence behind a new wrapper is realized in the middle of the prompt: a two-region pair
    (both regions realized, each its own ``realization`` event), then ``burst`` new-wrapper
    recipients sent at once (SGLang chunks one request at a time: the others wait their turn)."""
    out = Outcome(f"regions[{tag}]")
    gw = server.gateway
    donor, dsegs, rcp, rsegs, want = _two_region_pair(f"{tag}-two")
    ns = f"ns-{tag}-two"
    d = server.generate(donor, rid=f"{tag}-two-donor", extra_key=gw.token("acme", ns, dsegs))
    settle(server)
    w = server.generate(rcp, rid=f"{tag}-two-warm", extra_key=gw.token("acme", ns, rsegs))
    sent = [d, w]
    pairs = [pair_prompts(f"{tag}-w{i}", e_len=1024, wrapper=96) for i in range(burst)]
    sent += run_concurrently(
        [
            (
                lambda p=p, i=i: server.generate(
                    p.donor, rid=f"{tag}-d{i}", extra_key=gw.token("acme", f"ns-{tag}-{i}", p.donor_segs)
                )
            )
            for i, p in enumerate(pairs)
        ],
        workers=burst,
    )
    settle(server)
    sent += run_concurrently(
        [
            (
                lambda p=p, i=i: server.generate(
                    p.recipient,
                    rid=f"{tag}-r{i}",
                    extra_key=gw.token("acme", f"ns-{tag}-{i}", p.recipient_segs),
                )
            )
            for i, p in enumerate(pairs)
        ],
        workers=burst,
    )
    _sent(out, sent)
    audit = _audit(server)
    out.absorb(audit, f"{tag}-")
    events = [r for r in audit.realizations if r["request_id"] == f"{tag}-two-warm"]
    out.expect(
        audit.realized.get(f"{tag}-two-warm") == want,
        f"{tag}-two-warm: realized {audit.realized.get(f'{tag}-two-warm')} of {want}",
    )
    out.expect(
        [r["detail"].rsplit("; ", 1)[-1] for r in events] == ["region at 352", "region at 944"],
        f"{tag}-two-warm: realizations {[r['detail'] for r in events]}",
    )
    for i in range(burst):
        got = audit.realized.get(f"{tag}-r{i}", 0)
        out.expect(got == 1024, f"{tag}-r{i}: realized {got} of 1024 behind a new wrapper")
    out.notes.append(f"two-region TTFT {w.ttft_ms:.0f} ms; {burst} new-wrapper recipients at once")
    _server_problems(server, out)
    return out


# ---- the seed's shape: one long recipient, nearly all evidence, behind another wrapper -------


def seed_lengths(tokens: int, share: float = 0.97) -> tuple[int, int, int, int]:
    """``(s_len, w_len, e_len, q_len)`` of a seed-shaped recipient ``[S][W][E][Q]`` of ``tokens``
    tokens whose evidence ``E`` is ``share`` of its positions; the rest is split evenly between
    system prompt, new wrapper and question (49 tokens each at 4,900)."""
    e_len = round(tokens * share)
    rest = tokens - e_len
    if rest < 12 or e_len < 256:
        raise ValueError(f"a seed-shaped recipient needs at least 400 tokens, not {tokens}")
    s_len = w_len = rest // 3
    return s_len, w_len, e_len, rest - s_len - w_len


def seed_shape(server: Server, tag: str, tokens: int = 4900) -> Outcome:
    """The seed's shape: a recipient of ``tokens`` tokens whose evidence (97% of its positions)
    comes from a donor behind another instruction wrapper (``[S][I][E][Q1]`` donor, ``[S][W][E][Q2]``
    recipient). Cold: the recipient in a namespace no donor reaches, primed with ``[S][Q1]`` (the
    same exact hit as the governed arm); governed: after the donor. The evidence must be realized
    in the middle of the prompt, and the server must be alive and healthy afterwards."""
    out = Outcome(f"seed[{tag}]")
    gw = server.gateway
    s_len, w_len, e_len, q_len = seed_lengths(tokens)
    p = pair_prompts(f"{tag}-seed", s_len=s_len, i_len=w_len, e_len=e_len, q_len=q_len, wrapper=w_len)
    ns, ns_cold = f"ns-{tag}-seed", f"ns-{tag}-seed-cold"
    primer = server.generate(
        p.primer, rid=f"{tag}-primer", extra_key=gw.token("acme", ns_cold, p.primer_segs)
    )
    settle(server)
    cold = server.generate(
        p.recipient, rid=f"{tag}-cold", extra_key=gw.token("acme", ns_cold, p.recipient_segs)
    )
    donor = server.generate(p.donor, rid=f"{tag}-donor", extra_key=gw.token("acme", ns, p.donor_segs))
    settle(server)
    warm = server.generate(p.recipient, rid=f"{tag}-warm", extra_key=gw.token("acme", ns, p.recipient_segs))
    _sent(out, [primer, cold, donor, warm])
    out.ttft("seed cold", cold)
    out.ttft("seed warm", warm)
    audit = _audit(server)
    out.absorb(audit, f"{tag}-")
    got = audit.realized.get(f"{tag}-warm", 0)
    out.realized_by["seed"] = got
    out.expect(got == e_len, f"{tag}-warm: realized {got} of {e_len} evidence tokens behind a new wrapper")
    if cold.ttft_ms and warm.ttft_ms:
        out.notes.append(
            f"{len(p.recipient)} tokens, evidence {e_len} ({e_len / len(p.recipient):.0%}): TTFT "
            f"cold {cold.ttft_ms:.0f} ms, governed {warm.ttft_ms:.0f} ms, "
            f"governed/cold {warm.ttft_ms / cold.ttft_ms:.2f}"
        )
    _server_problems(server, out)
    return out


# ---- concurrency -----------------------------------------------------------------------------


def concurrency(server: Server, tag: str, groups: int = 10) -> Outcome:
    """``4 * groups`` requests in flight at once: recipients of settled donors, new donors,
    plain traffic and another tenant's look-alikes. Recipients are realized; nothing else is."""
    out = Outcome(f"concurrency[{tag}]")
    gw = server.gateway
    prompts = [pair_prompts(f"{tag}-{i}", e_len=1024) for i in range(groups)]
    # Donors first (concurrently too), settled.
    donors = run_concurrently(
        [
            (
                lambda p=p, i=i: server.generate(
                    p.donor, rid=f"{tag}-d{i}", extra_key=gw.token("acme", f"ns-{tag}-{i}", p.donor_segs)
                )
            )
            for i, p in enumerate(prompts)
        ],
        workers=groups,
    )
    settle(server)
    jobs: list[Callable[[], Result]] = []
    for i, p in enumerate(prompts):
        ns = f"ns-{tag}-{i}"
        jobs.append(
            lambda p=p, i=i, ns=ns: server.generate(
                p.recipient,
                rid=f"{tag}-r{i}",
                extra_key=gw.token("acme", ns, p.recipient_segs),
                max_new_tokens=16,
            )
        )
        jobs.append(
            lambda p=p, i=i, ns=ns: server.generate(
                p.recipient,
                rid=f"{tag}-x{i}",
                extra_key=gw.token("globex", ns, p.recipient_segs),
                max_new_tokens=16,
            )
        )
        q = pair_prompts(f"{tag}-new-{i}", e_len=1024)
        jobs.append(
            lambda q=q, i=i: server.generate(
                q.donor,
                rid=f"{tag}-n{i}",
                extra_key=gw.token("acme", f"ns-{tag}-new-{i}", q.donor_segs),
                max_new_tokens=16,
            )
        )
        jobs.append(
            lambda i=i: server.generate(block(f"{tag}-plain-{i}", 1500), rid=f"{tag}-p{i}", max_new_tokens=16)
        )
    results = run_concurrently(jobs, workers=len(jobs))
    _sent(out, list(donors) + list(results))
    audit = _audit(server)
    out.absorb(audit, f"{tag}-")
    for i in range(groups):
        got = audit.realized.get(f"{tag}-r{i}", 0)
        out.expect(got == 1024, f"{tag}-r{i}: realized {got} of 1024 under concurrency")
        for other in ("x", "n", "p", "d"):
            out.expect(not audit.realized.get(f"{tag}-{other}{i}"), f"{tag}-{other}{i} realized")
        out.expect(f"{tag}-x{i}" not in audit.decisions, f"{tag}-x{i} (other tenant) decided")
    out.notes.append(f"{len(jobs)} requests in flight at once")
    _server_problems(server, out)
    return out


# ---- aborts, flush ----------------------------------------------------------------------------


def aborts(server: Server, tag: str, n: int = 8) -> Outcome:
    """Clients that hang up while their request waits, prefills or decodes (realized recipients
    among them), and ``/abort_request`` by rid: the server stays up, nothing leaks, and a fresh
    pair afterwards still realizes."""
    out = Outcome(f"aborts[{tag}]")
    gw = server.gateway
    prompts = [pair_prompts(f"{tag}-{i}", e_len=1536) for i in range(n)]
    for i, p in enumerate(prompts):
        r = server.generate(
            p.donor, rid=f"{tag}-d{i}", extra_key=gw.token("acme", f"ns-{tag}-{i}", p.donor_segs)
        )
        _sent(out, [r])
    settle(server)
    jobs: list[Callable[[], Result]] = []
    for i, p in enumerate(prompts):
        tok = gw.token("acme", f"ns-{tag}-{i}", p.recipient_segs)
        cut = (0, 1, 3, None)[i % 4]  # after headers (waiting/prefill), first token, mid-decode, never
        jobs.append(
            lambda p=p, i=i, tok=tok, cut=cut: server.generate(
                p.recipient, rid=f"{tag}-r{i}", extra_key=tok, max_new_tokens=48, abort_after_chunks=cut
            )
        )
        jobs.append(
            lambda i=i: server.generate(
                block(f"{tag}-plain-{i}", 2500),
                rid=f"{tag}-p{i}",
                max_new_tokens=48,
                abort_after_chunks=(0, 2)[i % 2],
            )
        )
    for i in range(4):  # aborted by rid through the API while queued or running
        jobs.append(lambda i=i: _abort_by_rid(server, f"{tag}-api{i}", block(f"{tag}-api-{i}", 2000)))
    results = run_concurrently(jobs, workers=len(jobs))
    _sent(out, list(results), failures_ok=True)  # aborted requests end without output, by design
    time.sleep(2.0)
    _fresh_pair_realizes(server, tag, out, "after the aborts")
    out.notes.append(f"{sum(1 for r in results if not r.ok)} of {len(results)} requests ended by the client")
    _server_problems(server, out)
    return out


def _abort_by_rid(server: Server, rid: str, tokens: list[int]) -> Result:
    holder: dict[str, Result] = {}
    t = threading.Thread(target=lambda: holder.update(r=server.generate(tokens, rid=rid, max_new_tokens=64)))
    t.start()
    time.sleep(0.05)
    server.post("/abort_request", {"rid": rid})
    t.join(timeout=300)
    return holder.get("r") or Result(rid, ok=False, error="no result")


def flush_under_load(server: Server, tag: str, n: int = 12) -> Outcome:
    """``/flush_cache`` while requests run (SGLang refuses it until idle) and once idle (it
    flushes): the donor registry is forgotten with the tree, and reuse resumes with new donors."""
    out = Outcome(f"flush[{tag}]")
    gw = server.gateway
    prompts = [pair_prompts(f"{tag}-{i}", e_len=1024) for i in range(n)]
    for i, p in enumerate(prompts[: n // 2]):
        _sent(
            out,
            [
                server.generate(
                    p.donor, rid=f"{tag}-d{i}", extra_key=gw.token("acme", f"ns-{tag}-{i}", p.donor_segs)
                )
            ],
        )
    settle(server)
    stop = threading.Event()
    codes: list[int] = []

    def flusher() -> None:
        while not stop.is_set():
            try:
                codes.append(server.flush_cache())
            except OSError:
                pass
            time.sleep(0.05)

    ft = threading.Thread(target=flusher)
    ft.start()
    try:
        jobs = [
            (
                lambda p=p, i=i: server.generate(
                    p.recipient,
                    rid=f"{tag}-r{i}",
                    extra_key=gw.token("acme", f"ns-{tag}-{i}", p.recipient_segs),
                    max_new_tokens=24,
                )
            )
            for i, p in enumerate(prompts)
        ]
        results = run_concurrently(jobs, workers=len(jobs))
    finally:
        stop.set()
        ft.join()
    _sent(out, list(results))
    time.sleep(1.0)
    out.expect(server.flush_cache() == 200, "/flush_cache refused on an idle server")
    _fresh_pair_realizes(server, tag, out, "after the flush")
    out.notes.append(f"flush calls during load: {len(codes)} ({sum(1 for c in codes if c == 200)} accepted)")
    _server_problems(server, out)
    return out


# ---- client-controlled strings ---------------------------------------------------------------


def rid_collisions(server: Server, tag: str) -> Outcome:
    """Client-chosen ``rid``s key nothing: two tenants' donors sent with one rid are two donors,
    and recipients sent with that same rid are each realized from their own tenant's donor.
    (Two *live* requests with one rid are refused by SGLang's tokenizer manager on a single front
    end; the harness test ``test_twin_rids_get_their_own_plans`` drives that case.)"""
    out = Outcome(f"rid-collisions[{tag}]")
    gw = server.gateway
    a = pair_prompts(f"{tag}-a", e_len=1024)
    b = pair_prompts(f"{tag}-b", e_len=1024)
    same = f"{tag}-same"
    ns = f"ns-{tag}"
    _sent(out, [server.generate(a.donor, rid=same, extra_key=gw.token("acme", ns, a.donor_segs))])
    settle(server)
    _sent(out, [server.generate(b.donor, rid=same, extra_key=gw.token("globex", ns, b.donor_segs))])
    settle(server)
    _sent(out, [server.generate(a.recipient, rid=same, extra_key=gw.token("acme", ns, a.recipient_segs))])
    audit = _audit(server)
    first = [r for r in audit.realizations if r["request_id"] == same]
    _sent(out, [server.generate(b.recipient, rid=same, extra_key=gw.token("globex", ns, b.recipient_segs))])
    twins = run_concurrently(
        [
            lambda: server.generate(block(f"{tag}-t1", 1800), rid=f"{tag}-twin", max_new_tokens=32),
            lambda: server.generate(block(f"{tag}-t2", 1800), rid=f"{tag}-twin", max_new_tokens=32),
        ],
        workers=2,
    )
    refused = [t for t in twins if not t.ok]
    out.expect(all("Duplicate request ID" in str(t.error) for t in refused), f"twin errors: {refused}")
    out.notes.append(f"concurrent twin rids: {len(refused)} of 2 refused by SGLang's tokenizer manager")
    audit = _audit(server)
    out.absorb(audit, f"{tag}-")
    reals = [r for r in audit.realizations if r["request_id"] == same]
    out.expect(len(first) == 1 and len(reals) == 2, f"realizations under rid {same}: {len(reals)}")
    if len(reals) == 2:
        donors = [r["donor_id"] for r in reals]
        out.expect(donors[0] != donors[1], f"both tenants' recipients reused donor {donors[0]}")
        out.expect(not any(str(d) == same for d in donors), f"donor ids are client rids: {donors}")
        out.expect(all(r["materialized_tokens"] == 1024 for r in reals), "partial realizations")
    # Each recipient's allow decision names its own tenant.
    tenants = sorted(d["tenant"] for d in audit.decisions.get(same, []) if d["decision"] == "allow")
    out.expect(tenants == ["acme", "globex"], f"allow decisions by tenant: {tenants}")
    _server_problems(server, out)
    return out


HOSTILE_EXTRA_KEYS: dict[str, Any] = {
    "non-ascii": "semgov1.caf\u00e9.\u00e9t\u00e9",
    "lone-surrogate": "semgov1.\udcff",
    "emoji-tail": None,  # a valid token + an emoji (filled in below)
    "surrogate-tail": None,  # a valid token + a lone surrogate
    "junk-tail": None,  # a valid token + ASCII junk (no LoRA): refused, served plain
    "huge": "semgov1." + "A" * 200_000,
    "nul": "semgov1.\x00\x00",
    "not-a-token": "tenant=acme",
}


def rotation(server: Server, tag: str) -> Outcome:
    """A context-key rotation's grace period (the rig's servers hold SEMGOV_CONTEXT_KEY_PREVIOUS): a
    previous-key token is its tenant's scope (its recipient is realized from a current-key donor), another
    tenant's previous-key token gets nothing; a retired key's, another audience's and an expired token
    are refused, each with a tree key of its own (no exact-prefix hit, not even on its own repeat)."""
    from tests.sglang_server.rig import PREVIOUS_CONTEXT_SECRET

    out = Outcome(f"rotation[{tag}]")
    gw = server.gateway
    p = pair_prompts(f"{tag}-rotation", e_len=1024)
    ns = f"ns-{tag}-rotation"
    sent = [server.generate(p.donor, rid=f"{tag}-donor", extra_key=gw.token("acme", ns, p.donor_segs))]
    settle(server)
    old = gw.token("acme", ns, p.recipient_segs, secret=PREVIOUS_CONTEXT_SECRET)
    other = gw.token("globex", ns, p.recipient_segs, secret=PREVIOUS_CONTEXT_SECRET)
    warm = server.generate(p.recipient, rid=f"{tag}-old-key", extra_key=old)
    foreign = server.generate(p.recipient, rid=f"{tag}-other-tenant", extra_key=other)
    sent += [warm, foreign]
    refused = {
        "retired-key": gw.token(
            "acme", ns, p.recipient_segs, secret=b"a-key-retired-long-ago-0123456789abcdef"
        ),
        "other-audience": gw.token("acme", ns, p.recipient_segs, audience="another-deployment"),
        "expired": gw.token("acme", ns, p.recipient_segs, expires_at=1_000_000),
    }
    for name, tok in refused.items():
        for i in range(2):
            r = server.generate(p.recipient, rid=f"{tag}-{name}-{i}", extra_key=tok)
            sent.append(r)
            out.expect(r.cached_tokens == 0, f"{name} #{i}: {r.cached_tokens} cached tokens (a shared key?)")
    _sent(out, sent)
    audit = _audit(server)
    out.absorb(audit, f"{tag}-")
    realized = audit.realized.get(f"{tag}-old-key", 0)
    out.expect(
        realized == p.evidence_len, f"previous-key recipient realized {realized}, expected {p.evidence_len}"
    )
    out.expect(
        audit.realized.get(f"{tag}-other-tenant", 0) == 0, "another tenant's previous-key token realized"
    )
    out.expect(foreign.cached_tokens == 0, f"another tenant hit {foreign.cached_tokens} cached tokens")
    for name in refused:
        out.expect(f"{tag}-{name}-0" not in audit.decisions, f"a {name} token was decided")
    _server_problems(server, out)
    return out


def hostile_extra_keys(server: Server, tag: str) -> Outcome:
    """Malformed ``extra_key``s (non-ASCII, lone surrogates, junk after a valid token, huge) are
    served without semantic reuse, and the scheduler stays up."""
    out = Outcome(f"hostile-extra-key[{tag}]")
    gw = server.gateway
    p = pair_prompts(f"{tag}-h", e_len=1024)
    good = gw.token("acme", f"ns-{tag}", p.donor_segs)
    _sent(out, [server.generate(p.donor, rid=f"{tag}-donor", extra_key=good)])
    settle(server)
    rtoken = gw.token("acme", f"ns-{tag}", p.recipient_segs)
    keys = dict(HOSTILE_EXTRA_KEYS)
    keys["emoji-tail"] = rtoken + "\U0001f600"
    keys["surrogate-tail"] = rtoken + "\udcff"
    keys["junk-tail"] = rtoken + "X"
    results = []
    for name, extra_key in keys.items():
        # json.dumps escapes lone surrogates as \udcff: the server's JSON parser gives them back.
        payload = {
            "rid": f"{tag}-{name}",
            "input_ids": p.recipient,
            "sampling_params": {"max_new_tokens": 2, "temperature": 0.0, "ignore_eos": True},
            "extra_key": extra_key,
        }
        status, body = server.post("/generate", payload, timeout=120)
        ok = status == 200 and b"output_ids" in body
        results.append(
            Result(
                f"{tag}-{name}",
                ok=ok,
                status=status,
                error=None if ok else body[:200].decode("utf-8", "replace"),
            )
        )
    _sent(out, results, failures_ok=True)
    for r in results:
        out.expect(
            r.ok or (r.status is not None and 400 <= r.status < 500), f"{r.rid}: HTTP {r.status} {r.error}"
        )
    audit = _audit(server)
    out.absorb(audit, f"{tag}-")
    for name in keys:
        out.expect(not audit.realized.get(f"{tag}-{name}"), f"{tag}-{name} got semantic reuse")
    out.notes.append(", ".join(f"{r.rid.removeprefix(tag + '-')}: HTTP {r.status}" for r in results))
    _server_problems(server, out)
    return out


# ---- retraction and memory pressure ------------------------------------------------------------


def retraction(server: Server, tag: str, n: int = 6) -> Outcome:
    """Recipients decoding long enough to be retracted (the server runs with SGLang's
    ``SGLANG_TEST_RETRACT``): each is decided once, and realized again under that same decision
    when re-admitted."""
    out = Outcome(f"retraction[{tag}]")
    gw = server.gateway
    prompts = [pair_prompts(f"{tag}-{i}", e_len=1024) for i in range(n)]
    for i, p in enumerate(prompts):
        _sent(
            out,
            [
                server.generate(
                    p.donor, rid=f"{tag}-d{i}", extra_key=gw.token("acme", f"ns-{tag}-{i}", p.donor_segs)
                )
            ],
        )
    settle(server)
    jobs = [
        (
            lambda p=p, i=i: server.generate(
                p.recipient,
                rid=f"{tag}-r{i}",
                extra_key=gw.token("acme", f"ns-{tag}-{i}", p.recipient_segs),
                max_new_tokens=40,
            )
        )
        for i, p in enumerate(prompts)
    ]
    _sent(out, list(run_concurrently(jobs, workers=n)))
    audit = _audit(server)
    out.absorb(audit, f"{tag}-")
    retracted = server.log_text().count("Retract requests") + server.log_text().count("Testing retraction")
    out.notes.append(f"retraction rounds in the server log: {retracted}")
    out.expect(retracted > 0, "no retraction happened: the scenario did not exercise it")
    again = 0
    for i in range(n):
        rid = f"{tag}-r{i}"
        decisions = audit.decisions.get(rid, [])
        donors = [d["donor_id"] for d in decisions]
        out.expect(len(donors) == len(set(donors)) and decisions, f"{rid}: decisions {donors} (decide once)")
        reals = [r for r in audit.realizations if r["request_id"] == rid]
        out.expect(bool(reals), f"{rid} was never realized")
        ids = {r["decision_id"] for r in reals}
        out.expect(len(ids) <= 1, f"{rid}: realized under several decisions {ids}")
        again += max(0, len(reals) - 1)
    out.notes.append(f"re-realizations after retraction: {again}")
    _server_problems(server, out)
    return out


def _evicted(audit: AuditSummary, tag: str) -> list[str]:
    """Phase-1 recipients of ``tag`` allowed a donor whose KV was evicted before their admission.

    Either the realization found the donor's live KV short (``realization_failed``), or the
    exact match no longer reached the approved span (the shared ``[S]`` was evicted too) and
    nothing was planned: both run cold, with the allow decision on record."""
    return [
        rid
        for rid, ds in audit.decisions.items()
        if rid.startswith(f"{tag}-r")
        and any(d["decision"] == "allow" for d in ds)
        and not audit.realized.get(rid)
    ]


def _evict_round(server: Server, out: Outcome, tag: str, i: int) -> None:
    """One phase-1 round of :func:`pressure`: primer, donor, then the filler and the recipient."""
    gw = server.gateway
    out.expect(wait_idle(server), "the server did not go idle before the round")
    out.expect(server.flush_cache() == 200, "/flush_cache refused on an idle server")
    p = pair_prompts(f"{tag}-{i}", e_len=2048)
    ns = f"ns-{tag}-{i}"
    _sent(out, [server.generate(p.primer, rid=f"{tag}-p{i}", extra_key=gw.token("acme", ns, p.primer_segs))])
    _sent(out, [server.generate(p.donor, rid=f"{tag}-d{i}", extra_key=gw.token("acme", ns, p.donor_segs))])
    settle(server)

    def recipient() -> Result:
        time.sleep(0.1)  # behind the filler in SGLang's queue
        tok = gw.token("acme", ns, p.recipient_segs)
        return server.generate(p.recipient, rid=f"{tag}-r{i}", extra_key=tok, max_new_tokens=8)

    filler = block(f"{tag}-fill-{i}", 7000)
    jobs: list[Callable[[], Result]] = [
        lambda: server.generate(filler, rid=f"{tag}-f{i}", max_new_tokens=4),
        recipient,
    ]
    _sent(out, list(run_concurrently(jobs, workers=2)))


def pressure(server: Server, tag: str, rounds: int = 2) -> Outcome:
    """A pool too small for the traffic (the server runs with ``--max-total-tokens 8192`` and an
    aggressive ``--schedule-conservativeness``), in two phases:

    1. eviction between decision and admission: on a flushed tree, a primer ``[S][Q1]`` and a
       donor ``[S][I][E][Q1]`` of one scope, then a 7,000-token filler and, just behind it in
       SGLang's queue, the recipient ``[S][E][Q2]``. The filler's chunked prefill holds the
       prefill budget while the recipient waits, already decided (its matches keep ``[S]``
       fresh); its allocations evict the radix tree's leaves, the donor's among them. At
       admission the recipient's realization finds the donor's KV gone, fails cleanly and runs
       cold (or, when ``[S]`` went too, nothing is planned and it runs cold). A round in which
       the recipient got ahead of the evictions is repeated, up to six rounds in all;
    2. retraction (once): three long decodes (a realized recipient among them) that outgrow the
       pool together, so SGLang retracts some and re-admits them later (``ignore_eos`` off:
       SGLang then admits on its decode estimate instead of reserving every new token).

    Throughout, the pool accounting holds (SGLang's strict checks and the hook's guard) and the
    server stays up."""
    out = Outcome(f"pressure[{tag}]")
    gw = server.gateway
    # NOTE: where the filler's evictions fall relative to the recipient's admission is up to the
    # machine's speed; rounds are repeated until the case was seen ``rounds`` times.
    tried = 0
    while tried < 3 * rounds and len(_evicted(_audit(server), tag)) < rounds:
        _evict_round(server, out, tag, tried)
        tried += 1

    # Phase 2: a realized recipient and two plain requests decode past the pool together.
    q = pair_prompts(f"{tag}-b", e_len=1024)
    nsb = f"ns-{tag}-b"
    _sent(out, [server.generate(q.donor, rid=f"{tag}-bd", extra_key=gw.token("acme", nsb, q.donor_segs))])
    settle(server)
    rtok = gw.token("acme", nsb, q.recipient_segs)

    def long(j: int) -> Result:
        if not _admitted(server, f"{tag}-br"):  # the recipient first: its donor is then still whole
            out.problems.append(f"{tag}-br: no realization record within 120 s")
        return server.generate(
            block(f"{tag}-long-{j}", 1200), rid=f"{tag}-l{j}", max_new_tokens=3000, ignore_eos=False
        )

    jobs: list[Callable[[], Result]] = [
        lambda: server.generate(
            q.recipient, rid=f"{tag}-br", extra_key=rtok, max_new_tokens=3000, ignore_eos=False
        ),
        lambda: long(0),
        lambda: long(1),
    ]
    _sent(out, list(run_concurrently(jobs, workers=len(jobs))))
    audit = _audit(server)
    out.absorb(audit, f"{tag}-")
    log = server.log_text()
    evicted = _evicted(audit, tag)
    short = [
        f
        for f in audit.failed
        if str(f["request_id"]).startswith(f"{tag}-r") and "live KV covers" in str(f.get("detail"))
    ]
    retractions = log.count("Retract requests")
    for rid in [f"{tag}-r{i}" for i in range(tried)]:
        verdicts = [d["decision"] for d in audit.decisions.get(rid, [])]
        failed = [str(f.get("detail")) for f in audit.failed if f["request_id"] == rid]
        got = audit.realized.get(rid, 0)
        out.notes.append(f"{rid}: decisions {verdicts}, realized {got}, failed {failed}")
    out.notes.append(
        f"rounds {tried}: realized {out.realizations}, donor evicted between decision and admission "
        f"{len(evicted)} ({len(short)} found short at realization), "
        f"other failed realizations {out.fallbacks - len(short)}, "
        f"retraction rounds {retractions}"
    )
    out.expect(
        len(evicted) == rounds,
        f"donor evicted between decision and admission in {len(evicted)} of {tried} rounds, {rounds} wanted",
    )
    out.expect(retractions >= 1, "the pool never filled up to a retraction")
    why = [str(f.get("detail")) for f in audit.failed if f["request_id"] == f"{tag}-br"]
    out.expect(bool(audit.realized.get(f"{tag}-br")), f"{tag}-br was not realized: {why}")
    for rid in [f"{tag}-r{i}" for i in range(tried)] + [f"{tag}-br"]:
        donors = [d["donor_id"] for d in audit.decisions.get(rid, [])]
        out.expect(bool(donors) and len(donors) == len(set(donors)), f"{rid}: decisions for donors {donors}")
    _server_problems(server, out)
    return out
