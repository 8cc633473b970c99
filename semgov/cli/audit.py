"""``semgov audit``: verify, show, stats, prove and verify-proof over an audit log."""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from semgov import log
from semgov.audit.export import CSV_COLUMNS, csv_row
from semgov.audit.grouping import GROUPINGS
from semgov.audit.query import Filter, parse_when, select
from semgov.audit.reader import decoded_records
from semgov.audit.recovery_record import RECOVERY_KIND, RECOVERY_SCHEMA
from semgov.cli.audit_fleet import fleet_of
from semgov.cli.audit_report import FLEET_DIRS, add_key_options, register_report, verify_from_args
from semgov.cli.audit_ship import register_ship
from semgov.cli.audit_tables import PERIODS, stats_output, write_table
from semgov.cli.audit_witness import register_witness
from semgov.errors import InputError
from semgov.wire.names import ENGINE_EVENT_KINDS, ENGINE_EVENT_SCHEMAS, GATE_NAMES, SHADOW_DECISION_SCHEMA

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from semgov.audit.keyring import AuditKeyring
    from semgov.audit.verify import Report

# NOTE: start-up: `show` and `stats` read records as plain JSON; what verifies signatures (the
# keyring, cryptography, the verifier and its process pool) is imported by the commands that do.

DEFAULT_DIR = Path("audit/log")
SHOW_FORMATS = (
    "--format csv: a header row, then one row per record with the columns "
    + ", ".join(CSV_COLUMNS)
    + ". kind is decision, shadow or event; at is a decision's evaluated_at, an event's at; policy is "
    "name@version; failed_gates and cross_boundary (boundary:rule) are ;-joined; a field the record "
    "lacks is empty (donor_tenant, donor_namespace and cross_boundary exist from semgov.decision/v3 on); "
    "a shadow decision's detail is its live decision (live allow|deny|none [ID] [DISAGREE]). Tenant, "
    "namespace and ids are client-controlled: a cell that starts with =, +, -, @, a tab or a carriage "
    "return gets a leading ' so that a spreadsheet shows it as text instead of running it as a formula "
    "(json and jsonl keep every value exactly as logged). --format json: one JSON array of the objects jsonl "
    "writes one per line (the record with its index first)."
)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "audit",
        help="verify and review an audit log",
        description="The audit log is append-only and tamper-evident: an RFC 6962 Merkle tree over "
        "the signed decision records and engine events, with C2SP signed checkpoints. See audit/README.md.",
    )
    a = p.add_subparsers(dest="audit_command", metavar="ACTION", required=True)

    _register_verify(a)
    _register_show(a)
    _register_stats(a)
    register_report(a, DEFAULT_DIR)
    register_ship(a, DEFAULT_DIR)
    register_witness(a)

    pr = a.add_parser(
        "prove",
        help="write an offline proof bundle for one (live) decision",
        description="Write the record, its inclusion proof and the latest signed checkpoint as one JSON "
        "bundle that `semgov audit verify-proof` checks without the log.",
    )
    pr.add_argument("directory", type=Path, nargs="?", default=DEFAULT_DIR, metavar="DIR")
    pr.add_argument("--decision-id", required=True, metavar="ID")
    pr.add_argument("--out", type=Path, metavar="FILE", help="write here instead of stdout")
    pr.set_defaults(func=run_prove)

    vp = a.add_parser(
        "verify-proof",
        help="check an offline proof bundle",
        description="Check a bundle from `semgov audit prove`: checkpoint signature, inclusion proof, "
        "and the decision record's own signature, and that it is from the log you expect (--origin). "
        "Exit 1 if anything fails.",
    )
    vp.add_argument("bundle", type=Path, metavar="FILE")
    vp.add_argument(
        "--origin",
        metavar="ORIGIN",
        help="the log the record must be in: its checkpoints' origin line (`semgov audit verify` and "
        "`prove` print it; the log directory's `origin` file holds it). A bundle from any other log is "
        "refused. Without it, the bundle's origin is printed for you to compare (ORIGIN NOT CHECKED)",
    )
    vkeys = vp.add_mutually_exclusive_group(required=True)
    vkeys.add_argument("--pubkey", type=Path, metavar="KEY", help="the one key of the record and checkpoint")
    vkeys.add_argument("--keyring", type=Path, metavar="FILE", help="audit keyring (after a key rotation)")
    vp.set_defaults(func=run_verify_proof)


def _register_show(a: Any) -> None:
    s = a.add_parser(
        "show",
        help="list decisions, shadow decisions and engine events",
        description="List the decision records, shadow decision records and engine events that match "
        "every filter (decision filters skip engine events and apply to shadow decisions; --kind skips "
        "decisions). The table shows each decision's tenant, namespace, policy (name@version) and the "
        "gates that did not pass. A shadow decision (semgov.shadow_decision/v1) was never acted on: the "
        "table marks it `shadow` in the decision column, its outcome, the live decision's and whether "
        "they disagree in the last. Records are read unverified: run `semgov audit verify` first.",
        epilog=SHOW_FORMATS,
    )
    s.add_argument(
        "directory",
        type=Path,
        nargs="*",
        metavar="DIR",
        help=FLEET_DIRS,
    )
    _filters(s)
    s.add_argument(
        "--format",
        choices=("table", "csv", "json", "jsonl"),
        default="table",
        help="table (default), csv (fixed columns, below), json (one array) or jsonl (one object a line)",
    )
    s.add_argument("--limit", type=int, metavar="N", help="stop after N matches")
    s.set_defaults(func=run_show)


def _register_stats(a: Any) -> None:
    st = a.add_parser(
        "stats",
        help="counts over a log",
        description="Counts by record schema, decision, gate failures and errors, approved tokens by tenant "
        "and namespace, engine events by kind, and records over time, for the records that match the "
        "filters. Shadow decisions are counted apart from live ones (never as decisions): by outcome, "
        "and their disagreements with the live decision by direction (live->shadow). With --by tenant, "
        "namespace, policy or gate, the same first lines, then one table of live decisions grouped that "
        "way, with its totals, instead of the gate, token and time tables.",
    )
    st.add_argument(
        "directory",
        type=Path,
        nargs="*",
        metavar="DIR",
        help=FLEET_DIRS,
    )
    _filters(st)
    st.add_argument(
        "--by",
        choices=(*PERIODS, *GROUPINGS),
        default="day",
        help="hour, day (default) or month: the time bucket of the records-over-time table; tenant: "
        "candidates (live decisions), allows, denies and approved tokens per tenant; namespace: the same "
        "per namespace under each tenant, with a subtotal per tenant; policy: allows, denies and the first "
        "and last evaluated_at per policy (name@version (engine)) and revision; gate: per gate, fails, "
        "errors and the denies where it was the only gate that did not pass. Each ends with a total row",
    )
    st.add_argument(
        "--format",
        choices=("table", "json"),
        default="table",
        help="table (default): the tables above; json: one JSON object with the same counts "
        "(audit/README.md)",
    )
    st.set_defaults(func=run_stats)


def _register_verify(a: Any) -> None:
    v = a.add_parser(
        "verify",
        help="re-hash and check everything in a log",
        description="Re-read every record (frame hashes and leaf indices), check every record's "
        "signature (decisions and engine events), every seal (the writer's signed tree head after each "
        "batch) and the latest checkpoint (and every older one the log kept), find decision and event ids "
        "that repeat, and, given a checkpoint you kept earlier, prove the log still extends it. Records no "
        "seal or checkpoint by a trusted key anchors are a problem. With --keyring, each key is trusted "
        "only where its entry says (not_before_size, not_after_size, signs, revoked), and every revoked "
        "key's records and checkpoints are named. Reports the first bad record by index with the reason.",
        epilog="exit status: 0 OK; 1 FAILED (a problem was found); 2 bad input; 3 UNVERIFIED (no --pubkey "
        "or --keyring, and no --structure-only: nothing was checked that a key could vouch for).",
    )
    v.add_argument(
        "directory",
        type=Path,
        nargs="*",
        metavar="DIR",
        help=FLEET_DIRS,
    )
    add_key_options(v)
    v.set_defaults(func=run_verify)


def _filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tenant")
    p.add_argument("--namespace")
    p.add_argument("--request", metavar="REQUEST_ID")
    p.add_argument("--donor", metavar="DONOR_ID")
    p.add_argument("--decision", choices=("allow", "deny"))
    p.add_argument("--gate", choices=GATE_NAMES, help="decisions where this gate did not pass")
    p.add_argument(
        "--decision-id",
        metavar="ID",
        help="the decision, and the engine events and shadow decisions that name it",
    )
    p.add_argument(
        "--kind",
        choices=(*ENGINE_EVENT_KINDS, RECOVERY_KIND),
        help="engine events of this kind (audit_recovery: what a recovery of the log cut off)",
    )
    p.add_argument("--since", metavar="RFC3339", help="evaluated at or after")
    p.add_argument("--until", metavar="RFC3339", help="evaluated before")
    p.add_argument(
        "--shadow",
        choices=("include", "exclude", "only"),
        default="include",
        help="shadow decision records (never acted on): with the rest (default), left out, or only them",
    )


def _filter(args: argparse.Namespace) -> Filter:
    return Filter(
        tenant=args.tenant,
        namespace=args.namespace,
        request_id=args.request,
        donor_id=args.donor,
        decision=args.decision,
        gate=args.gate,
        since=parse_when(args.since, "--since"),
        until=parse_when(args.until, "--until"),
        kind=args.kind,
        decision_id=args.decision_id,
        shadow=args.shadow,
    )


def _spans(spans: list[tuple[int, int]]) -> str:
    return ", ".join(f"{a}" if b - a == 1 else f"{a}..{b - 1}" for a, b in spans) or "none"


def _sizes(sizes: list[int]) -> str:
    return ", ".join(map(str, sorted(sizes))) if sizes else "none"


def _print_keys(rep: Report) -> None:
    for kid, use in sorted(rep.keys.items(), key=lambda kv: (kv[1].records or [(1 << 64, 0)])[0]):
        seals = "no seals" if use.seal_sizes is None else f"{use.seals} seals (sizes {use.seal_sizes[0]}.."
        seals += f"{use.seal_sizes[1]})" if use.seal_sizes is not None else ""
        print(f"key {kid}: records {_spans(use.records)}; {seals}; checkpoints {_sizes(use.checkpoints)}")
    for kid, hit in sorted(rep.revoked.items()):
        n = sum(b - a for a, b in hit.records)
        seals = f"{hit.seals} (sizes {hit.seal_sizes[0]}..{hit.seal_sizes[1]})" if hit.seal_sizes else "none"
        only = "none" if hit.anchored_only is None else _spans([hit.anchored_only])
        print(f"revoked key {kid}: records {_spans(hit.records)} ({n} records) are signed by it; "
              f"checkpoints signed only by it: size {_sizes(hit.checkpoints)}; "
              f"seals signed only by it: {seals}; records anchored only by it: {only}")  # fmt: skip


def run_verify(args: argparse.Namespace) -> int:
    logs = fleet_of(args, DEFAULT_DIR)
    if logs is not None:
        from semgov.cli.audit_fleet import run_fleet_verify

        return run_fleet_verify(args, logs)
    rep, _ = verify_from_args(args)
    cp = rep.checkpoint
    print(f"audit log {args.directory}: {rep.records} records, {rep.seals} seals, root {rep.root.hex()}")
    print(f"signatures checked: {rep.signatures_checked} records, {rep.seals_checked} seals")
    if cp is not None:
        print(
            f"latest checkpoint: {cp.origin} size {cp.size} ({rep.checkpoints_checked} checkpoints checked)"
        )
        print(f"origin: {cp.origin} (check this log's proofs with `semgov audit verify-proof --origin "
              f"{cp.origin}`)")  # fmt: skip
    by = "" if rep.structure_only else " signed by a trusted key"
    print(f"anchored: {rep.anchored} of {rep.records} records (by a seal or checkpoint{by})")
    _print_keys(rep)
    if rep.witnessed:
        sizes = ", ".join(map(str, sorted(set(rep.witnessed))))
        print(f"witnessed: checkpoints of size {sizes} carry a verified cosignature; the log holds each tree")
    for i, what in rep.recoveries:
        print(f"RECOVERY at record {i}: {what}")
    for n in rep.notes:
        print(f"note: {n}")
    first = rep.first()
    if first is None and rep.structure_only and not args.structure_only:
        print(
            f"UNVERIFIED: no --pubkey or --keyring given: the {rep.records} record signatures, the "
            f"{rep.seals} seal and {rep.checkpoints_checked} checkpoint signatures were not checked (the "
            "structure is sound; pass --structure-only to accept a check of the structure alone)"
        )
        return 3
    if first is None and rep.structure_only:
        print(
            "OK (structure only): no signature was checked; frames, hashes, the tree, seals and "
            "checkpoints agree"
        )
        return 0
    if first is None:
        n = len(rep.recoveries)
        recovered = f" ({n} recovery record(s) above)" if n else ""
        print(f"OK: every record, seal and checkpoint verifies{recovered}")
        return 0
    print(f"FAILED: {first}")
    others = [p for p in rep.problems if p is not first]
    for p in others[:20]:
        print(f"  also: {p}")
    if len(others) > 20:
        print(f"  ... and {len(others) - 20} more")
    return 1


def run_show(args: argparse.Namespace) -> int:
    logs = fleet_of(args, DEFAULT_DIR)
    if logs is not None:
        from semgov.cli.audit_fleet import run_fleet_show

        return run_fleet_show(args, logs, _filter(args))
    rows = select(decoded_records(args.directory), _filter(args))
    if args.limit is not None:
        rows = itertools.islice(rows, max(args.limit, 0))
    out = sys.stdout
    if args.format == "table":
        write_table(out, rows)
    elif args.format == "csv":
        w = csv.writer(out, lineterminator="\n")
        w.writerow(CSV_COLUMNS)
        w.writerows(csv_row(i, rec) for i, rec in rows)
    elif args.format == "json":
        # NOTE: streamed, one object at a time: a log of any size, and `[]` when nothing matches
        sep = "["
        for i, rec in rows:
            out.write(sep + json.dumps({"index": i, **rec}, separators=(",", ":")))
            sep = ",\n"
        out.write("[]\n" if sep == "[" else "]\n")
    else:
        for i, rec in rows:
            out.write(json.dumps({"index": i, **rec}, separators=(",", ":")) + "\n")
    return 0


def run_stats(args: argparse.Namespace) -> int:
    logs = fleet_of(args, DEFAULT_DIR)
    if logs is not None:
        from semgov.cli.audit_fleet import run_fleet_stats

        return run_fleet_stats(args, logs, _filter(args))
    out = stats_output(args, (r for _, r in select(decoded_records(args.directory), _filter(args))))
    sys.stdout.write(out if isinstance(out, str) else json.dumps(out, indent=2, sort_keys=True) + "\n")
    return 0


def run_prove(args: argparse.Namespace) -> int:
    from semgov.audit.verify import bundle_origin
    from semgov.audit.verify_dir import make_bundle

    bundle = make_bundle(args.directory, args.decision_id)
    text = json.dumps(bundle, indent=2) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
        print(f"wrote {args.out}: record {bundle['index']} of {bundle['tree_size']} in log "
              f"{bundle_origin(bundle)!r}, {len(bundle['inclusion_proof'])}-hash inclusion "
              "proof")  # fmt: skip
    return 0


def run_verify_proof(args: argparse.Namespace) -> int:
    from semgov.audit.keyring import AuditKeyring
    from semgov.audit.merkle import ProofError
    from semgov.audit.verify import bundle_origin, read_bundle, verify_bundle
    from semgov.signing.keys import load_public_key
    from semgov.wire.strictjson import StrictJSONError

    key: Ed25519PublicKey | AuditKeyring = (
        load_public_key(args.pubkey) if args.pubkey is not None else AuditKeyring.load(args.keyring)
    )
    try:
        bundle = read_bundle(args.bundle.read_bytes())
    except OSError as e:
        raise InputError(f"cannot read proof bundle: {e.strerror}", source=str(args.bundle)) from e
    except StrictJSONError as e:  # duplicate keys, NaN, deep nesting, not UTF-8, ...
        raise InputError(f"cannot read proof bundle: {e}", source=str(args.bundle)) from e
    try:
        rec = verify_bundle(bundle, key, origin=args.origin)
    except ProofError as e:
        log.get_logger().error(f"{args.bundle}: proof does NOT verify: {e}")
        return 1
    origin = bundle_origin(bundle)
    checked = "as expected" if args.origin is not None else "NOT CHECKED"
    where = f"record {bundle['index']} of the log at size {bundle['tree_size']}"
    where += f", origin {origin!r} ({checked})"
    _print_proven(rec, where)
    if args.origin is None:
        print(f"ORIGIN NOT CHECKED: this proves the record is in log {origin!r}, whichever log that "
              "is; pass --origin with the origin of the log you mean (a proof from another log "
              "verifies just as well)")  # fmt: skip
    return 0


def _print_proven(rec: dict[str, Any], where: str) -> None:
    """The OK line of ``verify-proof``: what the record is, and where it was proved."""
    if rec.get("schema") == SHADOW_DECISION_SCHEMA:
        what = f"{rec.get('decision')}, request {rec.get('request_id')}, donor {rec.get('donor_id')}"
        print(f"OK: SHADOW decision {rec.get('decision_id')} ({what}; never acted on, live decision "
              f"{rec.get('live_decision_id')}: {rec.get('live_decision')}) is {where}")  # fmt: skip
    elif rec.get("schema") in ENGINE_EVENT_SCHEMAS:
        what = f"{rec.get('kind')}, request {rec.get('request_id')}, decision {rec.get('decision_id')}"
        print(f"OK: engine event {rec.get('event_id')} ({what}) is {where}")
    elif rec.get("schema") == RECOVERY_SCHEMA:
        print(f"OK: RECOVERY record {rec.get('recovery_id')} ({rec.get('cause')}) is {where}")
    else:
        what = f"{rec.get('decision')}, request {rec.get('request_id')}, donor {rec.get('donor_id')}"
        print(f"OK: decision {rec.get('decision_id')} ({what}) is {where}")
