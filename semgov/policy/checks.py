"""What semgov checks of every policy engine's result, whatever the engine: it fails closed.

An engine's gates must be exactly semgov's, each pass, fail or error; an approved span must lie
inside a span that token verification found identical, not overlap another, and plan a recompute
share within its length. Anything else is an engine failure or a token-verification error.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence

from semgov.policy.engine import ApprovedSpan, EngineResult, GateOutcome
from semgov.wire.models import GATES
from semgov.wire.policy_input import PolicyInput, SpanFacts


def engine_failure(reason: str) -> EngineResult:
    """Every gate ``error`` with ``reason``: nothing was decided."""
    return EngineResult([GateOutcome(gate=g, result="error", detail=reason) for g in GATES], [])


class _Verified:
    """The verified spans, indexed for containment queries in O(log V).

    NOTE: per (diagonal, kind), spans sorted by recipient start with the running maximum of their
    ends: a span lies inside one of them iff, among those starting at or before it, the furthest
    end reaches its end. Exactly the old linear ``any(...)`` test, whether or not spans overlap.
    """

    def __init__(self, spans: Sequence[SpanFacts]) -> None:
        groups: dict[tuple[int, str], list[tuple[int, int]]] = {}
        key: tuple[int, str]
        for v in spans:
            key = (v.donor_start - v.recipient_start, v.kind)
            groups.setdefault(key, []).append((v.recipient_start, v.recipient_start + v.length))
        self._index: dict[tuple[int, str], tuple[list[int], list[int]]] = {}
        for key, ivs in groups.items():
            ivs.sort()
            self._index[key] = ([a for a, _ in ivs], list(itertools.accumulate((b for _, b in ivs), max)))

    def contains(self, s: ApprovedSpan) -> bool:
        found = self._index.get((s.donor_start - s.recipient_start, s.kind))
        if found is None:
            return False
        starts, reach = found
        i = bisect.bisect_right(starts, s.recipient_start) - 1
        return i >= 0 and s.recipient_start + s.length <= reach[i]


def checked_result(result: EngineResult, doc: PolicyInput) -> EngineResult:
    """Fail closed on a malformed engine result or on spans that were not verified.

    NOTE: invariant: an approved span always lies inside a span that token
    verification found identical, whatever the engine says.
    """
    got = tuple(g.gate for g in result.gates)
    if got != GATES:
        return engine_failure(f"engine returned gates {list(got)}, expected {list(GATES)}")
    for g in result.gates:
        if g.result not in ("pass", "fail", "error") or not isinstance(g.detail, str):
            return engine_failure(f"engine returned a malformed outcome for gate {g.gate}: {g.result!r}")
    if not all(g.result == "pass" for g in result.gates):
        return EngineResult(result.gates, [])
    verified = _Verified(doc.facts.tokens.spans if doc.facts.tokens is not None else [])
    ordered = sorted(result.approved_spans, key=lambda s: s.recipient_start)
    overlap = any(a.recipient_start + a.length > b.recipient_start for a, b in itertools.pairwise(ordered))
    for s in result.approved_spans:
        ok = (
            not overlap and verified.contains(s) and type(s.recompute) is int and 0 <= s.recompute <= s.length
        )
        if not ok:
            gates = [
                g
                if g.gate != "token_verification"
                else GateOutcome(
                    gate=g.gate,
                    result="error",
                    detail=f"engine approved overlapping, unverified or ill-planned spans, e.g. {s!r}",
                )
                for g in result.gates
            ]
            return EngineResult(gates, [])
    if not result.approved_spans:
        gates = [
            g
            if g.gate != "token_verification"
            else GateOutcome(gate=g.gate, result="fail", detail="no approved spans")
            for g in result.gates
        ]
        return EngineResult(gates, [])
    return result
