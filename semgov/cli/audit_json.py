"""``semgov audit stats --format json``: the counts of ``stats`` as JSON data."""

from __future__ import annotations

from typing import Any

from semgov.audit.grouping import Groups
from semgov.audit.query import Stats
from semgov.wire.names import GATE_NAMES


def stats_doc(st: Stats) -> dict[str, Any]:
    """The counts of ``stats``' first lines and time tables as JSON data."""
    return {
        "records": st.records,
        "schemas": dict(st.schemas),
        "decisions": dict(st.decisions),
        "engine_events": dict(st.event_kinds),
        "materialized_tokens": st.materialized_tokens,
        "allows_not_realized": dict(st.not_realized),
        "policies": dict(st.engines),
        "gates": {g: {"fail": st.gate_fail[g], "error": st.gate_error[g]} for g in GATE_NAMES},
        "approved_tokens": [
            {"tenant": t, "namespace": ns, "tokens": n} for (t, ns), n in sorted(st.approved_tokens.items())
        ],
        "shadow": {
            "decisions": dict(st.shadow.decisions),
            "disagreements": dict(st.shadow.disagreements),
            "without_live": st.shadow.without_live,
        },
    }


def groups_doc(g: Groups, by: str) -> list[dict[str, Any]]:
    """The rows of ``stats --by tenant|namespace|policy|gate`` as JSON data."""
    if by == "gate":
        return [
            {"gate": n, "fail": r.fail, "error": r.error, "sole_deny": r.sole_deny}
            for n, r in g.gates.items()
        ]
    if by == "policy":
        return [
            {
                "policy": label,
                "revision": rev,
                "allow": r.allow,
                "deny": r.deny,
                "first": r.first,
                "last": r.last,
            }
            for (label, rev), r in sorted(g.policies.items())
        ]
    rows = g.tenants.items() if by == "tenant" else sorted(g.namespaces.items())
    return [
        {**({"tenant": k} if by == "tenant" else {"tenant": k[0], "namespace": k[1]}),
         "candidates": o.candidates, "allow": o.allow, "deny": o.deny, "approved_tokens": o.approved_tokens}
        for k, o in sorted(rows)
    ]  # fmt: skip
