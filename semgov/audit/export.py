"""``semgov audit show --format csv``: one row of fixed columns per record, safe to open in a
spreadsheet.

Pure: a decoded record (decision, shadow decision or engine event) in, its cells out. Records may
come from a log nobody verified: a field that is missing or of the wrong type gives an empty cell
(a string field that is not a string, its JSON text), never an error. Fields a record's schema does
not have are empty: ``donor_tenant``, ``donor_namespace`` and ``cross_boundary`` exist from
``semgov.decision/v3`` on; engine events have no tenant, policy or approved tokens, decisions no
event kind or materialized tokens.

NOTE: tenant, namespace, request and donor ids are client-controlled. A cell that starts with
``=``, ``+``, ``-`` or ``@`` (or a tab or carriage return) is a formula to a spreadsheet, so it
gets a leading ``'`` (OWASP "CSV injection"): ``'=1+1`` shows as the text ``=1+1``.
"""

from __future__ import annotations

import json
from typing import Any

from semgov.audit.query import disagreement, gates_of, is_event, is_shadow

CSV_COLUMNS = (
    "index",
    "kind",
    "at",
    "decision",
    "tenant",
    "namespace",
    "request_id",
    "donor_id",
    "donor_tenant",
    "donor_namespace",
    "decision_id",
    "policy",
    "policy_revision",
    "approved_tokens",
    "recipient_tokens",
    "failed_gates",
    "cross_boundary",
    "event_kind",
    "materialized_tokens",
    "detail",
)
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def neutralize(cell: str) -> str:
    """``cell`` with a leading ``'`` when a spreadsheet would read it as a formula."""
    return "'" + cell if cell.startswith(FORMULA_STARTS) else cell


def text(value: object) -> str:
    """A field as a cell: a string as is, nothing for null or absent, anything else its JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def integer(rec: dict[str, Any], name: str) -> str:
    """A count field: a JSON integer, else nothing (a float, string or boolean is not a count)."""
    v = rec.get(name)
    return str(v) if isinstance(v, int) and not isinstance(v, bool) else ""


def policy_cells(rec: dict[str, Any]) -> tuple[str, str]:
    """A decision's policy as ``name@version`` and its revision (nothing when there is no policy object)."""
    policy = rec.get("policy")
    if not isinstance(policy, dict):
        return "", ""
    return f"{text(policy.get('name'))}@{text(policy.get('version'))}", text(policy.get("revision"))


def failed_gates(rec: dict[str, Any]) -> list[str]:
    """The names of a decision's gates whose result is not ``pass``, in the record's order."""
    return [text(g.get("gate")) for g in gates_of(rec) if g.get("result") != "pass"]


def cross_boundary(rec: dict[str, Any]) -> list[str]:
    """A ``semgov.decision/v3`` record's cross-boundary reuses as ``boundary:rule`` (none before v3)."""
    items = rec.get("cross_boundary")
    if not isinstance(items, list):
        return []
    return [f"{text(c.get('boundary'))}:{text(c.get('rule'))}" for c in items if isinstance(c, dict)]


def shadow_detail(rec: dict[str, Any]) -> str:
    """A shadow decision's live counterpart: ``live allow <id>``, ``live none``, `` DISAGREE`` last."""
    live, live_id = rec.get("live_decision"), rec.get("live_decision_id")
    out = f"live {'none' if live is None else text(live)}"
    out += f" {text(live_id)}" if live_id is not None else ""
    return out + (" DISAGREE" if disagreement(rec) is not None else "")


def _event_cells(rec: dict[str, Any]) -> dict[str, str]:
    return {
        "kind": "event",
        "event_kind": text(rec.get("kind")),
        "materialized_tokens": integer(rec, "materialized_tokens"),
        "detail": text(rec.get("detail")),
    }


def _decision_cells(rec: dict[str, Any]) -> dict[str, str]:
    policy, revision = policy_cells(rec)
    return {
        "kind": "shadow" if is_shadow(rec) else "decision",
        "decision": text(rec.get("decision")),
        "tenant": text(rec.get("tenant")),
        "namespace": text(rec.get("namespace")),
        "donor_tenant": text(rec.get("donor_tenant")),
        "donor_namespace": text(rec.get("donor_namespace")),
        "policy": policy,
        "policy_revision": revision,
        "approved_tokens": integer(rec, "approved_tokens"),
        "recipient_tokens": integer(rec, "recipient_tokens"),
        "failed_gates": ";".join(failed_gates(rec)),
        "cross_boundary": ";".join(cross_boundary(rec)),
        "detail": shadow_detail(rec) if is_shadow(rec) else "",
    }


def csv_row(index: int, rec: dict[str, Any]) -> list[str]:
    """Record ``index``'s cells, in :data:`CSV_COLUMNS` order, each :func:`neutralize`\\ d."""
    at = rec.get("at") if is_event(rec) else rec.get("evaluated_at")
    cells = {
        "index": str(index),
        "at": text(at),
        "request_id": text(rec.get("request_id")),
        "donor_id": text(rec.get("donor_id")),
        "decision_id": text(rec.get("decision_id")),
        **(_event_cells(rec) if is_event(rec) else _decision_cells(rec)),
    }
    return [neutralize(cells.get(c, "")) for c in CSV_COLUMNS]
