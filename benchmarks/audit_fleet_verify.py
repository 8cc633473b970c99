"""Fleet audit verify time: W worker logs of N records each, verified as one fleet view.

Usage: python benchmarks/audit_fleet_verify.py [--workers-logs 2] [--records 100000] [--dir DIR]
       [--workers 2] [--smoke]

Builds (or reuses, with --dir) a fleet directory of worker logs ``w0``, ``w1``, ... (each its own
origin; real signed decision records, ~1.7 KB each, one fresh decision id each, as
benchmarks/audit_verify.py builds one), then times ``verify_fleet``: every log verified as
``semgov audit verify`` does (frames, leaf hashes, every record and seal signature in --workers
processes, the tree, every seal and checkpoint) and the checks across logs (origins, forks at any
signed size, decision and event ids in two logs), and the CLI end to end (``semgov audit verify
DIR``). A machine baseline is printed before and after. ``--smoke``: 300 records per worker.
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._machine import baseline  # noqa: E402
from semgov.audit.fleet_dir import find_logs, verify_fleet  # noqa: E402
from semgov.audit.store import AuditLog  # noqa: E402
from semgov.signing.canonical import canonicalize_record  # noqa: E402
from semgov.signing.keys import SigningKey, load_signing_key  # noqa: E402
from semgov.signing.records import sign_record  # noqa: E402

ASSETS = ROOT / "tests" / "assets"


def build(d: Path, n: int, origin: str, key: SigningKey) -> None:
    """One worker's log of ``n`` real signed decision records under ``origin``."""
    template = json.loads((ASSETS / "decisions.jsonl").read_text().splitlines()[0])
    template.pop("signature")
    t = time.perf_counter()
    with AuditLog.open(d, signing_key=key, origin=origin, checkpoint_every=10_000) as log:
        for i in range(n):
            rec = copy.copy(template)
            rec["decision_id"] = uuid.uuid4().hex
            rec["request_id"] = f"{origin}-r-{i}"
            log.append(canonicalize_record(sign_record(rec, key)))
    mb = (d / "records.log").stat().st_size / 1e6
    print(f"built {d.name}: {n} records in {time.perf_counter() - t:.1f} s ({mb:.0f} MB)", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers-logs", type=int, default=2, help="worker logs in the fleet (default 2)")
    ap.add_argument("--records", type=int, default=100_000, help="records per worker log")
    ap.add_argument("--dir", type=Path, help="fleet directory to build or reuse (default: a temporary one)")
    ap.add_argument("--workers", type=int, default=2, help="processes for signature checks")
    ap.add_argument("--smoke", action="store_true", help="300 records per worker: every step, in seconds")
    args = ap.parse_args()
    if args.smoke:
        args.records = 300
    tmp = tempfile.TemporaryDirectory() if args.dir is None else None
    d = args.dir if tmp is None else Path(tmp.name) / "fleet"
    d.mkdir(parents=True, exist_ok=True)
    print(baseline(d, quick=args.smoke), flush=True)
    key = load_signing_key(ASSETS / "decision-signing-key.pem")
    for w in range(args.workers_logs):
        if not (d / f"w{w}" / "records.log").exists():
            build(d / f"w{w}", args.records, f"bench.example/semgov/w{w}", key)
    logs = find_logs([d]) or []
    t = time.perf_counter()
    fr = verify_fleet(logs, public_key=key.public_key, workers=args.workers)
    took = time.perf_counter() - t
    n = fr.total("records")
    verdict = "OK" if fr.ok else fr.first()
    print(f"verify_fleet: {len(logs)} logs, {n} records, {fr.total('signatures_checked')} signatures, "
          f"{fr.total('seals_checked')} seals, {fr.total('checkpoints_checked')} checkpoints, "
          f"{args.workers} workers: {took:.1f} s ({n / took:,.0f} records/s) -> {verdict}")  # fmt: skip
    pub = ASSETS / "decision-signing-key.pub.pem"
    cmd = [sys.executable, "-m", "semgov.cli.main", "audit", "verify", str(d), "--pubkey", str(pub)]
    t = time.perf_counter()
    proc = subprocess.run([*cmd, "--workers", str(args.workers)], capture_output=True, text=True, cwd=ROOT)
    took = time.perf_counter() - t
    print(f"semgov audit verify DIR (fleet of {len(logs)}): {took:.1f} s wall, exit {proc.returncode}")
    print(baseline(d, quick=args.smoke))
    if tmp is not None:
        tmp.cleanup()
    return 0 if fr.ok and proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
