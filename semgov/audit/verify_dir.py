"""Verifying an audit log directory, and making proof bundles from one: the file and process side.

``verify_log`` re-reads every frame, re-hashes every leaf, checks every record's signature
(decision records and engine events; in parallel worker processes for large logs) and every
seal's, recomputes the tree, checks every seal and the latest and every older signed checkpoint
against it, finds decision and event ids that repeat, and, given a checkpoint a reviewer kept,
proves the log still extends it.

This module does the reading: it splits records.log into ranges, has each range read and its
frames checked (:mod:`semgov.audit._scan`) in a pool of worker processes, reads the checkpoint
notes and the records whose ids repeat, and hands all of it to the pure whole-log checks of
:class:`semgov.audit.verify.LogChecks`. :func:`make_bundle` reads a log for a proof bundle
(checked by :func:`semgov.audit.verify.verify_bundle`, no log needed).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from semgov.audit import _scan
from semgov.audit._scan import Found, WireKeys
from semgov.audit.errors import AuditLogError
from semgov.audit.frames import (
    CHECKPOINTS_DIR,
    FRAME_HEADER,
    LOG_FILE,
    MAX_RECORD_BYTES,
    SEAL_FLAG,
    note_files,
)
from semgov.audit.keyring import AuditKeyring
from semgov.audit.merkle import leaf_hash
from semgov.audit.note import NoteError, unverified_checkpoint
from semgov.audit.reader import iter_records, read_checkpoint
from semgov.audit.verify import LogChecks, Report, is_decision_record, is_shadow_record, proof_bundle
from semgov.signing.keys import key_id_for

_CHUNK = 20_000  # records per worker task


def verify_log(
    directory: Path,
    *,
    public_key: Ed25519PublicKey | None = None,
    keyring: AuditKeyring | None = None,
    kept_checkpoint: bytes | None = None,
    workers: int | None = None,
    allow_unanchored: bool = False,
    witnessed: list[tuple[str, bytes | str]] | None = None,
) -> Report:
    """Verify everything in the log at ``directory`` (see the module docstring).

    ``public_key`` (one key, valid for everything) or ``keyring``; neither: structure only.
    ``allow_unanchored``: records no trusted seal or checkpoint anchors are a note, not a problem.
    ``witnessed``: ``(file, note or why its cosignature was refused)`` of the checkpoints a witness
    cosigned (:func:`semgov.audit.witness_dir.witnessed_notes`): the log must still hold each tree.
    """
    return verify_log_checks(
        directory,
        public_key=public_key,
        keyring=keyring,
        kept_checkpoint=kept_checkpoint,
        workers=workers,
        allow_unanchored=allow_unanchored,
        witnessed=witnessed,
    )[0].report()


def verify_log_checks(
    directory: Path,
    *,
    public_key: Ed25519PublicKey | None = None,
    keyring: AuditKeyring | None = None,
    kept_checkpoint: bytes | None = None,
    workers: int | None = None,
    allow_unanchored: bool = False,
    witnessed: list[tuple[str, bytes | str]] | None = None,
) -> tuple[LogChecks, list[tuple[int, int, int]]]:
    """:func:`verify_log`, returning the checks done (ids, checkpoints and seals read) and the ranges
    of records.log (for :func:`leaves_at`): what the fleet view compares across logs."""
    if public_key is not None and keyring is not None:
        raise ValueError("give public_key or keyring, not both")
    ring = AuditKeyring.single(public_key) if public_key is not None else keyring
    expected = key_id_for(public_key) if public_key is not None else None
    path = Path(directory) / LOG_FILE
    if not path.exists():
        raise AuditLogError("no audit log here (records.log is missing)", source=str(directory))
    v = LogChecks(ring)
    nproc = workers if workers is not None else min(2, os.cpu_count() or 1)
    ranges = _check_frames(v, path, nproc, expected)
    v.add_checkpoints(read_checkpoint(Path(directory)), _numbered_notes(Path(directory)), kept_checkpoint)
    v.add_witnessed(witnessed or [])
    v.check_tree()
    v.check_records()
    v.check_anchoring(allow_unanchored)
    wanted = v.duplicates_to_read()
    if wanted:
        v.check_duplicates(leaves_at(path, ranges, wanted))
    recoveries = v.recoveries_to_read()
    if recoveries:
        v.add_recoveries(leaves_at(path, ranges, recoveries))
    return v, ranges


def _check_frames(v: LogChecks, path: Path, nproc: int, expected: str | None) -> list[tuple[int, int, int]]:
    """Every frame, in worker processes when the log has several ranges; returns the ranges."""
    ranges, scan_problem = scan_ranges(path, _CHUNK)
    wire: WireKeys = None
    if v.ring is not None:
        wire = tuple((k.key_id, k.public_key.public_bytes_raw()) for k in v.ring)
    jobs = [(str(path), first, start, end, wire, expected) for first, start, end in ranges]
    if nproc > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(nproc) as pool:
            found = list(pool.map(verify_range, jobs))
    else:
        found = [verify_range(j) for j in jobs]
    v.add_ranges(found, scan_problem)
    return ranges


def _numbered_notes(directory: Path) -> Iterator[tuple[str, bytes | OSError]]:
    """``(name, its bytes or why it could not be read)`` of every ``checkpoints/<size>.note``, by size."""
    try:
        names = os.listdir(directory / CHECKPOINTS_DIR)
    except FileNotFoundError:
        names = []
    for name in note_files(names):
        try:
            yield name, (directory / CHECKPOINTS_DIR / name).read_bytes()
        except OSError as e:
            yield name, e


def scan_ranges(path: Path, per: int) -> tuple[list[tuple[int, int, int]], tuple[int, str] | None]:
    """Split the log into ranges of ``per`` records by reading frame headers only.

    Returns ``[(first record index, start offset, end offset)]`` and ``(index, why)`` for the
    problem that stopped the scan (an incomplete or impossible frame), if any.
    """
    size = path.stat().st_size
    hsize = FRAME_HEADER.size
    ranges: list[tuple[int, int, int]] = []
    problem = None
    with open(path, "rb") as f:
        off = index = 0
        start, first = 0, 0
        while off < size:
            head = f.read(hsize)
            if len(head) < hsize:
                problem = (index, f"incomplete frame header at byte {off} (torn tail?)")
                break
            frame_index, length, _ = FRAME_HEADER.unpack(head)
            end = off + hsize + length
            if length > MAX_RECORD_BYTES or end > size:
                problem = (index, f"frame at byte {off} claims {length} bytes; the file ends first")
                break
            f.seek(end)
            off = end
            if frame_index & SEAL_FLAG:
                continue
            index += 1
            if index - first == per:
                ranges.append((first, start, off))
                start, first = off, index
        if off > start:  # the last, partial range (up to the problem, if one stopped the scan)
            ranges.append((first, start, off))
    return ranges, problem


def verify_range(args: tuple[str, int, int, int, WireKeys, str | None]) -> Found:
    """Worker: read one range of records.log and check its frames (:func:`semgov.audit._scan.check_range`)."""
    path, first, start, end, wire, expected = args
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    return _scan.check_range(data, first, start, wire, expected)


def leaves_at(path: Path, ranges: list[tuple[int, int, int]], wanted: set[int]) -> dict[int, bytes]:
    """The record bytes at the ``wanted`` indexes (reading only the ranges that hold them)."""
    out: dict[int, bytes] = {}
    with open(path, "rb") as f:
        for i, (first, start, end) in enumerate(ranges):
            stop = ranges[i + 1][0] if i + 1 < len(ranges) else None
            if not any(first <= w and (stop is None or w < stop) for w in wanted):
                continue
            f.seek(start)
            _scan.range_leaves(f.read(end - start), first, wanted, out)
    return out


def make_bundle(directory: Path, decision_id: str) -> dict[str, Any]:
    """Proof bundle for the decision record ``decision_id`` against the log's latest checkpoint."""
    note = read_checkpoint(directory)
    if note is None:
        raise AuditLogError("the log has no checkpoint yet; nothing to prove against", source=str(directory))
    try:
        cp, _ = unverified_checkpoint(note)
    except NoteError as e:
        raise AuditLogError(f"the latest checkpoint is malformed: {e}", source=str(directory)) from e
    hashes: list[bytes] = []
    found: tuple[int, bytes] | None = None
    shadow: int | None = None  # the index of a shadow decision with that id
    needle = json.dumps(decision_id).encode()
    for i, leaf in iter_records(directory):
        if i >= cp.size:
            break
        hashes.append(leaf_hash(leaf))
        if found is None and needle in leaf:
            if is_decision_record(leaf, decision_id):
                found = (i, leaf)
            elif shadow is None and is_shadow_record(leaf, decision_id):
                shadow = i
    if found is None and shadow is not None:
        raise AuditLogError(
            f"record {shadow} with decision_id {decision_id!r} is a shadow decision "
            "(semgov.shadow_decision/v1), never acted on: a proof bundle proves a live decision",
            source=str(directory),
        )
    if found is None:
        raise AuditLogError(
            f"no record with decision_id {decision_id!r} among the {cp.size} records the latest checkpoint "
            "covers (a newer record is provable after the next checkpoint)",
            source=str(directory),
        )
    index, leaf = found
    return proof_bundle(note, cp.size, index, leaf, hashes)
