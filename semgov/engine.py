"""The policy engine interface: one document in, gate outcomes and approved spans out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from semgov.models import GateName
from semgov.policy_input import PolicyInput


@dataclass(frozen=True, slots=True)
class GateOutcome:
    """One gate's result (the record's ``gates[]`` entry)."""

    gate: GateName
    result: Literal["pass", "fail", "error"]
    detail: str


@dataclass(frozen=True, slots=True)
class ApprovedSpan:
    """Token positions the policy approves for copying (the record's ``approved_spans[]``)."""

    recipient_start: int
    donor_start: int
    length: int
    kind: Literal["prefix", "shifted"]


@dataclass(frozen=True, slots=True)
class EngineResult:
    """Every gate's outcome, in gate order, and the spans the policy approves.

    The caller allows reuse only when every gate passed; ``approved_spans`` is
    ignored otherwise.
    """

    gates: list[GateOutcome]
    approved_spans: list[ApprovedSpan]


class PolicyEngine(Protocol):
    """Decides over a :class:`PolicyInput`. Must evaluate every gate, every time."""

    @property
    def name(self) -> str: ...

    def evaluate(self, doc: PolicyInput) -> EngineResult: ...
