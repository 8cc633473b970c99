"""What the policy lifecycle costs in the SGLang hook: capture, shadow and hot reload.

Usage: python benchmarks/policy_lifecycle.py [--n 400] [--tokens 650] [--reloads 20] [--core 0] [--smoke]

A real :class:`~engine_hooks.core.governor.Governor` (the hook without SGLang: the parts the
scheduler calls) decides on its decision thread in this process (``SEMGOV_DECISION_PROCESS=0``,
so every cost is visible here), with the default policy, real keys and one registered donor per
request. Four arms, ``--n`` recipients each, each recipient with one candidate:

- ``plain``: no capture, no shadow;
- ``capture``: ``SEMGOV_CAPTURE_DIR`` set (every request captured, no text);
- ``shadow``: ``SEMGOV_SHADOW_POLICY`` set (a stricter copy of the policy);
- ``both``.

Per arm: the scheduler thread's cost of queuing a decision (``decide_later``, p50/p99 in us:
capture and shadow add nothing there by design, and this shows it), the decision thread's time
until the live decision is handed over (``decided_s``, p50/p99 in ms), and the decision thread's
total busy time per request (wall time of the arm / n, ms), which includes the shadow and the
capture's ``offer`` (the capture's own writer thread serializes and writes; on a 2-core machine
it competes for the same cores). Capture arms also print the writer's counters and bytes per
request.

Reload: ``HookPolicies.reload()`` of a changed default policy, p50/p99 over ``--reloads``, and
end to end with the file watcher (poll 100 ms): atomic rename of a new policy -> the governor's
live revision changes (p50/max), i.e. what a policy author waits for.

A machine baseline (fsync, Ed25519, SHA-256, load) is printed before and after.

``--smoke``: n=3 (one warm-up request per arm), 300 tokens, 2 direct reloads, quick baselines, and
donors without text (``SEMGOV_DETOKENIZER=none``: no Presidio load, which alone takes about 10 s;
the default policy then denies every candidate): every arm and the reloads in seconds, the
figures meaning nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from array import array
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._machine import baseline  # noqa: E402
from engine_hooks.core.donors import DonorSpec  # noqa: E402
from engine_hooks.core.governor import Governor  # noqa: E402
from engine_hooks.core.settings import HookSettings  # noqa: E402
from semgov.context import RequestContext  # noqa: E402
from semgov.signing.keys import generate_keypair, key_id_for, load_public_key  # noqa: E402

TASK = {"id": "qa", "version": "1"}
CONTRACT = {"id": "answer-json", "schema_sha256": "a" * 64}
DETOK = "tests.sglang_hook.scenario:detokenizer"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def tokens(seed: int, n: int) -> list[int]:
    return [1000 + (seed * 7919 + i * 104729) % 40000 for i in range(n)]


def files(work: Path, smoke: bool = False) -> dict[str, str]:
    """Keys, keyring, context key, the default policy and its stricter copy, on disk (``smoke``:
    donors without text, so no PII scan)."""
    priv, pub = generate_keypair(work / "keys")
    trust = work / "keyring.json"
    trust.write_text(
        json.dumps({"keys": [{"key_id": key_id_for(load_public_key(pub)), "public_key": pub.read_text()}]})
    )
    (work / "context.key").write_bytes(b"benchmark-gateway-secret-0123456789abcdef")
    text = (ROOT / "policies" / "default" / "policy.yaml").read_text()
    for name, body in (
        ("policy", text),
        ("stricter", text.replace("min_approved_fraction: 0.5", "min_approved_fraction: 0.99")),
    ):
        (work / name).mkdir()
        (work / name / "policy.yaml").write_text(body)
    return {
        "SEMGOV_POLICY": str(work / "policy"),
        "SEMGOV_TRUST": str(trust),
        "SEMGOV_SIGNING_KEY": str(priv),
        "SEMGOV_CONTEXT_KEY": str(work / "context.key"),
        "SEMGOV_CONTEXT_AUDIENCE": "semgov-bench",
        "SEMGOV_DETOKENIZER": "none" if smoke else DETOK,
        "SEMGOV_DECISION_PROCESS": "0",
        "SEMGOV_ASYNC_REGISTRATION": "1",
        "SEMGOV_DECISION_TIMEOUT_MS": "30000",
        "SEMGOV_MIN_UNMATCHED_TOKENS": "64",
    }


def governor(env: dict[str, str], audit: Path, **over: str) -> Governor:
    return Governor(
        HookSettings.from_env({**env, "SEMGOV_AUDIT_DIR": str(audit), **over}), engine_name="bench"
    )


def run_arm(gov: Governor, n: int, size: int) -> dict[str, float]:
    """``n`` donor/recipient pairs (one namespace each: one candidate per recipient)."""
    sys_len = size // 3
    queue_us, decided_ms = [], []
    busy = 0.0
    for i in range(n):
        segs_d = (("system", 0, sys_len), ("evidence", sys_len, size - 50), ("question", size - 50, size))
        ctx = RequestContext("acme", f"ns{i}", dict(TASK), dict(CONTRACT), segs_d, None)
        base = tokens(10 * i + 1, size - 50)
        gov.submit_donor(
            DonorSpec(
                f"d-{i}",
                ctx,
                ctx.cache_key(gov.context_key),
                None,
                array("q", base + tokens(10 * i + 2, 50)),
                None,
            )
        )
        gov.wait_registrations(60)
        gov.drain_donors()
        gov.wait_idle(60)
        ids = array("q", base + tokens(10 * i + 3, 50))
        t0 = time.perf_counter()
        job = gov.decide_later(f"r-{i}", ctx, None, ids)
        queue_us.append((time.perf_counter() - t0) * 1e6)
        gov.wait_idle(60)  # the decision thread is done with this request: live, shadow, capture
        busy += time.perf_counter() - t0
        assert job.done and job.decisions, "no decision"
        decided_ms.append(job.decided_s * 1e3)
    return {
        "queue_p50_us": pct(queue_us, 0.5),
        "queue_p99_us": pct(queue_us, 0.99),
        "live_p50_ms": pct(decided_ms, 0.5),
        "live_p99_ms": pct(decided_ms, 0.99),
        "busy_ms": busy / n * 1e3,
    }


def capture_costs(gov: Governor) -> str:
    cap = gov.policies.capture
    assert cap is not None
    cap.flush(60)
    st = cap.stats()
    per = st.bytes / max(st.written, 1)
    return f"capture: {st.written} written, {st.dropped} dropped, {st.failed} failed, {per:.0f} B/request"


def reload_costs(env: dict[str, str], work: Path, reloads: int) -> str:
    gov = governor(env, work / "audit-reload", SEMGOV_RELOAD_POLL_MS="100")
    policy = Path(env["SEMGOV_POLICY"]) / "policy.yaml"
    original = policy.read_text()
    direct, watched = [], []
    try:
        for i in range(reloads):
            policy.write_text(original.replace("min: 0.6", f"min: 0.6{i + 1:02d}"))
            t0 = time.perf_counter()
            outcomes = gov.policies.reload()
            direct.append((time.perf_counter() - t0) * 1e3)
            assert outcomes and outcomes[0].ok, outcomes
        gov.watch()
        for i in range(max(3, reloads // 4)):
            before = gov.revision
            tmp = policy.with_name(".policy.yaml.new")
            tmp.write_text(original.replace("min: 0.6", f"min: 0.5{i + 1:02d}"))
            t0 = time.perf_counter()
            os.replace(tmp, policy)
            while gov.revision == before:
                time.sleep(0.002)
            watched.append((time.perf_counter() - t0) * 1e3)
    finally:
        policy.write_text(original)
        gov.close()
    return (
        f"reload (HookPolicies.reload, changed policy): p50 {statistics.median(direct):.1f} ms, "
        f"p99 {pct(direct, 0.99):.1f} ms, n={len(direct)}\n"
        f"reload end to end (rename -> new live revision, watcher poll 100 ms): "
        f"p50 {statistics.median(watched):.0f} ms, max {max(watched):.0f} ms, n={len(watched)}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=400, help="recipients per arm (default 400)")
    ap.add_argument("--tokens", type=int, default=650, help="prompt length (default 650)")
    ap.add_argument("--reloads", type=int, default=20, help="direct reloads timed (default 20)")
    ap.add_argument("--core", type=int, default=None, help="pin the process to this core")
    ap.add_argument("--smoke", action="store_true", help="n=3, 300 tokens, no PII scan: in seconds")
    args = ap.parse_args()
    if args.smoke:
        args.n, args.tokens, args.reloads = 3, 300, 2
    if args.core is not None:
        os.sched_setaffinity(0, {args.core})
    work = Path(tempfile.mkdtemp(prefix="semgov-lifecycle-", dir=ROOT))
    try:
        print(baseline(work, quick=args.smoke))
        env = files(work, args.smoke)
        arms: dict[str, dict[str, str]] = {
            "plain": {},
            "capture": {"SEMGOV_CAPTURE_DIR": str(work / "capture"), "SEMGOV_CAPTURE_RATE": "1"},
            "shadow": {"SEMGOV_SHADOW_POLICY": str(work / "stricter")},
            "both": {
                "SEMGOV_CAPTURE_DIR": str(work / "capture-both"),
                "SEMGOV_CAPTURE_RATE": "1",
                "SEMGOV_SHADOW_POLICY": str(work / "stricter"),
            },
        }
        print(
            f"n={args.n} recipients per arm, {args.tokens} tokens, one candidate each, in-process decisions"
        )
        print(
            f"{'arm':<9}{'queue p50 us':>13}{'p99 us':>9}{'live p50 ms':>13}{'p99 ms':>9}{'busy ms/req':>13}"
        )
        for name, over in arms.items():
            gov = governor(env, work / f"audit-{name}", **over)
            try:
                run_arm(gov, 1 if args.smoke else 5, args.tokens)  # warm-up: PII scanner, caches
                r = run_arm(gov, args.n, args.tokens)
                extra = capture_costs(gov) if "SEMGOV_CAPTURE_DIR" in over else ""
            finally:
                gov.close()
            print(
                f"{name:<9}{r['queue_p50_us']:>13.1f}{r['queue_p99_us']:>9.1f}{r['live_p50_ms']:>13.2f}"
                f"{r['live_p99_ms']:>9.2f}{r['busy_ms']:>13.2f}  {extra}"
            )
        print(reload_costs(env, work, args.reloads))
        print(baseline(work, quick=args.smoke))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
