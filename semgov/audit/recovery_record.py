"""The signed record a recovery leaves in the log: ``semgov.audit_recovery/v1``.

When opening a log cuts anything off (:mod:`semgov.audit.recovery`: a torn write, frames no
trusted seal covers, or sealed batches rolled back to an older seal or checkpoint), the writer
appends one of these as the first record after the cut, signed with its key like every other
record, and makes it durable before :meth:`~semgov.audit.store.AuditLog.open` returns. So the
log itself says, to anyone who verifies or reviews it (``semgov audit verify``, ``show``,
``report``), what was cut, where it went, and why; a recovery can no longer pass unnoticed.

Fields: ``schema``, ``recovery_id`` (random, hex), ``kind`` (always ``audit_recovery``: the
review tools list it with the log's events), ``cause`` (``torn_write``: an incomplete frame and
no complete record, a crash mid-write; ``unsealed_frames``: complete records no seal covers,
a crash mid-write or someone else's frames; ``rollback``: seal frames were cut too, the writer
went back to an older seal or checkpoint), ``at`` (RFC 3339 UTC), ``origin``, ``resumed``
(``size``, ``log_bytes``, ``root`` hex and ``from``: ``seal``, ``checkpoint`` or ``start``),
``cut`` (``first_record``, ``records``, ``bytes``, ``offset``, ``seals``, ``untrusted_signers``,
``torn``, ``quarantine_file`` (its name in ``quarantine/``), ``sha256`` of the bytes cut),
``checkpoint_size`` (the last signed checkpoint found), ``detail`` (one sentence), ``key_id``,
``signature`` (Ed25519 over the RFC 8785 form without ``signature``, as every record).
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from semgov.wire.timefmt import rfc3339

if TYPE_CHECKING:
    from semgov.audit.recovery import Recovery
    from semgov.signing.keys import SigningKey

RECOVERY_SCHEMA: Final = "semgov.audit_recovery/v1"
RECOVERY_KIND: Final = "audit_recovery"
CAUSES: Final = ("torn_write", "unsealed_frames", "rollback")


def cause_of(rec: Recovery) -> str:
    """Why the tail was cut, as the record's ``cause`` (module docstring)."""
    if rec.cut_seals:
        return "rollback"
    return "unsealed_frames" if rec.quarantined_records else "torn_write"


def _detail(rec: Recovery, cause: str) -> str:
    first = rec.size
    n = rec.quarantined_records
    what = f"record {first}" if n == 1 else f"records {first}..{first + n - 1}"
    signers = ", ".join(rec.untrusted_signers) or "no key the writer trusts, or past what it looks back on"
    why = {
        "torn_write": "an incomplete frame after the last seal (a crash mid-write)",
        "unsealed_frames": "no trusted seal covers them (a crash mid-write, or someone else's frames)",
        "rollback": (
            f"{rec.cut_seals} seal(s) were cut with them (signed by {signers}): "
            f"the log was rolled back to its last trusted {rec.resumed_from}"
        ),
    }[cause]
    what = what if n else "no complete record"
    return (
        f"recovery on open cut {rec.truncated_bytes} bytes at offset {rec.truncated_at} ({what}) to "
        f"quarantine/{Path(rec.quarantine_file).name}: {why}; the log resumes at {rec.size} records"
    )


def recovery_body(rec: Recovery, *, origin: str, at: datetime | None = None) -> dict[str, Any]:
    """The unsigned ``semgov.audit_recovery/v1`` record for a recovery that cut something."""
    cause = cause_of(rec)
    return {
        "schema": RECOVERY_SCHEMA,
        "recovery_id": secrets.token_hex(16),
        "kind": RECOVERY_KIND,
        "cause": cause,
        "at": rfc3339(at or datetime.now(UTC)),
        "origin": origin,
        "resumed": {
            "size": rec.size,
            "log_bytes": rec.log_bytes,
            "root": rec.root.hex(),
            "from": rec.resumed_from,
        },
        "cut": {
            "first_record": rec.size,
            "records": rec.quarantined_records,
            "bytes": rec.truncated_bytes,
            "offset": rec.truncated_at,
            "seals": rec.cut_seals,
            "untrusted_signers": list(rec.untrusted_signers),
            "torn": rec.torn_reason,
            "quarantine_file": Path(rec.quarantine_file).name,
            "sha256": rec.quarantine_sha256,
        },
        "checkpoint_size": rec.checkpoint_size,
        "detail": _detail(rec, cause),
    }


def sign_recovery(body: dict[str, Any], key: SigningKey) -> bytes:
    """The signed record's canonical bytes (the log's leaf), signed as every record is."""
    from semgov.signing.canonical import canonicalize_record, with_member  # NOTE: not on show's start-up

    unsigned = {**body, "key_id": key.key_id}
    message = canonicalize_record(unsigned)
    return with_member(message, unsigned, "signature", key.sign(message))


def describe(rec: dict[str, Any]) -> str:
    """One line for a reviewer about a recovery record read from a log (never raises)."""
    cut = rec.get("cut") if isinstance(rec.get("cut"), dict) else {}
    assert isinstance(cut, dict)
    return (
        f"{rec.get('cause')} at {rec.get('at')}: {cut.get('records')} record(s), {cut.get('bytes')} bytes "
        f"cut to quarantine/{cut.get('quarantine_file')} (sha256 {str(cut.get('sha256'))[:16]}...); "
        f"{rec.get('detail')}"
    )
