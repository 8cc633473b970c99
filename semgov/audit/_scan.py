"""The per-frame half of ``verify_log``: pure checks of the frames of one range of records.log.

:mod:`semgov.audit.verify_dir` splits the log into ranges and has each re-read from disk in a
worker process, which checks every frame in it here: record frames (index, SHA-256, the
record's canonical form and signature, its decision or event id; a shadow decision is checked as
a decision is) and seal frames (SHA-256, position, the note and its signatures). What needs the
whole log (roots, trust, validity, anchoring, duplicates) is the parent's job
(:mod:`semgov.audit.verify`). No file access here.
"""

from __future__ import annotations

import base64
import hashlib
import json
from array import array
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from semgov.audit.frames import FRAME_HEADER, INDEX, SEAL_FLAG
from semgov.audit.keyring import key_name_for
from semgov.audit.merkle import leaf_hash
from semgov.audit.note import NoteError, open_note, unverified_checkpoint
from semgov.audit.recovery_record import RECOVERY_SCHEMA
from semgov.signing.canonical import canonicalize_record
from semgov.wire.models import (
    DECISION_SCHEMAS,
    ENGINE_EVENT_SCHEMAS,
    SHADOW_DECISION_SCHEMA,
    DecisionRecord,
    EngineEvent,
    ShadowDecisionRecord,
)

_SIGNED = {
    **dict.fromkeys(DECISION_SCHEMAS, "decision"),
    SHADOW_DECISION_SCHEMA: "shadow decision",
    **dict.fromkeys(ENGINE_EVENT_SCHEMAS, "engine event"),
    RECOVERY_SCHEMA: "recovery record",
}  # schema -> what


def _required(model: Any) -> frozenset[str]:
    return frozenset(f.alias or name for name, f in model.model_fields.items() if f.is_required())


# NOTE: the members every record of a schema must have (its model's required fields): a record
# signed without one of them is refused here too, not only by the strict readers (a set
# difference per record, cheap on audit verify's hot path).
_REQUIRED = {
    **dict.fromkeys(DECISION_SCHEMAS, _required(DecisionRecord)),
    SHADOW_DECISION_SCHEMA: _required(ShadowDecisionRecord),
    **dict.fromkeys(ENGINE_EVENT_SCHEMAS, _required(EngineEvent)),
}
# NOTE: the id field, not the schema, keys uniqueness: a v1 and a v2 decision with one id repeat
# it, and so do a live and a shadow decision (the shadow evaluator draws its own decision ids).
_ID_FIELD = {
    **dict.fromkeys(DECISION_SCHEMAS, "decision_id"),
    SHADOW_DECISION_SCHEMA: "decision_id",
    **dict.fromkeys(ENGINE_EVENT_SCHEMAS, "event_id"),
    RECOVERY_SCHEMA: "recovery_id",
}
#: The bytes only a record whose top-level schema is a recovery record holds (canonical JSON: a
#: quote inside a string is escaped), to find them without parsing every record twice.
_RECOVERY_MEMBER = f'"schema":"{RECOVERY_SCHEMA}"'.encode()

#: (key id, raw Ed25519 public key) of every keyring key, as shipped to a worker; None: structure only.
WireKeys = tuple[tuple[str, bytes], ...] | None


def brief(v: Any) -> str:
    """A short, always printable description of a JSON value from a hostile record."""
    if isinstance(v, str):
        return repr(v) if len(v) <= 80 else repr(v[:80]) + "..."
    if isinstance(v, dict | list):
        return f"a JSON {'object' if isinstance(v, dict) else 'array'}"
    text = repr(v)  # None, a bool or a number (json.loads caps an integer at 4300 digits)
    return text if len(text) <= 40 else "a long number"


def id_hash(schema: str, value: str) -> bytes:
    """8 bytes standing for a record's unique id (its schema's id field), to find repeats cheaply."""
    data = _ID_FIELD[schema].encode() + b"\0" + value.encode("utf-8", "surrogatepass")
    return hashlib.blake2b(data, digest_size=8).digest()


def record_id(rec: Any) -> tuple[str, str] | None:
    """``(id field, id)`` of a decision record (live or shadow) or engine event, or None."""
    schema = rec.get("schema") if isinstance(rec, dict) else None
    name = _ID_FIELD.get(schema) if isinstance(schema, str) else None
    value = rec.get(name) if name is not None and isinstance(rec, dict) else None
    return (name, value) if name is not None and isinstance(value, str) else None


def inspect_record(
    leaf: bytes, keys: dict[str, Ed25519PublicKey] | None, expected: str | None
) -> tuple[str | None, str | None, bytes | None]:
    """``(why leaf is not a canonical record signed by a key in keys, the key id that verified, id hash)``.

    ``keys`` None: structure only (no signature is checked, the key id is None). ``expected``:
    the one key id when verifying with a single key (for the message). Never raises for any
    ``leaf`` (this runs on every record of a log, hostile ones included).
    """
    # NOTE: the hot path of `semgov audit verify` (one call per record): no per-character
    # scan here. json.loads and the canonicalizer fail cleanly on what they cannot take
    # (RecursionError on deep nesting, ValueError on bad JSON, a lone surrogate, NaN or
    # 1e400); everything else that is not RFC 8785 (a duplicate key, which json.loads
    # drops, other number spellings, spacing or key order) fails the exact-bytes comparison.
    try:
        rec = json.loads(leaf)
    except RecursionError:
        return "not canonical JSON: nested too deeply", None, None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, integer over the digit limit
        return f"not canonical JSON: {e}", None, None
    schema = rec.get("schema") if isinstance(rec, dict) else None
    what = _SIGNED.get(schema) if isinstance(schema, str) else None
    if what is None or not isinstance(schema, str):
        return f"not a {', '.join(_SIGNED)} record", None, None
    rid = record_id(rec)
    idh = id_hash(schema, rid[1]) if rid is not None else None
    missing = _REQUIRED.get(schema, frozenset()) - rec.keys()
    if missing:
        return f"{what} lacks {', '.join(sorted(missing)[:3])}", None, idh
    sig = rec.get("signature")
    if not isinstance(sig, str):
        return "record has no signature", None, idh
    kid = rec.get("key_id")
    key = keys.get(kid) if keys is not None and isinstance(kid, str) else None
    if keys is not None and key is None:
        if expected is not None:
            return f"signed by key {brief(kid)}, expected {expected!r}", None, idh
        return f"signed by key {brief(kid)}, which is not in the keyring", None, idh
    why = _signature_problem(rec, leaf, sig, key, what)
    return why, (kid if why is None and key is not None and isinstance(kid, str) else None), idh


def _signature_problem(
    rec: dict[str, Any], leaf: bytes, sig: str, key: Ed25519PublicKey | None, what: str
) -> str | None:
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
    if key is None:
        return None  # structure only
    message = leaf.replace(member, b"", 1)
    try:
        raw = base64.b64decode(sig, validate=True)
        key.verify(raw, message)
    except Exception:  # noqa: BLE001 - any failure is a bad signature
        return f"{what} signature does not verify"
    return None


@dataclass(frozen=True)
class SealSeen:
    """A seal frame that stands where its size says: the tree it claims and who signed it."""

    size: int
    offset: int
    origin: str
    root: bytes
    signers: tuple[str, ...]  # key ids whose signature verified (none in a structure-only check)
    unknown: tuple[str, ...]  # key names of signature lines by keys not in the keyring


@dataclass
class Found:
    """What one range holds: leaf hashes, problems, who signed which records, ids, seals."""

    leaves: bytes = b""
    problems: list[tuple[int | None, str]] = field(default_factory=list)
    spans: list[tuple[int, int, str]] = field(default_factory=list)  # [start, end) records verified by key id
    id_at: bytes = b""  # record indexes (uint64) holding a decision or event id
    id_hash: bytes = b""  # 8 bytes per id, in the same order
    seals: list[SealSeen] = field(default_factory=list)
    recoveries: list[int] = field(default_factory=list)  # indexes of verified recovery records


class _Keys:
    def __init__(self, wire: WireKeys) -> None:
        self.by_id: dict[str, Ed25519PublicKey] | None = None
        self.by_name: dict[str, tuple[str, Ed25519PublicKey]] = {}
        if wire is not None:
            self.by_id = {kid: Ed25519PublicKey.from_public_bytes(raw) for kid, raw in wire}
            self.by_name = {key_name_for(kid): (kid, k) for kid, k in self.by_id.items()}


def seal_problem(
    count: int, off: int, field_: int, payload: bytes, digest: bytes, keys: _Keys
) -> tuple[SealSeen | None, str | None]:
    """Check one seal frame (``count`` records before it): the seal, or why it is bad."""
    claimed = field_ ^ SEAL_FLAG
    sha256, pack = hashlib.sha256, INDEX.pack
    if sha256(pack(field_) + payload).digest() != digest:
        if sha256(pack(claimed) + payload).digest() == digest:
            return None, f"frame at byte offset {off}: its index field says {field_} (frame header altered)"
        return None, f"seal frame at byte offset {off}: its SHA-256 does not match"
    if claimed != count:
        return None, (
            f"seal at byte offset {off} is for {claimed} records, but {count} records precede it "
            "(a seal or records were moved, deleted or inserted)"
        )
    try:
        cp, names = unverified_checkpoint(payload)
    except NoteError as e:
        return None, f"seal at byte offset {off} is not a signed checkpoint note: {e}"
    if cp.size != claimed:
        return None, f"seal at byte offset {off} says size {cp.size} in its note, {claimed} in its frame"
    signers: list[str] = []
    unknown: list[str] = []
    if keys.by_id is not None:
        for name in dict.fromkeys(names):
            entry = keys.by_name.get(name)
            if entry is None:
                unknown.append(name)
                continue
            try:
                open_note(payload, name, entry[1])
            except NoteError as e:
                return None, f"seal for size {claimed} at byte offset {off}: {e}"
            signers.append(entry[0])
    return SealSeen(claimed, off, cp.origin, cp.root, tuple(signers), tuple(unknown)), None


def check_range(data: bytes, first: int, start: int, wire: WireKeys, expected: str | None) -> Found:
    """The frames of one range: index and hash checks, leaf hashes, signatures, ids, seals.

    ``data`` is the range's bytes, read from byte offset ``start`` of records.log, and begins
    with record ``first`` (whole frames only: :func:`semgov.audit.verify_dir.scan_ranges`).
    """
    keys = _Keys(wire)
    hsize = FRAME_HEADER.size
    sha256, unpack, pack_index = hashlib.sha256, FRAME_HEADER.unpack_from, INDEX.pack
    out = Found()
    leaves: list[bytes] = []
    id_at, id_hashes = array("Q"), bytearray()
    off, index = 0, first
    while off < len(data):
        frame_index, length, digest = unpack(data, off)
        payload = data[off + hsize : off + hsize + length]
        if frame_index & SEAL_FLAG:
            seal, why = seal_problem(index, start + off, frame_index, payload, digest, keys)
            if seal is not None:
                out.seals.append(seal)
            else:
                out.problems.append((None, str(why)))
            off += hsize + length
            continue
        if sha256(pack_index(index) + payload).digest() != digest:
            if frame_index != index and sha256(pack_index(frame_index) + payload).digest() == digest:
                out.problems.append((index, f"frame holds record {frame_index} where record {index} belongs "
                                            "(a record was deleted, inserted or moved)"))  # fmt: skip
            else:
                out.problems.append((index, "record bytes do not match the frame's SHA-256"))
        elif frame_index != index:
            out.problems.append((index, f"frame at byte offset {start + off}: its index field says "
                                        f"{frame_index}, not {index} (frame header altered)"))  # fmt: skip
        else:
            why, kid, idh = inspect_record(payload, keys.by_id, expected)
            if why is not None:
                out.problems.append((index, why))
            if kid is not None:
                _extend(out.spans, index, kid)
            if idh is not None:
                id_at.append(index)
                id_hashes += idh
            if why is None and _RECOVERY_MEMBER in payload:
                out.recoveries.append(index)
        leaves.append(leaf_hash(payload))
        off += hsize + length
        index += 1
    out.leaves, out.id_at, out.id_hash = b"".join(leaves), id_at.tobytes(), bytes(id_hashes)
    return out


def _extend(spans: list[tuple[int, int, str]], index: int, kid: str) -> None:
    if spans and spans[-1][1] == index and spans[-1][2] == kid:
        spans[-1] = (spans[-1][0], index + 1, kid)
    else:
        spans.append((index, index + 1, kid))


def range_leaves(data: bytes, first: int, wanted: set[int], out: dict[int, bytes]) -> None:
    """Add to ``out`` the record bytes at the ``wanted`` indexes in a range starting at record ``first``."""
    hsize = FRAME_HEADER.size
    off, index = 0, first
    while off < len(data):
        frame_index, length, _ = FRAME_HEADER.unpack_from(data, off)
        if not frame_index & SEAL_FLAG:
            if index in wanted:
                out[index] = data[off + hsize : off + hsize + length]
            index += 1
        off += hsize + length
