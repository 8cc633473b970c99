"""``semgov audit verify|show|stats|report`` over many workers' logs: one fleet view.

A fleet is several log directories, or one directory whose subdirectories are worker logs
(:mod:`semgov.audit.fleet_dir`). Each worker's log is verified (or read) as one log is; the
fleet view adds each worker's verdict with its origin and checkpoints, totals, and the checks
across logs (:mod:`semgov.audit.fleet`). One log directory is read exactly as before.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from semgov.errors import InputError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from semgov.audit.fleet import FleetReport, Worker


def fleet_of(args: argparse.Namespace, default: Path) -> list[tuple[str, Path]] | None:
    """The fleet the positional directories name, or None for one log (then ``args.directory`` is
    set to that one path, as the one-log commands read it)."""
    from semgov.audit.fleet_dir import find_logs

    paths = list(args.directory or [default])
    logs = find_logs(paths)
    if logs is None:
        args.directory = paths[0]
    return logs


def witness_keys(args: argparse.Namespace) -> list[tuple[str, Ed25519PublicKey]]:
    """The ``--witness-key`` verifier keys (a vkey, or a file holding one)."""
    from semgov.audit.cosign import parse_cosigner_vkey
    from semgov.audit.note import NoteError

    out = []
    for value in getattr(args, "witness_key", None) or []:
        text = value
        if Path(value).is_file():
            text = Path(value).read_text(encoding="utf-8").strip()
        try:
            out.append(parse_cosigner_vkey(text))
        except NoteError as e:
            raise InputError(f"--witness-key: {e}") from None
    return out


def log_origin(directory: Path) -> str | None:
    """The origin a log names (its latest checkpoint's, unverified; else its ``origin`` file)."""
    from semgov.audit.note import NoteError, unverified_checkpoint
    from semgov.audit.origin import read_origin_file
    from semgov.audit.reader import read_checkpoint

    note = read_checkpoint(directory)
    try:
        return unverified_checkpoint(note)[0].origin if note is not None else read_origin_file(directory)
    except NoteError:
        return read_origin_file(directory)


def fleet_report(args: argparse.Namespace, logs: list[tuple[str, Path]]) -> FleetReport:
    """Verify the fleet as the key options say."""
    from semgov.audit.fleet_dir import verify_fleet
    from semgov.audit.keyring import AuditKeyring
    from semgov.signing.keys import load_public_key

    if args.checkpoint is not None:
        raise InputError("--checkpoint names one log's checkpoint: verify that log on its own")
    return verify_fleet(
        logs,
        public_key=load_public_key(args.pubkey) if args.pubkey else None,
        keyring=AuditKeyring.load(args.keyring) if args.keyring else None,
        witnesses=witness_keys(args),
        workers=args.workers,
        allow_unanchored=args.allow_unanchored,
    )


def _sizes(sizes: list[int]) -> str:
    if not sizes:
        return "none"
    if len(sizes) <= 8:
        return ", ".join(map(str, sizes))
    return f"{len(sizes)} ({sizes[0]}, {sizes[1]}, ... {sizes[-1]})"


def worker_line(w: Worker) -> str:
    """One worker's verdict: name, origin, records, checkpoints, witnessed sizes, first problem."""
    rep = w.report
    first = rep.first()
    verdict = "OK" if first is None else f"FAILED: {first}"
    if first is None and rep.structure_only:
        verdict = "OK (structure only)"
    latest = (
        f"latest checkpoint size {rep.checkpoint.size}" if rep.checkpoint is not None else "no checkpoint"
    )
    text = (f"worker {w.name}: {w.path} origin {w.origin}: {rep.records} records, {rep.seals} seals, "
            f"anchored {rep.anchored}, {latest}; checkpoints: {_sizes(sorted(w.checkpoints))}")  # fmt: skip
    if rep.witnessed:
        text += f"; witnessed: {_sizes(sorted(set(rep.witnessed)))}"
    return f"{text} -> {verdict}"


def run_fleet_verify(args: argparse.Namespace, logs: list[tuple[str, Path]]) -> int:
    """``audit verify`` of a fleet: per-worker verdicts, totals, the checks across logs."""
    fr = fleet_report(args, logs)
    print(f"fleet: {len(fr.workers)} audit logs")
    for w in fr.workers:
        print(worker_line(w))
        others = [p for p in w.report.problems if p is not w.report.first()]
        for also in others[:5]:
            print(f"  also: {also}")
    print(f"totals: {fr.total('records')} records, {fr.total('seals')} seals, "
          f"{fr.total('signatures_checked')} record signatures, "
          f"{fr.total('checkpoints_checked')} checkpoints checked, "
          f"{fr.total('anchored')} records anchored")  # fmt: skip
    if not fr.problems:
        print("across logs: origins distinct; no two trees of one origin and size differ; no decision or "
              "event id in two logs")  # fmt: skip
    for across in fr.problems:
        print(f"across logs: {across}")
    first = fr.first()
    if first is not None:
        print(f"FAILED: {first}")
        return 1
    if fr.structure_only and not args.structure_only:
        print(f"UNVERIFIED: no --pubkey or --keyring given: no signature of the {len(fr.workers)} logs was "
              "checked (the structure is sound; pass --structure-only to accept that)")  # fmt: skip
        return 3
    print("OK (structure only)" if fr.structure_only else f"OK: every one of the {len(fr.workers)} logs "
          "verifies, and the checks across them pass")  # fmt: skip
    return 0


def fleet_records(logs: list[tuple[str, Path]]) -> Iterator[tuple[str, int, dict[str, Any]]]:
    """``(worker, index, record)`` of every worker's records, worker by worker (unverified)."""
    from semgov.audit.reader import decoded_records

    for name, d in logs:
        for i, rec in decoded_records(d):
            yield name, i, rec


def run_fleet_show(args: argparse.Namespace, logs: list[tuple[str, Path]], flt: Any) -> int:
    """``audit show`` of a fleet: the same formats, each row led by its worker."""
    import csv
    import itertools

    from semgov.audit.export import CSV_COLUMNS, csv_row
    from semgov.cli.audit_tables import write_table

    origins = {name: log_origin(d) for name, d in logs}
    rows: Iterator[tuple[str, int, dict[str, Any]]]
    rows = ((w, i, r) for w, i, r in fleet_records(logs) if flt.matches(r))
    if args.limit is not None:
        rows = itertools.islice(rows, max(args.limit, 0))
    out = sys.stdout
    if args.format == "table":
        for name, group in itertools.groupby(rows, key=lambda t: t[0]):
            out.write(f"worker {name} (origin {origins[name]}):\n")
            write_table(out, ((i, r) for _, i, r in group))
    elif args.format == "csv":
        w = csv.writer(out, lineterminator="\n")
        w.writerow(("worker", "origin", *CSV_COLUMNS))
        w.writerows((name, origins[name], *csv_row(i, rec)) for name, i, rec in rows)
    else:
        sep = "[" if args.format == "json" else ""
        for name, i, rec in rows:
            line = json.dumps(
                {"worker": name, "origin": origins[name], "index": i, **rec}, separators=(",", ":")
            )
            out.write(sep + line + ("" if args.format == "json" else "\n"))
            sep = ",\n" if args.format == "json" else ""
        if args.format == "json":
            out.write("[]\n" if sep == "[" else "]\n")
    return 0


def run_fleet_stats(args: argparse.Namespace, logs: list[tuple[str, Path]], flt: Any) -> int:
    """``audit stats`` of a fleet: each worker's counts, the checks of reuse across workers, then
    the fleet's counts over every record, as one log's ``stats`` gives them. Exit 1 when a check
    across workers fails."""
    from semgov.audit.fleet import CrossCheck
    from semgov.audit.query import Stats
    from semgov.cli.audit_json import stats_doc
    from semgov.cli.audit_tables import stats_head, stats_output

    per: dict[str, Stats] = {name: Stats() for name, _ in logs}
    period = args.by if args.by in ("hour", "day", "month") else "day"
    cross = CrossCheck()

    def records() -> Iterator[dict[str, Any]]:
        for name, i, rec in fleet_records(logs):
            cross.add(name, i, rec)
            if flt.matches(rec):
                per[name].add(rec, period)
                yield rec

    fleet = stats_output(args, records())
    problems = cross.finish()
    origins = {name: log_origin(d) for name, d in logs}
    if isinstance(fleet, dict):
        doc = {"workers": [{"worker": n, "path": str(d), "origin": origins[n], **stats_doc(per[n]),
                            "cross_boundary_allows": cross.cross_allows.get(n, 0)} for n, d in logs],
               "fleet": fleet, "cross_worker_problems": problems}  # fmt: skip
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        return 1 if problems else 0
    for n, d in logs:
        sys.stdout.write(f"worker {n} ({d}, origin {origins[n]}):\n")
        sys.stdout.write("".join(f"  {line}\n" for line in stats_head(per[n]).splitlines()))
        sys.stdout.write(f"  {cross.cross_allows.get(n, 0)} allows across a tenant or namespace boundary\n")
    total = sum(cross.cross_allows.values())
    sys.stdout.write(f"across workers: {total} allows across a tenant or namespace boundary; ")
    sys.stdout.write(
        f"{len(problems)} problems\n" if problems else "no realization of another worker's allow\n"
    )
    for p in problems:
        sys.stdout.write(f"ACROSS WORKERS: {p}\n")
    sys.stdout.write(f"\nfleet ({len(logs)} workers):\n" + fleet)
    return 1 if problems else 0


def fleet_verdict(args: argparse.Namespace, logs: list[tuple[str, Path]]) -> tuple[Any, int]:
    """``audit report`` of a fleet: the verdict the page opens with (each worker's line, the checks
    across logs), and the exit status it means."""
    from semgov.audit.report_html import Verdict

    fr = fleet_report(args, logs)
    details = [worker_line(w) for w in fr.workers]
    details.append(f"totals: {fr.total('records'):,} records, {fr.total('seals'):,} seals, "
                   f"{fr.total('anchored'):,} anchored")  # fmt: skip
    details += [f"across logs: {p}" for p in fr.problems]
    first = fr.first()
    if first is not None:
        return Verdict("failed", f"DOES NOT VERIFY: {first}", tuple(details)), 1
    if fr.structure_only:
        status = 0 if args.structure_only else 3
        return Verdict("unverified", f"STRUCTURE ONLY: no signature of the {len(logs)} logs was checked",
                       tuple(details)), status  # fmt: skip
    return Verdict("verified", f"VERIFIED: every one of the {len(logs)} logs verifies, and the checks "
                   "across them pass", tuple(details)), 0  # fmt: skip


def fleet_summary(args: argparse.Namespace, logs: list[tuple[str, Path]]) -> tuple[Any, str | None]:
    """One streaming pass over every worker's records for the page (record indexes are each
    worker's own); the summary, and what stopped it or failed across workers, if anything."""
    from semgov.audit.fleet import CrossCheck
    from semgov.audit.query import Filter, parse_when
    from semgov.audit.summary import Summary
    from semgov.errors import SemgovError

    flt = Filter(since=parse_when(args.since, "--since"), until=parse_when(args.until, "--until"))
    s = Summary(tenant=args.tenant)
    cross = CrossCheck()
    try:
        for name, i, rec in fleet_records(logs):
            cross.add(name, i, rec)
            if flt.matches(rec):
                s.add(i, rec)
    except SemgovError as e:
        return s, f"records after {s.records} were not read: {e}"
    problems = cross.finish()
    return s, ("; ".join(f"ACROSS WORKERS: {p}" for p in problems[:20]) or None)
