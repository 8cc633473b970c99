"""Allows not realized: the one rule both engines follow, and its reason codes.

An allow decision is signed and audited before the engine acts on it; when the engine then does
not copy or load what it allows, the audit log must say so and why, or the allow says nothing.
The rule: every allow decision record is followed by one engine event naming its ``decision_id``,
a ``realization`` or a ``realization_failed`` whose ``detail`` starts with a reason code
(``"<reason>: <text>"``, :data:`REASONS`). Adapters report through
:meth:`engine_hooks.core.governor.Governor.not_realized`; a decision the adapter abandoned
(:meth:`~engine_hooks.core.decisions.PendingDecision.abandon`: late, aborted) is reported by the
core itself when it finishes with allows (:func:`abandoned_allows`).

The codes (``semgov.wire.names.NOT_REALIZED_REASONS``; docs/formats.md "Allows not realized"):
``late``, ``not_durable``, ``donor_evicted``, ``unrealizable_plan``, ``prefix_cached``,
``another_donor_chosen``, ``unsealed``, ``discarded_by_engine``, ``canary_off``,
``reuse_disabled``, ``copy_failed``, ``hook_error``, ``aborted``.

NOTE: an allow for a donor other than the one the engine realized counts (``another_donor_chosen``):
each allow record then has its own outcome, and ``allows - realizations - not realized`` is zero
for a log written by this version (a preempted vLLM recipient loaded twice realizes its one
decision twice).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Literal, get_args

from semgov.decide import SignedDecision
from semgov.wire.names import NOT_REALIZED_REASONS

Reason = Literal[
    "late",
    "not_durable",
    "donor_evicted",
    "unrealizable_plan",
    "prefix_cached",
    "another_donor_chosen",
    "unsealed",
    "discarded_by_engine",
    "canary_off",
    "reuse_disabled",
    "copy_failed",
    "hook_error",
    "aborted",
]
REASONS: tuple[str, ...] = get_args(Reason)
assert REASONS == NOT_REALIZED_REASONS  # NOTE: one list; tests/audit hold the wire names to it too

_MAX_DETAIL = 500


def detail_of(reason: Reason, text: str) -> str:
    """The event's ``detail``: the code, then the human-readable why (bounded)."""
    return f"{reason}: {text}"[:_MAX_DETAIL] if text else reason


def allows(decisions: list[SignedDecision]) -> Iterator[SignedDecision]:
    return (d for d in decisions if d.decision == "allow")


NotRealized = Callable[..., None]  # Governor.not_realized


def abandoned_allows(
    decisions: list[SignedDecision], reason: str, request_id: str, text: str, report: NotRealized
) -> int:
    """Report each allow of an abandoned decision as not realized with ``reason``; returns how many."""
    code: Reason = reason if reason in REASONS else "hook_error"  # type: ignore[assignment]
    n = 0
    for d in allows(decisions):
        report(
            code,
            request_id=request_id,
            decision_id=str(d.record["decision_id"]),
            donor_id=d.donor_id,
            detail=text,
        )
        n += 1
    return n


__all__ = ["REASONS", "Reason", "abandoned_allows", "allows", "detail_of"]
