"""What changes between two policies' decisions on the same traffic (pure: no I/O, no engine).

``semgov diff`` decides every candidate of every captured request under policy A and policy B and
hands each pair of decisions here. A pair is one of:

- a **flip**: the decision changed (``allow->deny`` or ``deny->allow``);
- **spans**: both allow, but the approved spans differ (reuse changes, the decision does not);
- **reasons**: both deny, but which gates fail or error changed (nothing the engine does changes);
- unchanged.

Flips and span changes are what a policy change does to serving; :class:`Diff` counts them per
gate (each gate whose result changed), tenant, namespace and task, with the approved tokens under
each policy, so a summary never reports gate-failure counts without the decisions that flipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from semgov.typing import SignedDecision

Kind = Literal["allow->deny", "deny->allow", "spans", "reasons"]
KINDS: tuple[Kind, ...] = ("allow->deny", "deny->allow", "spans", "reasons")
GROUPS = ("gate", "tenant", "namespace", "task")


@dataclass(frozen=True, slots=True)
class GateChange:
    """One gate whose result or detail differs between the two decisions."""

    gate: str
    a: str  # result under A
    b: str  # result under B
    a_detail: str
    b_detail: str


@dataclass(frozen=True, slots=True)
class Change:
    """One candidate whose decision under B differs from A's (see the module docstring)."""

    kind: Kind
    request_id: str
    donor_id: str
    tenant: str
    namespace: str
    task: str  # "id@version"
    a_tokens: int  # approved tokens under A
    b_tokens: int
    gates: tuple[GateChange, ...]  # only the gates that changed
    a_spans: tuple[tuple[int, int, int, str, int], ...]
    b_spans: tuple[tuple[int, int, int, str, int], ...]

    def as_json(self) -> dict[str, Any]:
        """The change as JSON data (one ``--format jsonl`` line)."""
        return {
            "kind": self.kind,
            "request_id": self.request_id,
            "donor_id": self.donor_id,
            "tenant": self.tenant,
            "namespace": self.namespace,
            "task": self.task,
            "approved_tokens": {"a": self.a_tokens, "b": self.b_tokens},
            "gates": [
                {"gate": g.gate, "a": g.a, "b": g.b, "a_detail": g.a_detail, "b_detail": g.b_detail}
                for g in self.gates
            ],
            "approved_spans": {
                "a": [_span_json(s) for s in self.a_spans],
                "b": [_span_json(s) for s in self.b_spans],
            },
        }


def _span_json(s: tuple[int, int, int, str, int]) -> dict[str, Any]:
    return {"recipient_start": s[0], "donor_start": s[1], "length": s[2], "kind": s[3], "recompute": s[4]}


Spans = tuple[tuple[int, int, int, str, int], ...]


def _spans(record: Mapping[str, Any]) -> Spans:
    return tuple(
        (int(s["recipient_start"]), int(s["donor_start"]), int(s["length"]), s["kind"], int(s["recompute"]))
        for s in record["approved_spans"]
    )


def compare(a: SignedDecision, b: SignedDecision, *, task: str) -> Change | None:
    """The change from ``a`` to ``b`` (two decisions on the same candidate), or None if none.

    Raises ValueError when the two are not decisions on the same request and donor.
    """
    ra, rb = a.record, b.record
    if (ra["request_id"], ra["donor_id"]) != (rb["request_id"], rb["donor_id"]):
        raise ValueError(
            f"decisions on different candidates: {ra['request_id']}/{ra['donor_id']} "
            f"vs {rb['request_id']}/{rb['donor_id']}"
        )
    gb = {g["gate"]: (g["result"], g["detail"]) for g in rb["gates"]}
    gates = tuple(
        GateChange(g["gate"], g["result"], gb[g["gate"]][0], g["detail"], gb[g["gate"]][1])
        for g in ra["gates"]
        if g["gate"] in gb and (g["result"], g["detail"]) != gb[g["gate"]]
    )
    sa, sb = _spans(ra), _spans(rb)
    kind: Kind
    if a.decision != b.decision:
        kind = "allow->deny" if a.decision == "allow" else "deny->allow"
    elif a.decision == "allow" and sa != sb:
        kind = "spans"
    elif a.decision == "deny" and any(g.a != g.b for g in gates):
        kind = "reasons"
    else:
        return None  # NOTE: a detail that changed with every result the same is not a change
    return Change(
        kind, ra["request_id"], ra["donor_id"], ra["tenant"], ra["namespace"], task,
        int(ra["approved_tokens"]), int(rb["approved_tokens"]), gates, sa, sb,
    )  # fmt: skip


@dataclass
class Row:
    """One group's counts: changes by kind, and the approved tokens under A and B over its flips
    and span changes."""

    kinds: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    a_tokens: int = 0
    b_tokens: int = 0

    def add(self, c: Change) -> None:
        self.kinds[c.kind] += 1
        if c.kind != "reasons":
            self.a_tokens += c.a_tokens
            self.b_tokens += c.b_tokens

    @property
    def acted_on(self) -> int:
        """Flips and span changes in this group (what changes serving)."""
        return self.kinds["allow->deny"] + self.kinds["deny->allow"] + self.kinds["spans"]

    def as_json(self) -> dict[str, Any]:
        return {**self.kinds, "approved_tokens": {"a": self.a_tokens, "b": self.b_tokens}}


@dataclass
class Diff:
    """Every pair of decisions compared, and the changes grouped (see the module docstring)."""

    compared: int = 0
    requests: int = 0
    malformed: int = 0
    totals: Row = field(default_factory=Row)
    a_allow: int = 0
    b_allow: int = 0
    groups: dict[str, dict[str, Row]] = field(default_factory=lambda: {g: {} for g in GROUPS})
    changes: list[Change] = field(default_factory=list)

    @property
    def flipped(self) -> int:
        """Decisions that flipped (allow->deny plus deny->allow)."""
        return self.totals.kinds["allow->deny"] + self.totals.kinds["deny->allow"]

    @property
    def acted_on(self) -> int:
        """Changes that change what the engine does: flips and approved-span changes."""
        return self.totals.acted_on

    def add_pair(self, a: SignedDecision, b: SignedDecision, *, task: str) -> Change | None:
        """Compare one pair of decisions and count it."""
        self.compared += 1
        self.a_allow += a.decision == "allow"
        self.b_allow += b.decision == "allow"
        c = compare(a, b, task=task)
        if c is None:
            return None
        self.totals.add(c)
        keys: dict[str, Iterable[str]] = {
            "gate": sorted({g.gate for g in c.gates if g.a != g.b}) or ["(spans only)"],
            "tenant": [c.tenant],
            "namespace": [c.namespace],
            "task": [c.task],
        }
        for group, names in keys.items():
            for name in names:
                self.groups[group].setdefault(name, Row()).add(c)
        self.changes.append(c)
        return c

    def summary_json(self) -> dict[str, Any]:
        """The counts (no per-candidate changes)."""
        return {
            "requests": self.requests,
            "malformed": self.malformed,
            "decisions_compared": self.compared,
            "allow": {"a": self.a_allow, "b": self.b_allow},
            "flipped": self.flipped,
            **self.totals.as_json(),
            "unchanged": self.compared - sum(self.totals.kinds.values()),
        }

    def groups_json(self) -> dict[str, dict[str, Any]]:
        """Each group's rows, sorted by name."""
        return {g: {k: r.as_json() for k, r in sorted(rows.items())} for g, rows in self.groups.items()}
