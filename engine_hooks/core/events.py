"""Engine events and the hook's audit trail: what the hook appends to the audit log, and when it is durable.

- :class:`EventJob` is an engine event as the scheduler thread queued it (its time and plain
  fields); :func:`sign_event_job` builds and signs it off the scheduler thread (the decision
  thread, or the decision process), in order after the decisions queued before it (the vLLM
  ``take_events`` pattern: no signing on the scheduler thread).
- :class:`AuditTrail` is the writer side in the scheduler process: every decision record and
  engine event is appended to the audit log, which only queues it (its own writer thread makes
  it durable, group commit, never the scheduler); it keeps the allow decisions' tickets
  (:meth:`AuditTrail.decision_durable`), signs the events it is handed
  (:meth:`AuditTrail.sign`), and is the one place that declares the log broken (semantic reuse
  off, serving cold).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from engine_hooks.core.metrics import HookMetrics
from engine_hooks.core.settings import HookConfigError, HookSettings
from semgov.audit.keyring import AuditKeyring
from semgov.audit.store import AuditLog, Ticket
from semgov.decide import SignedDecision
from semgov.errors import SemgovError
from semgov.log import describe_error, get_logger
from semgov.signing.engine_events import SignedEvent, engine_event, sign_engine_event
from semgov.signing.keys import SigningKey

_MAX_TICKETS = 4096


@dataclass(frozen=True, slots=True)
class EventJob:
    """An engine event as the scheduler thread queued it: built and signed on the decision thread."""

    kind: str
    at: datetime
    fields: dict[str, Any]


def sign_event_job(job: EventJob, engine_name: str, key: SigningKey) -> SignedEvent:
    """Build and sign one queued engine event (the decision thread, or the decision process)."""
    f = job.fields
    return sign_engine_event(
        engine_event(
            job.kind,
            engine=engine_name,
            request_id=f["request_id"],
            decision_id=f["decision_id"],
            donor_id=f["donor_id"],
            materialized_tokens=f["materialized_tokens"],
            slots=list(f["slots"]),
            spans=list(f["spans"]),
            detail=f["detail"],
            at=job.at,
        ),
        key,
    )


def open_audit_log(settings: HookSettings, signing_key: SigningKey) -> AuditLog:
    """The hook's audit log (``SEMGOV_AUDIT_DIR``, checkpoints signed with the hook's key, origin
    ``SEMGOV_AUDIT_ORIGIN`` or the log's own: unique per log, no longer one constant for every hook)."""
    try:
        audit_keyring = AuditKeyring.load(settings.audit_keyring) if settings.audit_keyring else None
        return AuditLog.open(
            settings.audit_dir, signing_key=signing_key, origin=settings.audit_origin, keyring=audit_keyring
        )
    except ValueError as e:
        raise HookConfigError(f"SEMGOV_AUDIT_ORIGIN={settings.audit_origin!r}: {e}") from e
    except (OSError, SemgovError) as e:
        raise HookConfigError(f"SEMGOV_AUDIT_DIR={settings.audit_dir}: cannot open the audit log: {e}") from e


class AuditTrail:
    """The hook's side of its audit log: appends, the allows' tickets, event signing, and the
    log's broken state (``broken``: why, once any append or write failed; ``failures``: a count)."""

    def __init__(
        self,
        log: AuditLog,
        audit_dir: Path,
        engine_name: str,
        signing_key: SigningKey,
        metrics: HookMetrics | None = None,
    ) -> None:
        self.log = log
        self.metrics = metrics
        self.audit_dir = audit_dir
        self.engine_name = engine_name
        self.signing_key = signing_key
        self.broken: str | None = None
        self.failures = 0
        self._tickets: OrderedDict[str, Ticket] = OrderedDict()
        self._tickets_lock = threading.Lock()

    def put(self, decision: SignedDecision) -> None:
        """Queue one decision record for the audit log; keep an allow's ticket (durability).

        The hook's :class:`semgov.typing.DecisionSink`: decisions made in this process and those
        the decision process sends back both end here.
        """
        ticket = self.append(decision.canonical)
        if ticket is not None and self.metrics is not None:
            self.metrics.decision(decision.record)
        if ticket is not None and decision.decision == "allow":
            with self._tickets_lock:
                self._tickets[str(decision.record["decision_id"])] = ticket
                while len(self._tickets) > _MAX_TICKETS:
                    self._tickets.popitem(last=False)

    def record_decisions(self, decisions: list[SignedDecision]) -> list[SignedDecision]:
        """:meth:`put` each decision, in order."""
        for d in decisions:
            self.put(d)
        return decisions

    def record_shadow(self, records: list[SignedDecision]) -> None:
        """Queue shadow decision records for the audit log.

        NOTE: no ticket is kept: nothing ever waits for a shadow record, nothing acts on one.
        """
        for r in records:
            self.append(r.canonical)

    def decision_durable(self, decision_id: str, timeout: float) -> bool:
        """Whether an allow decision's record is durable in the audit log (waits up to ``timeout``).

        NOTE: a realization happens only after the record that allowed it is durable: a reuse
        whose decision could be lost in a crash or a full disk is not made.
        """
        with self._tickets_lock:
            ticket = self._tickets.get(decision_id)
        if ticket is None or self.broken is not None:
            return False
        try:
            done = ticket.done() or ticket.wait(timeout)  # wait(0) polls, and raises if the writer failed
        except Exception as e:  # noqa: BLE001 - the writer failed: the log is broken
            self.fail(e)
            return False
        if done:
            with self._tickets_lock:
                self._tickets.pop(decision_id, None)
        return bool(done)

    def sign(self, job: EventJob) -> SignedEvent | None:
        """Build, sign and append one engine event (the decision thread, or the caller without one)."""
        try:
            signed = sign_event_job(job, self.engine_name, self.signing_key)
        except Exception as e:  # noqa: BLE001 - auditing must not take the scheduler down
            self.not_audited(job.kind, describe_error(e), job.fields)
            return None
        self.append(signed.canonical)
        return signed

    def not_audited(self, kind: str | None, error: str, fields: dict[str, Any] | None = None) -> None:
        """An engine event that could not be built or signed: counted and logged (with the request,
        decision and donor it names), never raised."""
        self.failures += 1
        ids = {k: fields.get(k) for k in ("request_id", "decision_id", "donor_id")} if fields else {}
        get_logger().error("semgov engine event not audited", kind=kind, error=error, **ids)

    def append(self, record: bytes) -> Ticket | None:
        try:
            return self.log.append(record)  # queues only; the log's writer thread does the I/O
        except Exception as e:  # noqa: BLE001 - loud, counted, and the engine keeps serving cold
            self.fail(e)
            return None

    def fail(self, e: BaseException) -> None:
        self.failures += 1
        if self.broken is None:
            self.broken = describe_error(e)
            get_logger().error(
                "semgov audit log failed: semantic reuse is off, serving cold",
                audit_dir=str(self.audit_dir),
                error=self.broken,
            )

    def close(self) -> None:
        """Close the audit log (flushes, checkpoints); raises its error if accepted records could not
        be made durable."""
        self.log.close()
