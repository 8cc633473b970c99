"""``semgov audit ship`` and ``fetch``: copy a worker's sealed log to a store, and back for review.

:func:`ship_once` sends what the store lacks, in log order (:mod:`semgov.audit.ship` says what
and how it is named); :func:`ship_follow` repeats it, and when the store cannot be reached keeps
the local log as it is and catches up once the store answers again. :func:`fetch` rebuilds a log
directory from the store's copy, for ``semgov audit verify`` (which trusts nothing the store or
the shipper says: it checks every frame, signature and checkpoint).

The shipper only reads the log: it takes no lock, writes nothing in the log directory, and never
waits on the writer. It may run beside a live writer (a sidecar per worker).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from semgov.audit.errors import AuditLogError
from semgov.audit.frames import CHECKPOINT_FILE, CHECKPOINTS_DIR, LOG_FILE, MAX_RECORD_BYTES
from semgov.audit.origin import ORIGIN_FILE, origin_in_log
from semgov.audit.reader import note_sizes
from semgov.audit.ship import (
    DEFAULT_RANGE_BYTES,
    Range,
    ShipError,
    digest,
    log_prefix,
    next_range,
    note_key,
    parse_note,
    parse_range,
    range_key,
    shipped_cursor,
)
from semgov.audit.stores import Store, StoreUnavailable
from semgov.log import describe_error, get_logger


@dataclass
class Shipped:
    """What one pass sent, and where the store's copy ends now."""

    origin: str
    ranges: int = 0
    bytes: int = 0
    notes: int = 0
    end: Range = field(default_factory=lambda: Range(0, 0, 0))


def _origin(log_dir: Path) -> str | None:
    """The origin the log's checkpoints (or first seal) name; None before the first seal."""
    try:
        fd = os.open(log_dir / LOG_FILE, os.O_RDONLY)
    except OSError as e:
        raise AuditLogError(f"cannot read audit log: {e.strerror}", source=str(log_dir / LOG_FILE)) from e
    try:
        return origin_in_log(log_dir, fd)
    finally:
        os.close(fd)


def _read(path: Path, start: int, n: int) -> bytes:
    with path.open("rb") as f:
        f.seek(start)
        return f.read(n)


def _put(store: Store, key: str, data: bytes) -> bool:
    """Write ``key`` once; True if written now, False if the store already held these bytes."""
    held = store.put_once(key, data)
    if held is None:
        return True
    _compare(store, key, data, held)
    return False


def _compare(store: Store, key: str, data: bytes, held: bytes | None = None) -> None:
    """Refuse unless the store holds ``data`` at ``key``."""
    if held is None:
        held = store.get(key)
    if held != data:
        raise ShipError(
            f"{key}: the store already holds other bytes ({digest(held)}) than the log's ({digest(data)}): "
            "another log with this origin, or a log rewritten since it was shipped; nothing was replaced",
            source=store.where,
        )


def ship_once(
    log_dir: Path,
    store: Store,
    prefix: str = "",
    *,
    limit: int = DEFAULT_RANGE_BYTES,
    check_tail: bool = True,
) -> Shipped:
    """Send every sealed range and checkpoint note of ``log_dir`` the store does not hold yet.

    With ``check_tail`` (a shipper's first pass) the last range the store holds is read back and
    compared with the log's bytes: a store copy of another log with this origin, or of this log
    before it was rewritten, is refused instead of extended.
    """
    origin = _origin(log_dir)
    if origin is None:
        return Shipped(origin="")  # nothing sealed yet
    lp = log_prefix(prefix, origin)
    done = Shipped(origin=origin)
    names = store.list(lp + "records/")
    done.end = shipped_cursor(names, store.where + lp + "records/")
    path = log_dir / LOG_FILE
    file_size = path.stat().st_size
    if file_size < done.end.end:
        raise ShipError(
            f"records.log has {file_size} bytes but the store's copy of {origin!r} has {done.end.end}: "
            "the log lost sealed bytes, or another log has this origin; nothing was shipped",
            source=str(path),
        )
    if check_tail and names:
        last = max(r for n in names if (r := parse_range(n)) is not None)
        _compare(store, lp + "records/" + last.name, _read(path, last.start, last.end - last.start))
    while done.end.end < file_size:
        want = min(file_size - done.end.end, limit)
        while True:
            data = _read(path, done.end.end, want)
            r = next_range(data, done.end.end, done.end.size, limit, source=str(path))
            if r is not None or want >= min(file_size - done.end.end, limit + MAX_RECORD_BYTES):
                break
            want = min(file_size - done.end.end, want * 2)  # one sealed batch larger than limit
        if r is None:
            break  # only unsealed bytes follow
        body = data[: r.end - r.start]
        if _put(store, range_key(prefix, origin, r), body):
            done.ranges += 1
            done.bytes += len(body)
        done.end = r
    done.notes = _ship_notes(log_dir, store, prefix, origin, done.end.size)
    return done


def _ship_notes(log_dir: Path, store: Store, prefix: str, origin: str, shipped_size: int) -> int:
    """Send the checkpoint notes of sizes the store's records cover; how many were new."""
    lp = log_prefix(prefix, origin)
    held = {parse_note(n) for n in store.list(lp + "checkpoints/")}
    sent = 0
    for size in note_sizes(log_dir):
        if size > shipped_size or size in held:
            continue
        note = (log_dir / CHECKPOINTS_DIR / f"{size}.note").read_bytes()
        sent += _put(store, note_key(prefix, origin, size), note)
    return sent


def ship_follow(
    log_dir: Path,
    store: Store,
    prefix: str = "",
    *,
    interval_s: float = 5.0,
    limit: int = DEFAULT_RANGE_BYTES,
    stop: Callable[[], bool] = lambda: False,
    max_backoff_s: float = 60.0,
) -> None:
    """Ship every ``interval_s`` until ``stop()``; an unreachable store is retried with backoff.

    NOTE: nothing is dropped or reordered while the store is away: the local log keeps growing
    (the shipper never touches it) and the next pass that reaches the store sends every range
    after the last it holds, in order. Anything but an unreachable store (a conflict, a damaged
    log) stops the shipper with that error.
    """
    log = get_logger()
    wait, checked = interval_s, False
    while not stop():
        try:
            done = ship_once(log_dir, store, prefix, limit=limit, check_tail=not checked)
            checked = True
        except StoreUnavailable as e:
            log.warning("audit store unreachable; the local log keeps everything", why=describe_error(e))
            wait = min(max(wait * 2, interval_s), max_backoff_s)
        else:
            if done.ranges or done.notes:
                log.info(
                    "audit log shipped", origin=done.origin, ranges=done.ranges, bytes=done.bytes,
                    notes=done.notes, records=done.end.size,
                )  # fmt: skip
            wait = interval_s
        deadline = time.monotonic() + wait
        while not stop() and time.monotonic() < deadline:
            time.sleep(min(0.2, wait))


def stored_logs(store: Store, prefix: str = "") -> list[str]:
    """The origins of every log the store holds under ``prefix``."""
    head = prefix.strip("/") + "/" if prefix.strip("/") else ""
    origins = set()
    for key in store.list(head):
        if "/records/" in key:
            origins.add(key.rsplit("/records/", 1)[0])
    return sorted(origins)


def fetch(store: Store, prefix: str, origin: str, out: Path) -> Range:
    """Rebuild the log ``origin`` from the store in the new directory ``out``; the range it holds."""
    lp = log_prefix(prefix, origin)
    names = store.list(lp + "records/")
    end = shipped_cursor(names, store.where + lp + "records/")
    out.mkdir(parents=True, exist_ok=False)
    (out / CHECKPOINTS_DIR).mkdir()
    with (out / LOG_FILE).open("wb") as f:
        for name in names:
            r = parse_range(name)
            data = store.get(lp + "records/" + name)
            if r is None or len(data) != r.end - r.start:
                raise ShipError(
                    f"{name}: holds {len(data)} bytes, its name says {r}", source=store.where + lp
                )
            f.write(data)
    sizes = sorted(s for n in store.list(lp + "checkpoints/") if (s := parse_note(n)) is not None)
    for size in sizes:
        (out / CHECKPOINTS_DIR / f"{size}.note").write_bytes(store.get(note_key(prefix, origin, size)))
    if sizes:
        (out / CHECKPOINT_FILE).write_bytes((out / CHECKPOINTS_DIR / f"{sizes[-1]}.note").read_bytes())
    (out / ORIGIN_FILE).write_text(origin + "\n")
    return end
