"""``semgov audit``: verify, show, stats, prove and verify-proof over an audit log."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from semgov import log
from semgov.audit.errors import AuditLogError
from semgov.audit.query import (
    Filter,
    Stats,
    count_of,
    disagreement,
    gates_of,
    is_event,
    is_shadow,
    parse_when,
    record_time,
    select,
    tally,
)
from semgov.audit.reader import iter_records
from semgov.errors import InputError
from semgov.wire import strictjson
from semgov.wire.names import ENGINE_EVENT_KINDS, ENGINE_EVENT_SCHEMAS, GATE_NAMES, SHADOW_DECISION_SCHEMA

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from semgov.audit.keyring import AuditKeyring
    from semgov.audit.verify import Report

# NOTE: start-up: `show` and `stats` read records as plain JSON; what verifies signatures (the
# keyring, cryptography, the verifier and its process pool) is imported by the commands that do.

DEFAULT_DIR = Path("audit/log")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "audit",
        help="verify and review an audit log",
        description="The audit log is append-only and tamper-evident: an RFC 6962 Merkle tree over "
        "the signed decision records and engine events, with C2SP signed checkpoints. See audit/README.md.",
    )
    a = p.add_subparsers(dest="audit_command", metavar="ACTION", required=True)

    _register_verify(a)

    s = a.add_parser(
        "show",
        help="list decisions, shadow decisions and engine events",
        description="List the decision records, shadow decision records and engine events that match "
        "every filter (decision filters skip engine events and apply to shadow decisions; --kind skips "
        "decisions). A shadow decision (semgov.shadow_decision/v1) was never acted on: the table marks it "
        "`shadow` in the decision column, its outcome, the live decision's and whether they disagree "
        "in the last.",
    )
    s.add_argument("directory", type=Path, nargs="?", default=DEFAULT_DIR, metavar="DIR")
    _filters(s)
    s.add_argument("--format", choices=("table", "jsonl"), default="table")
    s.add_argument("--limit", type=int, metavar="N", help="stop after N matches")
    s.set_defaults(func=run_show)

    st = a.add_parser(
        "stats",
        help="counts over a log",
        description="Counts by record schema, decision, gate failures and errors, approved tokens by tenant "
        "and namespace, engine events by kind, and records over time, for the records that match the "
        "filters. Shadow decisions are counted apart from live ones (never as decisions): by outcome, "
        "and their disagreements with the live decision by direction (live->shadow).",
    )
    st.add_argument("directory", type=Path, nargs="?", default=DEFAULT_DIR, metavar="DIR")
    _filters(st)
    st.add_argument("--by", choices=("hour", "day", "month"), default="day", help="time bucket (default day)")
    st.set_defaults(func=run_stats)

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
        "and the decision record's own signature. Exit 1 if anything fails.",
    )
    vp.add_argument("bundle", type=Path, metavar="FILE")
    vkeys = vp.add_mutually_exclusive_group(required=True)
    vkeys.add_argument("--pubkey", type=Path, metavar="KEY", help="the one key of the record and checkpoint")
    vkeys.add_argument("--keyring", type=Path, metavar="FILE", help="audit keyring (after a key rotation)")
    vp.set_defaults(func=run_verify_proof)


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
    v.add_argument("directory", type=Path, nargs="?", default=DEFAULT_DIR, metavar="DIR")
    keys = v.add_mutually_exclusive_group()
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
    v.add_argument("--checkpoint", type=Path, metavar="FILE", help="a checkpoint note you kept earlier")
    v.add_argument(
        "--allow-unanchored",
        action="store_true",
        help="report records after the last trusted seal or checkpoint as a note, not a failure "
        "(a log whose writer is running or crashed mid-write)",
    )
    v.add_argument("--workers", type=int, metavar="N", help="processes for signature checks (default 2)")
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
    p.add_argument("--kind", choices=ENGINE_EVENT_KINDS, help="engine events of this kind")
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


def _decoded(directory: Path) -> Any:
    after_seal = [0, 0]  # records since the last seal frame, seal frames seen

    def on_seal(*_: Any) -> None:
        after_seal[0] = 0
        after_seal[1] += 1

    for i, leaf in iter_records(directory, on_seal):
        after_seal[0] += 1
        try:
            # NOTE: a record cannot nest deeper than it has brackets: only one with many goes
            # through the strict reader (slower, but depth-limited); the rest stay on json.loads.
            if leaf.count(b"[") + leaf.count(b"{") > strictjson.MAX_DEPTH:
                rec = strictjson.loads(leaf)
            else:
                rec = json.loads(leaf)
        except ValueError as e:
            raise AuditLogError(f"record {i} is not JSON: {e}", source=str(directory)) from e
        if not isinstance(rec, dict):
            raise AuditLogError(f"record {i} is not a JSON object", source=str(directory))
        yield i, rec
    if after_seal[0] and after_seal[1]:
        log.get_logger().warning(
            f"{directory}: the last {after_seal[0]} records are not sealed (a writer is mid-write or "
            "crashed, or someone else appended them); these are counts of unverified records: run "
            "`semgov audit verify`"
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
    rep = verify_log(
        args.directory,
        public_key=key,
        keyring=keyring,
        kept_checkpoint=kept,
        workers=args.workers,
        allow_unanchored=args.allow_unanchored,
    )
    cp = rep.checkpoint
    print(f"audit log {args.directory}: {rep.records} records, {rep.seals} seals, root {rep.root.hex()}")
    print(f"signatures checked: {rep.signatures_checked} records, {rep.seals_checked} seals")
    if cp is not None:
        print(
            f"latest checkpoint: {cp.origin} size {cp.size} ({rep.checkpoints_checked} checkpoints checked)"
        )
    by = "" if rep.structure_only else " signed by a trusted key"
    print(f"anchored: {rep.anchored} of {rep.records} records (by a seal or checkpoint{by})")
    _print_keys(rep)
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
        print("OK: every record, seal and checkpoint verifies")
        return 0
    print(f"FAILED: {first}")
    others = [p for p in rep.problems if p is not first]
    for p in others[:20]:
        print(f"  also: {p}")
    if len(others) > 20:
        print(f"  ... and {len(others) - 20} more")
    return 1


def _event_row(i: int, rec: dict[str, Any]) -> str:
    """An engine event: "event" in the decision column, its materialized tokens, and kind,
    decision id and detail in the last column."""
    at, tokens = record_time(rec), count_of(rec, "materialized_tokens")
    req, donor = (str(rec.get(k) or "-")[:14] for k in ("request_id", "donor_id"))
    what = str(rec.get("kind"))
    if rec.get("decision_id") is not None:
        what += f" decision {rec['decision_id']}"
    if rec.get("detail"):
        what += f" {str(rec['detail'])[:80]}"
    return f"{i:>7}  {at:<20}  {'event':<8}  {'-':<12}  {req:<14}  {donor:<14}  {tokens:>6}  {what}\n"


def _decision_row(i: int, rec: dict[str, Any]) -> str:
    """A decision; a shadow decision has "shadow" in the decision column and, in the last, its
    outcome, the live decision's (and its id), ``DISAGREE`` when they differ, and its failed gates."""
    failed = ",".join(str(g.get("gate")) for g in gates_of(rec) if g.get("result") != "pass")
    at, tenant = str(rec.get("evaluated_at")), str(rec.get("tenant"))[:12]
    req, donor = str(rec.get("request_id"))[:14], str(rec.get("donor_id"))[:14]
    tokens, decision = count_of(rec, "approved_tokens"), str(rec.get("decision"))[:8]
    if is_shadow(rec):
        live, live_id = rec.get("live_decision"), rec.get("live_decision_id")
        what = f"{decision}, live {'none' if live is None else live}"
        what += f" {live_id}" if live_id is not None else ""
        what += " DISAGREE" if disagreement(rec) is not None else ""
        failed = what + (f"; failed {failed}" if failed else "")
        decision = "shadow"
    return f"{i:>7}  {at:<20}  {decision:<8}  {tenant:<12}  {req:<14}  {donor:<14}  {tokens:>6}  {failed}\n"


def run_show(args: argparse.Namespace) -> int:
    flt = _filter(args)
    seen: Counter[str] = Counter()
    out = sys.stdout
    if args.format == "table":
        out.write(f"{'index':>7}  {'evaluated_at':<20}  {'decision':<8}  {'tenant':<12}  {'request':<14}  "
                  f"{'donor':<14}  {'tokens':>6}  failed gates | event\n")  # fmt: skip
    for i, rec in select(_decoded(args.directory), flt):
        event = is_event(rec)
        if args.format == "jsonl":
            out.write(json.dumps({"index": i, **rec}, separators=(",", ":")) + "\n")
        else:
            out.write(_event_row(i, rec) if event else _decision_row(i, rec))
        seen["event" if event else "shadow" if is_shadow(rec) else "decision"] += 1
        if args.limit is not None and seen.total() >= args.limit:
            break
    if args.format == "table":
        parts = [f"{seen['decision']} decision(s)"]
        parts += [
            f"{seen[k]} {w}(s)"
            for k, w in (("event", "engine event"), ("shadow", "shadow decision"))
            if seen[k]
        ]
        out.write(", ".join(parts) + "\n")
    return 0


def _counts(c: Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items()))


def _shadow_lines(st: Stats) -> str:
    """The shadow section of ``stats`` (nothing without shadow decisions)."""
    sh = st.shadow
    n = sh.decisions.total()
    if not n:
        return ""
    d = sh.disagreements.total()
    text = f"{n} shadow decisions (never acted on): {_counts(sh.decisions)}"
    text += f" ({sh.without_live} without a live decision)\n" if sh.without_live else "\n"
    text += f"shadow disagreements with live: {d} of {n} ({100 * d / n:.1f}%)"
    text += f": {_counts(sh.disagreements)} (live->shadow)\n" if d else "\n"
    return text + "shadow policies: " + ", ".join(f"{k} x{v}" for k, v in sh.policies.most_common()) + "\n"


def run_stats(args: argparse.Namespace) -> int:
    st = tally((r for _, r in select(_decoded(args.directory), _filter(args))), period=args.by)
    w = sys.stdout.write
    w(f"{st.records} records: {_counts(st.schemas)}\n")
    w(f"{st.decisions.total()} decisions: {_counts(st.decisions)}\n")
    w(f"{st.event_kinds.total()} engine events: {_counts(st.event_kinds)} "
      f"({st.materialized_tokens} tokens materialized)\n")  # fmt: skip
    w("policies: " + ", ".join(f"{k} x{v}" for k, v in st.engines.most_common()) + "\n")
    w(_shadow_lines(st))
    w(f"\n{'gate':<20}{'fail':>8}{'error':>8}\n")
    for g in GATE_NAMES:
        w(f"{g:<20}{st.gate_fail[g]:>8}{st.gate_error[g]:>8}\n")
    w(f"\n{'tenant':<14}{'namespace':<32}{'approved tokens':>16}\n")
    for (tenant, ns), tokens in sorted(st.approved_tokens.items()):
        w(f"{tenant[:13]:<14}{ns[:31]:<32}{tokens:>16}\n")
    # NOTE: a shadow column only where there are shadow decisions (the table is unchanged without)
    cols = ("allow", "deny", "event", *(("shadow",) if st.shadow.decisions else ()))
    w(f"\n{args.by:<16}" + "".join(f"{'events' if c == 'event' else c:>8}" for c in cols) + "\n")
    for period in sorted(st.by_period):
        w(f"{period:<16}" + "".join(f"{st.by_period[period][c]:>8}" for c in cols) + "\n")
    return 0


def run_prove(args: argparse.Namespace) -> int:
    from semgov.audit.verify_dir import make_bundle

    bundle = make_bundle(args.directory, args.decision_id)
    text = json.dumps(bundle, indent=2) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text, encoding="utf-8")
        print(f"wrote {args.out}: record {bundle['index']} of {bundle['tree_size']}, "
              f"{len(bundle['inclusion_proof'])}-hash inclusion proof")  # fmt: skip
    return 0


def run_verify_proof(args: argparse.Namespace) -> int:
    from semgov.audit.keyring import AuditKeyring
    from semgov.audit.merkle import ProofError
    from semgov.audit.verify import read_bundle, verify_bundle
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
        rec = verify_bundle(bundle, key)
    except ProofError as e:
        log.get_logger().error(f"{args.bundle}: proof does NOT verify: {e}")
        return 1
    where = f"record {bundle['index']} of the log at size {bundle['tree_size']}"
    if rec.get("schema") == SHADOW_DECISION_SCHEMA:
        what = f"{rec.get('decision')}, request {rec.get('request_id')}, donor {rec.get('donor_id')}"
        print(f"OK: SHADOW decision {rec.get('decision_id')} ({what}; never acted on, live decision "
              f"{rec.get('live_decision_id')}: {rec.get('live_decision')}) is {where}")  # fmt: skip
        return 0
    if rec.get("schema") in ENGINE_EVENT_SCHEMAS:
        what = f"{rec.get('kind')}, request {rec.get('request_id')}, decision {rec.get('decision_id')}"
        print(f"OK: engine event {rec.get('event_id')} ({what}) is {where}")
        return 0
    what = f"{rec.get('decision')}, request {rec.get('request_id')}, donor {rec.get('donor_id')}"
    print(f"OK: decision {rec.get('decision_id')} ({what}) is {where}")
    return 0
