"""The text ``semgov audit show`` and ``stats`` print: the record table, the counts and groupings.

Shared by one log's commands (:mod:`semgov.cli.audit`) and the fleet view
(:mod:`semgov.cli.audit_fleet`).
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Iterable
from typing import Any, TextIO

from semgov.audit.export import failed_gates, policy_cells, shadow_detail
from semgov.audit.grouping import Groups, Outcomes
from semgov.audit.query import Stats, count_of, is_event, is_shadow, record_time, tally
from semgov.cli.audit_json import groups_doc, stats_doc
from semgov.wire.names import GATE_NAMES

PERIODS = ("hour", "day", "month")


def cell(value: object, width: int | None = None) -> str:
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
    out = [f"{cell(c, cut):{a}{w}}" for c, (w, cut, a) in zip(cells, _COLUMNS, strict=True)]
    return "  ".join([*out, cell(last)]) + "\n"


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


def write_table(out: TextIO, rows: Iterable[tuple[int, dict[str, Any]]]) -> None:
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


def stats_head(st: Stats) -> str:
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
        text += f"{cell(tenant, 13):<14}{cell(ns, 31):<32}{tokens:>16}\n"
    # NOTE: a shadow column only where there are shadow decisions (the table is unchanged without)
    cols = ("allow", "deny", "event", *(("shadow",) if st.shadow.decisions else ()))
    text += f"\n{by:<16}" + "".join(f"{'events' if c == 'event' else c:>8}" for c in cols) + "\n"
    for period in sorted(st.by_period):
        text += f"{cell(period):<16}" + "".join(f"{st.by_period[period][c]:>8}" for c in cols)
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
        text += f"{cell(tenant, 31):<32}{_outcomes(o)}\n"
    text += "-" * (32 + len(_OUTCOMES)) + "\n"
    return text + f"{'total (' + _n(len(g.tenants), 'tenant') + ')':<32}{_outcomes(g.total())}\n"


def _by_namespace(g: Groups) -> str:
    """The namespaces of each tenant, then the tenant's subtotal; the grand total last."""
    text = f"{'tenant':<24}{'namespace':<32}{_OUTCOMES}\n"
    for tenant, rows, subtotal in g.by_tenant():
        for ns, o in rows:
            text += f"{cell(tenant, 23):<24}{cell(ns, 31):<32}{_outcomes(o)}\n"
        text += f"{cell(tenant, 23):<24}{'(subtotal: ' + _n(len(rows), 'namespace') + ')':<32}"
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
        text += f"{cell(label, 31):<32}{cell(revision, 19):<21}{r.allow:>8}{r.deny:>8}  "
        text += f"{cell(r.first or '-', 31):<32}{cell(r.last or '-', 31)}\n"
    t = g.policy_total()
    policies = _n(len({label for label, _ in g.policies}), "policy", "policies")
    what = f"total ({policies}, {_n(len(g.policies), 'revision')})"
    text += "-" * 120 + "\n" + f"{what:<53}{t.allow:>8}{t.deny:>8}  "
    return text + f"{cell(t.first or '-', 31):<32}{cell(t.last or '-', 31)}\n"


def _by_gate(g: Groups) -> str:
    """Per gate: fails, errors, and the denies where it was the only gate that did not pass; totals."""
    text = f"{'gate':<24}{'fail':>8}{'error':>8}{'denied by it alone':>20}\n"
    for name, r in g.gates.items():
        text += f"{cell(name, 23):<24}{r.fail:>8}{r.error:>8}{r.sole_deny:>20}\n"
    fail, error = sum(r.fail for r in g.gates.values()), sum(r.error for r in g.gates.values())
    alone = sum(r.sole_deny for r in g.gates.values())
    text += "-" * 60 + "\n" + f"{'total':<24}{fail:>8}{error:>8}{alone:>20}\n"
    several = g.denies - alone - g.denies_without_gate
    text += f"{_n(g.denies, 'live deny', 'live denies')}: {alone} by one gate alone, {several} by several"
    return text + (f", {g.denies_without_gate} with every gate passing\n" if g.denies_without_gate else "\n")


_GROUPED = {"tenant": _by_tenant, "namespace": _by_namespace, "policy": _by_policy, "gate": _by_gate}


def stats_output(args: argparse.Namespace, records: Iterable[dict[str, Any]]) -> str | dict[str, Any]:
    """What ``stats`` prints for ``records`` (already filtered): the text, or the JSON document."""
    if args.by in PERIODS:
        st = tally(records, period=args.by)
        if args.format == "json":
            return {
                **stats_doc(st),
                "by": args.by,
                "over_time": {p: dict(c) for p, c in sorted(st.by_period.items())},
            }
        return stats_head(st) + _time_tables(st, args.by)
    st, groups = Stats(), Groups()
    for r in records:
        st.add(r, "day")
        groups.add(r)
    if args.format == "json":
        return {**stats_doc(st), "by": args.by, "groups": groups_doc(groups, args.by),
                "not_grouped": dict(groups.skipped)}  # fmt: skip
    text = stats_head(st) + "\n" + _GROUPED[args.by](groups)
    words = (("shadow", "shadow decision"), ("event", "engine event"))
    skipped = [_n(groups.skipped[k], w) for k, w in words if groups.skipped[k]]
    if skipped:
        text += f"live decisions only: {' and '.join(skipped)} not counted\n"
    return text
