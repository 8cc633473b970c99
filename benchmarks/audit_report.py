"""Time and size of `semgov audit report` on large logs (issue 18: 100k and 1M records).

Usage: python benchmarks/audit_report.py [--records 100000] [--dir DIR] [--out report.html] [--workers 2]
       [--smoke]

Builds (or reuses, with --dir) a log of real signed records: `semgov.decision/v3` records made from
real decisions of the example workload (examples/captured.jsonl.gz, the default policy), varied over
20 tenants x 10 namespaces and 30 days (same-scope allows, allows across a namespace boundary under
a sharing rule, denies), each with a fresh decision id and signed again with the example decision
key; a `realization` engine event for half of the allows, a few `realization_failed`, two
`policy_loaded` and one `reuse_disabled`. Then runs `semgov audit report` with the public key and
prints the time to verify, the time to summarize (the one streaming pass), the page's size and the
process's peak memory, between two machine baselines. ``--smoke``: 200 decisions, quick baselines
(every step, the report included, in seconds; the figures mean nothing); the templates are decided
without the PII scan (Presidio's load alone takes about 10 s).
"""

from __future__ import annotations

import argparse
import copy
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._machine import baseline  # noqa: E402
from benchmarks._smoke import NoPii  # noqa: E402
from semgov import Evaluator, Keyring, load_policy, load_signing_key  # noqa: E402
from semgov.audit.store import AuditLog  # noqa: E402
from semgov.intake.capture import read_captured  # noqa: E402
from semgov.signing.engine_events import engine_event, sign_engine_event  # noqa: E402
from semgov.signing.keys import SigningKey  # noqa: E402
from semgov.signing.records import sign_record_canonical  # noqa: E402
from semgov.wire.models import CapturedRequest  # noqa: E402

EX = ROOT / "examples"
START = datetime(2026, 11, 1, tzinfo=UTC)


def templates(key: SigningKey, smoke: bool = False) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A real allow and real denies of the example workload (one per set of failing gates, at most
    six), unsigned (``smoke``: decided without a PII scan)."""
    ev = Evaluator(
        load_policy(ROOT / "policies" / "default"),
        Keyring.load(EX / "keyring.json"),
        key,
        pii_scanner=NoPii() if smoke else None,
    )
    allow: dict[str, Any] | None = None
    denies: dict[tuple[str, ...], dict[str, Any]] = {}
    for req in read_captured(EX / "captured.jsonl.gz"):
        if not isinstance(req, CapturedRequest):
            continue
        for d in ev.evaluate(req):
            rec = {k: v for k, v in d.record.items() if k not in ("signature", "key_id")}
            if d.decision == "allow":
                allow = allow or rec
            else:
                denies.setdefault(tuple(g["gate"] for g in rec["gates"] if g["result"] != "pass"), rec)
        if allow is not None and len(denies) >= 6:
            break
    assert allow is not None and denies
    return allow, list(denies.values())[:6]


def variant(i: int, n: int, allow: dict[str, Any], denies: list[dict[str, Any]]) -> dict[str, Any]:
    """Record ``i`` of ``n``: its scope, outcome and time (deterministic)."""
    tenant, ns = f"tenant-{i % 20:02d}", f"research/entity-{(i // 20) % 10:03d}"
    at = START + timedelta(seconds=30 * 86400 * i / n)
    rec = copy.copy(allow if i % 3 else denies[(i // 3) % len(denies)])
    rec.update(
        decision_id=uuid.uuid4().hex,
        request_id=f"r-{i}",
        tenant=tenant,
        namespace=ns,
        evaluated_at=at.isoformat().replace("+00:00", "Z"),
        donor_tenant=tenant,
        donor_namespace=ns,
        cross_boundary=[],
    )
    if i % 3 and i % 7 == 0:  # an allow across a namespace boundary, under a sharing rule
        rec.update(
            donor_namespace="legal/shared",
            cross_boundary=[{"boundary": "namespace", "rule": "shared by namespace.sharing[0]"}],
        )
    return rec


def build(d: Path, n: int, key: SigningKey, smoke: bool = False) -> None:
    allow, denies = templates(key, smoke)
    t = time.perf_counter()
    with AuditLog.open(d, signing_key=key, origin="semgov/bench", checkpoint_every=100_000) as log:
        for kind, detail in (("policy_loaded", "live default@1"), ("policy_loaded", "shadow default@2")):
            log.append(
                sign_engine_event(engine_event(kind, engine="bench", at=START, detail=detail), key).canonical
            )
        for i in range(n):
            rec, canonical = sign_record_canonical(variant(i, n, allow, denies), key)
            log.append(canonical)
            if rec["decision"] == "allow" and (i * 7919) % 11 < 6:  # about half, spread over every scope
                kind = "realization_failed" if i % 1000 == 2 else "realization"
                tokens = 0 if kind != "realization" else rec["approved_tokens"]
                ev = engine_event(
                    kind,
                    engine="bench",
                    at=datetime.fromisoformat(rec["evaluated_at"]),
                    request_id=rec["request_id"],
                    decision_id=rec["decision_id"],
                    donor_id=rec["donor_id"],
                    materialized_tokens=tokens,
                    slots=range(tokens),
                    detail="RuntimeError: donor evicted" if tokens == 0 else "",
                )
                log.append(sign_engine_event(ev, key).canonical)
        end = START + timedelta(days=30)
        log.append(
            sign_engine_event(
                engine_event("reuse_disabled", engine="bench", at=end, detail="invariant tripped"), key
            ).canonical
        )
    mb = (d / "records.log").stat().st_size / 1e6
    print(f"built {n:,} decisions (+ events) in {time.perf_counter() - t:.1f} s ({mb:,.0f} MB)", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--dir", type=Path, help="log directory to build or reuse (default: a temporary one)")
    ap.add_argument("--out", type=Path, help="the report (default: report.html beside the log)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--smoke", action="store_true", help="200 decisions: every step, in seconds")
    args = ap.parse_args()
    if args.smoke:
        args.records = 200
    tmp = None
    d = args.dir
    if d is None:
        tmp = tempfile.TemporaryDirectory()
        d = Path(tmp.name) / "log"
    print(baseline(d.parent if d.parent.exists() else Path.cwd(), quick=args.smoke), flush=True)
    key = load_signing_key(EX / "keys" / "decision-signing-key.pem")
    if not (d / "records.log").exists():
        build(d, args.records, key, args.smoke)
    out = args.out or d.parent / "report.html"
    cmd = [
        sys.executable,
        "-m",
        "semgov.cli.main",
        "audit",
        "report",
        str(d),
        "--out",
        str(out),
        "--pubkey",
        str(EX / "keys" / "decision-signing-key.pub.pem"),
        "--workers",
        str(args.workers),
    ]
    t = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True, check=False)
    took = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(run.stdout.strip())
    print(run.stderr.strip().splitlines()[-1] if run.stderr.strip() else "(no stderr)")
    print(
        f"audit report: {took:.1f} s wall, exit {run.returncode}, peak RSS {peak:,.0f} MiB, "
        f"page {out.stat().st_size / 1e3:,.0f} kB"
    )
    print(baseline(d.parent, quick=args.smoke), flush=True)
    if tmp is not None:
        tmp.cleanup()
    return 0 if run.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
