"""Shipping an audit log off its worker: what to send next, and how the store's copy is named.

A worker's log (``records.log`` plus ``checkpoints/``, :mod:`semgov.audit.frames`) is copied to
an object store an organisation already runs, as objects written once and never replaced:

- ``<prefix>/<origin>/records/<start>-<end>-<size>.frames``: the bytes ``[start, end)`` of
  ``records.log``, every frame in them, ending with a seal frame; ``size`` is the number of
  records before ``end`` (the tree size that seal signs). Zero-padded to 20 digits, so the
  store's lexicographic listing is the log's order.
- ``<prefix>/<origin>/checkpoints/<size>.note``: each checkpoint note the log kept.

This module is pure: it finds the next range in bytes it is handed (:func:`next_range`), names
and parses objects, and checks that a listing tiles the log from byte 0 without a gap or an
overlap (:func:`shipped_cursor`). :mod:`semgov.audit.shipper` does the reading and the store calls.

NOTE: invariants:
- Only sealed bytes are shipped: a range ends right after a seal frame. What follows the last
  seal may still be cut off by the writer's recovery (moved to ``quarantine/``), so it is never
  sent; sealed bytes never change.
- The store's listing is the cursor: a range starts where the last one the store holds ends.
  A crash after a write and before anything local is remembered sends the same range again,
  which the store refuses as already present (written once) and the shipper compares.
- Ranges are sent in log order, one at a time, and a checkpoint note only once the range with
  its seal is stored: the store's copy is always a prefix of the log, never one with a hole.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Final

from semgov.audit.errors import AuditLogError
from semgov.audit.frames import FRAME_HEADER, MAX_RECORD_BYTES, SEAL_FLAG, check_frame

#: A range object's name under ``<origin>/records/``.
_RANGE = re.compile(r"^(\d{20})-(\d{20})-(\d{20})\.frames$")
_NOTE = re.compile(r"^(\d{20})\.note$")
#: One path segment of an origin as a store key: no empty, ``.`` or ``..`` segment, no backslash.
_SEGMENT = re.compile(r"^[A-Za-z0-9_.:@+=,-]+$")
#: Default most bytes one range object holds (it still ends on a seal: a larger batch is one object).
DEFAULT_RANGE_BYTES: Final = 8 << 20


class ShipError(AuditLogError):
    """The log or the store's copy cannot be shipped as it is (a gap, an overlap, a changed range)."""


@dataclass(frozen=True, order=True)
class Range:
    """Bytes ``[start, end)`` of records.log, holding the records before tree size ``size``."""

    start: int
    end: int
    size: int

    @property
    def name(self) -> str:
        return f"{self.start:020d}-{self.end:020d}-{self.size:020d}.frames"


def range_key(prefix: str, origin: str, r: Range) -> str:
    """The object key of range ``r`` of the log named ``origin``."""
    return f"{log_prefix(prefix, origin)}records/{r.name}"


def note_key(prefix: str, origin: str, size: int) -> str:
    """The object key of the checkpoint note for tree size ``size``."""
    return f"{log_prefix(prefix, origin)}checkpoints/{size:020d}.note"


def log_prefix(prefix: str, origin: str) -> str:
    """Where one log's objects live: ``<prefix>/<origin>/``. The origin must be usable as a key:
    ``/``-separated segments of letters, digits and ``_.:@+=,-``, none of them ``.`` or ``..``."""
    segments = origin.split("/")
    if not all(_SEGMENT.match(s) and s not in (".", "..") for s in segments):
        raise ShipError(
            f"the log's origin {origin!r} cannot name objects in a store: use segments of letters, "
            "digits and _.:@+=,- separated by /, none of them . or .. (SEMGOV_AUDIT_ORIGIN)"
        )
    head = prefix.strip("/")
    return f"{head}/{origin}/" if head else f"{origin}/"


def parse_range(name: str) -> Range | None:
    """The range an object name under ``records/`` stands for, or None if it is not one."""
    m = _RANGE.match(name)
    if m is None:
        return None
    return Range(int(m[1]), int(m[2]), int(m[3]))


def parse_note(name: str) -> int | None:
    """The tree size of a note object name under ``checkpoints/``, or None."""
    m = _NOTE.match(name)
    return int(m[1]) if m else None


def shipped_cursor(names: list[str], where: str) -> Range:
    """Where the store's copy ends, from the names under ``records/``: it must tile records.log from 0.

    Returns ``Range(0, end, size)``: the bytes and records the store holds. Raises
    :class:`ShipError` (its source ``where``, the listing's place) for a name that is not a range,
    a gap, an overlap or a size that goes back.
    """
    ranges = []
    for n in names:
        r = parse_range(n)
        if r is None:
            raise ShipError(
                f"{n}: not a range object of a semgov log (records/<start>-<end>-<size>.frames)", source=where
            )
        ranges.append(r)
    ranges.sort()
    end, size = 0, 0
    for r in ranges:
        if r.start != end:
            what = "a gap" if r.start > end else "an overlap"
            raise ShipError(f"{r.name}: {what}: the store's copy ends at byte {end} before it", source=where)
        if r.end <= r.start or r.size < size:
            raise ShipError(f"{r.name}: an empty range, or fewer records than the range before", source=where)
        end, size = r.end, r.size
    return Range(0, end, size)


def next_range(
    data: bytes, start: int, size: int, limit: int = DEFAULT_RANGE_BYTES, *, source: str = "records.log"
) -> Range | None:
    """The next range to ship from ``data`` (records.log's bytes from byte ``start`` on, ``size``
    records before it): every frame up to the last seal that ends within ``limit`` bytes, or up to
    the first seal when even that one ends past it. None when no seal follows ``start`` yet.

    Each frame is checked (:func:`semgov.audit.frames.check_frame`) so a damaged log is never sent
    as if it were sound; a bad frame raises :class:`ShipError` naming its record and offset. A frame
    that runs past the end of ``data`` is the unsealed tail and ends the search.
    """
    hsize, off, index = FRAME_HEADER.size, 0, size
    best: Range | None = None
    while off + hsize <= len(data):
        field, length, digest = FRAME_HEADER.unpack_from(data, off)
        end = off + hsize + length
        if length > MAX_RECORD_BYTES or end > len(data):
            break
        bad = check_frame(index, start + off, start + end, field, digest, data[off + hsize : end])
        if bad is not None:
            raise ShipError(
                f"record {bad.index} at byte offset {bad.offset}: {bad.reason} (not shipped)", source=source
            )
        off = end
        if field & SEAL_FLAG:
            if best is not None and off > limit:
                break
            best = Range(start, start + off, index)
        else:
            index += 1
    return best


def digest(data: bytes) -> str:
    """``sha256:<hex>`` of an object's bytes (compared when the store already holds a range)."""
    return "sha256:" + hashlib.sha256(data).hexdigest()
