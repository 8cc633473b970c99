"""Reading an audit log directory: records, the latest checkpoint, ``state.json``.

Reading: :func:`iter_records` and :func:`read_checkpoint` take no lock and write nothing. The
frame walker, the torn-tail rule and the ``state.json`` parser here are also what the writer's
crash recovery (:mod:`semgov.audit.recovery`) re-reads the log with.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from semgov.audit.errors import AuditLogError
from semgov.audit.frames import (
    CHECKPOINT_FILE,
    CHECKPOINTS_DIR,
    FRAME_HEADER,
    LOG_FILE,
    MAX_RECORD_BYTES,
    SEAL_FLAG,
    STATE_FILE,
    BadFrame,
    check_frame,
    frame_error,
    note_files,
)
from semgov.audit.fsio import READ_CHUNK
from semgov.audit.merkle import Frontier
from semgov.wire import strictjson

#: Called for each seal frame: (records before it, frame offset, frame end, the note).
SealCallback = Callable[[int, int, int, bytes], None]


class FrameWalker:
    """Iterate the record frames of ``f`` up to ``file_size``; afterwards ``bad`` names the first bad one.

    Yields ``(index, offset, record)`` for every complete, hash-valid record frame in order,
    calls ``on_seal`` for every complete, hash-valid seal frame standing where its size says, and
    stops at the first frame that is neither.
    """

    def __init__(
        self,
        f: BinaryIO,
        file_size: int,
        on_seal: SealCallback | None = None,
        *,
        start: tuple[int, int] = (0, 0),
    ) -> None:
        self._f = f
        self.file_size = file_size
        self.on_seal = on_seal
        self.bad: BadFrame | None = None
        self._start = start  # NOTE: (byte offset, record index) of a frame boundary walked before
        self.end, self.count = start  # end of the last good frame, records

    def __iter__(self) -> Iterator[tuple[int, int, bytes]]:
        f, size, hsize = self._f, self.file_size, FRAME_HEADER.size
        unpack = FRAME_HEADER.unpack
        off, index = self._start
        f.seek(off)
        while off < size:
            if size - off < hsize:
                self.bad = BadFrame(
                    index, off, "short_header", f"{size - off} bytes, less than a frame header", None
                )
                break
            frame_index, length, digest = unpack(f.read(hsize))
            end = off + hsize + length
            if length > MAX_RECORD_BYTES:
                self.bad = BadFrame(index, off, "bad_length", f"frame length {length} is too large", end)
                break
            if end > size:
                self.bad = BadFrame(
                    index, off, "short_body", f"frame needs {length} bytes, {size - off - hsize} left", end
                )
                break
            payload = f.read(length)
            if len(payload) != length:  # the file shrank under us
                self.bad = BadFrame(index, off, "short_body", "file ended while reading the record", end)
                break
            self.bad = check_frame(index, off, end, frame_index, digest, payload)
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


def _all_zero(f: BinaryIO, start: int, stop: int) -> bool:
    f.seek(start)
    left = stop - start
    while left > 0:
        chunk = f.read(min(left, READ_CHUNK))
        if not chunk:
            return False
        if chunk.count(0) != len(chunk):
            return False
        left -= len(chunk)
    return True


def is_torn_tail(bad: BadFrame, f: BinaryIO, file_size: int, durable_bytes: int | None) -> bool:
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


# ---------------------------------------------------------------------------------------------
# state.json and checkpoints


@dataclass(frozen=True)
class State:
    """What ``state.json`` says (a cache: the log is the truth)."""

    size: int
    log_bytes: int
    frontier: Frontier
    checkpoint_size: int
    seal_offset: int | None  # byte offset of the last seal frame (None: no seal yet)

    def to_bytes(self) -> bytes:
        """The ``state.json`` document that :func:`read_state` reads back as this state."""
        doc = {
            "size": self.size,
            "log_bytes": self.log_bytes,
            "frontier": self.frontier.to_json(),
            "checkpoint_size": self.checkpoint_size,
            "seal_offset": self.seal_offset,
        }
        return json.dumps(doc).encode("utf-8")


def read_state(directory: Path) -> tuple[State | None, str]:
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
    return State(size, log_bytes, frontier, cp_size, seal_offset), ""


def durable_bound(directory: Path, file_size: int) -> int | None:
    """``state.json``'s ``log_bytes`` when it can bound where a crash may have torn the log."""
    state, _ = read_state(directory)
    if state is None or state.log_bytes > file_size:
        return None
    return state.log_bytes


def note_sizes(directory: Path) -> list[int]:
    """The tree sizes of the ``checkpoints/<size>.note`` files of the log, ascending."""
    try:
        names = os.listdir(directory / CHECKPOINTS_DIR)
    except FileNotFoundError:
        return []
    return [int(n[:-5]) for n in note_files(names)]


# ---------------------------------------------------------------------------------------------
# Readers: no lock, no writes


def iter_records(directory: Path, on_seal: SealCallback | None = None) -> Iterator[tuple[int, bytes]]:
    """Yield ``(index, record bytes)`` for every complete record of the log, in order.

    Seal frames are not records: ``on_seal(records before it, offset, end, note)`` is called for
    each one (unverified). Takes no lock and writes nothing. After the last good record it
    raises :class:`~semgov.audit.errors.TornTailError` if the file ends in an incomplete frame
    (a writer crashed, or is in the middle of a write), or
    :class:`~semgov.audit.errors.CorruptLogError` (with index and byte offset) if a frame
    elsewhere is bad.
    """
    directory = Path(directory)
    path = directory / LOG_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise AuditLogError(f"cannot read audit log: {e.strerror}", source=str(path)) from e
    with os.fdopen(fd, "rb", buffering=READ_CHUNK) as f:
        file_size = os.fstat(f.fileno()).st_size
        durable = durable_bound(directory, file_size)
        walker = FrameWalker(f, file_size, on_seal)
        for index, _, rec in walker:
            yield index, rec
        if walker.bad is not None:
            torn = is_torn_tail(walker.bad, f, file_size, durable)
            raise frame_error(str(directory / LOG_FILE), walker.bad, file_size, torn=torn)


def read_checkpoint(directory: Path) -> bytes | None:
    """The latest signed checkpoint note of the log in ``directory`` (None if none yet)."""
    path = Path(directory) / CHECKPOINT_FILE
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise AuditLogError(f"cannot read checkpoint: {e.strerror}", source=str(path)) from e


def decoded_records(directory: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(index, record)`` of every record, decoded as JSON objects (not verified: ``semgov audit
    verify`` does that); a record that is not a JSON object is an :class:`AuditLogError`. Warns
    (once, at the end) when the last records are not sealed."""
    after_seal = [0, 0]  # records since the last seal frame, seal frames seen

    def on_seal(*_: Any) -> None:
        after_seal[0] = 0
        after_seal[1] += 1

    for i, leaf in iter_records(directory, on_seal):
        after_seal[0] += 1
        try:
            # NOTE: a record cannot nest deeper than it has brackets: only one with many goes
            # through the strict reader (slower, but depth-limited); the rest stay on json.loads.
            if leaf.count(b"[") + leaf.count(b"{") > strictjson.MAX_DEPTH:
                rec = strictjson.loads(leaf)
            else:
                rec = json.loads(leaf)
        except ValueError as e:
            raise AuditLogError(f"record {i} is not JSON: {e}", source=str(directory)) from e
        if not isinstance(rec, dict):
            raise AuditLogError(f"record {i} is not a JSON object", source=str(directory))
        yield i, rec
    if after_seal[0] and after_seal[1]:
        from semgov.log import get_logger

        get_logger().warning(
            f"{directory}: the last {after_seal[0]} records are not sealed (a writer is mid-write or "
            "crashed, or someone else appended them); these are counts of unverified records: run "
            "`semgov audit verify`"
        )


class AuditTail:
    """The records a live log gained since the last :meth:`poll`, decoded (no lock, no writes).

    For a reader that follows a running writer (``semgov calibrate`` reading the server's own
    events): each poll walks only the frames past the last one read, stops quietly at a frame the
    writer has not finished, and raises :class:`~semgov.audit.errors.AuditLogError` for a bad frame
    or a log that shrank below what was read. Records are not verified here.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.offset = 0
        self.index = 0

    def poll(self) -> list[dict[str, Any]]:
        """The new records, decoded."""
        leaves = self.poll_raw()
        first = self.index - len(leaves)
        return [_decoded(first + i, leaf, self.directory / LOG_FILE) for i, leaf in enumerate(leaves)]

    def poll_raw(self) -> list[bytes]:
        """The new records, as the log holds them (the bytes their signatures cover)."""
        path = self.directory / LOG_FILE
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return []  # NOTE: no record written yet
        except OSError as e:
            raise AuditLogError(f"cannot read audit log: {e.strerror}", source=str(path)) from e
        out: list[bytes] = []
        with os.fdopen(fd, "rb", buffering=READ_CHUNK) as f:
            size = os.fstat(f.fileno()).st_size
            if size < self.offset:
                raise AuditLogError(
                    f"the log is {size} bytes, shorter than the {self.offset} already read (replaced?)",
                    source=str(path),
                )
            walker = FrameWalker(f, size, start=(self.offset, self.index))
            for _, _, leaf in walker:
                out.append(leaf)
            bad = walker.bad
            if bad is not None and not is_torn_tail(bad, f, size, durable_bound(self.directory, size)):
                raise frame_error(str(path), bad, size, torn=False)  # NOTE: else a write in progress
            self.offset, self.index = walker.end, walker.count
        return out


def _decoded(i: int, leaf: bytes, path: Path) -> dict[str, Any]:
    try:
        rec = (
            strictjson.loads(leaf)
            if leaf.count(b"[") + leaf.count(b"{") > strictjson.MAX_DEPTH
            else json.loads(leaf)
        )
    except ValueError as e:
        raise AuditLogError(f"record {i} is not JSON: {e}", source=str(path)) from e
    if not isinstance(rec, dict):
        raise AuditLogError(f"record {i} is not a JSON object", source=str(path))
    return rec
