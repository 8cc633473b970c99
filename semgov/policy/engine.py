"""The policy engine interface: one document in, gate outcomes and approved spans out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from semgov.facts.config import FactConfig
from semgov.wire.models import GateName
from semgov.wire.policy_input import PolicyInput


@dataclass(frozen=True, slots=True)
class GateOutcome:
    """One gate's result (the record's ``gates[]`` entry)."""

    gate: GateName
    result: Literal["pass", "fail", "error"]
    detail: str


@dataclass(frozen=True, slots=True)
class ApprovedSpan:
    """Token positions the policy approves for reuse (the record's ``approved_spans[]``).

    ``recompute``: how many of the span's leading tokens the engine must compute instead of
    copying (the policy's quality plan for shifted spans; ``0 <= recompute <= length``).
    """

    recipient_start: int
    donor_start: int
    length: int
    kind: Literal["prefix", "shifted"]
    recompute: int = 0


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


class PolicySource(Protocol):
    """A loaded policy, in any language: identity, fact parameters, and its engine."""

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str: ...

    @property
    def revision(self) -> str: ...

    @property
    def fact_config(self) -> FactConfig: ...

    @property
    def engine_name(self) -> str:
        """The engine ``auto`` picks for this policy (``semgov.policy.source.make_engine``)."""
        ...


# Which computed fact each gate relies on: an error computing it is that gate's
# error, in every engine (facts are computed by semgov, not by the policy).
GATE_FACT: dict[GateName, str | None] = {
    "tenant": "provenance",
    "namespace": "provenance",
    "provenance": "provenance",
    "expiry": "provenance",
    "policy_version": "provenance",
    "pii": "pii",
    "task": "provenance",
    "response_contract": "provenance",
    "similarity": None,
    "token_verification": "tokens",
}


def fact_error(gate: GateName, doc: PolicyInput) -> str | None:
    """The error of the fact ``gate`` depends on, if computing it failed (never an empty detail)."""
    fact = GATE_FACT[gate]
    err = doc.facts.errors.get(fact) if fact is not None else None
    if err is None:
        return None
    # NOTE: a deny always names its reason, even for a document whose error message is blank.
    return err if err.strip() else f"fact {fact} unavailable (no reason given)"
