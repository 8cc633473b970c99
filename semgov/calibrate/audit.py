"""What the server's own audit log says a calibration request got: its decisions and realizations.

A calibration run counts a reuse only from the engine's signed records, never from what it
asked for: :class:`ServerAudit` follows the log directories of the server (one per worker of a
fleet) with :class:`~semgov.audit.reader.AuditTail`, verifies each decision record and engine
event it uses against the trust keyring (an unsigned or foreign record stops the run), and
indexes them by the request id the engine recorded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from semgov.audit.reader import AuditTail
from semgov.audit.verify import verify_leaf
from semgov.errors import SemgovError
from semgov.signing.keys import Keyring

_DECISION = "semgov.decision/"
_EVENT = "semgov.engine_event/"


@dataclass(slots=True)
class Outcome:
    """One request's decisions and what the engine did with its allows."""

    decisions: list[dict[str, Any]] = field(default_factory=list)
    realized: dict[str, int] = field(default_factory=dict)  # decision id -> tokens copied
    failed: dict[str, str] = field(default_factory=dict)  # decision id -> realization_failed detail

    @property
    def allows(self) -> list[dict[str, Any]]:
        return [d for d in self.decisions if d.get("decision") == "allow"]

    @property
    def settled(self) -> bool:
        """Every allow has its outcome (a realization, or why not)."""
        return all(str(d["decision_id"]) in self.realized or str(d["decision_id"]) in self.failed
                   for d in self.allows)  # fmt: skip

    @property
    def realized_tokens(self) -> int:
        return sum(self.realized.values())

    @property
    def approved_tokens(self) -> int:
        return sum(int(d.get("approved_tokens", 0)) for d in self.allows)

    def revisions(self) -> set[str]:
        return {str(d.get("policy", {}).get("revision")) for d in self.decisions}


class ServerAudit:
    """The server's audit logs, followed: :meth:`outcome` of a request id once it is in them."""

    def __init__(self, directories: Sequence[Path], keyring: Keyring) -> None:
        if not directories:
            raise SemgovError(
                "no audit directory: a calibration run reads the server's own log", field="--audit"
            )
        for d in directories:
            if not Path(d).is_dir():
                raise SemgovError(
                    "not a directory (the server's SEMGOV_AUDIT_DIR)", source=str(d), field="--audit"
                )
        self.tails = [AuditTail(Path(d)) for d in directories]
        self.keys = keyring.trusted()
        self.by_rid: dict[str, Outcome] = {}
        self._decision_rid: dict[str, str] = {}

    def poll(self) -> None:
        for tail in self.tails:
            for leaf in tail.poll_raw():
                self._take(leaf, tail.directory)

    def _take(self, leaf: bytes, where: Path) -> None:
        try:
            rec = json.loads(leaf)
        except ValueError:
            rec = None
        if not isinstance(rec, dict):
            raise SemgovError("a record of the log is not a JSON object", source=str(where))
        schema = str(rec.get("schema", ""))
        kind = rec.get("kind")
        if not schema.startswith(_DECISION) and not (
            schema.startswith(_EVENT) and kind in ("realization", "realization_failed")
        ):
            return
        why = verify_leaf(leaf, self.keys)
        if why is not None:
            raise SemgovError(
                f"a record the run would count does not verify with --trust: {why} (is this the "
                "server's audit log, and --trust the keyring its SEMGOV_TRUST names?)",
                source=str(where),
            )
        if schema.startswith(_DECISION):
            rid = str(rec.get("request_id"))
            self.by_rid.setdefault(rid, Outcome()).decisions.append(rec)
            self._decision_rid[str(rec.get("decision_id"))] = rid
        else:
            did = str(rec.get("decision_id"))
            rid = str(rec.get("request_id") or self._decision_rid.get(did, ""))
            out = self.by_rid.setdefault(rid, Outcome())
            if rec["kind"] == "realization":
                out.realized[did] = out.realized.get(did, 0) + int(rec.get("materialized_tokens", 0))
            else:
                out.failed.setdefault(did, str(rec.get("detail", ""))[:300])

    def outcome(self, rid: str, *, expect_decision: bool, wait_s: float) -> Outcome:
        """What the log says of ``rid``, waiting up to ``wait_s`` for its decisions (when one is
        expected) and for every allow's realization or its failure, then once more for stragglers."""
        deadline = time.monotonic() + wait_s
        while True:
            self.poll()
            out = self.by_rid.get(rid)
            ready = out is not None and out.settled and (out.decisions or not expect_decision)
            if ready or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        time.sleep(0.2)
        self.poll()  # NOTE: a region realized after the first may be a batch behind
        return self.by_rid.get(rid, Outcome())
