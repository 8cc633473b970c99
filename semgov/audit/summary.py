"""What a compliance reviewer asks of an audit log, aggregated in one streaming pass
(``semgov audit report``).

Pure bookkeeping over decoded records (decision records, shadow decision records, engine events),
in log order; reading and verifying the log is the caller's job. Memory is bounded by the number
of distinct tenants, namespaces, policies, days and allowed decisions (realization events are
joined to the allow they realize by ``decision_id``), plus fixed-size lists of the rows the page
shows (cross-boundary reuses, notable engine events, recent decisions): a million records make a
page of the same size as a thousand.

NOTE: shadow decisions were never acted on: they are counted apart and never as candidates,
allows or denies (as ``semgov audit stats`` does).
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from semgov.audit.query import (
    UNCLASSIFIED,
    count_of,
    disagreement,
    gates_of,
    is_event,
    is_shadow,
    record_time,
)
from semgov.audit.recovery_record import RECOVERY_KIND
from semgov.wire.names import not_realized_reason

MAX_CROSS_ROWS = 1000  # cross-boundary reuses listed in the page (all are counted)
MAX_EVENT_ROWS = 500  # notable engine events listed (all are counted)
RECENT_ROWS = 200  # most recent decisions listed
NOTABLE_EVENTS = frozenset(
    {
        "realization_failed",
        "invariant_violation",
        "reuse_disabled",
        "shifted_reuse_disabled",
        "policy_load_failed",
        RECOVERY_KIND,  # the log's own: what a recovery on open cut off (semgov.audit_recovery/v1)
    }
)


@dataclass
class ScopeRow:
    """One (tenant, namespace): live candidates decided, allows, denies and tokens."""

    candidates: int = 0
    allows: int = 0
    denies: int = 0
    approved_tokens: int = 0
    realizations: int = 0
    realized_tokens: int = 0  # prefill tokens not computed: K/V copied from an approved donor
    cross_boundary: int = 0  # allows whose donor belonged to another tenant or namespace

    def add(self, other: ScopeRow) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class PolicyRow:
    """One policy revision as the decisions name it."""

    name: str
    revision: str
    engine: str
    first: str
    last: str
    allows: int = 0
    denies: int = 0


@dataclass(frozen=True)
class Row:
    """A record the page lists: its index and the fields shown."""

    index: int
    at: str
    kind: str  # allow | deny | shadow | an engine event kind
    tenant: str
    namespace: str
    request_id: str
    decision_id: str
    donor_id: str
    detail: str


def _s(rec: dict[str, Any], key: str) -> str:
    v = rec.get(key)
    return "" if v is None else str(v)


def _row(index: int, rec: dict[str, Any], kind: str, detail: str = "") -> Row:
    return Row(
        index,
        record_time(rec),
        kind,
        _s(rec, "tenant"),
        _s(rec, "namespace"),
        _s(rec, "request_id"),
        _s(rec, "decision_id"),
        _s(rec, "donor_id"),
        detail[:300],
    )


def _policy(rec: dict[str, Any]) -> tuple[str, str, str]:
    p = rec.get("policy")
    p = p if isinstance(p, dict) else {}
    return f"{p.get('name')}@{p.get('version')}", str(p.get("revision")), str(p.get("engine"))


def cross_boundary(rec: dict[str, Any]) -> list[tuple[str, str]]:
    """``(boundary, rule)`` pairs of a ``semgov.decision/v3`` allow whose donor belonged to another
    tenant or namespace (empty for older records, which do not say)."""
    out = []
    items = rec.get("cross_boundary")
    for c in items if isinstance(items, list) else []:
        if isinstance(c, dict):
            out.append((str(c.get("boundary")), str(c.get("rule"))))
    return out


@dataclass
class Summary:
    """The report's aggregates (see the module docstring). With ``tenant``, only that tenant's
    decisions count, with the engine events about its allows and those that name no request
    (server-wide: policy reloads, reuse turned off)."""

    tenant: str | None = None
    records: int = 0
    decisions: int = 0
    first_at: str = ""
    last_at: str = ""
    schemas: Counter[str] = field(default_factory=Counter)
    timeline: dict[str, Counter[str]] = field(default_factory=dict)  # day -> allow/deny/shadow/event
    deny_gates: Counter[tuple[str, str]] = field(default_factory=Counter)  # (gate, fail|error) in denies
    scopes: dict[tuple[str, str], ScopeRow] = field(default_factory=dict)
    cross_total: int = 0
    cross_denied: int = 0  # denied candidates whose verified donor was of another tenant or namespace
    cross_rows: list[tuple[Row, str, str, str]] = field(
        default_factory=list
    )  # row (detail: rule), donor t/ns, policy
    policies: dict[tuple[str, str, str], PolicyRow] = field(default_factory=dict)
    events: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)  # failures without a reason code, by detail head
    # allows not realized by reason code (realization_failed events; "(unclassified)": no code)
    not_realized: Counter[str] = field(default_factory=Counter)
    event_rows: list[Row] = field(default_factory=list)
    policy_events: list[Row] = field(default_factory=list)
    shadow: Counter[str] = field(default_factory=Counter)  # outcome, and "disagree"
    recent: deque[Row] = field(default_factory=lambda: deque(maxlen=RECENT_ROWS))
    untyped: int = 0  # records with no known schema (an unverified log)
    _allowed: dict[str, tuple[str, str]] = field(default_factory=dict)  # decision id -> scope

    def add(self, index: int, rec: dict[str, Any]) -> None:
        if self.tenant is not None and not self._in_scope(rec):
            return
        self.records += 1
        self.schemas[_s(rec, "schema")] += 1
        at = record_time(rec)
        if at and at != "None":
            # NOTE: to the second (the RFC 3339 prefix): as strings, "…:00.5Z" would sort before "…:00Z".
            sec = at[:19] + "Z"
            self.first_at = min(self.first_at, sec) if self.first_at else sec
            self.last_at = max(self.last_at, sec)
        if is_event(rec):
            self._event(index, rec, at)
        elif is_shadow(rec):
            self.shadow[_s(rec, "decision")] += 1
            self.shadow["disagree"] += disagreement(rec) is not None
            self._day(at)["shadow"] += 1
        elif rec.get("decision") in ("allow", "deny"):
            self._decision(index, rec, at)
        else:
            self.untyped += 1

    def _in_scope(self, rec: dict[str, Any]) -> bool:
        if not is_event(rec):
            return rec.get("tenant") == self.tenant
        if rec.get("decision_id") is not None:
            return _s(rec, "decision_id") in self._allowed
        return rec.get("request_id") is None

    def _day(self, at: str) -> Counter[str]:
        return self.timeline.setdefault(at[:10], Counter())

    def _decision(self, index: int, rec: dict[str, Any], at: str) -> None:
        self.decisions += 1
        allow = rec.get("decision") == "allow"
        outcome = "allow" if allow else "deny"
        self._day(at)[outcome] += 1
        key = (_s(rec, "tenant"), _s(rec, "namespace"))
        scope = self.scopes.setdefault(key, ScopeRow())
        scope.candidates += 1
        scope.allows += allow
        scope.denies += not allow
        scope.approved_tokens += count_of(rec, "approved_tokens")
        name, revision, engine = _policy(rec)
        sec = at[:19] + "Z"
        pol = self.policies.setdefault((name, revision, engine), PolicyRow(name, revision, engine, sec, sec))
        pol.first, pol.last = min(pol.first, sec), max(pol.last, sec)
        pol.allows += allow
        pol.denies += not allow
        failed = [g for g in gates_of(rec) if g.get("result") != "pass"]
        for g in failed:
            self.deny_gates[(str(g.get("gate")), str(g.get("result")))] += 1
        row = _row(index, rec, outcome, ", ".join(f"{g.get('gate')} {g.get('result')}" for g in failed))
        self.recent.append(row)
        crossed = cross_boundary(rec)
        if allow:
            self._allowed[row.decision_id] = key
        if allow and crossed:
            scope.cross_boundary += 1
            self.cross_total += 1
            if len(self.cross_rows) < MAX_CROSS_ROWS:
                rule = "; ".join(f"{b}: {r}" for b, r in crossed)
                donor = (_s(rec, "donor_tenant"), _s(rec, "donor_namespace"))
                self.cross_rows.append(
                    (_row(index, rec, outcome, rule), *donor, f"{name} rev {revision[:12]}")
                )
        elif not allow and rec.get("donor_tenant") is not None:
            self.cross_denied += (rec.get("donor_tenant"), rec.get("donor_namespace")) != key

    def _event(self, index: int, rec: dict[str, Any], at: str) -> None:
        kind = _s(rec, "kind")
        self.events[kind] += 1
        self._day(at)["event"] += 1
        detail = _s(rec, "detail")
        if kind == "realization":
            key = self._allowed.get(_s(rec, "decision_id"))
            scope = self.scopes.setdefault(key or ("(unknown)", "(unknown)"), ScopeRow())
            scope.realizations += 1
            scope.realized_tokens += count_of(rec, "materialized_tokens")
        elif kind == "realization_failed":
            code = not_realized_reason(detail)
            self.not_realized[code or UNCLASSIFIED] += 1
            if code is None:  # NOTE: written before the codes (or not about an allow): its own head
                self.failures[detail.split(":")[0][:80] or "(no reason)"] += 1
        if kind in ("policy_loaded", "policy_load_failed") and len(self.policy_events) < MAX_EVENT_ROWS:
            self.policy_events.append(_row(index, rec, kind, detail))
        if kind in NOTABLE_EVENTS and len(self.event_rows) < MAX_EVENT_ROWS:
            self.event_rows.append(_row(index, rec, kind, detail))

    def totals(self) -> ScopeRow:
        out = ScopeRow()
        for row in self.scopes.values():
            out.add(row)
        return out

    def tenants(self) -> dict[str, ScopeRow]:
        """Per tenant: the sum of its namespaces."""
        out: dict[str, ScopeRow] = {}
        for (tenant, _), row in self.scopes.items():
            out.setdefault(tenant, ScopeRow()).add(row)
        return out
