"""Reviewing an audit log: filters (``semgov audit show``) and tallies (``stats``).

Pure functions over decoded records (decision records, shadow decision records and engine
events); reading the log is the caller's job. Filters on decision fields (tenant, namespace,
decision, gate) skip engine events and apply to shadow decisions as to live ones; ``kind`` (an
engine event kind) skips both; ``shadow`` includes, excludes or keeps only shadow decisions.
Tallies count shadow decisions apart: they were never acted on, so they are never counted as
decisions (outcomes, gates, approved tokens, policies, periods' allow and deny).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from semgov.audit.recovery_record import RECOVERY_SCHEMA
from semgov.wire.names import ENGINE_EVENT_SCHEMAS, SHADOW_DECISION_SCHEMA, disagrees, not_realized_reason
from semgov.wire.timefmt import parse_rfc3339

ShadowMode = Literal["include", "exclude", "only"]
# NOTE: a recovery record (semgov.audit_recovery/v1) decides nothing: it is listed and counted as
# an event of kind audit_recovery, never as a decision.
_EVENT_SCHEMAS = frozenset((*ENGINE_EVENT_SCHEMAS, RECOVERY_SCHEMA))


def is_event(rec: dict[str, Any]) -> bool:
    """True for an engine event or a recovery record (the log's own event, kind ``audit_recovery``),
    False for a decision record (live or shadow)."""
    return rec.get("schema") in _EVENT_SCHEMAS


def is_shadow(rec: dict[str, Any]) -> bool:
    """True for a shadow decision record (``semgov.shadow_decision/v1``: never acted on)."""
    return rec.get("schema") == SHADOW_DECISION_SCHEMA


def disagreement(rec: dict[str, Any]) -> str | None:
    """A shadow record's disagreement with the live decision as ``live->shadow`` (``allow->deny``,
    ``deny->allow``, or ``none->allow`` when the live policy made none), or None when they agree."""
    if not is_shadow(rec) or not disagrees(rec.get("decision"), rec.get("live_decision")):
        return None
    live = rec.get("live_decision")
    return f"{'none' if live is None else live}->{rec.get('decision')}"


def gates_of(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """A decision's gate results; what is not a list of objects (an unverified log) counts as none."""
    gates = rec.get("gates")
    return [g for g in gates if isinstance(g, dict)] if isinstance(gates, list) else []


def count_of(rec: dict[str, Any], name: str) -> int:
    """A token count field: a JSON integer, else 0 (never ``int()`` of a float, string or ``1e400``)."""
    v = rec.get(name, 0)
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def record_time(rec: dict[str, Any]) -> str:
    """When a record happened, as logged: ``evaluated_at`` of a decision, ``at`` of an engine event."""
    return str(rec.get("at") if is_event(rec) else rec.get("evaluated_at"))


@dataclass(frozen=True)
class Filter:
    """Conditions a record must meet; ``None`` means any (see the module docstring for events)."""

    tenant: str | None = None
    namespace: str | None = None
    request_id: str | None = None
    donor_id: str | None = None
    decision: str | None = None
    gate: str | None = None  # records where this gate did not pass
    since: datetime | None = None  # evaluated_at (an event's at) >= since
    until: datetime | None = None  # evaluated_at (an event's at) < until
    kind: str | None = None  # engine events of this kind
    # the decision record, the engine events that name it and the shadow records of it (and a
    # shadow record by its own id)
    decision_id: str | None = None
    shadow: ShadowMode = "include"  # shadow decision records: with the rest, none, or only them

    def matches(self, rec: dict[str, Any]) -> bool:
        event, shadow = is_event(rec), is_shadow(rec)
        if self.shadow != "include" and shadow != (self.shadow == "only"):
            return False
        if event and any(v is not None for v in (self.tenant, self.namespace, self.decision, self.gate)):
            return False
        if self.kind is not None and (not event or rec.get("kind") != self.kind):
            return False
        if self.tenant is not None and rec.get("tenant") != self.tenant:
            return False
        if self.namespace is not None and rec.get("namespace") != self.namespace:
            return False
        if self.request_id is not None and rec.get("request_id") != self.request_id:
            return False
        if self.donor_id is not None and rec.get("donor_id") != self.donor_id:
            return False
        if self.decision_id is not None and self.decision_id not in _decision_ids(rec, shadow):
            return False
        if self.decision is not None and rec.get("decision") != self.decision:
            return False
        if self.gate is not None and not any(
            g.get("gate") == self.gate and g.get("result") != "pass" for g in gates_of(rec)
        ):
            return False
        if self.since is not None or self.until is not None:
            at = parse_rfc3339(record_time(rec), what="at" if event else "evaluated_at")
            if self.since is not None and at < self.since:
                return False
            if self.until is not None and at >= self.until:
                return False
        return True


def _decision_ids(rec: dict[str, Any], shadow: bool) -> tuple[object, ...]:
    """The decision ids a record is found by: its ``decision_id``, and a shadow's live decision's."""
    return (rec.get("decision_id"), rec.get("live_decision_id")) if shadow else (rec.get("decision_id"),)


def select(
    records: Iterable[tuple[int, dict[str, Any]]], flt: Filter
) -> Iterator[tuple[int, dict[str, Any]]]:
    """The (index, record) pairs that match ``flt``, in log order."""
    return ((i, r) for i, r in records if flt.matches(r))


def _bucket(at: str, period: str) -> str:
    return at[:10] if period == "day" else at[:13] + "h" if period == "hour" else at[:7]


def _policy(rec: dict[str, Any]) -> str:
    policy = rec.get("policy")
    policy = policy if isinstance(policy, dict) else {}
    return f"{policy.get('name')}@{policy.get('version')} ({policy.get('engine')})"


@dataclass
class ShadowStats:
    """Tallies over shadow decision records (never acted on), apart from the live decisions."""

    decisions: Counter[str] = field(default_factory=Counter)  # by the shadow's outcome
    disagreements: Counter[str] = field(default_factory=Counter)  # by direction, live->shadow
    without_live: int = 0  # shadow records of a donor the live policy made no decision for
    policies: Counter[str] = field(default_factory=Counter)

    def add(self, rec: dict[str, Any]) -> None:
        self.decisions[str(rec.get("decision"))] += 1
        direction = disagreement(rec)
        if direction is not None:
            self.disagreements[direction] += 1
        self.without_live += rec.get("live_decision_id") is None
        self.policies[_policy(rec)] += 1


UNCLASSIFIED = "(unclassified)"  # a realization_failed event whose detail has no reason code


@dataclass
class Stats:
    """Tallies over decision records, shadow decision records and engine events (``records``
    counts them all; ``decisions`` and what follows from them, live decisions only)."""

    records: int = 0
    schemas: Counter[str] = field(default_factory=Counter)
    decisions: Counter[str] = field(default_factory=Counter)
    gate_fail: Counter[str] = field(default_factory=Counter)
    gate_error: Counter[str] = field(default_factory=Counter)
    approved_tokens: Counter[tuple[str, str]] = field(default_factory=Counter)  # (tenant, namespace)
    by_period: dict[str, Counter[str]] = field(
        default_factory=lambda: defaultdict(Counter)
    )  # period -> decision, "event" for engine events, "shadow" for shadow decisions
    engines: Counter[str] = field(default_factory=Counter)
    event_kinds: Counter[str] = field(default_factory=Counter)
    # realization_failed events by their reason code (docs/formats.md "Allows not realized"),
    # "(unclassified)" for one whose detail has none (written before the codes)
    not_realized: Counter[str] = field(default_factory=Counter)
    materialized_tokens: int = 0
    shadow: ShadowStats = field(default_factory=ShadowStats)

    def add(self, rec: dict[str, Any], period: str) -> None:
        self.records += 1
        self.schemas[str(rec.get("schema"))] += 1
        if is_event(rec):
            self.event_kinds[str(rec.get("kind"))] += 1
            if rec.get("kind") == "realization_failed":
                self.not_realized[not_realized_reason(rec.get("detail")) or UNCLASSIFIED] += 1
            self.materialized_tokens += count_of(rec, "materialized_tokens")
            self.by_period[_bucket(record_time(rec), period)]["event"] += 1
            return
        if is_shadow(rec):
            self.shadow.add(rec)
            self.by_period[_bucket(str(rec.get("evaluated_at", "")), period)]["shadow"] += 1
            return
        decision = str(rec.get("decision"))
        self.decisions[decision] += 1
        for g in gates_of(rec):
            if g.get("result") == "fail":
                self.gate_fail[str(g.get("gate"))] += 1
            elif g.get("result") == "error":
                self.gate_error[str(g.get("gate"))] += 1
        key = (str(rec.get("tenant")), str(rec.get("namespace")))
        self.approved_tokens[key] += count_of(rec, "approved_tokens")
        self.by_period[_bucket(str(rec.get("evaluated_at", "")), period)][decision] += 1
        self.engines[_policy(rec)] += 1


def tally(records: Iterable[dict[str, Any]], *, period: str = "day") -> Stats:
    """Counts by schema, decision, gate failure and error, approved tokens, event kind and period,
    and the shadow decisions' outcomes and disagreements with the live ones."""
    st = Stats()
    for r in records:
        st.add(r, period)
    return st


def parse_when(value: str | None, what: str) -> datetime | None:
    return parse_rfc3339(value, what=what) if value else None
