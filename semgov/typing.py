"""The types an adapter implements or receives: one public, typed module (like ``structlog.typing``).

- :class:`PolicyEngine` decides one :class:`~semgov.wire.policy_input.PolicyInput` into an
  :class:`EngineResult` (gate outcomes and :class:`ApprovedSpan` s); :class:`PolicySource` is a
  loaded policy in any language (``semgov.policy.source.make_engine`` picks its engine).
- :class:`SignedDecision` is a signed decision record and its canonical bytes;
  :class:`DecisionSink` receives every signed decision, the last step of the data path
  (``Evaluator(..., sink=...)``); :class:`AuditSink` puts them in an audit log.
- :class:`CandidateProvider` finds donor candidates for a serving engine's hook
  (``SEMGOV_PROVIDER=module.path:callable``), returning :class:`Match` es.
- :class:`Contracts` (``semgov.contracts.load_contracts``) gives each response contract's
  :class:`ContractSpec`, which compares a cold and a warm answer into a :class:`Comparison` (what
  canaries, calibration and benchmarks count as a regression).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from semgov.contracts import Comparison, Contracts, ContractSpec
from semgov.policy.engine import ApprovedSpan, EngineResult, GateOutcome, PolicyEngine, PolicySource


@dataclass(frozen=True, slots=True)
class SignedDecision:
    """A signed decision record and its canonical bytes (one JSON line, no newline)."""

    record: dict[str, Any]
    canonical: bytes

    @property
    def decision(self) -> str:
        return str(self.record["decision"])

    @property
    def donor_id(self) -> str:
        return str(self.record["donor_id"])

    @property
    def approved_spans(self) -> list[dict[str, Any]]:
        return list(self.record["approved_spans"])


class DecisionSink(Protocol):
    """Where each signed decision goes once signed (an audit log, a test's list, a ticket keeper)."""

    def put(self, decision: SignedDecision) -> None: ...


class RecordLog(Protocol):
    """An append-only log of canonical record bytes (``semgov.audit.store.AuditLog``)."""

    def append(self, record: bytes) -> object: ...


class AuditSink:
    """A :class:`DecisionSink` that appends each decision's canonical bytes to an audit log."""

    __slots__ = ("log",)

    def __init__(self, log: RecordLog) -> None:
        self.log = log

    def put(self, decision: SignedDecision) -> None:
        """Queue the record (the log's own writer does the I/O)."""
        self.log.append(decision.canonical)


@dataclass(frozen=True, slots=True)
class Match:
    """One candidate donor: its id and how similar it looks to the query, in [0.0, 1.0]."""

    donor_id: str
    similarity: float  # in [0.0, 1.0], finite


class CandidateProvider(Protocol):
    """What the hook needs from a donor candidate provider (``docs/sglang.md``, "Candidate providers")."""

    name: str

    def add(self, donor_id: str, scope: str, token_ids: Sequence[int], text: str | None) -> None: ...

    def remove(self, donor_id: str) -> None: ...

    def query(self, scope: str, token_ids: Sequence[int], text: str | None, *, limit: int) -> list[Match]: ...

    def __len__(self) -> int: ...


__all__ = [
    "ApprovedSpan",
    "AuditSink",
    "CandidateProvider",
    "Comparison",
    "ContractSpec",
    "Contracts",
    "DecisionSink",
    "EngineResult",
    "GateOutcome",
    "Match",
    "PolicyEngine",
    "PolicySource",
    "RecordLog",
    "SignedDecision",
]
