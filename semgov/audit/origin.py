"""The log's origin: the name every checkpoint and seal of one log carries, unique per log.

A C2SP checkpoint's first line names the log it belongs to; a proof bundle is bound to that
name (its checkpoint is signed over it), so two logs must never share one. The writer takes the
origin it is given (``AuditLog.open(origin=...)``, ``semgov check --audit-origin``,
``SEMGOV_AUDIT_ORIGIN``) or, by default, the log directory's own: the ``origin`` file, written
once when the log is created, holding ``semgov/<128 random bits, hex>`` (stable across restarts
of the same log, distinct between logs).

Logs written before the ``origin`` file existed (the SGLang hook's constant ``semgov-hook``,
``semgov check``'s ``semgov/<key id>``) keep the origin their latest checkpoint (or, before the
first checkpoint, their first seal) names: an origin never changes within a log, so their
proofs still verify, against that (shared) name. The file is written for them on the next open.

The file is a name, not a secret and not trusted: a changed ``origin`` file makes the writer
refuse a log whose checkpoints name another (denial of service only), and ``verify`` reads the
origin from the signed checkpoints, never from the file.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Final

from semgov.audit.errors import AuditLogError, CheckpointConflictError
from semgov.audit.frames import CHECKPOINT_FILE, CHECKPOINTS_DIR, FRAME_HEADER, MAX_RECORD_BYTES, SEAL_FLAG
from semgov.audit.note import Checkpoint, NoteError, unverified_checkpoint
from semgov.audit.reader import note_sizes

#: The file in a log directory that names its origin (one line).
ORIGIN_FILE: Final = "origin"
#: The origin every SGLang hook process used before logs had their own (still read).
LEGACY_HOOK_ORIGIN: Final = "semgov-hook"
_MAX_ORIGIN = 256


def new_origin() -> str:
    """A fresh origin, unique to one log: ``semgov/`` and 128 random bits in hex."""
    return f"semgov/{secrets.token_hex(16)}"


def check_origin(origin: object, *, what: str = "origin") -> str:
    """``origin`` if it can be a checkpoint's origin line (one printable line, at most 256 characters)."""
    if not isinstance(origin, str) or not origin or len(origin) > _MAX_ORIGIN:
        raise ValueError(f"{what} must be a non-empty line of at most {_MAX_ORIGIN} characters")
    try:
        Checkpoint(origin, 0, bytes(32))
    except NoteError as e:
        raise ValueError(f"{what} {origin!r}: {e}") from None
    return origin


def read_origin_file(directory: Path) -> str | None:
    """The origin the directory's ``origin`` file names, or None when there is none."""
    path = directory / ORIGIN_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise AuditLogError(f"cannot read the log's origin file: {e.strerror}", source=str(path)) from e
    try:
        return check_origin(data.decode("utf-8").removesuffix("\n"), what="the origin file")
    except (UnicodeDecodeError, ValueError) as e:
        raise AuditLogError(f"malformed origin file: {e}", source=str(path)) from None


def origin_in_log(directory: Path, log_fd: int) -> str | None:
    """The origin an existing log already names (unverified): its latest checkpoint's, else its
    first seal's; None for a log with neither (a new one)."""
    notes = [directory / CHECKPOINT_FILE]
    sizes = note_sizes(directory)
    if sizes:
        notes.append(directory / CHECKPOINTS_DIR / f"{sizes[-1]}.note")
    for path in notes:
        try:
            return unverified_checkpoint(path.read_bytes())[0].origin
        except (OSError, NoteError):
            continue
    return _first_seal_origin(log_fd)


def _first_seal_origin(log_fd: int) -> str | None:
    """The origin of the first seal frame in records.log (reading headers only until it)."""
    off, hsize, end = 0, FRAME_HEADER.size, os.fstat(log_fd).st_size
    while off + hsize <= end:
        field, length, _ = FRAME_HEADER.unpack(os.pread(log_fd, hsize, off))
        if length > MAX_RECORD_BYTES or off + hsize + length > end:
            return None
        if field & SEAL_FLAG:
            try:
                return unverified_checkpoint(os.pread(log_fd, length, off + hsize))[0].origin
            except NoteError:
                return None
        off += hsize + length
    return None


def resolve_origin(directory: Path, log_fd: int, configured: str | None) -> tuple[str, bool]:
    """The origin the writer signs with, and whether the ``origin`` file must be written.

    ``configured`` wins; it must agree with an existing ``origin`` file (else another log's
    directory: refused). Without it: the file's, else what an existing log already names, else a
    fresh :func:`new_origin`. Recovery then checks the origin against the signed checkpoint.
    """
    on_file = read_origin_file(directory)
    if configured is not None:
        check_origin(configured)
        if on_file is not None and on_file != configured:
            raise CheckpointConflictError(
                f"the log's origin is {on_file!r} ({ORIGIN_FILE} file), not the configured {configured!r}: "
                "another log's directory? (leave the origin unset to use the log's own)",
                source=str(directory / ORIGIN_FILE),
            )
        return configured, on_file is None
    if on_file is not None:
        return on_file, False
    return origin_in_log(directory, log_fd) or new_origin(), True
