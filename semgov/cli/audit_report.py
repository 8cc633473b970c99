"""``semgov audit report``: verify a log and write what a compliance reviewer reads, as one HTML page."""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from semgov.errors import InputError, SemgovError

REPORT_EPILOG = (
    "exit status: 0 the log verifies (or --structure-only and its structure is sound); 1 it does not "
    "verify (the report is written all the same, opening with the first bad record); 2 bad input; "
    "3 UNVERIFIED (no --pubkey or --keyring: the report is written, marked unverified)."
)


FLEET_DIRS = (
    "the log directory (default audit/log); or several, or one directory whose subdirectories are worker "
    "logs (it holds no records.log, they do): one fleet view of every log (audit/README.md, 'Many logs')"
)


def add_key_options(p: argparse.ArgumentParser) -> None:
    """The options that say how a log is verified (``audit verify`` and ``audit report``)."""
    keys = p.add_mutually_exclusive_group()
    keys.add_argument("--pubkey", type=Path, metavar="KEY", help="the log's one signing key's public PEM")
    keys.add_argument(
        "--keyring",
        type=Path,
        metavar="FILE",
        help="audit keyring (docs/formats.md): every key that signed records, seals or checkpoints, with "
        "where each is valid and whether it is revoked (after a key rotation)",
    )
    keys.add_argument(
        "--structure-only",
        action="store_true",
        help="no key: check frames, hashes, the tree, seals and checkpoints against it, and ids, but no "
        "signature; exit 0 if that structure is sound (without this flag, no key means UNVERIFIED, exit 3)",
    )
    p.add_argument("--checkpoint", type=Path, metavar="FILE", help="a checkpoint note you kept earlier")
    p.add_argument(
        "--allow-unanchored",
        action="store_true",
        help="report records after the last trusted seal or checkpoint as a note, not a failure "
        "(a log whose writer is running or crashed mid-write)",
    )
    p.add_argument("--workers", type=int, metavar="N", help="processes for signature checks (default 2)")
    p.add_argument(
        "--witness-key",
        action="append",
        metavar="VKEY",
        help="a witness's verifier key (name+id+key, cosignature/v1; or a file holding it; repeatable): "
        "the log must have a checkpoint it cosigned (cosignatures/), each cosignature must verify, and "
        "the log must still hold each tree it cosigned",
    )


def register_report(a: Any, default_dir: Path) -> None:
    r = a.add_parser(
        "report",
        help="write an HTML report a reviewer reads (verdict, boundaries, policies, engine events)",
        description="Verify the log (as `semgov audit verify`) and write one self-contained HTML page (no "
        "network, no external script or font) that opens with the verdict and the first bad record if "
        "any, then: decisions over time by outcome; deny reasons by gate; per tenant and namespace the "
        "candidates, allows, approved tokens and prefill tokens saved (realized); every allowed reuse of "
        "a donor from another tenant or namespace with the rule that allowed it; the policy revisions in "
        "force over time; engine events (realizations, failures by reason, violations, reuse turned "
        "off); and a search box over the request and decision ids listed. Aggregates are computed in "
        "one streaming pass: the page's size does not grow with the log.",
        epilog=REPORT_EPILOG,
    )
    r.add_argument("directory", type=Path, nargs="*", metavar="DIR", help=FLEET_DIRS)
    r.add_argument("--out", type=Path, required=True, metavar="FILE", help="the HTML file to write")
    r.add_argument("--tenant", help="only this tenant's decisions (and the realizations of its allows)")
    r.add_argument("--since", metavar="RFC3339", help="records at or after")
    r.add_argument("--until", metavar="RFC3339", help="records before")
    add_key_options(r)
    r.set_defaults(func=run_report)


def verify_from_args(args: argparse.Namespace) -> tuple[Any, bytes | None]:
    """``verify_log`` as the key options say (``audit verify`` and ``audit report``); the report
    and the kept checkpoint's bytes (None without ``--checkpoint``)."""
    from semgov.audit.keyring import AuditKeyring
    from semgov.audit.verify_dir import verify_log
    from semgov.signing.keys import load_public_key

    key = load_public_key(args.pubkey) if args.pubkey else None
    keyring = AuditKeyring.load(args.keyring) if args.keyring else None
    kept = None
    if args.checkpoint is not None:
        try:
            kept = args.checkpoint.read_bytes()
        except OSError as e:
            raise InputError(f"cannot read checkpoint: {e.strerror}", source=str(args.checkpoint)) from e
    from semgov.audit.verify import Problem
    from semgov.audit.witness_dir import witnessed_notes
    from semgov.cli.audit_fleet import witness_keys

    witnesses = witness_keys(args)
    witnessed, missing = witnessed_notes(args.directory, witnesses) if witnesses else ([], [])
    rep = verify_log(
        args.directory,
        public_key=key,
        keyring=keyring,
        kept_checkpoint=kept,
        workers=args.workers,
        allow_unanchored=args.allow_unanchored,
        witnessed=witnessed,
    )
    rep.problems += [Problem(None, m) for m in missing]
    return rep, kept


def _verdict(args: argparse.Namespace) -> Any:
    """Verify the log; the verdict the page opens with, and the exit status it means."""
    from semgov.audit.report_html import Verdict

    rep, kept = verify_from_args(args)
    details = [
        f"{rep.records:,} records, {rep.seals:,} seals; signatures checked: {rep.signatures_checked:,} "
        f"records, {rep.seals_checked:,} seals, {rep.checkpoints_checked} checkpoints",
        f"anchored: {rep.anchored:,} of {rep.records:,} records by a seal or checkpoint",
    ]
    if rep.checkpoint is not None:
        details.append(f"latest checkpoint: {rep.checkpoint.origin} size {rep.checkpoint.size}")
    if kept is not None:
        details.append(
            f"consistent with the kept checkpoint {args.checkpoint}"
            if rep.ok
            else f"kept checkpoint {args.checkpoint} given (see the problems)"
        )
    for kid, use in sorted(rep.keys.items()):
        spans = ", ".join(f"{a}..{b - 1}" for a, b in use.records) or "none"
        details.append(f"key {kid}: records {spans}; {use.seals} seals; checkpoints {len(use.checkpoints)}")
    details += [f"revoked key {kid}: nothing it signed is trusted" for kid in sorted(rep.revoked)]
    details += [f"RECOVERY at record {i}: {what}" for i, what in rep.recoveries]
    details += [f"note: {n}" for n in rep.notes]
    first = rep.first()
    if first is not None:
        details += [f"also: {p}" for p in rep.problems if p is not first][:20]
        return Verdict("failed", f"DOES NOT VERIFY: {first}", tuple(details)), 1
    if rep.structure_only and not args.structure_only:
        return Verdict(
            "unverified",
            "UNVERIFIED: no --pubkey or --keyring given: no signature was checked (the structure is sound)",
            tuple(details),
        ), 3
    if rep.structure_only:
        return Verdict(
            "unverified",
            "STRUCTURE ONLY: frames, hashes, the tree, seals and checkpoints agree; no signature was checked",
            tuple(details),
        ), 0
    recovered = f"; {len(rep.recoveries)} RECOVERY record(s): see below" if rep.recoveries else ""
    return Verdict(
        "verified",
        f"VERIFIED: every record, seal and checkpoint of {args.directory} verifies{recovered}",
        tuple(details),
    ), 0


def _summarize(args: argparse.Namespace) -> tuple[Any, str | None]:
    """One streaming pass over the log's records; the summary, and why it stopped early (if it did)."""
    from semgov.audit.query import Filter, parse_when
    from semgov.audit.reader import decoded_records
    from semgov.audit.summary import Summary

    flt = Filter(since=parse_when(args.since, "--since"), until=parse_when(args.until, "--until"))
    s = Summary(tenant=args.tenant)
    try:
        for i, rec in decoded_records(args.directory):
            if flt.matches(rec):
                s.add(i, rec)
    except SemgovError as e:
        return s, f"records after {s.records} were not read: {e}"
    return s, None


def run_report(args: argparse.Namespace) -> int:
    from semgov.audit.report_html import Verdict, render
    from semgov.cli.audit_fleet import fleet_of, fleet_summary, fleet_verdict

    t0 = time.perf_counter()
    logs = fleet_of(args, Path("audit/log"))
    verdict, status = _verdict(args) if logs is None else fleet_verdict(args, logs)
    status = int(status)
    t1 = time.perf_counter()
    summary, stopped = _summarize(args) if logs is None else fleet_summary(args, logs)
    if stopped is not None:
        verdict = Verdict(verdict.status, verdict.headline, (*verdict.details, stopped))
    scope = f"log {args.directory}" if logs is None else f"fleet of {len(logs)} logs"
    scope += f", tenant {args.tenant}" if args.tenant else ""
    scope += "".join(f", {w} {v}" for w, v in (("since", args.since), ("until", args.until)) if v)
    html = render(
        summary, verdict, title_scope=scope, generated_at=datetime.now(UTC).isoformat(timespec="seconds")
    )
    out: Path = args.out
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(html, encoding="utf-8")
        os.replace(tmp, out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise InputError(f"cannot write the report: {e.strerror}", source=str(out)) from e
    t2 = time.perf_counter()
    print(verdict.headline)
    print(
        f"report: {out} ({len(html.encode()):,} bytes; {summary.records:,} records summarized; "
        f"verify {t1 - t0:.1f} s, summarize {t2 - t1:.1f} s)",
        file=sys.stderr,
    )
    return status
