"""The policy engine interface: one document in, gate outcomes and approved spans out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from semgov.models import GateResult, Span
from semgov.policy_input import PolicyInput


@dataclass(frozen=True, slots=True)
class EngineResult:
    """Every gate's outcome, in gate order, and the spans the policy approves.

    The caller allows reuse only when every gate passed; ``approved_spans`` is
    ignored otherwise.
    """

    gates: list[GateResult]
    approved_spans: list[Span]


class PolicyEngine(Protocol):
    """Decides over a :class:`PolicyInput`. Must evaluate every gate, every time."""

    @property
    def name(self) -> str: ...

    def evaluate(self, doc: PolicyInput) -> EngineResult: ...
