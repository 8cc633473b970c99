"""``semgov audit stats --by tenant|namespace|policy|gate``: live decisions grouped, with totals.

Pure bookkeeping over decoded records, in one pass; reading the log and printing are the
caller's. Only live decision records are grouped: shadow decisions were never acted on and
engine events decide nothing, so neither is ever counted as a decision (as in
:mod:`semgov.audit.query`). Records come from a log that may not have been verified: a field of
the wrong type counts as that field's ``str`` (a tenant), 0 (a token count) or nothing (a gate),
never as an error.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from semgov.audit.query import count_of, gates_of, is_event, is_shadow
from semgov.errors import InputError
from semgov.wire.names import GATE_NAMES
from semgov.wire.timefmt import parse_rfc3339

GROUPINGS = ("tenant", "namespace", "policy", "gate")


def is_live(rec: dict[str, Any]) -> bool:
    """True for a live decision record: neither an engine event nor a shadow decision."""
    return not is_event(rec) and not is_shadow(rec)


def policy_label(rec: dict[str, Any]) -> tuple[str, str]:
    """A decision's policy as ``name@version (engine)``, and its revision (as in ``stats``)."""
    policy = rec.get("policy")
    policy = policy if isinstance(policy, dict) else {}
    label = f"{policy.get('name')}@{policy.get('version')} ({policy.get('engine')})"
    return label, str(policy.get("revision"))


def _when(rec: dict[str, Any]) -> datetime | None:
    """A decision's ``evaluated_at`` as an aware datetime; None when it is not RFC 3339."""
    at = rec.get("evaluated_at")
    if not isinstance(at, str):
        return None
    try:
        return parse_rfc3339(at, what="evaluated_at")
    except (InputError, OverflowError):
        return None


@dataclass
class Outcomes:
    """Live decisions of one group: how many, allowed, denied, and the tokens the allows approved.

    ``allow + deny`` equals ``candidates`` unless a record's decision is neither (an unverified log)."""

    candidates: int = 0
    allow: int = 0
    deny: int = 0
    approved_tokens: int = 0

    def add(self, rec: dict[str, Any]) -> None:
        self.candidates += 1
        self.allow += rec.get("decision") == "allow"
        self.deny += rec.get("decision") == "deny"
        self.approved_tokens += count_of(rec, "approved_tokens")

    def __iadd__(self, other: Outcomes) -> Outcomes:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self


@dataclass
class PolicyRow:
    """The live decisions one policy revision made: allows, denies, and the first and last
    ``evaluated_at`` (compared as times, not strings; shown as logged; empty when none parses)."""

    allow: int = 0
    deny: int = 0
    candidates: int = 0
    first: str = ""
    last: str = ""
    first_at: datetime | None = field(default=None, repr=False)
    last_at: datetime | None = field(default=None, repr=False)

    def add(self, rec: dict[str, Any]) -> None:
        self.candidates += 1
        self.allow += rec.get("decision") == "allow"
        self.deny += rec.get("decision") == "deny"
        at = _when(rec)
        if at is not None:
            self._seen(at, str(rec.get("evaluated_at")), at, str(rec.get("evaluated_at")))

    def _seen(self, first_at: datetime, first: str, last_at: datetime, last: str) -> None:
        if self.first_at is None or first_at < self.first_at:
            self.first_at, self.first = first_at, first
        if self.last_at is None or last_at >= self.last_at:
            self.last_at, self.last = last_at, last

    def __iadd__(self, other: PolicyRow) -> PolicyRow:
        self.allow, self.deny = self.allow + other.allow, self.deny + other.deny
        self.candidates += other.candidates
        if other.first_at is not None and other.last_at is not None:
            self._seen(other.first_at, other.first, other.last_at, other.last)
        return self


@dataclass
class GateRow:
    """One gate over live decisions: how often it failed, errored, and was the only gate that did
    not pass in a denied decision (the one gate that alone denied it)."""

    fail: int = 0
    error: int = 0
    sole_deny: int = 0


@dataclass
class Groups:
    """Live decisions grouped by tenant, by (tenant, namespace), by policy revision and by gate."""

    tenants: dict[str, Outcomes] = field(default_factory=dict)
    namespaces: dict[tuple[str, str], Outcomes] = field(default_factory=dict)
    policies: dict[tuple[str, str], PolicyRow] = field(default_factory=dict)  # (label, revision)
    gates: dict[str, GateRow] = field(default_factory=lambda: {g: GateRow() for g in GATE_NAMES})
    denies: int = 0  # live denies
    denies_without_gate: int = 0  # live denies in which every gate passed (an unverified log)
    skipped: Counter[str] = field(default_factory=Counter)  # "shadow", "event": not grouped

    def add(self, rec: dict[str, Any]) -> None:
        if not is_live(rec):
            self.skipped["event" if is_event(rec) else "shadow"] += 1
            return
        tenant, namespace = str(rec.get("tenant")), str(rec.get("namespace"))
        self.tenants.setdefault(tenant, Outcomes()).add(rec)
        self.namespaces.setdefault((tenant, namespace), Outcomes()).add(rec)
        self.policies.setdefault(policy_label(rec), PolicyRow()).add(rec)
        failing = [g for g in gates_of(rec) if g.get("result") != "pass"]
        for g in failing:
            row = self.gates.setdefault(str(g.get("gate")), GateRow())
            row.fail += g.get("result") == "fail"
            row.error += g.get("result") == "error"
        if rec.get("decision") == "deny":
            self.denies += 1
            names = {str(g.get("gate")) for g in failing}
            if len(names) == 1:
                self.gates[next(iter(names))].sole_deny += 1
            self.denies_without_gate += not names

    def total(self) -> Outcomes:
        """Every live decision grouped."""
        out = Outcomes()
        for o in self.tenants.values():
            out += o
        return out

    def policy_total(self) -> PolicyRow:
        """Every policy revision's row added up (the first and last over all of them)."""
        out = PolicyRow()
        for r in self.policies.values():
            out += r
        return out

    def by_tenant(self) -> list[tuple[str, list[tuple[str, Outcomes]], Outcomes]]:
        """Per tenant (sorted): its namespaces' rows (sorted) and the tenant's subtotal."""
        out: list[tuple[str, list[tuple[str, Outcomes]], Outcomes]] = []
        for (tenant, namespace), o in sorted(self.namespaces.items()):
            if not out or out[-1][0] != tenant:
                out.append((tenant, [], Outcomes()))
            _, rows, subtotal = out[-1]
            rows.append((namespace, o))
            subtotal += o
        return out


def group(records: Iterable[dict[str, Any]]) -> Groups:
    """Live decisions of ``records`` grouped every way :class:`Groups` keeps."""
    g = Groups()
    for r in records:
        g.add(r)
    return g
