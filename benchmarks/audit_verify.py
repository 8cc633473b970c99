"""Verification speed of a large audit log (target: 1,000,000 records in under 60 s).

Usage: python benchmarks/audit_verify.py [--records 1000000] [--dir DIR] [--workers 2] [--batch N] [--smoke]

Builds (or reuses, with --dir) a log of real signed decision records (~1.7 KB each,
Ed25519 over RFC 8785, one fresh decision id each), then times `verify_log`: every frame
re-read and re-hashed, every decision signature and every seal checked (in --workers
processes), the tree recomputed, every seal and checkpoint checked against it, decision ids
checked for repeats, and a consistency proof from an early checkpoint. Also times proof
generation and bundle verification for one record. ``--batch N`` builds the log N records per
batch (the producer waits for each batch to be durable): ``--batch 1`` is the worst case for
seals, one per record, as a lightly loaded server writes them. A machine baseline is printed
before and after. ``--smoke``: 300 records, a quick baseline (every step, in seconds; the figures
mean nothing).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._machine import baseline  # noqa: E402
from semgov.audit.frames import CHECKPOINTS_DIR  # noqa: E402
from semgov.audit.reader import iter_records  # noqa: E402
from semgov.audit.store import AuditLog  # noqa: E402
from semgov.audit.verify import verify_bundle  # noqa: E402
from semgov.audit.verify_dir import make_bundle, verify_log  # noqa: E402
from semgov.signing.canonical import canonicalize_record  # noqa: E402
from semgov.signing.keys import SigningKey, load_signing_key  # noqa: E402
from semgov.signing.records import sign_record  # noqa: E402

ASSETS = ROOT / "tests" / "assets"


def build(d: Path, n: int, batch: int | None, key: SigningKey) -> None:
    template = json.loads((ASSETS / "decisions.jsonl").read_text().splitlines()[0])
    template.pop("signature")
    t = time.perf_counter()
    with AuditLog.open(d, signing_key=key, origin="semgov/bench", checkpoint_every=100_000) as log:
        for i in range(n):
            rec = copy.copy(template)
            rec["decision_id"] = uuid.uuid4().hex
            rec["request_id"] = f"r-{i}"
            ticket = log.append(canonicalize_record(sign_record(rec, key)))
            if batch is not None and (i + 1) % batch == 0:
                ticket.wait()
    mb = (d / "records.log").stat().st_size / 1e6
    print(f"built {n} records in {time.perf_counter() - t:.1f} s ({mb:.0f} MB)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--dir", type=Path, help="log directory to build or reuse (default: a temporary one)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=None, help="records per batch when building (default: free)")
    ap.add_argument("--smoke", action="store_true", help="300 records: every step, in seconds")
    args = ap.parse_args()
    if args.smoke:
        args.records = 300
    tmp = None
    d = args.dir
    if d is None:
        tmp = tempfile.TemporaryDirectory()
        d = Path(tmp.name) / "log"
    print(baseline(d.parent if d.parent.exists() else Path.cwd(), quick=args.smoke), flush=True)
    # NOTE: one key for building and verifying, read once (the asset may be regenerated meanwhile).
    key = load_signing_key(ASSETS / "decision-signing-key.pem")
    if not (d / "records.log").exists():
        build(d, args.records, args.batch, key)
    pub = key.public_key
    kept = sorted((d / CHECKPOINTS_DIR).iterdir(), key=lambda p: int(p.stem))[0].read_bytes()
    t = time.perf_counter()
    rep = verify_log(d, public_key=pub, kept_checkpoint=kept, workers=args.workers)
    took = time.perf_counter() - t
    print(f"verify_log: {rep.records} records, {rep.signatures_checked} signatures, "
          f"{rep.seals_checked} seals, {rep.checkpoints_checked} checkpoints, {args.workers} workers: "
          f"{took:.1f} s "
          f"({rep.records / took:,.0f} records/s) -> {'OK' if rep.ok else rep.first()}")  # fmt: skip
    first = json.loads(next(iter_records(d))[1])["decision_id"]
    t = time.perf_counter()
    bundle = make_bundle(d, first)
    t_make = time.perf_counter() - t
    t = time.perf_counter()
    verify_bundle(bundle, pub)
    t_check = time.perf_counter() - t
    size = len(json.dumps(bundle))
    hashes = len(bundle["inclusion_proof"])
    print(f"proof bundle for record 0 of {bundle['tree_size']}: made in {t_make:.2f} s (reads the log), "
          f"verified in {t_check * 1e3:.2f} ms; {hashes} hashes, {size} bytes")  # fmt: skip
    print(baseline(d.parent, quick=args.smoke))
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
