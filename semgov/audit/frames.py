"""The on-disk format of an audit log directory: its file names, and the frame codec of ``records.log``.

Pure: encoding frames, checking a frame's bytes, naming what is wrong with one; no file access
(the readers in :mod:`semgov.audit.reader` and the writer in :mod:`semgov.audit.store` do that).

A log directory (default ``./audit/log/``) holds:

- ``LOCK``: held with ``flock(LOCK_EX | LOCK_NB)`` by the one writer (its pid is written
  inside, for the error message a second writer gets). Readers never take it.
- ``records.log``: frames ``index (8 bytes, big-endian) | length (4 bytes) | SHA-256(index ||
  payload) (32 bytes) | payload``. A *record frame* carries a record: record ``i`` of the file
  is leaf ``i`` of the Merkle tree (RFC 6962 leaf hash of the record bytes, i.e. of the
  canonical signed decision record); the index in the hashed frame makes a deleted, inserted or
  moved frame fail where it happened. A *seal frame* (index field ``2^63 | size``) carries a
  C2SP signed checkpoint note for the tree of the ``size`` records before it, signed by the
  writer's key: every batch the writer commits ends with one (see :mod:`semgov.audit.store`).
- ``state.json``: ``{"size", "log_bytes", "frontier", "checkpoint_size", "seal_offset"}``,
  rewritten atomically after every batch. It only speeds up opening; the log is the truth.
- ``checkpoint``: the latest signed checkpoint (a C2SP signed note), replaced atomically;
  ``checkpoints/<size>.note`` keeps every one, written once.
- ``quarantine/``: frames the writer found after the last seal it can verify, moved here
  verbatim on open (never deleted): a write cut short by a crash, or frames someone else
  appended (a replay of genuine records).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from semgov.audit.errors import AuditLogError, CorruptLogError, TornTailError

LOCK_FILE: Final = "LOCK"
LOG_FILE: Final = "records.log"
STATE_FILE: Final = "state.json"
CHECKPOINT_FILE: Final = "checkpoint"
CHECKPOINTS_DIR: Final = "checkpoints"
QUARANTINE_DIR: Final = "quarantine"

#: Frame header: leaf index (big-endian uint64), record length (uint32), and SHA-256 of the
#: index (8 bytes, big-endian) followed by the record. The index makes a deleted, inserted or
#: reordered frame fail right where it happened, naming the record index.
FRAME_HEADER: Final = struct.Struct(">QI32s")
#: The index field alone, as it is hashed with the payload.
INDEX: Final = struct.Struct(">Q")
#: The index field of a seal frame: this bit, or'ed with the tree size the seal signs.
SEAL_FLAG: Final = 1 << 63
#: Largest record :meth:`~semgov.audit.store.AuditLog.append` accepts; a frame claiming more is corrupt.
MAX_RECORD_BYTES: Final = 64 * 1024 * 1024


def record_header(index: int, record: bytes) -> bytes:
    """The header of the record frame holding ``record`` as record ``index``."""
    return FRAME_HEADER.pack(index, len(record), hashlib.sha256(INDEX.pack(index) + record).digest())


def seal_frame(size: int, note: bytes) -> bytes:
    """The seal frame for the tree of ``size`` records: header (index field ``SEAL_FLAG | size``), note."""
    field = SEAL_FLAG | size
    return FRAME_HEADER.pack(field, len(note), hashlib.sha256(INDEX.pack(field) + note).digest()) + note


def note_files(names: Iterable[str]) -> list[str]:
    """The ``<size>.note`` file names among ``names`` (a listing of ``checkpoints/``), by size."""
    # NOTE: ASCII digits only: str.isdigit() is also true of "²" or "٣", which int() refuses.
    numbered = [n for n in names if n.endswith(".note") and n[:-5].isascii() and n[:-5].isdigit()]
    return sorted(numbered, key=lambda n: int(n[:-5]))


@dataclass(frozen=True)
class BadFrame:
    """The first bad frame a reader met, and what is wrong with it."""

    index: int  # index the bad frame's record would have (records before it)
    offset: int  # byte offset of the bad frame
    kind: str  # short_header | short_body | bad_length | hash_mismatch | index_mismatch | bad_index_field
    # | seal_misplaced
    reason: str
    frame_end: int | None  # where the frame claims to end (None: header unreadable)


def check_frame(
    index: int, off: int, end: int, frame_index: int, digest: bytes, payload: bytes
) -> BadFrame | None:
    """Why the frame at ``off`` (``index`` records before it) is bad, or None."""
    sha256, pack_index = hashlib.sha256, INDEX.pack
    if frame_index & SEAL_FLAG:
        if sha256(pack_index(frame_index) + payload).digest() == digest:
            claimed = frame_index ^ SEAL_FLAG
            if claimed == index:
                return None
            why = f"seal for size {claimed} where {index} records precede it (moved, or records deleted?)"
            return BadFrame(index, off, "seal_misplaced", why, end)
        if sha256(pack_index(frame_index ^ SEAL_FLAG) + payload).digest() == digest:
            return BadFrame(index, off, "bad_index_field", f"frame's index field says {frame_index}", end)
        return BadFrame(index, off, "hash_mismatch", "frame SHA-256 does not match", end)
    if sha256(pack_index(index) + payload).digest() != digest:
        if frame_index != index and sha256(pack_index(frame_index) + payload).digest() == digest:
            why = f"frame holds record {frame_index} where record {index} belongs (deleted, moved?)"
            return BadFrame(index, off, "index_mismatch", why, end)
        return BadFrame(index, off, "hash_mismatch", "record SHA-256 does not match", end)
    if frame_index != index:  # record and hash intact, the header's index field altered
        return BadFrame(
            index, off, "bad_index_field", f"frame's index field says {frame_index}, not {index}", end
        )
    return None


def frame_error(source: str, bad: BadFrame, file_size: int, *, torn: bool) -> AuditLogError:
    """The error for ``bad`` in the log file ``source``: a torn tail, or corruption."""
    if torn:
        return TornTailError(
            f"torn tail: record {bad.index} at byte offset {bad.offset} is incomplete "
            f"({bad.reason}); {file_size - bad.offset} bytes after the last complete record",
            source=source,
            index=bad.index,
            offset=bad.offset,
            reason=bad.reason,
            tail_bytes=file_size - bad.offset,
        )
    return CorruptLogError(
        f"corrupt record {bad.index} at byte offset {bad.offset}: {bad.reason} "
        "(not the tail of an interrupted write; refusing to use or repair the log)",
        source=source,
        index=bad.index,
        offset=bad.offset,
        reason=bad.reason,
    )
