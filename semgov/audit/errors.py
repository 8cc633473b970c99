"""The errors of an audit log: opening, reading, recovering and writing it.

Their own module (pure: no I/O) because the readers, crash recovery, the writer and verification
all raise or catch them, and none of these should have to import the writer to do so.
"""

from __future__ import annotations

from semgov.errors import SemgovError


class AuditLogError(SemgovError):
    """An audit log cannot be opened, read or written."""


class LogLockedError(AuditLogError):
    """Another writer holds the log's ``LOCK``."""


class CorruptLogError(AuditLogError):
    """A frame that is not the torn tail of the log is bad: the log is refused, never repaired."""

    def __init__(self, message: str, *, source: str, index: int, offset: int, reason: str) -> None:
        super().__init__(message, source=source)
        self.index = index
        self.offset = offset
        self.reason = reason


class TornTailError(AuditLogError):
    """The log ends inside a frame (or its last frame is damaged): a write cut short.

    Raised by readers after every complete record before it was yielded; a writer opening the
    log cuts the tail off (see :class:`~semgov.audit.recovery.Recovery`).
    """

    def __init__(
        self, message: str, *, source: str, index: int, offset: int, reason: str, tail_bytes: int
    ) -> None:
        super().__init__(message, source=source)
        self.index = index
        self.offset = offset
        self.reason = reason
        self.tail_bytes = tail_bytes


class UnsealedRecordsError(CorruptLogError):
    """Frames ``state.json`` calls acknowledged that no seal or checkpoint by a trusted key covers.

    A writer acknowledges a record only after its seal is durable, so these frames were appended
    by someone else (a replay with a forged ``state.json``), lost their seal, come from a log
    written before seals, or were sealed by a key the writer was not given. Refused, untouched.
    """


class CheckpointConflictError(AuditLogError):
    """The log does not extend the last signed checkpoint: writing would sign a fork."""


class AuditWriteError(AuditLogError):
    """The writer thread failed (disk full, I/O error, ...). Nothing more is accepted."""
