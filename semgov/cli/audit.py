"""``semgov audit``: verify, show, stats, prove and verify-proof over an audit log."""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from semgov import log
from semgov.audit.export import CSV_COLUMNS, csv_row, failed_gates, policy_cells, shadow_detail
from semgov.audit.grouping import GROUPINGS, Groups, Outcomes
from semgov.audit.query import (
    Filter,
    Stats,
    count_of,
    is_event,
    is_shadow,
    parse_when,
    record_time,
    select,
    tally,
)
from semgov.audit.reader import decoded_records
from semgov.audit.recovery_record import RECOVERY_KIND, RECOVERY_SCHEMA
from semgov.cli.audit_json import groups_doc, stats_doc
from semgov.cli.audit_report import add_key_options, register_report, verify_from_args
from semgov.cli.audit_ship import register_ship
from semgov.errors import InputError
from semgov.wire.names import ENGINE_EVENT_KINDS, ENGINE_EVENT_SCHEMAS, GATE_NAMES, SHADOW_DECISION_SCHEMA

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from semgov.audit.keyring import AuditKeyring
    from semgov.audit.verify import Report

# NOTE: start-up: `show` and `stats` read records as plain JSON; what verifies signatures (the
# keyring, cryptography, the verifier and its process pool) is imported by the commands that do.

DEFAULT_DIR = Path("audit/log")
PERIODS = ("hour", "day", "month")
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
    s.add_argument("directory", type=Path, nargs="?", default=DEFAULT_DIR, metavar="DIR")
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
    st.add_argument("directory", type=Path, nargs="?", default=DEFAULT_DIR, metavar="DIR")
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
    v.add_argument("directory", type=Path, nargs="?", default=DEFAULT_DIR, metavar="DIR")
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


def _cell(value: object, width: int | None = None) -> str:
    """A table cell, non-printable characters escaped (``\\n``, ``\\x1b``: a client-controlled name
    can neither add a row nor send the terminal an escape sequence), cut to ``width`` if given."""
    s = str(value)
    if not s.isprintable():
        s = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in s)
    return s if width is None else s[:width]


# index, evaluated_at, decision, tenant, namespace, policy, request, donor, tokens: (width, cut
# at, alignment); a time is never cut short (a longer one moves the columns after it)
_COLUMNS = ((7, 7, ">"), (20, 40, "<"), (8, 8, "<"), (12, 12, "<"), (20, 20, "<"), (14, 14, "<"),
            (14, 14, "<"), (14, 14, "<"), (6, 6, ">"))  # fmt: skip
_HEADER = ("index", "evaluated_at", "decision", "tenant", "namespace", "policy", "request", "donor", "tokens")


def _row(cells: tuple[object, ...], last: str) -> str:
    """One table line: the fixed columns (cut and escaped), then ``last`` (escaped)."""
    out = [f"{_cell(c, cut):{a}{w}}" for c, (w, cut, a) in zip(cells, _COLUMNS, strict=True)]
    return "  ".join([*out, _cell(last)]) + "\n"


def _event_row(i: int, rec: dict[str, Any]) -> str:
    """An engine event: "event" in the decision column, "-" for tenant, namespace and policy (an
    event has none), its materialized tokens, and kind, decision id and detail in the last column."""
    req, donor = (rec.get(k) or "-" for k in ("request_id", "donor_id"))
    what = str(rec.get("kind"))
    if rec.get("decision_id") is not None:
        what += f" decision {rec['decision_id']}"
    if rec.get("detail"):
        what += f" {str(rec['detail'])[:80]}"
    tokens = count_of(rec, "materialized_tokens")
    return _row((i, record_time(rec), "event", "-", "-", "-", req, donor, tokens), what)


def _decision_row(i: int, rec: dict[str, Any]) -> str:
    """A decision: its tenant, namespace, policy (name@version) and, last, the gates that did not
    pass; a shadow decision has "shadow" in the decision column and, in the last, its outcome, the
    live decision's (and its id), ``DISAGREE`` when they differ, and its failed gates."""
    failed = ",".join(failed_gates(rec))
    decision = str(rec.get("decision"))
    if is_shadow(rec):
        failed = f"{decision}, {shadow_detail(rec)}" + (f"; failed {failed}" if failed else "")
        decision = "shadow"
    policy = policy_cells(rec)[0] or "-"
    cells = (i, str(rec.get("evaluated_at")), decision, rec.get("tenant"), rec.get("namespace"), policy,
             rec.get("request_id"), rec.get("donor_id"), count_of(rec, "approved_tokens"))  # fmt: skip
    return _row(cells, failed)


def _write_table(out: TextIO, rows: Iterable[tuple[int, dict[str, Any]]]) -> None:
    """The table, and a closing line counting decisions, engine events and shadow decisions."""
    out.write(_row(_HEADER, "failed gates | event"))
    seen: Counter[str] = Counter()
    for i, rec in rows:
        out.write(_event_row(i, rec) if is_event(rec) else _decision_row(i, rec))
        seen["event" if is_event(rec) else "shadow" if is_shadow(rec) else "decision"] += 1
    parts = [f"{seen['decision']} decision(s)"]
    parts += [
        f"{seen[k]} {w}(s)" for k, w in (("event", "engine event"), ("shadow", "shadow decision")) if seen[k]
    ]
    out.write(", ".join(parts) + "\n")


def run_show(args: argparse.Namespace) -> int:
    rows = select(decoded_records(args.directory), _filter(args))
    if args.limit is not None:
        rows = itertools.islice(rows, max(args.limit, 0))
    out = sys.stdout
    if args.format == "table":
        _write_table(out, rows)
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


def _head(st: Stats) -> str:
    """The first lines of ``stats``: records by schema, decisions, engine events, policies, shadows."""
    text = f"{st.records} records: {_counts(st.schemas)}\n"
    text += f"{st.decisions.total()} decisions: {_counts(st.decisions)}\n"
    text += (f"{st.event_kinds.total()} engine events: {_counts(st.event_kinds)} "
             f"({st.materialized_tokens} tokens materialized)\n")  # fmt: skip
    if st.not_realized:
        text += f"{st.not_realized.total()} allows not realized: {_counts(st.not_realized)}\n"
    text += "policies: " + ", ".join(f"{k} x{v}" for k, v in st.engines.most_common()) + "\n"
    return text + _shadow_lines(st)


def _time_tables(st: Stats, by: str) -> str:
    """The gate, approved-token and records-over-time tables of ``stats --by hour|day|month``."""
    text = f"\n{'gate':<20}{'fail':>8}{'error':>8}\n"
    for g in GATE_NAMES:
        text += f"{g:<20}{st.gate_fail[g]:>8}{st.gate_error[g]:>8}\n"
    text += f"\n{'tenant':<14}{'namespace':<32}{'approved tokens':>16}\n"
    for (tenant, ns), tokens in sorted(st.approved_tokens.items()):
        text += f"{_cell(tenant, 13):<14}{_cell(ns, 31):<32}{tokens:>16}\n"
    # NOTE: a shadow column only where there are shadow decisions (the table is unchanged without)
    cols = ("allow", "deny", "event", *(("shadow",) if st.shadow.decisions else ()))
    text += f"\n{by:<16}" + "".join(f"{'events' if c == 'event' else c:>8}" for c in cols) + "\n"
    for period in sorted(st.by_period):
        text += f"{_cell(period):<16}" + "".join(f"{st.by_period[period][c]:>8}" for c in cols)
        text += "\n"
    return text


def _n(count: int, one: str, many: str = "") -> str:
    """``1 tenant``, ``2 tenants`` (``many`` when the plural is not ``one`` + s)."""
    return f"{count} {one if count == 1 else many or one + 's'}"


def _outcomes(o: Outcomes) -> str:
    return f"{o.candidates:>11}{o.allow:>8}{o.deny:>8}{o.approved_tokens:>17}"


_OUTCOMES = f"{'candidates':>11}{'allow':>8}{'deny':>8}{'approved tokens':>17}"


def _by_tenant(g: Groups) -> str:
    """One row per tenant: live decisions (candidates), allows, denies, approved tokens; the total."""
    text = f"{'tenant':<32}{_OUTCOMES}\n"
    for tenant, o in sorted(g.tenants.items()):
        text += f"{_cell(tenant, 31):<32}{_outcomes(o)}\n"
    text += "-" * (32 + len(_OUTCOMES)) + "\n"
    return text + f"{'total (' + _n(len(g.tenants), 'tenant') + ')':<32}{_outcomes(g.total())}\n"


def _by_namespace(g: Groups) -> str:
    """The namespaces of each tenant, then the tenant's subtotal; the grand total last."""
    text = f"{'tenant':<24}{'namespace':<32}{_OUTCOMES}\n"
    for tenant, rows, subtotal in g.by_tenant():
        for ns, o in rows:
            text += f"{_cell(tenant, 23):<24}{_cell(ns, 31):<32}{_outcomes(o)}\n"
        text += f"{_cell(tenant, 23):<24}{'(subtotal: ' + _n(len(rows), 'namespace') + ')':<32}"
        text += f"{_outcomes(subtotal)}\n"
    text += "-" * (56 + len(_OUTCOMES)) + "\n"
    what = f"({_n(len(g.tenants), 'tenant')}, {_n(len(g.namespaces), 'namespace')})"
    return text + f"{'total':<24}{what:<32}{_outcomes(g.total())}\n"


def _by_policy(g: Groups) -> str:
    """One row per policy (name@version (engine)) and revision: allows, denies, first and last
    evaluated_at, in order of policy then first use; the total."""
    text = f"{'policy':<32}{'revision':<21}{'allow':>8}{'deny':>8}  {'first evaluated_at':<32}"
    text += "last evaluated_at\n"
    rows = sorted(g.policies.items(), key=lambda kv: (kv[0][0], kv[1].first == "", kv[1].first, kv[0][1]))
    for (label, revision), r in rows:
        text += f"{_cell(label, 31):<32}{_cell(revision, 19):<21}{r.allow:>8}{r.deny:>8}  "
        text += f"{_cell(r.first or '-', 31):<32}{_cell(r.last or '-', 31)}\n"
    t = g.policy_total()
    policies = _n(len({label for label, _ in g.policies}), "policy", "policies")
    what = f"total ({policies}, {_n(len(g.policies), 'revision')})"
    text += "-" * 120 + "\n" + f"{what:<53}{t.allow:>8}{t.deny:>8}  "
    return text + f"{_cell(t.first or '-', 31):<32}{_cell(t.last or '-', 31)}\n"


def _by_gate(g: Groups) -> str:
    """Per gate: fails, errors, and the denies where it was the only gate that did not pass; totals."""
    text = f"{'gate':<24}{'fail':>8}{'error':>8}{'denied by it alone':>20}\n"
    for name, r in g.gates.items():
        text += f"{_cell(name, 23):<24}{r.fail:>8}{r.error:>8}{r.sole_deny:>20}\n"
    fail, error = sum(r.fail for r in g.gates.values()), sum(r.error for r in g.gates.values())
    alone = sum(r.sole_deny for r in g.gates.values())
    text += "-" * 60 + "\n" + f"{'total':<24}{fail:>8}{error:>8}{alone:>20}\n"
    several = g.denies - alone - g.denies_without_gate
    text += f"{_n(g.denies, 'live deny', 'live denies')}: {alone} by one gate alone, {several} by several"
    return text + (f", {g.denies_without_gate} with every gate passing\n" if g.denies_without_gate else "\n")


_GROUPED = {"tenant": _by_tenant, "namespace": _by_namespace, "policy": _by_policy, "gate": _by_gate}


def run_stats(args: argparse.Namespace) -> int:
    records = (r for _, r in select(decoded_records(args.directory), _filter(args)))
    if args.by in PERIODS:
        st = tally(records, period=args.by)
        if args.format == "json":
            doc = {
                **stats_doc(st),
                "by": args.by,
                "over_time": {p: dict(c) for p, c in sorted(st.by_period.items())},
            }
            sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
            return 0
        sys.stdout.write(_head(st) + _time_tables(st, args.by))
        return 0
    st, groups = Stats(), Groups()
    for r in records:
        st.add(r, "day")
        groups.add(r)
    if args.format == "json":
        doc = {**stats_doc(st), "by": args.by, "groups": groups_doc(groups, args.by),
               "not_grouped": dict(groups.skipped)}  # fmt: skip
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        return 0
    text = _head(st) + "\n" + _GROUPED[args.by](groups)
    words = (("shadow", "shadow decision"), ("event", "engine event"))
    skipped = [_n(groups.skipped[k], w) for k, w in words if groups.skipped[k]]
    if skipped:
        text += f"live decisions only: {' and '.join(skipped)} not counted\n"
    sys.stdout.write(text)
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
