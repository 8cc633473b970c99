"""Crash recovery: the durable, provably written state an audit log writer starts from.

:func:`recover` runs once, in :meth:`~semgov.audit.store.AuditLog.open`, under the writer's
lock, before the writer thread starts; it returns an :class:`Opened` (the frontier, length, last
seal and checkpoint size to continue from, and the :class:`Recovery` report).

Recovery on open: the writer finds the last seal (or checkpoint) signed by a key it trusts (its
own, or one in the ``keyring`` it was given, e.g. the key before a rotation) whose tree matches
the frames before it. Everything after it is moved to ``quarantine/`` and cut off, and reported
(:attr:`AuditLog.recovery <semgov.audit.store.AuditLog.recovery>`), so no checkpoint is ever
signed over frames the writer cannot prove were written by a trusted writer. Refused instead,
and left untouched: a bad frame that is not the tail of an interrupted write (corruption: the
record index and byte offset are named); a seal signed by a trusted key over another tree than
the records before it (acknowledged records altered in place, or a genuine seal copied in); a
log shorter than ``state.json`` says was acknowledged (records cut off); unsealed frames that
``state.json`` says were acknowledged durable (a replay with a forged ``state.json``, a removed
seal, a log written before seals, or a rotated key the writer was not given); a log holding
fewer records than the last signed checkpoint, or whose prefix no longer hashes to that
checkpoint's root; a latest checkpoint not signed by a trusted key.
"""

# NOTE: long module: one procedure (find the trusted anchor, quarantine or refuse what follows),
# read top to bottom; its steps are small functions that share the walk's types.

from __future__ import annotations

import collections
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from semgov.audit.errors import AuditLogError, CheckpointConflictError, CorruptLogError, UnsealedRecordsError
from semgov.audit.frames import (
    CHECKPOINT_FILE,
    CHECKPOINTS_DIR,
    FRAME_HEADER,
    INDEX,
    LOG_FILE,
    QUARANTINE_DIR,
    SEAL_FLAG,
    STATE_FILE,
    BadFrame,
    frame_error,
)
from semgov.audit.fsio import READ_CHUNK, atomic_replace, open_dir, write_all
from semgov.audit.keyring import AuditKeyring, key_name_for
from semgov.audit.merkle import Frontier, leaf_hash
from semgov.audit.note import Checkpoint, NoteError, open_note, unverified_checkpoint
from semgov.audit.reader import FrameWalker, State, is_torn_tail, note_sizes, read_state
from semgov.log import get_logger
from semgov.signing.keys import SigningKey

#: Seals remembered while re-reading a log (newest first they are tried as the anchor).
_SEALS_KEPT: Final = 64


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
    cut_seals: int = 0  # seal frames in the tail cut off (of the newest 64 looked at): batches rolled back
    resumed_from: str = ""  # what vouches for the kept prefix: "seal", "checkpoint" or "start" (empty log)
    root: bytes = b""  # Merkle root of the kept prefix (of ``size`` records)
    quarantine_sha256: str = ""  # SHA-256 (hex) of the bytes moved to quarantine_file

    @property
    def clean(self) -> bool:
        return not self.rebuilt and not self.truncated_bytes


@dataclass(frozen=True)
class Opened:
    """The durable state the writer starts from."""

    frontier: Frontier
    log_bytes: int
    checkpoint_size: int
    have_checkpoint: bool
    seal_offset: int | None
    recovery: Recovery


# ---------------------------------------------------------------------------------------------
# Trusted keys and the last signed checkpoint


def parse_note_unverified(note: bytes, *, source: str) -> tuple[Checkpoint, list[str]]:
    """The checkpoint in a C2SP signed note and the key names that signed it, unverified."""
    try:
        return unverified_checkpoint(note)
    except NoteError as e:
        raise AuditLogError(f"not a signed checkpoint note: {e}", source=source) from e


class Trust:
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


def _seal_vouches(note: bytes, size: int, root: bytes, origin: str, trust: Trust) -> tuple[bool, list[str]]:
    """Whether ``note`` is a seal of this log's tree of ``size`` records with ``root``, by a trusted key."""
    try:
        cp, names = parse_note_unverified(note, source="")
    except AuditLogError:
        return False, []
    if (cp.origin, cp.size, cp.root) != (origin, size, root):
        return False, []
    return trust.vouches(note, names, size)


_ROTATION_HINT = (
    "if the log's key was rotated, open it with a keyring holding the previous key "
    "(AuditLog.open(keyring=...), semgov check --audit-keyring, SEMGOV_AUDIT_KEYRING; docs/operations.md)"
)


def _latest_checkpoint(directory: Path, trust: Trust, origin: str) -> Checkpoint | None:
    """The latest signed checkpoint on disk, verified with a key the writer trusts (else refused)."""
    candidates: list[tuple[int, Path]] = []
    main = directory / CHECKPOINT_FILE
    if main.exists():
        main_cp, _ = parse_note_unverified(main.read_bytes(), source=str(main))
        candidates.append((main_cp.size, main))
    sizes = note_sizes(directory)
    if sizes:
        candidates.append((sizes[-1], directory / CHECKPOINTS_DIR / f"{sizes[-1]}.note"))
    if not candidates:
        return None
    _, path = max(candidates, key=lambda c: c[0])
    note = path.read_bytes()
    cp, names = parse_note_unverified(note, source=str(path))
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


# ---------------------------------------------------------------------------------------------
# The fast path: state.json taken as is


def _unproven_state(state: State, cp: Checkpoint | None) -> str:
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
    log_fd: int, state: State, cp: Checkpoint | None, trust: Trust, origin: str, file_size: int
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
    if hashlib.sha256(INDEX.pack(field) + note).digest() != digest:
        return "the last seal frame is damaged"
    if not _seal_vouches(note, state.size, cp.root, origin, trust)[0]:
        return "the last seal is not signed by a trusted key for the checkpointed tree"
    return ""


# ---------------------------------------------------------------------------------------------
# Re-reading the log and finding the anchor


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
    bad: BadFrame | None
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

    with os.fdopen(os.dup(log_fd), "rb", buffering=READ_CHUNK) as f:
        walker = FrameWalker(f, file_size, on_seal)
        for _, off, rec in walker:
            frontier.append(leaf_hash(rec))
            if cp is not None and frontier.size == cp.size:
                cp_point = (off + FRAME_HEADER.size + len(rec), frontier.copy(), last_seal[0])
        torn = False
        if walker.bad is not None:
            torn = is_torn_tail(walker.bad, f, file_size, durable)
            if not torn:
                raise frame_error(str(directory / LOG_FILE), walker.bad, file_size, torn=False)
    return _Walked(frontier, walker.end, walker.bad, torn, seals, cp_point)


@dataclass(frozen=True)
class _Anchor:
    """The end of what a trusted seal or checkpoint vouches for: everything after it is unproven."""

    offset: int
    frontier: Frontier
    seal_offset: int | None  # the last seal frame kept
    untrusted: tuple[str, ...]  # key names of newer seals the writer does not trust
    kind: str = "seal"  # what it is: "seal", "checkpoint" or "start" (nothing vouches: an empty prefix)


def _anchor(directory: Path, walked: _Walked, cp: Checkpoint | None, trust: Trust, origin: str) -> _Anchor:
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
        return _Anchor(off, fr, seal, tuple(dict.fromkeys(untrusted)), "checkpoint")
    return _Anchor(0, Frontier(), None, tuple(dict.fromkeys(untrusted)), "start")


def _seal_conflict(seen: _Seen, origin: str, trust: Trust) -> str:
    """Why a seal a trusted key did sign does not fit where it stands ('' if not signed by one)."""
    try:
        cp, names = parse_note_unverified(seen.note, source="")
    except AuditLogError:
        return ""
    if not trust.vouches(seen.note, names, cp.size)[0]:
        return ""
    if cp.origin != origin:
        return f"for log {cp.origin!r}, not {origin!r}"
    if cp.size != seen.size:
        return f"for a tree of {cp.size} records, where {seen.size} precede it"
    return f"the {seen.size} records before it do not hash to its root"


# ---------------------------------------------------------------------------------------------
# Refusing, or cutting off what no trusted seal vouches for


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


def _quarantine(
    directory: Path, log_fd: int, dir_fd: int, start: int, stop: int, first: int
) -> tuple[Path, str]:
    """Copy bytes ``start..stop`` of records.log to ``quarantine/`` (fsynced) before they are cut off;
    the file, and the SHA-256 (hex) of the bytes."""
    qdir = directory / QUARANTINE_DIR
    if not qdir.is_dir():
        qdir.mkdir()
        os.fsync(dir_fd)
    qdir_fd = open_dir(qdir)
    try:
        tmp = qdir / f".{start}.tmp"
        digest = hashlib.sha256()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            off = start
            while off < stop:
                chunk = os.pread(log_fd, min(READ_CHUNK, stop - off), off)
                if not chunk:
                    raise AuditLogError(
                        "records.log shrank while its tail was moved to quarantine", source=str(directory)
                    )
                write_all(fd, chunk)
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
    return final, digest.hexdigest()


def _cut_unproven_tail(
    directory: Path,
    log_fd: int,
    dir_fd: int,
    walked: _Walked,
    anchor: _Anchor,
    file_size: int,
    durable: int | None,
) -> tuple[Path, str] | None:
    """Move the bytes after the anchor to quarantine and cut them off; their quarantine file and
    its SHA-256, or None.

    Refused (raises :class:`UnsealedRecordsError`, nothing changed) when ``state.json`` says some
    of them were acknowledged durable.
    """
    if anchor.offset >= file_size:
        return None
    if durable is not None and anchor.offset < durable:
        raise _refuse_unsealed(directory, walked, anchor, durable)
    quarantine = _quarantine(directory, log_fd, dir_fd, anchor.offset, file_size, anchor.frontier.size)
    os.ftruncate(log_fd, anchor.offset)
    return quarantine


# ---------------------------------------------------------------------------------------------
# Recovery


@dataclass(frozen=True)
class _Found:
    """What opening finds before it re-reads the log."""

    file_size: int  # bytes of records.log
    state: State | None  # state.json, if usable
    state_problem: str  # why not (empty when usable)
    cp: Checkpoint | None  # the latest checkpoint, verified with a trusted key
    floor: int  # records the log must hold: the last signed checkpoint's size (or state.json's)


def _find(directory: Path, log_fd: int, trust: Trust, origin: str) -> _Found:
    file_size = os.fstat(log_fd).st_size
    state, state_problem = read_state(directory)
    cp = _latest_checkpoint(directory, trust, origin)
    floor = max(cp.size if cp is not None else 0, state.checkpoint_size if state is not None else 0)
    return _Found(file_size, state, state_problem, cp, floor)


def recover(directory: Path, log_fd: int, dir_fd: int, *, origin: str, trust: Trust, verify: bool) -> Opened:
    """Establish the durable, provably written state of the log before the writer starts (module doc)."""
    found = _find(directory, log_fd, trust, origin)
    state, file_size = found.state, found.file_size
    if state is not None and not verify:
        rebuild_reason = _fast_state(log_fd, state, found.cp, trust, origin, file_size)
        if not rebuild_reason:
            clean = Recovery(state.size, file_size, False, "", 0, 0, "", found.floor)
            return Opened(
                state.frontier, file_size, found.floor, found.cp is not None, state.seal_offset, clean
            )
    else:
        rebuild_reason = found.state_problem if state is None and file_size else ""
    durable = state.log_bytes if state is not None and state.log_bytes <= file_size else None
    walked = _reread(directory, log_fd, file_size, found.cp, durable)
    _check_extends(directory, walked, found)
    anchor = _anchor(directory, walked, found.cp, trust, origin)
    if verify and state is not None and state.log_bytes == file_size and anchor.frontier != state.frontier:
        rebuild_reason = "state.json does not match the records (verify=True)"
    quarantine = _cut_unproven_tail(directory, log_fd, dir_fd, walked, anchor, file_size, durable)
    # NOTE: what a writer that failed (or was killed) left in the page cache but never got
    # durable becomes durable here, before any checkpoint can be signed over it.
    os.fsync(log_fd)
    return _finish(directory, dir_fd, walked, anchor, quarantine, found, rebuild_reason)


def _check_extends(directory: Path, walked: _Walked, found: _Found) -> None:
    """Refuse a log that does not extend its last signed checkpoint, or lost acknowledged records."""
    src = str(directory / LOG_FILE)
    cp, state, file_size = found.cp, found.state, found.file_size
    if walked.frontier.size < found.floor:
        raise CheckpointConflictError(
            f"log has {walked.frontier.size} records but checkpoint says {found.floor}: refusing to continue",
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


def _finish(
    directory: Path,
    dir_fd: int,
    walked: _Walked,
    anchor: _Anchor,
    quarantine: tuple[Path, str] | None,
    found: _Found,
    rebuild_reason: str,
) -> Opened:
    """Report what recovery did (a warning when not clean) and rewrite state.json if it changed."""
    truncated = found.file_size - anchor.offset
    size = anchor.frontier.size
    recovery = Recovery(
        size=size,
        log_bytes=anchor.offset,
        rebuilt=bool(rebuild_reason),
        rebuild_reason=rebuild_reason,
        truncated_bytes=truncated,
        truncated_at=anchor.offset if truncated else 0,
        torn_reason=walked.bad.reason if truncated and walked.bad is not None else "",
        checkpoint_size=found.floor,
        quarantined_records=walked.frontier.size - size,
        quarantine_file=str(quarantine[0]) if quarantine is not None else "",
        untrusted_signers=anchor.untrusted,
        cut_seals=sum(1 for s in walked.seals if s.offset >= anchor.offset) if truncated else 0,
        resumed_from=anchor.kind,
        root=anchor.frontier.root(),
        quarantine_sha256=quarantine[1] if quarantine is not None else "",
    )
    if not recovery.clean:
        _warn(directory, recovery)
    if recovery.rebuilt or truncated:
        state = State(size, anchor.offset, anchor.frontier, found.floor, anchor.seal_offset)
        atomic_replace(dir_fd, directory, STATE_FILE, state.to_bytes())
    return Opened(
        anchor.frontier, anchor.offset, found.floor, found.cp is not None, anchor.seal_offset, recovery
    )


def _warn(directory: Path, recovery: Recovery) -> None:
    """Log what a recovery that was not clean did, as a warning."""
    truncated = recovery.truncated_bytes
    get_logger().warning(
        "audit log recovered",
        directory=str(directory),
        records=recovery.size,
        log_bytes=recovery.log_bytes,
        rebuilt_because=recovery.rebuild_reason or None,
        truncated_bytes=truncated,
        truncated_at=recovery.truncated_at if truncated else None,
        torn=recovery.torn_reason or None,
        quarantined_records=recovery.quarantined_records if truncated else None,
        quarantine_file=recovery.quarantine_file or None,
        untrusted_signers=list(recovery.untrusted_signers) or None,
    )
