"""Capturing live traffic: governed requests written as ``semgov.captured_request/v1`` JSON Lines.

An engine hook offers each request it decided (with its donor candidates) to a
:class:`CaptureWriter` from its decision thread or process; a daemon thread serializes and
writes them, so that ``semgov check`` and ``semgov diff`` can replay real traffic
(:func:`semgov.intake.capture.read_captured` reads the capture directory as one stream).

:meth:`CaptureWriter.offer` never blocks and never raises: it only puts the request on a
bounded queue, and drops it (counted) when the queue is full or the writer is closed. The
writer thread never stops for a bad request or an I/O error either: it counts the failure,
logs it, and goes on (the next write opens a new file).

Files are ``{prefix}-{UTC start}-{pid}-{seq}.jsonl`` in the capture directory (see
:class:`CaptureWriter`); each line is one ``write`` call on an ``O_APPEND`` descriptor, with no
``fsync``: a capture is for replay, not the audit log, and the newest file may end in a line
still being written (it reads as one malformed line).

A capture is personal data: with ``keep_text`` off it holds no prompt text, but it holds every
prompt's token ids, and token ids decode back to the text with the model's tokenizer. So the
writer keeps a capture directory bounded in size and in age (``max_total_bytes``, ``max_age_s``;
:class:`CaptureWriter`), deleting its oldest files, and the hook samples only the share of
requests its operator chose (``SEMGOV_CAPTURE_RATE``, required with ``SEMGOV_CAPTURE_DIR``).
"""

from __future__ import annotations

import os
import queue
import re
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import field_serializer

from semgov.errors import InputError
from semgov.log import get_logger
from semgov.wire.models import CapturedRequest
from semgov.wire.timefmt import rfc3339

__all__ = ["CaptureStats", "CaptureWriter"]

_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
# NOTE: how many existing names (another writer of this process started in the same second with
# the same prefix) a new file skips before the open counts as failed.
_NAME_TRIES = 1000
# NOTE: how often at least the writer thread looks at its files' ages and sizes without traffic.
_PRUNE_EVERY_S = 60.0


class _Wire(CapturedRequest):
    """A captured request as written: ``received_at`` rendered with :func:`rfc3339`.

    NOTE: the default datetime serializer drops an :class:`~semgov.wire.timefmt.Instant`'s
    nanoseconds past the microsecond; ``received_at`` is the replay's decision clock, and times
    compare as exact nanoseconds (an expiry within that microsecond would flip on replay).
    """

    @field_serializer("received_at")
    def _received_at(self, v: datetime) -> str:
        return rfc3339(v)


# NOTE: by field name, never ``exclude_none``: that would also drop the provenance payload's
# null values (``text_sha256``), and the signature is over the payload exactly as it was signed.
_NO_TEXT: dict[str, Any] = {
    "prompt": {"text": True},
    "candidates": {"__all__": {"prompt": {"text": True}}},
}


def _serialize(request: CapturedRequest, *, keep_text: bool = False) -> bytes:
    """One JSON line (newline included) that :func:`~semgov.intake.capture.parse_line` reads back
    into a request equal to ``request`` (without its texts unless ``keep_text``).

    The model is serialized by alias (``schema``), ``received_at`` to the nanosecond (as UTC),
    and each provenance ``payload`` as the raw JSON object it is, so its Ed25519 signature still
    verifies. Raises whatever pydantic raises for a value it cannot serialize.
    """
    wire = _Wire.model_construct(_fields_set=request.model_fields_set, **dict(request))
    body = wire.model_dump_json(by_alias=True, exclude=None if keep_text else _NO_TEXT)
    return body.encode("utf-8") + b"\n"


@dataclass(frozen=True, slots=True)
class CaptureStats:
    """What a :class:`CaptureWriter` has done so far."""

    offered: int  # every offer() call
    written: int  # lines written whole
    dropped: int  # queue full or closed
    failed: int  # could not serialize or write
    files: int  # files created
    bytes: int  # bytes written
    pruned: int = 0  # files deleted for the size or age cap


_CLOSE = object()


class CaptureWriter:
    """Writes offered :class:`CapturedRequest` objects as JSON Lines from a daemon thread.

    ``directory`` is created (mode 0o700) when missing; a directory that cannot be created or
    written is an :class:`InputError` naming it. Files are
    ``{prefix}-{UTC start as YYYYmmddTHHMMSSZ}-{pid}-{seq:06d}.jsonl`` (the writer's start time,
    ``seq`` from 1), created with ``O_CREAT | O_EXCL | O_APPEND`` and mode 0o600, so the names
    sort in the order they were written. A line that would take the current file over
    ``max_file_bytes`` goes to the next file; a line longer than that goes alone in a fresh file.

    Bounded in size and age: before a new file is opened, the oldest of this prefix's files in the
    directory (earlier runs' included) are deleted until they and the new file fit in
    ``max_total_bytes`` (which must be at least ``max_file_bytes``; a line longer than it is never
    written, counted as failed); a file is closed ``max_age_s / 4`` after it was opened and deleted
    once its last line is ``3 * max_age_s / 4`` old, so no line is kept much past ``max_age_s`` (the
    thread looks at least every minute, traffic or not). Only the writer's own names are deleted;
    keep one writer per directory.

    ``keep_text=False`` (the default) drops every prompt's ``text``, the request's and each
    candidate's: only token ids, segments, metadata and the signed provenance are written. Token
    ids are the text to anyone with the model's tokenizer: a capture without text is still
    personal data. The
    provenance already binds the donor's token hash (and its segments' and text's), so a replay
    still verifies that the donor tokens are the ones signed. A replay without text scans no
    donor text for PII, as the engine decides for a donor offered without text: where the engine
    decided with the donor's text, a text-free replay can allow a donor whose text scan found
    forbidden PII its provenance did not declare (``keep_text=True`` replays exactly).

    :meth:`offer` may be called from any thread, never blocks and never raises (``False``: the
    request was dropped, because ``queue_size`` requests are waiting or the writer is closed).
    Create the writer in the process that offers (the thread does not survive a fork), and
    :meth:`close` it on shutdown: what is still queued at interpreter exit is lost. A request is
    serialized on the writer thread, after ``offer`` returns: it is frozen, but its provenance
    ``payload`` is a dict, which the caller must not change once offered.
    """

    def __init__(
        self,
        directory: Path,
        *,
        max_file_bytes: int = 64 << 20,
        keep_text: bool = False,
        queue_size: int = 1024,
        prefix: str = "capture",
        max_total_bytes: int = 1 << 30,
        max_age_s: float = 7 * 86400.0,
    ) -> None:
        if max_file_bytes < 1 or queue_size < 1 or not max_age_s > 0:
            raise ValueError(
                f"max_file_bytes ({max_file_bytes}), queue_size ({queue_size}) and max_age_s "
                f"({max_age_s}) must be positive"
            )
        if max_total_bytes < max_file_bytes:
            raise ValueError(
                f"max_total_bytes ({max_total_bytes}) is below max_file_bytes ({max_file_bytes})"
            )
        if not prefix or os.sep in prefix or (os.altsep is not None and os.altsep in prefix):
            raise ValueError(f"prefix must be a non-empty file name part, not {prefix!r}")
        self.directory = Path(directory)
        _prepare_directory(self.directory)
        self.max_file_bytes = max_file_bytes
        self.max_total_bytes = max_total_bytes
        self.max_age_s = max_age_s
        self.keep_text = keep_text
        self.queue_size = queue_size
        self._stem = f"{prefix}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}-{os.getpid()}"
        self._mine = re.compile(re.escape(prefix) + r"-\d{8}T\d{6}Z-\d+-\d{6}\.jsonl")
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self._pending = self._offered = self._dropped = 0
        self._written = self._failed = self._files = self._bytes = self._pruned = 0
        # the writer thread's own state
        self._fd: int | None = None
        self._path: Path | None = None
        self._opened = 0.0  # time.monotonic() the current file was opened
        self._pruned_at = float("-inf")
        self._size = 0
        self._seq = 0
        self._io_warned = self._serialize_warned = False
        self._thread = threading.Thread(target=self._run, name="semgov-capture-writer", daemon=True)
        self._thread.start()

    # ---- the caller's side ----------------------------------------------------------------------

    def offer(self, request: CapturedRequest) -> bool:
        """Queue ``request`` for writing; ``False`` when it was dropped (queue full or closed).

        Never blocks (beyond a lock held for a few counter updates) and never raises.
        """
        try:
            with self._cond:
                self._offered += 1
                if self._closed or self._pending >= self.queue_size:
                    self._dropped += 1
                    return False
                self._pending += 1
                self._queue.put(request)  # NOTE: unbounded SimpleQueue: never waits
                return True
        except Exception:  # noqa: BLE001 - offer never raises into the engine
            return False

    def stats(self) -> CaptureStats:
        """The counters so far (``written + failed`` catch up with what was queued)."""
        with self._cond:
            return CaptureStats(
                offered=self._offered,
                written=self._written,
                dropped=self._dropped,
                failed=self._failed,
                files=self._files,
                bytes=self._bytes,
                pruned=self._pruned,
            )

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every request offered so far is written (or failed); ``False`` on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            target = self._offered - self._dropped
            while self._written + self._failed < target:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return False
                self._cond.wait(left)
            return True

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, close the file and stop the thread (waiting up to ``timeout``
        seconds); every later :meth:`offer` is dropped. Calling it again does nothing more."""
        with self._cond:
            first = not self._closed
            self._closed = True
        if first:
            self._queue.put(_CLOSE)
        self._thread.join(timeout)

    # ---- the writer thread ----------------------------------------------------------------------

    def _run(self) -> None:
        self._tick()
        while True:
            try:
                item = self._queue.get(timeout=self._tick_s())
            except queue.Empty:
                self._tick()
                continue
            if item is _CLOSE:
                self._close_file()
                return
            with self._cond:
                self._pending -= 1  # NOTE: the queue bound counts requests waiting, not this one
            try:
                ok, size = self._handle(item)
            except Exception as e:  # noqa: BLE001 - the thread never dies
                ok, size = False, 0
                self._warn_io(e)
            with self._cond:
                if ok:
                    self._written += 1
                    self._bytes += size
                else:
                    self._failed += 1
                self._cond.notify_all()

    def _handle(self, item: object) -> tuple[bool, int]:
        """Serialize and write one request: (written, bytes)."""
        try:
            if not isinstance(item, CapturedRequest):
                raise TypeError(f"expected a CapturedRequest, got {type(item).__name__}")
            line = _serialize(item, keep_text=self.keep_text)
        except Exception as e:  # noqa: BLE001 - a request that cannot be serialized is counted
            if not self._serialize_warned:
                self._serialize_warned = True
                get_logger().warning(
                    "capture: cannot serialize a request (counted as failed; logged once)",
                    error=f"{type(e).__name__}: {e}",
                )
            return False, 0
        try:
            self._write(line)
        except OSError as e:
            self._close_file()
            self._warn_io(e)
            return False, 0
        self._io_warned = False
        return True, len(line)

    def _write(self, line: bytes) -> None:
        if len(line) > self.max_total_bytes:
            raise OSError(f"a line of {len(line)} bytes is over the capture's max_total_bytes")
        self._tick()
        if self._fd is not None and self._size > 0 and self._size + len(line) > self.max_file_bytes:
            self._close_file()
        if self._fd is None:
            self._open_next()
        assert self._fd is not None
        n = os.write(self._fd, line)
        self._size += n
        if n != len(line):
            raise OSError(f"short write: {n} of {len(line)} bytes")

    def _open_next(self) -> None:
        self._prune(self.max_file_bytes)
        for _ in range(_NAME_TRIES):
            self._seq += 1
            path = self.directory / f"{self._stem}-{self._seq:06d}.jsonl"
            try:
                self._fd = os.open(path, _FILE_FLAGS, 0o600)
            except FileExistsError:
                continue
            self._size = 0
            self._path, self._opened = path, time.monotonic()
            with self._cond:
                self._files += 1
            return
        raise OSError(f"no free capture file name after {_NAME_TRIES} tries ({self._stem}-*)")

    # ---- the caps (the writer thread) ----------------------------------------------------------------

    def _tick_s(self) -> float:
        return min(_PRUNE_EVERY_S, self.max_age_s / 4)

    def _tick(self) -> None:
        """Close the current file once it is ``max_age_s / 4`` old; prune when a look is due."""
        now = time.monotonic()
        if self._fd is not None and now - self._opened >= self.max_age_s / 4:
            self._close_file()
        if now - self._pruned_at >= self._tick_s():
            self._prune(0)

    def _prune(self, reserve: int) -> None:
        """Delete this prefix's closed files whose last line is ``3 * max_age_s / 4`` old, then the
        oldest until they, the open file and ``reserve`` more bytes fit in ``max_total_bytes``."""
        self._pruned_at = time.monotonic()
        try:
            files = sorted(
                (p for p in self.directory.iterdir() if self._mine.fullmatch(p.name) and p != self._path),
                key=lambda p: p.name,
            )
            sizes = {p: p.lstat() for p in files}
        except OSError as e:
            self._warn_io(e)
            return
        too_old = time.time() - self.max_age_s * 3 / 4
        budget = self.max_total_bytes - reserve - (self._size if self._fd is not None else 0)
        kept = sum(st.st_size for st in sizes.values())
        for p, st in sizes.items():
            if st.st_mtime >= too_old and kept <= budget:
                continue
            try:
                p.unlink()
            except FileNotFoundError:
                pass
            except OSError as e:
                self._warn_io(e)
                continue
            kept -= st.st_size
            with self._cond:
                self._pruned += 1

    def _close_file(self) -> None:
        fd, self._fd = self._fd, None
        self._path = None
        if fd is not None:
            try:
                os.close(fd)
            except OSError as e:
                self._warn_io(e)

    def _warn_io(self, e: BaseException) -> None:
        """Log the first failure of each outage (a later success re-arms it)."""
        if self._io_warned:
            return
        self._io_warned = True
        get_logger().warning(
            f"capture: cannot write to {self.directory} (counted as failed; the next write opens a new file)",
            error=f"{type(e).__name__}: {e}",
        )


def _prepare_directory(directory: Path) -> None:
    """Create ``directory`` (0o700) when missing; :class:`InputError` unless it is a writable directory."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(
            f"cannot create the capture directory: {e.strerror or e}", source=str(directory)
        ) from e
    if not directory.is_dir():
        raise InputError("the capture directory is not a directory", source=str(directory))
    if not os.access(directory, os.W_OK | os.X_OK):
        raise InputError("the capture directory is not writable", source=str(directory))
