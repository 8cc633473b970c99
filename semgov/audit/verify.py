"""Verifying an audit log, and offline proof bundles.

``verify_log`` re-reads every frame, re-hashes every leaf, checks every record's
signature (decision records and engine events) (in parallel worker processes for large logs), recomputes the
tree, checks the latest signed checkpoint and every older one kept in the log,
and, given a checkpoint a reviewer kept, proves the log still extends it. It
reports the first bad record by index with the reason.

Proof bundles (``semgov.audit_proof/v1``) carry one record, its inclusion proof
and the signed checkpoint it is proved against; :func:`verify_bundle` checks one
with no access to the log.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import struct
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from semgov._internal import strictjson
from semgov.audit.merkle import (
    ProofError,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    root,
    verify_consistency,
    verify_inclusion,
)
from semgov.audit.note import Checkpoint, NoteError, open_checkpoint
from semgov.audit.store import (
    CHECKPOINTS_DIR,
    FRAME_HEADER,
    LOG_FILE,
    MAX_RECORD_BYTES,
    AuditLogError,
    iter_records,
    key_name_for,
    read_checkpoint,
)
from semgov.canonical import canonicalize_record
from semgov.keys import key_id_for
from semgov.models import DECISION_SCHEMA, ENGINE_EVENT_SCHEMA

BUNDLE_SCHEMA = "semgov.audit_proof/v1"
_MAX_SIZE = 2**64 - 1  # tree sizes are uint64 (checkpoints, RFC 9162)
_MAX_PROOF = 64  # an inclusion path in a tree of at most 2^64 leaves
_HEX_HASH = re.compile(r"[0-9a-f]{64}")
_CHUNK = 20_000  # frames per worker task
_INDEX = struct.Struct(">Q")


@dataclass(frozen=True)
class Problem:
    """One finding: the record index it concerns (when it concerns one) and why."""

    index: int | None
    message: str
    exact: bool = True  # False: the problem lies somewhere in records index..end (a checkpoint range)
    end: int | None = None

    def __str__(self) -> str:
        if self.index is None:
            return self.message
        return (
            f"record {self.index}: {self.message}"
            if self.exact
            else f"from record {self.index}: {self.message}"
        )


@dataclass
class Report:
    records: int = 0
    root: bytes = b""
    checkpoint: Checkpoint | None = None
    checkpoints_checked: int = 0
    signatures_checked: int = 0
    kept: Checkpoint | None = None
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def first(self) -> Problem | None:
        """The earliest problem by record index; a range gives way to an exact problem inside it."""
        named = sorted((p for p in self.problems if p.index is not None), key=lambda p: p.index or 0)
        if not named:
            return self.problems[0] if self.problems else None
        head = named[0]
        if not head.exact:
            lo = head.index or 0
            hi = head.end if head.end is not None else lo
            inside = [p for p in named if p.exact and lo <= (p.index or 0) <= hi]
            if inside:
                return inside[0]
        return head


# ---- per-record signature check (pure; also run in worker processes) ------------------------


_SIGNED = {DECISION_SCHEMA: "decision", ENGINE_EVENT_SCHEMA: "engine event"}  # schema -> what it is


def _brief(v: Any) -> str:
    """A short, always printable description of a JSON value from a hostile record."""
    if isinstance(v, str):
        return repr(v) if len(v) <= 80 else repr(v[:80]) + "..."
    if isinstance(v, dict | list):
        return f"a JSON {'object' if isinstance(v, dict) else 'array'}"
    text = repr(v)  # None, a bool or a number (json.loads caps an integer at 4300 digits)
    return text if len(text) <= 40 else "a long number"


def record_problem(leaf: bytes, public_key: Ed25519PublicKey, key_id: str) -> str | None:
    """Why ``leaf`` is not a canonical decision record or engine event signed by ``public_key``, or None.

    Never raises for any ``leaf`` (this runs on every record of a log, hostile ones included).
    """
    # NOTE: the hot path of `semgov audit verify` (one call per record): no per-character
    # scan here. json.loads and the canonicalizer fail cleanly on what they cannot take
    # (RecursionError on deep nesting, ValueError on bad JSON, a lone surrogate, NaN or
    # 1e400); everything else that is not RFC 8785 (a duplicate key, which json.loads
    # drops, other number spellings, spacing or key order) fails the exact-bytes comparison.
    try:
        rec = json.loads(leaf)
    except RecursionError:
        return "not canonical JSON: nested too deeply"
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, integer over the digit limit
        return f"not canonical JSON: {e}"
    schema = rec.get("schema") if isinstance(rec, dict) else None
    what = _SIGNED.get(schema) if isinstance(schema, str) else None
    if what is None:
        return f"not a {DECISION_SCHEMA} or {ENGINE_EVENT_SCHEMA} record"
    sig = rec.get("signature")
    if not isinstance(sig, str):
        return "record has no signature"
    kid = rec.get("key_id")
    if kid != key_id:
        return f"signed by key {_brief(kid)}, expected {key_id!r}"
    try:
        canonical = canonicalize_record(rec)
    except RecursionError:
        return "not canonical JSON: nested too deeply"
    except (ValueError, OverflowError) as e:  # rfc8785: lone surrogate, NaN/Infinity, huge integer
        return f"not canonical JSON: {type(e).__name__}: {e}"
    if canonical != leaf:
        return "record bytes are not RFC 8785 canonical JSON"
    # NOTE: the leaf is canonical, so the signed message (the record without "signature",
    # canonical) is the leaf with exactly that top-level member cut out; the signature is
    # base64 (no escapes), and a member's text cannot occur inside a JSON string.
    member = b',"signature":"' + sig.encode("ascii", "replace") + b'"'
    if leaf.count(member) != 1:
        return "record has no unique signature member"
    message = leaf.replace(member, b"", 1)
    try:
        raw = base64.b64decode(sig, validate=True)
        public_key.verify(raw, message)
    except Exception:  # noqa: BLE001 - any failure is a bad signature
        return f"{what} signature does not verify"
    return None


def _scan_ranges(path: Path, per: int) -> tuple[list[tuple[int, int, int]], Problem | None]:
    """Split the log into ranges of ``per`` frames by reading frame headers only.

    Returns ``[(first_index, start_offset, end_offset)]`` and the problem that stopped the
    scan (an incomplete or impossible frame), if any.
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
                problem = Problem(index, f"incomplete frame header at byte {off} (torn tail?)")
                break
            _, length, _ = FRAME_HEADER.unpack(head)
            end = off + hsize + length
            if length > MAX_RECORD_BYTES or end > size:
                problem = Problem(index, f"frame at byte {off} claims {length} bytes; the file ends first")
                break
            f.seek(end)
            off = end
            index += 1
            if index - first == per:
                ranges.append((first, start, off))
                start, first = off, index
        if off > start:  # the last, partial range (up to the problem, if one stopped the scan)
            ranges.append((first, start, off))
    return ranges, problem


def _verify_range(args: tuple[str, int, int, int, bytes]) -> tuple[bytes, list[tuple[int, str]]]:
    """Worker: frames of one range: index and hash checks, leaf hashes, signature checks."""
    path, first, start, end, raw_key = args
    key = Ed25519PublicKey.from_public_bytes(raw_key) if raw_key else None
    kid = key_id_for(key) if key is not None else ""
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    hsize = FRAME_HEADER.size
    sha256, unpack, pack_index = hashlib.sha256, FRAME_HEADER.unpack_from, _INDEX.pack
    leaves: list[bytes] = []
    problems: list[tuple[int, str]] = []
    off, index = 0, first
    while off < len(data):
        frame_index, length, digest = unpack(data, off)
        leaf = data[off + hsize : off + hsize + length]
        if sha256(pack_index(index) + leaf).digest() != digest:
            if frame_index != index and sha256(pack_index(frame_index) + leaf).digest() == digest:
                problems.append((index, f"frame holds record {frame_index} where record {index} belongs "
                                        "(a record was deleted, inserted or moved)"))  # fmt: skip
            else:
                problems.append((index, "record bytes do not match the frame's SHA-256"))
        elif frame_index != index:
            problems.append((index, f"frame at byte offset {start + off}: its index field says "
                                    f"{frame_index}, not {index} (frame header altered)"))  # fmt: skip
        elif key is not None:
            why = record_problem(leaf, key, kid)
            if why is not None:
                problems.append((index, why))
        leaves.append(leaf_hash(leaf))
        off += hsize + length
        index += 1
    return b"".join(leaves), problems


# ---- the log ----------------------------------------------------------------------------------


def _open_cp(note: bytes, public_key: Ed25519PublicKey | None, what: str) -> Checkpoint:
    if public_key is None:
        split = note.rfind(b"\n\n")
        if split < 0:
            raise NoteError("no blank line before the signatures")
        return Checkpoint.from_body(note[: split + 1])
    return open_checkpoint(note, key_name_for(key_id_for(public_key)), public_key)


def verify_log(
    directory: Path,
    *,
    public_key: Ed25519PublicKey | None = None,
    kept_checkpoint: bytes | None = None,
    workers: int | None = None,
) -> Report:
    """Verify everything in the log at ``directory`` (see the module docstring)."""
    rep = Report()
    raw_key = public_key.public_bytes(Encoding.Raw, PublicFormat.Raw) if public_key is not None else b""
    nproc = workers if workers is not None else min(2, os.cpu_count() or 1)
    path = Path(directory) / LOG_FILE
    if not path.exists():
        raise AuditLogError("no audit log here (records.log is missing)", source=str(directory))
    ranges, scan_problem = _scan_ranges(path, _CHUNK)
    jobs = [(str(path), first, start, end, raw_key) for first, start, end in ranges]
    joined: list[bytes] = []
    if nproc > 1 and len(ranges) > 1:
        with ProcessPoolExecutor(nproc) as pool:
            results = list(pool.map(_verify_range, jobs))
    else:
        results = [_verify_range(j) for j in jobs]
    for leaves, found in results:
        joined.append(leaves)
        rep.problems += [Problem(i, why) for i, why in found]
    blob = b"".join(joined)
    hashes = [blob[i : i + 32] for i in range(0, len(blob), 32)]
    if scan_problem is not None:
        rep.problems.append(scan_problem)
    if public_key is None:
        rep.notes.append("record signatures not checked (no public key given)")
    else:
        rep.signatures_checked = len(hashes)
    rep.records = len(hashes)
    rep.root = root(hashes)
    _check_checkpoints(directory, hashes, public_key, rep)
    if kept_checkpoint is not None:
        _check_kept(kept_checkpoint, hashes, public_key, rep)
    rep.problems.sort(key=lambda p: (p.index is None, p.index or 0))
    return rep


def _prefix_problem(cp: Checkpoint, hashes: Sequence[bytes], what: str) -> Problem | None:
    n = len(hashes)
    if cp.size > n:
        return Problem(n, f"log truncated: it has {n} records but the {what} covers {cp.size}; "
                          f"records {n}..{cp.size - 1} are missing")  # fmt: skip
    if root(hashes[: cp.size]) != cp.root:
        return Problem(None, f"the first {cp.size} records do not hash to the {what}'s root: "
                             "records were altered, removed, inserted or reordered")  # fmt: skip
    return None


def _check_checkpoints(
    directory: Path, hashes: list[bytes], key: Ed25519PublicKey | None, rep: Report
) -> None:
    note = read_checkpoint(directory)
    if note is None:
        rep.notes.append("no checkpoint yet: nothing anchors the log's head")
        return
    try:
        rep.checkpoint = _open_cp(note, key, "checkpoint")
    except NoteError as e:
        rep.problems.append(Problem(None, f"latest checkpoint rejected: {e}"))
        return
    if key is None:
        rep.notes.append("checkpoint signatures not checked (no public key given)")
    # Older checkpoints kept by the log localise a mismatch to the records between two of them.
    history: list[tuple[int, Checkpoint]] = []
    try:
        names = os.listdir(directory / CHECKPOINTS_DIR)
    except FileNotFoundError:
        names = []
    # NOTE: ASCII digits only: str.isdigit() is also true of "²" or "٣", which int() refuses.
    numbered = [n for n in names if n.endswith(".note") and n[:-5].isascii() and n[:-5].isdigit()]
    for name in sorted(numbered, key=lambda n: int(n[:-5])):
        try:
            cp = _open_cp((directory / CHECKPOINTS_DIR / name).read_bytes(), key, name)
        except (NoteError, OSError) as e:
            rep.problems.append(Problem(None, f"checkpoint {name} rejected: {e}"))
            continue
        history.append((cp.size, cp))
    rep.checkpoints_checked = len(history) + 1
    prev = 0
    for size, cp in history:
        if cp.origin != rep.checkpoint.origin:
            rep.problems.append(Problem(None, f"checkpoint of size {size} names another log {cp.origin!r}"))
        p = _prefix_problem(cp, hashes, f"checkpoint of size {size}")
        if p is not None:
            if p.index is None:
                p = Problem(
                    prev, f"{p.message} (between records {prev} and {size - 1})", exact=False, end=size - 1
                )
            rep.problems.append(p)
            break
        prev = size
    p = _prefix_problem(rep.checkpoint, hashes, "latest checkpoint")
    if p is not None and not any(q.message == p.message for q in rep.problems):
        cp_size = rep.checkpoint.size
        rep.problems.append(
            p if p.index is not None else Problem(prev, p.message, exact=False, end=cp_size - 1)
        )


def _check_kept(note: bytes, hashes: list[bytes], key: Ed25519PublicKey | None, rep: Report) -> None:
    if key is None:
        rep.problems.append(Problem(None, "a kept checkpoint can only be checked with --pubkey"))
        return
    try:
        kept = open_checkpoint(note, key_name_for(key_id_for(key)), key)
    except NoteError as e:
        rep.problems.append(Problem(None, f"kept checkpoint rejected: {e}"))
        return
    rep.kept = kept
    latest = rep.checkpoint
    if latest is not None and kept.origin != latest.origin:
        rep.problems.append(Problem(None, f"kept checkpoint is for another log ({kept.origin!r})"))
        return
    p = _prefix_problem(kept, hashes, "kept checkpoint")
    if p is not None:
        rep.problems.append(p)
        return
    if latest is not None and latest.size >= kept.size:
        try:
            proof = consistency_proof(kept.size, latest.size, hashes)
            verify_consistency(kept.size, latest.size, kept.root, latest.root, proof)
            rep.notes.append(
                f"kept checkpoint (size {kept.size}) is consistent with the latest (size {latest.size}): "
                f"{len(proof)}-hash proof verified"
            )
        except ProofError as e:
            rep.problems.append(Problem(None, f"kept checkpoint is not consistent with the latest: {e}"))
    elif latest is not None:
        rep.problems.append(
            Problem(
                latest.size,
                f"latest checkpoint (size {latest.size}) is older than the kept one ({kept.size})",
            )
        )


# ---- offline proof bundles --------------------------------------------------------------------


def make_bundle(directory: Path, decision_id: str) -> dict[str, Any]:
    """Proof bundle for the decision record ``decision_id`` against the log's latest checkpoint."""
    note = read_checkpoint(directory)
    if note is None:
        raise AuditLogError("the log has no checkpoint yet; nothing to prove against", source=str(directory))
    try:
        cp = _open_cp(note, None, "checkpoint")
    except NoteError as e:
        raise AuditLogError(f"the latest checkpoint is malformed: {e}", source=str(directory)) from e
    hashes: list[bytes] = []
    found: tuple[int, bytes] | None = None
    needle = json.dumps(decision_id).encode()
    for i, leaf in iter_records(directory):
        if i >= cp.size:
            break
        hashes.append(leaf_hash(leaf))
        if found is None and needle in leaf:
            try:
                rec = strictjson.loads(leaf)
            except strictjson.StrictJSONError:
                continue  # not a record anyone can prove (`semgov audit verify` names it)
            # NOTE: an engine event names its decision too; the bundle proves the decision record.
            is_decision = isinstance(rec, dict) and rec.get("schema") == DECISION_SCHEMA
            if is_decision and rec.get("decision_id") == decision_id:
                found = (i, leaf)
    if found is None:
        raise AuditLogError(
            f"no record with decision_id {decision_id!r} among the {cp.size} records the latest checkpoint "
            "covers (a newer record is provable after the next checkpoint)",
            source=str(directory),
        )
    index, leaf = found
    return {
        "schema": BUNDLE_SCHEMA,
        "record": leaf.decode("utf-8"),
        "index": index,
        "tree_size": cp.size,
        "inclusion_proof": [h.hex() for h in inclusion_proof(index, hashes)],
        "checkpoint": note.decode("utf-8"),
    }


def _field(bundle: dict[str, Any], name: str) -> Any:
    try:
        return bundle[name]
    except KeyError:
        raise ProofError(f'malformed bundle: "{name}" is missing') from None


def _int_field(bundle: dict[str, Any], name: str, lo: int, hi: int) -> int:
    """``bundle[name]`` as a JSON integer in ``lo..hi`` (not a bool, not a float such as 4.9 or 1e400)."""
    v = _field(bundle, name)
    if not strictjson.is_int(v):
        raise ProofError(f'malformed bundle: "{name}" must be a JSON integer, got {_brief(v)}')
    n: int = v
    if not lo <= n <= hi:
        raise ProofError(f'malformed bundle: "{name}" {n} is out of range {lo}..{hi}')
    return n


def _text_field(bundle: dict[str, Any], name: str) -> bytes:
    v = _field(bundle, name)
    if not isinstance(v, str):
        raise ProofError(f'malformed bundle: "{name}" must be a JSON string, got {_brief(v)}')
    try:
        return v.encode("utf-8")
    except UnicodeEncodeError:
        raise ProofError(f'malformed bundle: "{name}" holds a lone surrogate (not valid Unicode)') from None


def read_bundle(data: bytes | str) -> Any:
    """Parse a proof bundle file as strict JSON (no duplicate keys, NaN, lone surrogates or deep nesting).

    Raises :class:`semgov._internal.strictjson.StrictJSONError` (a ValueError) saying what is wrong.
    """
    return strictjson.loads(data)


def verify_bundle(bundle: Any, public_key: Ed25519PublicKey) -> dict[str, Any]:
    """Check a proof bundle without the log; return its record (a decision, or an engine event).

    ``bundle`` is the parsed document (see :func:`read_bundle`), or the file's bytes or text,
    parsed here strictly (only then can a duplicate key be seen). Every field must have its
    exact type: ``index`` and ``tree_size`` JSON integers in range (not ``4.9``, ``1e400`` or
    ``false``), the proof a list of 64 lower-case hex digits each. Raises ProofError.
    """
    if isinstance(bundle, bytes | str):
        try:
            bundle = read_bundle(bundle)
        except strictjson.StrictJSONError as e:
            raise ProofError(f"malformed bundle: {e}") from None
    if not isinstance(bundle, dict) or bundle.get("schema") != BUNDLE_SCHEMA:
        raise ProofError(f"not a {BUNDLE_SCHEMA} bundle")
    leaf = _text_field(bundle, "record")
    size = _int_field(bundle, "tree_size", 1, _MAX_SIZE)
    index = _int_field(bundle, "index", 0, size - 1)
    hashes = _field(bundle, "inclusion_proof")
    if not isinstance(hashes, list):
        raise ProofError(f'malformed bundle: "inclusion_proof" must be a JSON array, got {_brief(hashes)}')
    if len(hashes) > _MAX_PROOF:
        raise ProofError(
            f'malformed bundle: "inclusion_proof" has {len(hashes)} hashes (at most {_MAX_PROOF})'
        )
    for i, h in enumerate(hashes):
        if not isinstance(h, str) or not _HEX_HASH.fullmatch(h):
            raise ProofError(
                f'malformed bundle: "inclusion_proof"[{i}] must be 64 lower-case hex digits, got {_brief(h)}'
            )
    proof = [bytes.fromhex(h) for h in hashes]
    note = _text_field(bundle, "checkpoint")
    try:
        cp = open_checkpoint(note, key_name_for(key_id_for(public_key)), public_key)
    except NoteError as e:
        raise ProofError(f"checkpoint rejected: {e}") from e
    if cp.size != size:
        raise ProofError(f"bundle says tree size {size}, its checkpoint says {cp.size}")
    verify_inclusion(index, size, leaf_hash(leaf), proof, cp.root)
    why = record_problem(leaf, public_key, key_id_for(public_key))
    if why is not None:
        raise ProofError(f"record {index}: {why}")
    rec: dict[str, Any] = json.loads(leaf)
    return rec
