"""The durable, append-only, single-writer audit log of signed decision records.

A log directory (default ``./audit/log/``) holds:

- ``LOCK``: held with ``flock(LOCK_EX | LOCK_NB)`` by the one writer (its pid is written
  inside, for the error message a second writer gets). Readers never take it.
- ``records.log``: frames ``index (8 bytes, big-endian) | length (4 bytes) | SHA-256(index ||
  record) (32 bytes) | record``. Record ``i`` of the file is leaf ``i`` of the Merkle tree
  (RFC 6962 leaf hash of the record bytes, i.e. of the canonical signed decision record); the
  index in the hashed frame makes a deleted, inserted or moved frame fail where it happened.
- ``state.json``: ``{"size", "log_bytes", "frontier", "checkpoint_size"}``, rewritten atomically
  after every batch. It only speeds up opening; the log is the truth.
- ``checkpoint``: the latest signed checkpoint (a C2SP signed note), replaced atomically;
  ``checkpoints/<size>.note`` keeps every one, written once.

Writing: :meth:`AuditLog.append` only queues the record and returns a :class:`Ticket` carrying
the record's index. One writer thread drains the queue in batches (group commit): one ``write``
of all the batch's frames, one ``fsync``, then the Merkle frontier is extended, the tickets
become durable, ``state.json`` is rewritten, and a checkpoint is signed every
``checkpoint_every`` records, every ``checkpoint_interval`` seconds and on :meth:`AuditLog.close`.

Recovery on open: a torn tail (a crash in the middle of a batch write) is cut back to the end of
the last complete, hash-valid frame and reported (:attr:`AuditLog.recovery`); a bad frame
anywhere else is corruption and the log is refused with the record index and byte offset, never
repaired. A log holding fewer records than the last signed checkpoint, or whose prefix no longer
hashes to that checkpoint's root, is refused too.

Reading: :func:`iter_records` and :func:`read_checkpoint` take no lock and write nothing.
"""

from __future__ import annotations

import collections
import errno
import fcntl
import hashlib
import json
import os
import re
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Final

from semgov._internal import strictjson
from semgov._internal.log import get_logger
from semgov.audit.merkle import Frontier, leaf_hash
from semgov.audit.note import Checkpoint, NoteError, open_checkpoint, sign_checkpoint
from semgov.errors import SemgovError
from semgov.keys import SigningKey

DEFAULT_DIRECTORY: Final = Path("audit") / "log"
LOCK_FILE: Final = "LOCK"
LOG_FILE: Final = "records.log"
STATE_FILE: Final = "state.json"
CHECKPOINT_FILE: Final = "checkpoint"
CHECKPOINTS_DIR: Final = "checkpoints"

#: Frame header: leaf index (big-endian uint64), record length (uint32), and SHA-256 of the
#: index (8 bytes, big-endian) followed by the record. The index makes a deleted, inserted or
#: reordered frame fail right where it happened, naming the record index.
FRAME_HEADER: Final = struct.Struct(">QI32s")
_INDEX: Final = struct.Struct(">Q")
#: Largest record :meth:`AuditLog.append` accepts; a frame claiming more is corrupt.
MAX_RECORD_BYTES: Final = 64 * 1024 * 1024

_SIG_PREFIX: Final = "\u2014 ".encode()  # C2SP signed note line: em dash, space, name, space, base64
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


class CheckpointConflictError(AuditLogError):
    """The log does not extend the last signed checkpoint: writing would sign a fork."""


class AuditWriteError(AuditLogError):
    """The writer thread failed (disk full, I/O error, ...). Nothing more is accepted."""


# ---------------------------------------------------------------------------------------------
# Frames


@dataclass(frozen=True)
class _BadFrame:
    index: int  # index the bad frame's record would have
    offset: int  # byte offset of the bad frame
    kind: str  # short_header | short_body | bad_length | hash_mismatch | index_mismatch | bad_index_field
    reason: str
    frame_end: int | None  # where the frame claims to end (None: header unreadable)


class _Walker:
    """Iterate the frames of ``f`` up to ``file_size``; afterwards ``bad`` names the first bad one.

    Yields ``(index, offset, record)`` for every complete, hash-valid frame in order, and stops
    at the first frame that is not.
    """

    def __init__(self, f: BinaryIO, file_size: int) -> None:
        self._f = f
        self.file_size = file_size
        self.bad: _BadFrame | None = None
        self.end = 0  # end of the last good frame
        self.count = 0

    def __iter__(self) -> Iterator[tuple[int, int, bytes]]:
        f, size, hsize = self._f, self.file_size, FRAME_HEADER.size
        sha256, unpack, pack_index = hashlib.sha256, FRAME_HEADER.unpack, _INDEX.pack
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
            rec = f.read(length)
            if len(rec) != length:  # the file shrank under us
                self.bad = _BadFrame(index, off, "short_body", "file ended while reading the record", end)
                break
            if sha256(pack_index(index) + rec).digest() != digest:
                if frame_index != index and sha256(pack_index(frame_index) + rec).digest() == digest:
                    why = f"frame holds record {frame_index} where record {index} belongs (deleted, moved?)"
                    self.bad = _BadFrame(index, off, "index_mismatch", why, end)
                else:
                    self.bad = _BadFrame(index, off, "hash_mismatch", "record SHA-256 does not match", end)
                break
            if frame_index != index:  # record and hash intact, the header's index field altered
                why = f"frame's index field says {frame_index}, not {index}"
                self.bad = _BadFrame(index, off, "bad_index_field", why, end)
                break
            yield index, off, rec
            off = end
            index += 1
            self.end, self.count = off, index


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
    except KeyError as e:
        return None, f"state.json is malformed (no {e} member)"
    except (ValueError, TypeError) as e:
        return None, f"state.json is malformed ({e})"
    return _State(size, log_bytes, frontier, cp_size), ""


def _durable_bound(directory: Path, file_size: int) -> int | None:
    """``state.json``'s ``log_bytes`` when it can bound where a crash may have torn the log."""
    state, _ = _read_state(directory)
    if state is None or state.log_bytes > file_size:
        return None
    return state.log_bytes


def _parse_note_unverified(note: bytes, *, source: str) -> tuple[Checkpoint, list[str]]:
    """The checkpoint in a C2SP signed note and the key names that signed it, unverified."""
    split = note.rfind(b"\n\n")
    try:
        if split < 0:
            raise NoteError("no blank line before the signatures")
        cp = Checkpoint.from_body(note[: split + 1])
        names = [
            line[len(_SIG_PREFIX) :].decode("utf-8", "replace").split(" ")[0]
            for line in note[split + 2 :].split(b"\n")
            if line.startswith(_SIG_PREFIX)
        ]
    except NoteError as e:
        raise AuditLogError(f"not a signed checkpoint note: {e}", source=source) from e
    return cp, names


def _note_sizes(directory: Path) -> list[int]:
    try:
        names = os.listdir(directory / CHECKPOINTS_DIR)
    except FileNotFoundError:
        return []
    # NOTE: ASCII digits only: str.isdigit() is also true of "²" or "٣", which int() refuses.
    return sorted(int(n[:-5]) for n in names if n.endswith(".note") and n[:-5].isascii() and n[:-5].isdigit())


_KEY_NAME_BAD = re.compile(r"[\s+\x00-\x1f\x7f]")


def key_name_for(key_id: str) -> str:
    """A C2SP note key name for ``key_id``: spaces, control characters and ``+`` become ``_``.

    (c2sp.org/signed-note: a key name is non-empty UTF-8 without Unicode spaces or ``+``; ``:``
    is allowed, so ``ed25519:0123abcd...`` is used as is.)
    """
    name = _KEY_NAME_BAD.sub("_", key_id)
    return name or "semgov"


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
    truncated_bytes: int  # torn tail cut off (0: none)
    truncated_at: int  # byte offset the tail was cut at (= log_bytes when truncated)
    torn_reason: str  # what was wrong with the torn frame (empty when none)
    checkpoint_size: int  # size of the last signed checkpoint found

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
    - Acknowledged means fsynced: a ticket is done, ``size`` and :meth:`flush` count a record,
      only after the ``fsync`` of the batch that holds it returned.
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
        frontier: Frontier,
        log_bytes: int,
        checkpoint_size: int,
        have_checkpoint: bool,
        recovery: Recovery,
    ) -> None:
        self.directory = directory
        self.origin = origin
        self.key_name = key_name_for(signing_key.key_id)
        self.recovery = recovery
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
        self._frontier = frontier
        self._log_bytes = log_bytes
        self._checkpoint_size = checkpoint_size
        self._have_checkpoint = have_checkpoint
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
    ) -> AuditLog:
        """Open (creating if needed) the log in ``directory`` for writing, recovering a torn tail.

        ``origin`` is the checkpoint origin line (the log's name). Checkpoints are signed every
        ``checkpoint_every`` records, every ``checkpoint_interval`` seconds when records were
        added, and on close. The writer waits up to ``commit_interval`` seconds for more records
        before committing a batch (0: commit as soon as a record is queued), and commits at most
        ``max_batch`` records at a time. When ``state.json`` matches the log's length the log is
        not re-read; ``verify=True`` re-hashes every record anyway (finding corruption anywhere).

        Raises :class:`LogLockedError` if another writer holds the log, :class:`CorruptLogError`
        for a bad frame that is not the tail, :class:`CheckpointConflictError` if the log does not
        extend the last signed checkpoint, :class:`AuditLogError` for other I/O failures.
        """
        if checkpoint_every < 1 or max_batch < 1:
            raise ValueError("checkpoint_every and max_batch must be at least 1")
        if checkpoint_interval <= 0 or commit_interval < 0:
            raise ValueError("checkpoint_interval must be > 0 and commit_interval >= 0")
        if not origin or "\n" in origin:
            raise ValueError("origin must be a non-empty single line")
        directory = Path(directory)
        src = str(directory)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            lock_fd = _acquire_lock(directory)
        except OSError as e:
            raise AuditLogError(f"cannot open audit log directory: {e.strerror}", source=src) from e
        fds: list[int] = [lock_fd]
        try:
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
            key_name = key_name_for(signing_key.key_id)
            frontier, log_bytes, cp_size, have_cp, recovery = _recover(
                directory,
                log_fd,
                dir_fd,
                origin=origin,
                key_name=key_name,
                signing_key=signing_key,
                verify=verify,
            )
            os.lseek(log_fd, log_bytes, os.SEEK_SET)
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
            frontier=frontier,
            log_bytes=log_bytes,
            checkpoint_size=cp_size,
            have_checkpoint=have_cp,
            recovery=recovery,
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
        """Write and fsync one batch, extend the frontier, then acknowledge it."""
        pack, sha256, pack_index = FRAME_HEADER.pack, hashlib.sha256, _INDEX.pack
        parts: list[bytes] = []
        first = self._frontier.size  # NOTE: the frontier's size is the next leaf index
        for i, rec in enumerate(batch, start=first):
            parts.append(pack(i, len(rec), sha256(pack_index(i) + rec).digest()))
            parts.append(rec)
        data = b"".join(parts)
        leaves = [leaf_hash(rec) for rec in batch]
        # NOTE: one write and one fsync per batch; nothing of the batch is acknowledged before
        # the fsync returned. If either fails, the bytes may or may not be in the file: the
        # records stay unacknowledged and the next open sorts the tail out.
        _write_all(self._log_fd, data)
        os.fsync(self._log_fd)
        self._log_bytes += len(data)
        frontier = self._frontier
        for h in leaves:
            frontier.append(h)
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


def _latest_checkpoint(
    directory: Path, key_name: str, signing_key: SigningKey, origin: str
) -> tuple[Checkpoint | None, int]:
    """The latest signed checkpoint on disk (verified when signed by our key), and its size."""
    candidates: list[tuple[int, Path]] = []
    main = directory / CHECKPOINT_FILE
    if main.exists():
        main_cp, _ = _parse_note_unverified(main.read_bytes(), source=str(main))
        candidates.append((main_cp.size, main))
    sizes = _note_sizes(directory)
    if sizes:
        candidates.append((sizes[-1], directory / CHECKPOINTS_DIR / f"{sizes[-1]}.note"))
    if not candidates:
        return None, 0
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
    if key_name in names:
        try:
            open_checkpoint(note, key_name, signing_key.public_key)
        except NoteError as e:
            raise CheckpointConflictError(
                f"checkpoint signature by {key_name} does not verify: {e}", source=str(path)
            ) from e
    return cp, cp.size


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


def _recover(
    directory: Path,
    log_fd: int,
    dir_fd: int,
    *,
    origin: str,
    key_name: str,
    signing_key: SigningKey,
    verify: bool,
) -> tuple[Frontier, int, int, bool, Recovery]:
    """Establish the durable state of the log before the writer starts (see the module doc)."""
    src = str(directory / LOG_FILE)
    file_size = os.fstat(log_fd).st_size
    state, state_problem = _read_state(directory)
    cp, cp_size = _latest_checkpoint(directory, key_name, signing_key, origin)
    floor = max(cp_size, state.checkpoint_size if state is not None else 0)

    rebuild_reason = ""
    truncate_to: int | None = None
    torn_reason = ""
    cp_root: bytes | None = None
    fits = state is not None and state.log_bytes == file_size
    unproven = _unproven_state(state, cp) if fits and state is not None and not verify else ""
    if fits and state is not None and not verify and not unproven:
        frontier, log_bytes = state.frontier, file_size
        if cp is not None:
            cp_root = frontier.root()  # equal to cp.root (checked by _unproven_state)
    else:
        if state is None:
            rebuild_reason = state_problem if file_size else ""  # no records: a new log
        elif unproven:
            rebuild_reason = unproven
        elif state.log_bytes == file_size:
            rebuild_reason = ""  # verify=True: set below if the records disagree with state.json
        else:
            rebuild_reason = (
                f"state.json says {state.log_bytes} log bytes ({state.size} records), "
                f"records.log has {file_size} bytes"
            )
        durable = state.log_bytes if state is not None and state.log_bytes <= file_size else None
        frontier = Frontier()
        if cp is not None and cp.size == 0:
            cp_root = frontier.root()
        with os.fdopen(os.dup(log_fd), "rb", buffering=_READ_CHUNK) as f:
            walker = _Walker(f, file_size)
            for _, _, rec in walker:
                frontier.append(leaf_hash(rec))
                if cp is not None and frontier.size == cp.size:
                    cp_root = frontier.root()
            log_bytes = walker.end
            if walker.bad is not None:
                torn = _is_torn_tail(walker.bad, f, file_size, durable)
                err = _frame_error(directory, walker.bad, file_size, torn=torn)
                if not torn:
                    raise err
                truncate_to, torn_reason = walker.end, walker.bad.reason
        if state is not None and state.log_bytes == file_size and frontier != state.frontier:
            rebuild_reason = "state.json does not match the records (verify=True)"
    size = frontier.size
    if size < floor:
        raise CheckpointConflictError(
            f"log has {size} records but checkpoint says {floor}: refusing to continue", source=src
        )
    if cp is not None and cp_root is not None and cp_root != cp.root:
        raise CheckpointConflictError(
            f"the first {cp.size} records do not hash to the signed checkpoint's root: refusing to continue",
            source=src,
        )
    truncated = 0
    if truncate_to is not None:
        truncated = file_size - truncate_to
        os.ftruncate(log_fd, truncate_to)
    # NOTE: what a writer that failed (or was killed) left in the page cache but never got
    # durable becomes durable here, before any checkpoint can be signed over it.
    os.fsync(log_fd)
    recovery = Recovery(
        size=size,
        log_bytes=log_bytes,
        rebuilt=bool(rebuild_reason),
        rebuild_reason=rebuild_reason,
        truncated_bytes=truncated,
        truncated_at=log_bytes if truncated else 0,
        torn_reason=torn_reason,
        checkpoint_size=floor,
    )
    if not recovery.clean:
        get_logger().warning(
            "audit log recovered",
            directory=str(directory),
            records=size,
            log_bytes=log_bytes,
            rebuilt_because=rebuild_reason or None,
            truncated_bytes=truncated,
            truncated_at=recovery.truncated_at if truncated else None,
            torn=torn_reason or None,
        )
    if recovery.rebuilt or truncated:
        doc = {
            "size": size,
            "log_bytes": log_bytes,
            "frontier": frontier.to_json(),
            "checkpoint_size": floor,
        }
        _atomic_replace(dir_fd, directory, STATE_FILE, json.dumps(doc).encode("utf-8"))
    return frontier, log_bytes, floor, cp is not None, recovery


# ---------------------------------------------------------------------------------------------
# Readers: no lock, no writes


def iter_records(directory: Path) -> Iterator[tuple[int, bytes]]:
    """Yield ``(index, record bytes)`` for every complete record of the log, in order.

    Takes no lock and writes nothing. After the last good record it raises
    :class:`TornTailError` if the file ends in an incomplete frame (a writer crashed, or is in
    the middle of a write), or :class:`CorruptLogError` (with index and byte offset) if a frame
    elsewhere is bad.
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
        walker = _Walker(f, file_size)
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
