"""The durable, append-only, single-writer audit log of signed decision records.

A log directory (default ``./audit/log/``) holds:

- ``LOCK``: held with ``flock(LOCK_EX | LOCK_NB)`` by the one writer (its pid is written
  inside, for the error message a second writer gets). Readers never take it.
- ``records.log``: frames ``index (8 bytes, big-endian) | length (4 bytes) | SHA-256(index ||
  payload) (32 bytes) | payload``. A *record frame* carries a record: record ``i`` of the file
  is leaf ``i`` of the Merkle tree (RFC 6962 leaf hash of the record bytes, i.e. of the
  canonical signed decision record); the index in the hashed frame makes a deleted, inserted or
  moved frame fail where it happened. A *seal frame* (index field ``2^63 | size``) carries a
  C2SP signed checkpoint note for the tree of the ``size`` records before it, signed by the
  writer's key: every batch the writer commits ends with one (see Writing).
- ``state.json``: ``{"size", "log_bytes", "frontier", "checkpoint_size", "seal_offset"}``,
  rewritten atomically after every batch. It only speeds up opening; the log is the truth.
- ``checkpoint``: the latest signed checkpoint (a C2SP signed note), replaced atomically;
  ``checkpoints/<size>.note`` keeps every one, written once.
- ``quarantine/``: frames the writer found after the last seal it can verify, moved here
  verbatim on open (never deleted): a write cut short by a crash, or frames someone else
  appended (a replay of genuine records).

Writing: :meth:`AuditLog.append` only queues the record and returns a :class:`Ticket` carrying
the record's index. One writer thread drains the queue in batches (group commit): it signs one
seal for the tree after the batch (one Ed25519 signature per batch, never on the caller's
path), does one ``write`` of the batch's frames and its seal and one ``fsync``; then the
tickets become durable, ``state.json`` is rewritten, and a checkpoint is signed every
``checkpoint_every`` records, every ``checkpoint_interval`` seconds and on :meth:`AuditLog.close`.

Why seals: a frame's SHA-256 is no proof of who wrote it (anyone can compute it), so frames
appended by someone else would look like the writer's own. A seal can only be made with the
writer's key; a record is acknowledged only after its seal is on disk; so complete frames after
the last valid seal were never acknowledged by any writer holding a trusted key.

Recovery on open: the writer finds the last seal (or checkpoint) signed by a key it trusts (its
own, or one in the ``keyring`` it was given, e.g. the key before a rotation) whose tree matches
the frames before it. Everything after it is moved to ``quarantine/`` and cut off, and reported
(:attr:`AuditLog.recovery`), so no checkpoint is ever signed over frames the writer cannot prove
were written by a trusted writer. Refused instead, and left untouched: a bad frame that is not
the tail of an interrupted write (corruption: the record index and byte offset are named); a
seal signed by a trusted key over another tree than the records before it (acknowledged records
altered in place, or a genuine seal copied in); a log shorter than ``state.json`` says was
acknowledged (records cut off); unsealed frames that ``state.json`` says were acknowledged
durable (a replay with a forged ``state.json``, a removed seal, a log written before seals, or a
rotated key the writer was not given); a log holding fewer records than the last signed
checkpoint, or whose prefix no longer hashes to that checkpoint's root; a latest checkpoint not
signed by a trusted key.

Reading: :func:`iter_records` and :func:`read_checkpoint` take no lock and write nothing.
"""

from __future__ import annotations

import collections
import errno
import fcntl
import hashlib
import json
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from semgov._internal import strictjson
from semgov._internal.log import get_logger
from semgov.audit.keyring import AuditKeyring
from semgov.audit.keyring import key_name_for as key_name_for
from semgov.audit.merkle import Frontier, leaf_hash
from semgov.audit.note import Checkpoint, NoteError, open_note, sign_checkpoint, unverified_checkpoint
from semgov.errors import SemgovError
from semgov.keys import SigningKey

DEFAULT_DIRECTORY: Final = Path("audit") / "log"
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
_INDEX: Final = struct.Struct(">Q")
#: The index field of a seal frame: this bit, or'ed with the tree size the seal signs.
SEAL_FLAG: Final = 1 << 63
#: Seals remembered while re-reading a log (newest first they are tried as the anchor).
_SEALS_KEPT: Final = 64
#: Largest record :meth:`AuditLog.append` accepts; a frame claiming more is corrupt.
MAX_RECORD_BYTES: Final = 64 * 1024 * 1024

_READ_CHUNK: Final = 1 << 20


# ---------------------------------------------------------------------------------------------
# Errors


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
    log cuts the tail off (see :class:`Recovery`).
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


# ---------------------------------------------------------------------------------------------
# Frames


def seal_frame(size: int, note: bytes) -> bytes:
    """The seal frame for the tree of ``size`` records: header (index field ``SEAL_FLAG | size``), note."""
    field = SEAL_FLAG | size
    return FRAME_HEADER.pack(field, len(note), hashlib.sha256(_INDEX.pack(field) + note).digest()) + note


@dataclass(frozen=True)
class _BadFrame:
    index: int  # index the bad frame's record would have (records before it)
    offset: int  # byte offset of the bad frame
    kind: str  # short_header | short_body | bad_length | hash_mismatch | index_mismatch | bad_index_field
    # | seal_misplaced
    reason: str
    frame_end: int | None  # where the frame claims to end (None: header unreadable)


#: Called for each seal frame: (records before it, frame offset, frame end, the note).
SealCallback = Callable[[int, int, int, bytes], None]


class _Walker:
    """Iterate the record frames of ``f`` up to ``file_size``; afterwards ``bad`` names the first bad one.

    Yields ``(index, offset, record)`` for every complete, hash-valid record frame in order,
    calls ``on_seal`` for every complete, hash-valid seal frame standing where its size says, and
    stops at the first frame that is neither.
    """

    def __init__(self, f: BinaryIO, file_size: int, on_seal: SealCallback | None = None) -> None:
        self._f = f
        self.file_size = file_size
        self.on_seal = on_seal
        self.bad: _BadFrame | None = None
        self.end = 0  # end of the last good frame
        self.count = 0  # records

    def __iter__(self) -> Iterator[tuple[int, int, bytes]]:
        f, size, hsize = self._f, self.file_size, FRAME_HEADER.size
        unpack = FRAME_HEADER.unpack
        off, index = 0, 0
        f.seek(0)
        while off < size:
            if size - off < hsize:
                self.bad = _BadFrame(
                    index, off, "short_header", f"{size - off} bytes, less than a frame header", None
                )
                break
            frame_index, length, digest = unpack(f.read(hsize))
            end = off + hsize + length
            if length > MAX_RECORD_BYTES:
                self.bad = _BadFrame(index, off, "bad_length", f"frame length {length} is too large", end)
                break
            if end > size:
                self.bad = _BadFrame(
                    index, off, "short_body", f"frame needs {length} bytes, {size - off - hsize} left", end
                )
                break
            payload = f.read(length)
            if len(payload) != length:  # the file shrank under us
                self.bad = _BadFrame(index, off, "short_body", "file ended while reading the record", end)
                break
            self.bad = _check_frame(index, off, end, frame_index, digest, payload)
            if self.bad is not None:
                break
            if frame_index & SEAL_FLAG:
                if self.on_seal is not None:
                    self.on_seal(index, off, end, payload)
            else:
                yield index, off, payload
                index += 1
            off = end
            self.end, self.count = off, index


def _check_frame(
    index: int, off: int, end: int, frame_index: int, digest: bytes, payload: bytes
) -> _BadFrame | None:
    """Why the frame at ``off`` (``index`` records before it) is bad, or None."""
    sha256, pack_index = hashlib.sha256, _INDEX.pack
    if frame_index & SEAL_FLAG:
        if sha256(pack_index(frame_index) + payload).digest() == digest:
            claimed = frame_index ^ SEAL_FLAG
            if claimed == index:
                return None
            why = f"seal for size {claimed} where {index} records precede it (moved, or records deleted?)"
            return _BadFrame(index, off, "seal_misplaced", why, end)
        if sha256(pack_index(frame_index ^ SEAL_FLAG) + payload).digest() == digest:
            return _BadFrame(index, off, "bad_index_field", f"frame's index field says {frame_index}", end)
        return _BadFrame(index, off, "hash_mismatch", "frame SHA-256 does not match", end)
    if sha256(pack_index(index) + payload).digest() != digest:
        if frame_index != index and sha256(pack_index(frame_index) + payload).digest() == digest:
            why = f"frame holds record {frame_index} where record {index} belongs (deleted, moved?)"
            return _BadFrame(index, off, "index_mismatch", why, end)
        return _BadFrame(index, off, "hash_mismatch", "record SHA-256 does not match", end)
    if frame_index != index:  # record and hash intact, the header's index field altered
        return _BadFrame(
            index, off, "bad_index_field", f"frame's index field says {frame_index}, not {index}", end
        )
    return None


def _all_zero(f: BinaryIO, start: int, stop: int) -> bool:
    f.seek(start)
    left = stop - start
    while left > 0:
        chunk = f.read(min(left, _READ_CHUNK))
        if not chunk:
            return False
        if chunk.count(0) != len(chunk):
            return False
        left -= len(chunk)
    return True


def _is_torn_tail(bad: _BadFrame, f: BinaryIO, file_size: int, durable_bytes: int | None) -> bool:
    """Is ``bad`` the tail of an interrupted write (cut it off) rather than corruption (refuse)?

    NOTE: the writer fsyncs a batch's frames before ``state.json`` records their end
    (``durable_bytes``), and writes the next batch only after that. So when ``state.json`` is
    readable and no longer than the file, a crash can only have damaged bytes at or after
    ``durable_bytes``: a bad frame there is a torn tail (even a hole with whole frames after it,
    as a partly flushed write leaves), and one before it is corruption of data that was
    acknowledged durable. Without that bound, only a frame the file ends inside, a last frame
    whose hash does not match, or a bad frame followed by nothing but zero bytes (a file size
    extended before its data reached the disk) is taken as a torn tail.
    """
    if durable_bytes is not None:
        return bad.offset >= durable_bytes
    if bad.kind in ("short_header", "short_body"):
        return True
    if bad.kind == "hash_mismatch" and bad.frame_end == file_size:
        return True
    return _all_zero(f, bad.offset, file_size)


def _frame_error(directory: Path, bad: _BadFrame, file_size: int, *, torn: bool) -> AuditLogError:
    src = str(directory / LOG_FILE)
    if torn:
        return TornTailError(
            f"torn tail: record {bad.index} at byte offset {bad.offset} is incomplete "
            f"({bad.reason}); {file_size - bad.offset} bytes after the last complete record",
            source=src,
            index=bad.index,
            offset=bad.offset,
            reason=bad.reason,
            tail_bytes=file_size - bad.offset,
        )
    return CorruptLogError(
        f"corrupt record {bad.index} at byte offset {bad.offset}: {bad.reason} "
        "(not the tail of an interrupted write; refusing to use or repair the log)",
        source=src,
        index=bad.index,
        offset=bad.offset,
        reason=bad.reason,
    )


# ---------------------------------------------------------------------------------------------
# state.json and checkpoints


@dataclass(frozen=True)
class _State:
    size: int
    log_bytes: int
    frontier: Frontier
    checkpoint_size: int
    seal_offset: int | None  # byte offset of the last seal frame (None: no seal yet)


def _read_state(directory: Path) -> tuple[_State | None, str]:
    """The parsed ``state.json``, or None and why it is unusable."""
    path = directory / STATE_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None, "state.json is missing"
    except OSError as e:
        return None, f"state.json is unreadable ({e.strerror})"
    try:
        # NOTE: strict (no duplicate keys, NaN, lone surrogates, deep nesting): whatever is
        # wrong with the cache, the log is re-read instead (it is the truth).
        doc = strictjson.loads(raw)
        if not isinstance(doc, dict):
            raise ValueError(f"expected an object, got a JSON {type(doc).__name__}")
        size, log_bytes, cp_size = doc["size"], doc["log_bytes"], doc["checkpoint_size"]
        if not all(type(v) is int and v >= 0 for v in (size, log_bytes, cp_size)):
            raise ValueError("size, log_bytes and checkpoint_size must be non-negative integers")
        frontier = Frontier.from_json(doc["frontier"])
        if frontier.size != size:
            raise ValueError(f"frontier size {frontier.size} != size {size}")
        seal_offset = doc.get("seal_offset")
        if seal_offset is not None and not (type(seal_offset) is int and seal_offset >= 0):
            raise ValueError("seal_offset must be null or a non-negative integer")
    except KeyError as e:
        return None, f"state.json is malformed (no {e} member)"
    except (ValueError, TypeError) as e:
        return None, f"state.json is malformed ({e})"
    return _State(size, log_bytes, frontier, cp_size, seal_offset), ""


def _durable_bound(directory: Path, file_size: int) -> int | None:
    """``state.json``'s ``log_bytes`` when it can bound where a crash may have torn the log."""
    state, _ = _read_state(directory)
    if state is None or state.log_bytes > file_size:
        return None
    return state.log_bytes


def _parse_note_unverified(note: bytes, *, source: str) -> tuple[Checkpoint, list[str]]:
    """The checkpoint in a C2SP signed note and the key names that signed it, unverified."""
    try:
        return unverified_checkpoint(note)
    except NoteError as e:
        raise AuditLogError(f"not a signed checkpoint note: {e}", source=source) from e


def _note_sizes(directory: Path) -> list[int]:
    try:
        names = os.listdir(directory / CHECKPOINTS_DIR)
    except FileNotFoundError:
        return []
    # NOTE: ASCII digits only: str.isdigit() is also true of "²" or "٣", which int() refuses.
    return sorted(int(n[:-5]) for n in names if n.endswith(".note") and n[:-5].isascii() and n[:-5].isdigit())


# ---------------------------------------------------------------------------------------------
# Small durable-file helpers


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _durable_temp(directory: Path, name: str, data: bytes) -> Path:
    """Write ``data`` to ``directory/.name.tmp`` and fsync it; return its path."""
    tmp = directory / f".{name}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    return tmp


def _atomic_replace(dir_fd: int, directory: Path, name: str, data: bytes) -> None:
    """Replace ``directory/name`` with ``data``: temp file, fsync, rename, fsync directory."""
    os.replace(_durable_temp(directory, name, data), directory / name)
    os.fsync(dir_fd)


def _write_once(dir_fd: int, directory: Path, name: str, data: bytes) -> bytes | None:
    """Create ``directory/name`` with ``data`` unless it exists; return the existing bytes if so."""
    final = directory / name
    tmp = _durable_temp(directory, name, data)
    try:
        os.link(tmp, final)
    except FileExistsError:
        return final.read_bytes()
    finally:
        os.unlink(tmp)
    os.fsync(dir_fd)
    return None


def _open_dir(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


# ---------------------------------------------------------------------------------------------
# The writer


@dataclass(frozen=True)
class Recovery:
    """What opening the log found and did (also logged as a warning when not clean)."""

    size: int  # records in the log after recovery
    log_bytes: int  # bytes of records.log after recovery
    rebuilt: bool  # frontier re-hashed from the log (state.json missing, stale or wrong)
    rebuild_reason: str  # why (empty when not rebuilt)
    truncated_bytes: int  # bytes after the last trusted seal cut off, all kept in quarantine_file (0: none)
    truncated_at: int  # byte offset the tail was cut at (= log_bytes when truncated)
    torn_reason: str  # what was wrong with the frame the tail ended in (empty when it held whole frames only)
    checkpoint_size: int  # size of the last signed checkpoint found
    quarantined_records: int = (
        0  # complete record frames in that tail (never acknowledged by a trusted writer)
    )
    quarantine_file: str = ""  # where the tail's bytes were moved, verbatim (empty when nothing was cut)
    untrusted_signers: tuple[str, ...] = ()  # key names of seals in the tail that this writer does not trust

    @property
    def clean(self) -> bool:
        return not self.rebuilt and not self.truncated_bytes


class Ticket:
    """A queued record: its leaf index, and whether it is durable yet."""

    __slots__ = ("_log", "index")

    def __init__(self, log: AuditLog, index: int) -> None:
        self._log = log
        self.index = index

    def done(self) -> bool:
        """True once the record is fsynced (and the frontier covers it)."""
        return self._log._durable > self.index

    def wait(self, timeout: float | None = None) -> bool:
        """Block until durable (True) or ``timeout`` seconds pass (False).

        Raises :class:`AuditWriteError` if the writer failed before the record was durable: such a
        record is never acknowledged (it may or may not be found in the log after a reopen).
        """
        log = self._log
        if log._durable > self.index:
            return True
        with log._durable_cv:
            ok = log._durable_cv.wait_for(
                lambda: log._durable > self.index or log._error is not None, timeout
            )
        if log._durable > self.index:
            return True
        if ok and log._error is not None:
            raise log._error
        return False

    def __repr__(self) -> str:
        return f"Ticket(index={self.index}, done={self.done()})"


class AuditLog:
    """The single writer of an audit log directory. Use :meth:`open`; always :meth:`close`.

    NOTE: invariants.
    - Acknowledged means fsynced and sealed: a ticket is done, ``size`` and :meth:`flush` count
      a record, only after the ``fsync`` of the write holding its batch and the batch's seal.
    - The writer never signs (a seal or a checkpoint) over a frame it did not write or cannot
      prove a trusted writer wrote: on open, frames after the last trusted seal or checkpoint
      are moved to quarantine (or the log is refused); afterwards only its own batches follow.
    - The frontier always equals the Merkle tree of the durable prefix: it is extended with a
      batch's leaves after that batch's fsync and before the batch is acknowledged; state.json
      is written from it, never ahead of the log.
    - Checkpoints only ever extend: the writer signs only its own frontier, which only grows;
      on open it refuses a log shorter than the last signed checkpoint or whose prefix does not
      hash to that checkpoint's root; before signing it checks the size did not go back.
    - After a writer error nothing more is written or acknowledged: every later call raises.

    The queue is not bounded: producers are expected to be slower than the writer (decisions
    cost far more than their fsync share). Records still queued when a process exits without
    :meth:`close` are lost; they were never acknowledged.
    """

    def __init__(
        self,
        directory: Path,
        *,
        signing_key: SigningKey,
        origin: str,
        checkpoint_every: int,
        checkpoint_interval: float,
        commit_interval: float,
        max_batch: int,
        lock_fd: int,
        dir_fd: int,
        ckpt_dir_fd: int,
        log_fd: int,
        opened: _Opened,
    ) -> None:
        self.directory = directory
        self.origin = origin
        self.key_name = key_name_for(signing_key.key_id)
        self.recovery = opened.recovery
        self._key = signing_key
        self._checkpoint_every = checkpoint_every
        self._checkpoint_interval = checkpoint_interval
        self._commit_interval = commit_interval
        self._max_batch = max_batch
        self._lock_fd = lock_fd
        self._dir_fd = dir_fd
        self._ckpt_dir_fd = ckpt_dir_fd
        self._log_fd = log_fd
        # Writer-thread state.
        frontier = opened.frontier
        self._frontier = frontier
        self._log_bytes = opened.log_bytes
        self._seal_offset = opened.seal_offset
        self._checkpoint_size = opened.checkpoint_size
        self._have_checkpoint = opened.have_checkpoint
        self._last_checkpoint_at = time.monotonic()
        self._snapshot = frontier.copy()
        # Shared state. Producers and the writer meet on _cv (queue); waiters on _durable_cv.
        self._cv = threading.Condition(threading.Lock())
        self._pending: collections.deque[bytes] = collections.deque()
        self._next_index = frontier.size
        self._wake_at = 1  # the writer wants a notify once len(_pending) reaches this
        self._flush_requested = False
        self._closing = False
        self._closed = False
        self._durable_cv = threading.Condition(threading.Lock())
        self._durable = frontier.size
        self._error: AuditWriteError | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"semgov-audit-writer {directory}", daemon=True
        )
        self._thread.start()

    # -- opening ------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: Path,
        *,
        signing_key: SigningKey,
        origin: str,
        checkpoint_every: int = 1000,
        checkpoint_interval: float = 5.0,
        commit_interval: float = 0.0,
        max_batch: int = 4096,
        verify: bool = False,
        keyring: AuditKeyring | None = None,
    ) -> AuditLog:
        """Open (creating if needed) the log in ``directory`` for writing, recovering a torn tail.

        ``origin`` is the checkpoint origin line (the log's name). ``keyring`` holds the other keys
        whose seals and checkpoints the writer accepts on open (not revoked, valid at the tree
        size): after a key rotation, the previous key. Checkpoints are signed every
        ``checkpoint_every`` records, every ``checkpoint_interval`` seconds when records were
        added, and on close. The writer waits up to ``commit_interval`` seconds for more records
        before committing a batch (0: commit as soon as a record is queued), and commits at most
        ``max_batch`` records at a time. When ``state.json`` matches the log's length the log is
        not re-read; ``verify=True`` re-hashes every record anyway (finding corruption anywhere).

        Frames after the last seal or checkpoint by a trusted key are moved to ``quarantine/``
        (see :class:`Recovery`), never signed over.

        Raises :class:`LogLockedError` if another writer holds the log, :class:`CorruptLogError`
        for a bad frame that is not the tail, :class:`UnsealedRecordsError` for unsealed frames
        ``state.json`` says were acknowledged, :class:`CheckpointConflictError` if the log does not
        extend the last signed checkpoint or that checkpoint is not signed by a trusted key,
        :class:`AuditLogError` for other I/O failures.
        """
        if checkpoint_every < 1 or max_batch < 1:
            raise ValueError("checkpoint_every and max_batch must be at least 1")
        if checkpoint_interval <= 0 or commit_interval < 0:
            raise ValueError("checkpoint_interval must be > 0 and commit_interval >= 0")
        if not origin or "\n" in origin:
            raise ValueError("origin must be a non-empty single line")
        directory = Path(directory)
        src = str(directory)
        trust = _Trust(signing_key, keyring, source=src)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            lock_fd = _acquire_lock(directory)
        except OSError as e:
            raise AuditLogError(f"cannot open audit log directory: {e.strerror}", source=src) from e
        fds: list[int] = [lock_fd]
        try:
            dir_fd, ckpt_dir_fd, log_fd = _open_files(directory, fds)
            opened = _recover(directory, log_fd, dir_fd, origin=origin, trust=trust, verify=verify)
            os.lseek(log_fd, opened.log_bytes, os.SEEK_SET)
        except OSError as e:
            for fd in reversed(fds):
                os.close(fd)
            raise AuditLogError(f"cannot open audit log: {e}", source=src) from e
        except BaseException:
            for fd in reversed(fds):
                os.close(fd)
            raise
        return cls(
            directory,
            signing_key=signing_key,
            origin=origin,
            checkpoint_every=checkpoint_every,
            checkpoint_interval=checkpoint_interval,
            commit_interval=commit_interval,
            max_batch=max_batch,
            lock_fd=lock_fd,
            dir_fd=dir_fd,
            ckpt_dir_fd=ckpt_dir_fd,
            log_fd=log_fd,
            opened=opened,
        )

    # -- producer API -------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Records durable in the log (fsynced and covered by the frontier)."""
        return self._durable

    @property
    def checkpoint_size(self) -> int:
        """Size of the last checkpoint signed (or found on open)."""
        return self._checkpoint_size

    def root(self) -> tuple[int, bytes]:
        """``(size, Merkle root)`` of a durable prefix (the latest one the writer published)."""
        snap = self._snapshot
        return snap.size, snap.root()

    def append(self, record: bytes) -> Ticket:
        """Queue ``record`` (the leaf bytes) for the writer thread; no I/O. Returns its ticket.

        Raises :class:`AuditWriteError` once the writer has failed, :class:`AuditLogError`
        after :meth:`close`.
        """
        if type(record) is not bytes:
            raise TypeError(f"record must be bytes, not {type(record).__name__}")
        if len(record) > MAX_RECORD_BYTES:
            raise ValueError(f"record of {len(record)} bytes exceeds {MAX_RECORD_BYTES}")
        with self._cv:
            if self._error is not None:
                raise self._error
            if self._closing:
                raise AuditLogError("audit log is closed", source=str(self.directory))
            index = self._next_index
            self._next_index = index + 1
            self._pending.append(record)
            if len(self._pending) >= self._wake_at:
                self._cv.notify()
        return Ticket(self, index)

    def flush(self) -> int:
        """Block until every record queued so far is durable; return the durable size."""
        with self._cv:
            if self._error is not None:
                raise self._error
            target = self._next_index
            if self._durable >= target:
                return self._durable
            if self._closed:
                raise AuditLogError("audit log is closed", source=str(self.directory))
            self._flush_requested = True
            self._cv.notify()
        with self._durable_cv:
            self._durable_cv.wait_for(lambda: self._durable >= target or self._error is not None)
        if self._durable < target and self._error is not None:
            raise self._error
        return self._durable

    def close(self) -> None:
        """Flush, sign a final checkpoint, stop the writer and release the lock. Idempotent.

        Raises the writer's :class:`AuditWriteError` if it failed (the lock is released anyway).
        """
        with self._cv:
            already = self._closing
            self._closing = True
            self._cv.notify()
        if not already:
            self._thread.join()
            self._closed = True
            for fd in (self._log_fd, self._ckpt_dir_fd, self._dir_fd):
                os.close(fd)
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            os.close(self._lock_fd)
        if self._error is not None:
            raise self._error

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.close()
        except AuditWriteError:
            if exc is None:
                raise

    # -- writer thread ------------------------------------------------------------------------

    def _take_batch(self) -> tuple[list[bytes], bool]:
        """Wait for records (or a checkpoint deadline, or close); return up to max_batch of them."""
        cv, pending = self._cv, self._pending
        with cv:
            while not pending and not self._closing:
                timeout = None
                if self._frontier.size > self._checkpoint_size:
                    timeout = self._last_checkpoint_at + self._checkpoint_interval - time.monotonic()
                    if timeout <= 0:
                        return [], False
                self._wake_at = 1
                cv.wait(timeout)
            if self._commit_interval > 0 and pending and not (self._closing or self._flush_requested):
                deadline = time.monotonic() + self._commit_interval
                self._wake_at = self._max_batch
                while len(pending) < self._max_batch and not (self._closing or self._flush_requested):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    cv.wait(left)
            self._wake_at = 1 << 62  # busy: producers need not notify
            if len(pending) <= self._max_batch:
                batch = list(pending)
                pending.clear()
            else:
                batch = [pending.popleft() for _ in range(self._max_batch)]
            if not pending:
                self._flush_requested = False
            return batch, self._closing and not pending

    def _commit(self, batch: list[bytes]) -> None:
        """Write one batch and its seal, fsync, extend the frontier, then acknowledge the batch."""
        pack, sha256, pack_index = FRAME_HEADER.pack, hashlib.sha256, _INDEX.pack
        parts: list[bytes] = []
        frontier = self._frontier.copy()
        first = frontier.size  # NOTE: the frontier's size is the next leaf index
        for i, rec in enumerate(batch, start=first):
            parts.append(pack(i, len(rec), sha256(pack_index(i) + rec).digest()))
            parts.append(rec)
            frontier.append(leaf_hash(rec))
        records = b"".join(parts)
        # NOTE: the seal signs the tree after the batch with the writer's key (one signature per
        # batch, on this thread, never on a producer's path). It is written in the same write as
        # the batch, and nothing is acknowledged before the fsync returned: so an acknowledged
        # record always has its seal on disk, and complete frames after the last valid seal were
        # never acknowledged (a crash mid-write, or someone else's frames). If the write or the
        # fsync fails, the records stay unacknowledged and the next open sorts the tail out.
        cp = Checkpoint(self.origin, frontier.size, frontier.root())
        seal = seal_frame(frontier.size, sign_checkpoint(cp, self.key_name, self._key.private_key))
        _write_all(self._log_fd, records + seal)
        os.fsync(self._log_fd)
        self._seal_offset = self._log_bytes + len(records)
        self._log_bytes += len(records) + len(seal)
        self._frontier = frontier
        self._snapshot = frontier.copy()
        with self._durable_cv:
            self._durable = frontier.size
            self._durable_cv.notify_all()

    def _checkpoint_due(self, final: bool) -> bool:
        size = self._frontier.size
        if final:
            return size != self._checkpoint_size or not self._have_checkpoint
        if size - self._checkpoint_size >= self._checkpoint_every:
            return True
        return (
            size > self._checkpoint_size
            and time.monotonic() - self._last_checkpoint_at >= self._checkpoint_interval
        )

    def _write_checkpoint(self) -> None:
        """Sign the frontier as a checkpoint; keep it as checkpoints/<size>.note and checkpoint."""
        size = self._frontier.size
        if size < self._checkpoint_size:  # cannot happen: the frontier only grows
            raise CheckpointConflictError(
                f"frontier has {size} records but the last checkpoint says {self._checkpoint_size}: "
                "refusing to sign",
                source=str(self.directory),
            )
        cp = Checkpoint(self.origin, size, self._frontier.root())
        note = sign_checkpoint(cp, self.key_name, self._key.private_key)
        existing = _write_once(self._ckpt_dir_fd, self.directory / CHECKPOINTS_DIR, f"{size}.note", note)
        if existing is not None and existing != note:
            old, _ = _parse_note_unverified(existing, source=str(self.directory / CHECKPOINTS_DIR))
            if (old.size, old.root) != (cp.size, cp.root):
                raise CheckpointConflictError(
                    f"checkpoints/{size}.note already holds a different tree: refusing to sign",
                    source=str(self.directory),
                )
            note = existing  # same tree, signed by another key: keep the one written first
        _atomic_replace(self._dir_fd, self.directory, CHECKPOINT_FILE, note)
        self._checkpoint_size = size
        self._have_checkpoint = True
        self._last_checkpoint_at = time.monotonic()

    def _write_state(self) -> None:
        doc = {
            "size": self._frontier.size,
            "log_bytes": self._log_bytes,
            "frontier": self._frontier.to_json(),
            "checkpoint_size": self._checkpoint_size,
            "seal_offset": self._seal_offset,
        }
        _atomic_replace(self._dir_fd, self.directory, STATE_FILE, json.dumps(doc).encode("utf-8"))

    def _run(self) -> None:
        try:
            while True:
                batch, final = self._take_batch()
                if batch:
                    self._commit(batch)
                checkpointed = self._checkpoint_due(final)
                if checkpointed:
                    self._write_checkpoint()
                if batch or checkpointed or final:
                    self._write_state()
                if final:
                    return
        except Exception as e:  # noqa: BLE001 - every failure is recorded and re-raised to callers
            self._fail(e)

    def _fail(self, exc: Exception) -> None:
        if isinstance(exc, OSError):
            what = f"{exc.strerror or exc} (errno {exc.errno} {errno.errorcode.get(exc.errno or 0, '')})"
        else:
            what = f"{type(exc).__name__}: {exc}"
        err = AuditWriteError(
            f"audit log writer failed: {what}; {self._durable} records are durable, "
            "no further records are accepted (reopen the log once the cause is fixed)",
            source=str(self.directory),
        )
        err.__cause__ = exc
        get_logger().error("audit log writer failed", directory=str(self.directory), error=what)
        with self._cv:
            self._error = err
            self._pending.clear()
        with self._durable_cv:
            self._durable_cv.notify_all()


def _open_files(directory: Path, fds: list[int]) -> tuple[int, int, int]:
    """Open (creating) the directory, ``checkpoints/`` and records.log; each fd is added to ``fds``."""
    dir_fd = _open_dir(directory)
    fds.append(dir_fd)
    created = False
    if not (directory / CHECKPOINTS_DIR).is_dir():
        (directory / CHECKPOINTS_DIR).mkdir()
        created = True
    ckpt_dir_fd = _open_dir(directory / CHECKPOINTS_DIR)
    fds.append(ckpt_dir_fd)
    log_path = directory / LOG_FILE
    if not log_path.exists():
        created = True
    log_fd = os.open(log_path, os.O_RDWR | os.O_CREAT, 0o644)
    fds.append(log_fd)
    if created:
        os.fsync(dir_fd)
    return dir_fd, ckpt_dir_fd, log_fd


def _acquire_lock(directory: Path) -> int:
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        finally:
            os.close(fd)
        raise LogLockedError(
            f"audit log {directory} is locked by another writer (pid {holder})", source=str(directory)
        ) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    return fd


class _Trust:
    """The keys a writer takes seals and checkpoints from: its own, and a keyring's (a rotated key)."""

    def __init__(self, own: SigningKey, keyring: AuditKeyring | None, *, source: str) -> None:
        self.own_name = key_name_for(own.key_id)
        self.own = own.public_key
        self.keyring = keyring
        entry = keyring.by_name(self.own_name) if keyring is not None else None
        if entry is not None and entry.revoked:
            raise AuditLogError(
                f"the writer's signing key {own.key_id} is revoked in its keyring", source=source
            )

    def key(self, name: str, size: int) -> Ed25519PublicKey | None:
        """The public key a signature line named ``name`` on a tree of ``size`` records is checked with."""
        if name == self.own_name:
            return self.own
        entry = self.keyring.by_name(name) if self.keyring is not None else None
        return entry.public_key if entry is not None and entry.trusted_for_size(size) else None

    def vouches(self, note: bytes, names: list[str], size: int) -> tuple[bool, list[str]]:
        """Whether a trusted key signed ``note`` (every trusted line verifies), and the untrusted names."""
        untrusted: list[str] = []
        ok = False
        for name in dict.fromkeys(names):
            key = self.key(name, size)
            if key is None:
                untrusted.append(name)
                continue
            try:
                open_note(note, name, key)
            except NoteError:
                return False, untrusted  # a trusted key's line that does not verify: forged or damaged
            ok = True
        return ok, untrusted


def _seal_vouches(note: bytes, size: int, root: bytes, origin: str, trust: _Trust) -> tuple[bool, list[str]]:
    """Whether ``note`` is a seal of this log's tree of ``size`` records with ``root``, by a trusted key."""
    try:
        cp, names = _parse_note_unverified(note, source="")
    except AuditLogError:
        return False, []
    if (cp.origin, cp.size, cp.root) != (origin, size, root):
        return False, []
    return trust.vouches(note, names, size)


_ROTATION_HINT = (
    "if the log's key was rotated, open it with a keyring holding the previous key "
    "(AuditLog.open(keyring=...), semgov check --audit-keyring, SEMGOV_AUDIT_KEYRING; docs/operations.md)"
)


def _latest_checkpoint(directory: Path, trust: _Trust, origin: str) -> Checkpoint | None:
    """The latest signed checkpoint on disk, verified with a key the writer trusts (else refused)."""
    candidates: list[tuple[int, Path]] = []
    main = directory / CHECKPOINT_FILE
    if main.exists():
        main_cp, _ = _parse_note_unverified(main.read_bytes(), source=str(main))
        candidates.append((main_cp.size, main))
    sizes = _note_sizes(directory)
    if sizes:
        candidates.append((sizes[-1], directory / CHECKPOINTS_DIR / f"{sizes[-1]}.note"))
    if not candidates:
        return None
    _, path = max(candidates, key=lambda c: c[0])
    note = path.read_bytes()
    cp, names = _parse_note_unverified(note, source=str(path))
    if path.parent.name == CHECKPOINTS_DIR and cp.size != sizes[-1]:
        raise CheckpointConflictError(f"note holds size {cp.size}, not {sizes[-1]}", source=str(path))
    if cp.origin != origin:
        raise CheckpointConflictError(
            f"checkpoint origin is {cp.origin!r}, not {origin!r}: another log's directory?",
            source=str(path),
        )
    ok, untrusted = trust.vouches(note, names, cp.size)
    if ok:
        return cp
    if len(untrusted) < len(set(names)):
        raise CheckpointConflictError(
            f"checkpoint of size {cp.size}: a signature by a trusted key does not verify "
            "(forged or damaged): refusing to continue",
            source=str(path),
        )
    raise CheckpointConflictError(
        f"checkpoint of size {cp.size} is not signed by a key this writer trusts (signed by "
        f"{', '.join(untrusted) or 'no key'}): refusing to sign over what it cannot verify; {_ROTATION_HINT}",
        source=str(path),
    )


def _unproven_state(state: _State, cp: Checkpoint | None) -> str:
    """Why ``state.json``'s frontier cannot be trusted without re-reading the log ('' if it can).

    NOTE: state.json is a cache and anything may have happened to it; a wrong frontier would
    make the writer sign checkpoints over a root the log does not have. A writer that closed
    cleanly signed a checkpoint of exactly its frontier's size, so the frontier is taken only
    when it hashes to that signed root (64 hashes at most); after a crash (records past the
    last checkpoint) or with no checkpoint, the log is re-read, as for a missing state.json.
    """
    if state.size == 0 and cp is None:
        return ""  # a new, empty log (the frontier of size 0 has no hashes)
    if cp is None:
        return f"state.json says {state.size} records but the log has no checkpoint to check them against"
    if cp.size != state.size:
        return (
            f"state.json says {state.size} records, the last checkpoint {cp.size} "
            "(the last writer did not close cleanly)"
        )
    if state.frontier.root() != cp.root:
        return f"state.json's frontier does not hash to the root of the signed checkpoint of size {cp.size}"
    return ""


def _fast_state(
    log_fd: int, state: _State, cp: Checkpoint | None, trust: _Trust, origin: str, file_size: int
) -> str:
    """Why ``state.json`` cannot be taken as is ('' if it can).

    NOTE: it must match the log's length and the last signed checkpoint, and the log must end in
    the seal state.json names, by a trusted key, for that same tree: then nothing follows the
    last acknowledged batch (frames appended by someone else change the length or the last frame).
    """
    if state.log_bytes != file_size:
        return (
            f"state.json says {state.log_bytes} log bytes ({state.size} records), "
            f"records.log has {file_size} bytes"
        )
    why = _unproven_state(state, cp)
    if why:
        return why
    if state.size == 0:
        return "" if file_size == 0 else f"state.json says 0 records, records.log has {file_size} bytes"
    if cp is None:
        return "no checkpoint"  # cannot happen: _unproven_state refuses records without a checkpoint
    if state.seal_offset is None:
        return "state.json names no seal (a log written before seals)"
    off, hsize = state.seal_offset, FRAME_HEADER.size
    head = os.pread(log_fd, hsize, off)
    if len(head) < hsize:
        return f"state.json's seal_offset {off} is past the end of records.log"
    field, length, digest = FRAME_HEADER.unpack(head)
    if field != SEAL_FLAG | state.size or off + hsize + length != file_size:
        return f"state.json's seal_offset {off} is not a seal of {state.size} records ending records.log"
    note = os.pread(log_fd, length, off + hsize)
    if hashlib.sha256(_INDEX.pack(field) + note).digest() != digest:
        return "the last seal frame is damaged"
    if not _seal_vouches(note, state.size, cp.root, origin, trust)[0]:
        return "the last seal is not signed by a trusted key for the checkpointed tree"
    return ""


@dataclass
class _Seen:
    """A seal frame met while re-reading the log, with the tree of the records before it."""

    size: int
    offset: int
    end: int
    note: bytes
    frontier: Frontier


@dataclass
class _Walked:
    """What re-reading records.log found (the frames after the first bad one are not looked at)."""

    frontier: Frontier  # every complete record
    end: int  # end of the last complete frame
    bad: _BadFrame | None
    torn: bool  # bad is the tail of an interrupted write (else it was raised as corruption)
    seals: collections.deque[_Seen]  # the newest seals, oldest first
    cp_point: (
        tuple[int, Frontier, int | None] | None
    )  # just after record cp.size - 1: (offset, tree, last seal)


def _reread(
    directory: Path, log_fd: int, file_size: int, cp: Checkpoint | None, durable: int | None
) -> _Walked:
    """Re-hash every frame; raise :class:`CorruptLogError` for a bad frame that is not a torn tail."""
    frontier = Frontier()
    seals: collections.deque[_Seen] = collections.deque(maxlen=_SEALS_KEPT)
    last_seal: list[int | None] = [None]
    cp_point: tuple[int, Frontier, int | None] | None = None
    if cp is not None and cp.size == 0:
        cp_point = (0, Frontier(), None)

    def on_seal(count: int, off: int, end: int, note: bytes) -> None:
        seals.append(_Seen(count, off, end, note, frontier.copy()))
        last_seal[0] = off

    with os.fdopen(os.dup(log_fd), "rb", buffering=_READ_CHUNK) as f:
        walker = _Walker(f, file_size, on_seal)
        for _, off, rec in walker:
            frontier.append(leaf_hash(rec))
            if cp is not None and frontier.size == cp.size:
                cp_point = (off + FRAME_HEADER.size + len(rec), frontier.copy(), last_seal[0])
        torn = False
        if walker.bad is not None:
            torn = _is_torn_tail(walker.bad, f, file_size, durable)
            if not torn:
                raise _frame_error(directory, walker.bad, file_size, torn=False)
    return _Walked(frontier, walker.end, walker.bad, torn, seals, cp_point)


@dataclass(frozen=True)
class _Anchor:
    """The end of what a trusted seal or checkpoint vouches for: everything after it is unproven."""

    offset: int
    frontier: Frontier
    seal_offset: int | None  # the last seal frame kept
    untrusted: tuple[str, ...]  # key names of newer seals the writer does not trust


def _anchor(directory: Path, walked: _Walked, cp: Checkpoint | None, trust: _Trust, origin: str) -> _Anchor:
    """The newest seal by a trusted key whose tree matches, or else the checkpoint, or else nothing.

    NOTE: a seal a trusted key signed for another tree than the records before it is refused as
    corruption, never skipped: the writer signs a seal only over the batch it just wrote, so the
    records it covered were acknowledged, and have since been altered (or the seal was copied in).
    """
    floor = walked.cp_point[0] if walked.cp_point is not None else 0
    untrusted: list[str] = []
    for seen in reversed(walked.seals):
        if seen.end <= floor:
            break
        ok, names = _seal_vouches(seen.note, seen.size, seen.frontier.root(), origin, trust)
        if ok:
            return _Anchor(seen.end, seen.frontier, seen.offset, tuple(dict.fromkeys(untrusted)))
        conflict = _seal_conflict(seen, origin, trust)
        if conflict:
            raise CorruptLogError(
                f"the seal at byte {seen.offset} (after record {seen.size - 1}) is signed by a trusted key "
                f"but {conflict}: acknowledged records were altered, or the seal was copied in; refusing "
                "to continue, nothing was changed",
                source=str(directory / LOG_FILE),
                index=seen.size,
                offset=seen.offset,
                reason="seal_mismatch",
            )
        untrusted += names
    if walked.cp_point is not None:
        off, fr, seal = walked.cp_point
        return _Anchor(off, fr, seal, tuple(dict.fromkeys(untrusted)))
    return _Anchor(0, Frontier(), None, tuple(dict.fromkeys(untrusted)))


def _seal_conflict(seen: _Seen, origin: str, trust: _Trust) -> str:
    """Why a seal a trusted key did sign does not fit where it stands ('' if not signed by one)."""
    try:
        cp, names = _parse_note_unverified(seen.note, source="")
    except AuditLogError:
        return ""
    if not trust.vouches(seen.note, names, cp.size)[0]:
        return ""
    if cp.origin != origin:
        return f"for log {cp.origin!r}, not {origin!r}"
    if cp.size != seen.size:
        return f"for a tree of {cp.size} records, where {seen.size} precede it"
    return f"the {seen.size} records before it do not hash to its root"


def _records_words(first: int, stop: int) -> str:
    if stop <= first:
        return "no complete record"
    return f"record {first}" if stop == first + 1 else f"records {first}..{stop - 1}"


def _refuse_unsealed(directory: Path, walked: _Walked, anchor: _Anchor, durable: int) -> UnsealedRecordsError:
    first = anchor.frontier.size
    what = _records_words(first, walked.frontier.size)
    signers = f" (its seals are signed by {', '.join(anchor.untrusted)})" if anchor.untrusted else ""
    return UnsealedRecordsError(
        f"{what} (bytes {anchor.offset}..{durable}) are recorded as durable in state.json, but no seal or "
        f"checkpoint by a trusted key covers them{signers}: frames appended by someone else with a forged "
        "state.json, a removed seal, a log written before seals, or a key rotation; refusing to sign over "
        f"them, nothing was changed. {_ROTATION_HINT[0].upper()}{_ROTATION_HINT[1:]}; if the frames are not "
        "genuine, delete state.json and reopen: they are then moved to quarantine/",
        source=str(directory / LOG_FILE),
        index=first,
        offset=anchor.offset,
        reason="not sealed",
    )


def _quarantine(directory: Path, log_fd: int, dir_fd: int, start: int, stop: int, first: int) -> Path:
    """Copy bytes ``start..stop`` of records.log to ``quarantine/`` (fsynced) before they are cut off."""
    qdir = directory / QUARANTINE_DIR
    if not qdir.is_dir():
        qdir.mkdir()
        os.fsync(dir_fd)
    qdir_fd = _open_dir(qdir)
    try:
        tmp = qdir / f".{start}.tmp"
        digest = hashlib.sha256()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            off = start
            while off < stop:
                chunk = os.pread(log_fd, min(_READ_CHUNK, stop - off), off)
                if not chunk:
                    raise AuditLogError(
                        "records.log shrank while its tail was moved to quarantine", source=str(directory)
                    )
                _write_all(fd, chunk)
                digest.update(chunk)
                off += len(chunk)
            os.fsync(fd)
        finally:
            os.close(fd)
        final = qdir / f"{first}-at-{start}-{digest.hexdigest()[:16]}.frames"
        os.replace(tmp, final)
        os.fsync(qdir_fd)
    finally:
        os.close(qdir_fd)
    return final


@dataclass(frozen=True)
class _Opened:
    """The durable state the writer starts from."""

    frontier: Frontier
    log_bytes: int
    checkpoint_size: int
    have_checkpoint: bool
    seal_offset: int | None
    recovery: Recovery


def _recover(
    directory: Path, log_fd: int, dir_fd: int, *, origin: str, trust: _Trust, verify: bool
) -> _Opened:
    """Establish the durable, provably written state of the log before the writer starts (module doc)."""
    src = str(directory / LOG_FILE)
    file_size = os.fstat(log_fd).st_size
    state, state_problem = _read_state(directory)
    cp = _latest_checkpoint(directory, trust, origin)
    floor = max(cp.size if cp is not None else 0, state.checkpoint_size if state is not None else 0)
    if state is not None and not verify:
        rebuild_reason = _fast_state(log_fd, state, cp, trust, origin, file_size)
        if not rebuild_reason:
            clean = Recovery(state.size, file_size, False, "", 0, 0, "", floor)
            return _Opened(state.frontier, file_size, floor, cp is not None, state.seal_offset, clean)
    else:
        rebuild_reason = state_problem if state is None and file_size else ""
    durable = state.log_bytes if state is not None and state.log_bytes <= file_size else None
    walked = _reread(directory, log_fd, file_size, cp, durable)
    if walked.frontier.size < floor:
        raise CheckpointConflictError(
            f"log has {walked.frontier.size} records but checkpoint says {floor}: refusing to continue",
            source=src,
        )
    if cp is not None and walked.cp_point is not None and walked.cp_point[1].root() != cp.root:
        raise CheckpointConflictError(
            f"the first {cp.size} records do not hash to the signed checkpoint's root: refusing to continue",
            source=src,
        )
    if state is not None and state.log_bytes > file_size:
        # NOTE: state.json is rewritten only after its bytes were fsynced, and recovery cuts only
        # bytes after what state.json acknowledged: a shorter log lost acknowledged records.
        raise CorruptLogError(
            f"records.log has {file_size} bytes but state.json records {state.log_bytes} bytes "
            f"({state.size} records) as acknowledged durable: acknowledged records were cut off, or "
            "state.json was altered; refusing to continue, nothing was changed. If state.json is wrong "
            "(the log is intact), delete it and reopen",
            source=src,
            index=state.size,
            offset=file_size,
            reason="log_shorter_than_acknowledged",
        )
    anchor = _anchor(directory, walked, cp, trust, origin)
    if verify and state is not None and state.log_bytes == file_size and anchor.frontier != state.frontier:
        rebuild_reason = "state.json does not match the records (verify=True)"
    quarantine: Path | None = None
    if anchor.offset < file_size:
        if durable is not None and anchor.offset < durable:
            raise _refuse_unsealed(directory, walked, anchor, durable)
        quarantine = _quarantine(directory, log_fd, dir_fd, anchor.offset, file_size, anchor.frontier.size)
        os.ftruncate(log_fd, anchor.offset)
    # NOTE: what a writer that failed (or was killed) left in the page cache but never got
    # durable becomes durable here, before any checkpoint can be signed over it.
    os.fsync(log_fd)
    return _finish(directory, dir_fd, walked, anchor, quarantine, file_size, floor, cp, rebuild_reason)


def _finish(
    directory: Path,
    dir_fd: int,
    walked: _Walked,
    anchor: _Anchor,
    quarantine: Path | None,
    file_size: int,
    floor: int,
    cp: Checkpoint | None,
    rebuild_reason: str,
) -> _Opened:
    """Report what recovery did (a warning when not clean) and rewrite state.json if it changed."""
    truncated = file_size - anchor.offset
    size = anchor.frontier.size
    recovery = Recovery(
        size=size,
        log_bytes=anchor.offset,
        rebuilt=bool(rebuild_reason),
        rebuild_reason=rebuild_reason,
        truncated_bytes=truncated,
        truncated_at=anchor.offset if truncated else 0,
        torn_reason=walked.bad.reason if truncated and walked.bad is not None else "",
        checkpoint_size=floor,
        quarantined_records=walked.frontier.size - size,
        quarantine_file=str(quarantine) if quarantine is not None else "",
        untrusted_signers=anchor.untrusted,
    )
    if not recovery.clean:
        get_logger().warning(
            "audit log recovered",
            directory=str(directory),
            records=size,
            log_bytes=anchor.offset,
            rebuilt_because=rebuild_reason or None,
            truncated_bytes=truncated,
            truncated_at=recovery.truncated_at if truncated else None,
            torn=recovery.torn_reason or None,
            quarantined_records=recovery.quarantined_records if truncated else None,
            quarantine_file=recovery.quarantine_file or None,
            untrusted_signers=list(anchor.untrusted) or None,
        )
    if recovery.rebuilt or truncated:
        doc = {
            "size": size,
            "log_bytes": anchor.offset,
            "frontier": anchor.frontier.to_json(),
            "checkpoint_size": floor,
            "seal_offset": anchor.seal_offset,
        }
        _atomic_replace(dir_fd, directory, STATE_FILE, json.dumps(doc).encode("utf-8"))
    return _Opened(anchor.frontier, anchor.offset, floor, cp is not None, anchor.seal_offset, recovery)


# ---------------------------------------------------------------------------------------------
# Readers: no lock, no writes


def iter_records(directory: Path, on_seal: SealCallback | None = None) -> Iterator[tuple[int, bytes]]:
    """Yield ``(index, record bytes)`` for every complete record of the log, in order.

    Seal frames are not records: ``on_seal(records before it, offset, end, note)`` is called for
    each one (unverified). Takes no lock and writes nothing. After the last good record it
    raises :class:`TornTailError` if the file ends in an incomplete frame (a writer crashed, or
    is in the middle of a write), or :class:`CorruptLogError` (with index and byte offset) if a
    frame elsewhere is bad.
    """
    directory = Path(directory)
    path = directory / LOG_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise AuditLogError(f"cannot read audit log: {e.strerror}", source=str(path)) from e
    with os.fdopen(fd, "rb", buffering=_READ_CHUNK) as f:
        file_size = os.fstat(f.fileno()).st_size
        durable = _durable_bound(directory, file_size)
        walker = _Walker(f, file_size, on_seal)
        for index, _, rec in walker:
            yield index, rec
        if walker.bad is not None:
            torn = _is_torn_tail(walker.bad, f, file_size, durable)
            raise _frame_error(directory, walker.bad, file_size, torn=torn)


def read_checkpoint(directory: Path) -> bytes | None:
    """The latest signed checkpoint note of the log in ``directory`` (None if none yet)."""
    path = Path(directory) / CHECKPOINT_FILE
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise AuditLogError(f"cannot read checkpoint: {e.strerror}", source=str(path)) from e
