"""The durable, append-only, single-writer audit log of signed decision records: :class:`AuditLog`.

A log directory (default ``./audit/log/``) holds ``LOCK``, ``records.log`` (record frames, each
batch ended by a seal frame), ``state.json``, ``checkpoint``, ``checkpoints/<size>.note`` and
``quarantine/``: their formats are in :mod:`semgov.audit.frames`.

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

Recovery on open (:mod:`semgov.audit.recovery`): everything after the last seal or checkpoint
signed by a key the writer trusts is moved to ``quarantine/`` and cut off, or the log is refused.

Reading (:mod:`semgov.audit.reader`): :func:`~semgov.audit.reader.iter_records` and
:func:`~semgov.audit.reader.read_checkpoint` take no lock and write nothing.
"""

from __future__ import annotations

import collections
import errno
import fcntl
import os
import threading
import time
from pathlib import Path
from types import TracebackType

from semgov.audit.errors import AuditLogError, AuditWriteError, CheckpointConflictError, LogLockedError
from semgov.audit.frames import (
    CHECKPOINT_FILE,
    CHECKPOINTS_DIR,
    LOCK_FILE,
    LOG_FILE,
    MAX_RECORD_BYTES,
    STATE_FILE,
    record_header,
    seal_frame,
)
from semgov.audit.fsio import atomic_replace, open_dir, write_all, write_once
from semgov.audit.keyring import AuditKeyring, key_name_for
from semgov.audit.merkle import leaf_hash
from semgov.audit.note import Checkpoint, sign_checkpoint
from semgov.audit.origin import ORIGIN_FILE, check_origin, resolve_origin
from semgov.audit.reader import State
from semgov.audit.recovery import Opened, Trust, parse_note_unverified, recover
from semgov.audit.recovery_record import recovery_body, sign_recovery
from semgov.log import get_logger
from semgov.signing.keys import SigningKey

# ---------------------------------------------------------------------------------------------
# The writer


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
        opened: Opened,
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
        self._waiting_since = 0.0  # monotonic: when the oldest record not yet durable arrived (about)
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
        origin: str | None = None,
        checkpoint_every: int = 1000,
        checkpoint_interval: float = 5.0,
        commit_interval: float = 0.0,
        max_batch: int = 4096,
        verify: bool = False,
        keyring: AuditKeyring | None = None,
    ) -> AuditLog:
        """Open (creating if needed) the log in ``directory`` for writing, recovering a torn tail.

        ``origin`` is the checkpoint origin line (the log's name, unique per log, proofs are bound
        to it); None: the log's own (:mod:`semgov.audit.origin`). A recovery that cuts anything off
        appends a signed record of it (:mod:`semgov.audit.recovery_record`). ``keyring``: other keys
        whose seals and checkpoints the writer accepts on open (not revoked, valid at the tree
        size): after a key rotation, the previous key. Checkpoints are signed every
        ``checkpoint_every`` records, every ``checkpoint_interval`` seconds when records were
        added, and on close. The writer waits up to ``commit_interval`` seconds for more records
        before committing a batch (0: commit as soon as a record is queued), and commits at most
        ``max_batch`` records at a time. When ``state.json`` matches the log's length the log is
        not re-read; ``verify=True`` re-hashes every record anyway (finding corruption anywhere).

        Frames after the last seal or checkpoint by a trusted key are moved to ``quarantine/``
        (see :class:`~semgov.audit.recovery.Recovery`), never signed over.

        Raises (all in :mod:`semgov.audit.errors`) :class:`LogLockedError` if another writer holds
        the log, :class:`CorruptLogError` for a bad frame that is not the tail,
        :class:`UnsealedRecordsError` for unsealed frames ``state.json`` says were acknowledged,
        :class:`CheckpointConflictError` if the log does not extend the last signed checkpoint or
        that checkpoint is not signed by a trusted key, :class:`AuditLogError` for other I/O failures.
        """
        if checkpoint_every < 1 or max_batch < 1:
            raise ValueError("checkpoint_every and max_batch must be at least 1")
        if checkpoint_interval <= 0 or commit_interval < 0:
            raise ValueError("checkpoint_interval must be > 0 and commit_interval >= 0")
        if origin is not None:
            check_origin(origin)
        directory = Path(directory)
        src = str(directory)
        trust = Trust(signing_key, keyring, source=src)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            lock_fd = _acquire_lock(directory)
        except OSError as e:
            raise AuditLogError(f"cannot open audit log directory: {e.strerror}", source=src) from e
        fds: list[int] = [lock_fd]
        try:
            dir_fd, ckpt_dir_fd, log_fd = _open_files(directory, fds)
            origin, opened = _recover_named(directory, log_fd, dir_fd, origin, trust, verify)
            os.lseek(log_fd, opened.log_bytes, os.SEEK_SET)
        except OSError as e:
            for fd in reversed(fds):
                os.close(fd)
            raise AuditLogError(f"cannot open audit log: {e}", source=src) from e
        except BaseException:
            for fd in reversed(fds):
                os.close(fd)
            raise
        log = cls(
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
        log._record_recovery(signing_key)
        return log

    def _record_recovery(self, signing_key: SigningKey) -> None:
        """If recovery cut anything off: append the signed record of it and make it durable (module doc
        of :mod:`semgov.audit.recovery_record`); a log that cannot record it is not opened."""
        if not self.recovery.truncated_bytes:
            return
        body = recovery_body(self.recovery, origin=self.origin)
        try:
            self.append(sign_recovery(body, signing_key))
            self.flush()
        except BaseException:
            try:
                self.close()
            except AuditWriteError:
                pass
            raise
        get_logger().warning(
            "audit log recovery recorded", directory=str(self.directory), cause=body["cause"],
            record=self.recovery.size, recovery_id=body["recovery_id"],
        )  # fmt: skip

    # -- producer API -------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Records durable in the log (fsynced and covered by the frontier)."""
        return self._durable

    @property
    def checkpoint_size(self) -> int:
        """Size of the last checkpoint signed (or found on open)."""
        return self._checkpoint_size

    def backlog(self) -> tuple[int, float]:
        """``(records accepted and not yet durable, seconds the oldest of them has waited)``.

        For monitoring (read without the writer's locks: a moment's view). The age is measured from
        when the oldest waiting record was appended, or from the last commit for records that
        arrived while it ran (a lower bound then).
        """
        pending = max(0, self._next_index - self._durable)
        return pending, (max(0.0, time.monotonic() - self._waiting_since) if pending else 0.0)

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
            if index == self._durable:
                self._waiting_since = time.monotonic()  # NOTE: nothing was waiting: this one is the oldest
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
        parts: list[bytes] = []
        frontier = self._frontier.copy()
        first = frontier.size  # NOTE: the frontier's size is the next leaf index
        for i, rec in enumerate(batch, start=first):
            parts.append(record_header(i, rec))
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
        write_all(self._log_fd, records + seal)
        os.fsync(self._log_fd)
        self._seal_offset = self._log_bytes + len(records)
        self._log_bytes += len(records) + len(seal)
        self._frontier = frontier
        self._snapshot = frontier.copy()
        self._waiting_since = (
            time.monotonic()
        )  # NOTE: what waits now arrived during this commit at the latest
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
        existing = write_once(self._ckpt_dir_fd, self.directory / CHECKPOINTS_DIR, f"{size}.note", note)
        if existing is not None and existing != note:
            old, _ = parse_note_unverified(existing, source=str(self.directory / CHECKPOINTS_DIR))
            if (old.size, old.root) != (cp.size, cp.root):
                raise CheckpointConflictError(
                    f"checkpoints/{size}.note already holds a different tree: refusing to sign",
                    source=str(self.directory),
                )
            note = existing  # same tree, signed by another key: keep the one written first
        atomic_replace(self._dir_fd, self.directory, CHECKPOINT_FILE, note)
        self._checkpoint_size = size
        self._have_checkpoint = True
        self._last_checkpoint_at = time.monotonic()

    def _write_state(self) -> None:
        state = State(
            self._frontier.size, self._log_bytes, self._frontier, self._checkpoint_size, self._seal_offset
        )
        atomic_replace(self._dir_fd, self.directory, STATE_FILE, state.to_bytes())

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


def _recover_named(
    directory: Path, log_fd: int, dir_fd: int, origin: str | None, trust: Trust, verify: bool
) -> tuple[str, Opened]:
    """The log's origin (:func:`~semgov.audit.origin.resolve_origin`) and its recovered state; the
    ``origin`` file is written once recovery accepted the log under that origin."""
    origin, write_origin = resolve_origin(directory, log_fd, origin)
    opened = recover(directory, log_fd, dir_fd, origin=origin, trust=trust, verify=verify)
    if write_origin:
        atomic_replace(dir_fd, directory, ORIGIN_FILE, f"{origin}\n".encode())
    return origin, opened


def _open_files(directory: Path, fds: list[int]) -> tuple[int, int, int]:
    """Open (creating) the directory, ``checkpoints/`` and records.log; each fd is added to ``fds``."""
    dir_fd = open_dir(directory)
    fds.append(dir_fd)
    created = False
    if not (directory / CHECKPOINTS_DIR).is_dir():
        (directory / CHECKPOINTS_DIR).mkdir()
        created = True
    ckpt_dir_fd = open_dir(directory / CHECKPOINTS_DIR)
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
