"""The witness's files: its state directory, and the cosigned checkpoints it leaves with each log.

``semgov audit witness --key K --name N --state DIR LOGDIR...`` runs :func:`witness_log` on each
log. The state directory holds, per origin, the latest checkpoint the witness cosigned
(``logs/<sha256(origin)[:32]>.json``: origin, size, base64 root, time) and every cosigned note it
made (``logs/<same>/<size>.note``); a ``LOCK`` file (``flock``) makes a run the only one, so that
checking the old size and storing the new one are one step (tlog-witness: else two runs could
roll the state back). The state is written (temp file, fsync, rename, fsync directory) *before*
a cosignature leaves the witness. The cosigned note (the log's checkpoint with the witness's
cosignature line added) is also written once into the log directory as
``cosignatures/<size>.<witness key id>.note``, where ``semgov audit verify --witness-key`` finds it.

The consistency proof from the size the witness holds to the new checkpoint is computed from the
log's own records (the witness reads the log it is given): a log rewritten since cannot produce
one that verifies against the root the witness kept.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from semgov.audit.cosign import cosigner_key_hash, open_cosignatures
from semgov.audit.errors import AuditLogError
from semgov.audit.fsio import atomic_replace, open_dir, write_once
from semgov.audit.keyring import AuditKeyring
from semgov.audit.merkle import consistency_proof, leaf_hash
from semgov.audit.note import NoteError, unverified_checkpoint
from semgov.audit.reader import iter_records, read_checkpoint
from semgov.audit.witness import Seen, WitnessError, add_checkpoint

COSIGNED_DIR = "cosignatures"  # in a log directory: the checkpoints witnesses cosigned
_LOGS = "logs"


@dataclass(frozen=True)
class Outcome:
    """What the witness did with one log: cosigned (new or already), or refused, and why."""

    log: Path
    origin: str
    size: int
    status: int  # 200 cosigned, 304 cosigned before (nothing new), else the refusal's status
    message: str
    note: Path | None = None  # where the cosigned note was written


def _origin_key(origin: str) -> str:
    return hashlib.sha256(origin.encode()).hexdigest()[:32]


class WitnessState:
    """The state directory, locked for the life of the object (``with WitnessState(dir) as st``)."""

    def __init__(self, directory: Path) -> None:
        self.dir = Path(directory)
        (self.dir / _LOGS).mkdir(parents=True, exist_ok=True)
        self._lock = os.open(self.dir / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock)
            raise AuditLogError("another witness run holds the state's lock", source=str(self.dir)) from None

    def __enter__(self) -> WitnessState:
        return self

    def __exit__(self, *_: object) -> None:
        os.close(self._lock)

    def load(self, origin: str) -> Seen | None:
        """What the witness last cosigned for ``origin`` (None: never)."""
        path = self.dir / _LOGS / f"{_origin_key(origin)}.json"
        try:
            doc = json.loads(path.read_bytes())
            seen = Seen(doc["origin"], int(doc["size"]), base64.b64decode(doc["root"]), int(doc["time"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise AuditLogError(f"unreadable witness state: {e}", source=str(path)) from None
        if seen.origin != origin or len(seen.root) != 32:
            raise AuditLogError(f"witness state names another origin {seen.origin!r}", source=str(path))
        return seen

    def save(self, seen: Seen, cosigned: bytes) -> None:
        """Store the cosigned note (once) and then the new latest state (atomically)."""
        key = _origin_key(seen.origin)
        notes = self.dir / _LOGS / key
        notes.mkdir(exist_ok=True)
        fd = open_dir(notes)
        try:
            write_once(fd, notes, f"{seen.size}.note", cosigned)
        finally:
            os.close(fd)
        doc = {"origin": seen.origin, "size": seen.size, "root": base64.b64encode(seen.root).decode(),
               "time": seen.time}  # fmt: skip
        fd = open_dir(self.dir / _LOGS)
        try:
            atomic_replace(fd, self.dir / _LOGS, f"{key}.json", json.dumps(doc, sort_keys=True).encode())
        finally:
            os.close(fd)


def _leaf_hashes(log: Path, size: int) -> list[bytes]:
    hashes: list[bytes] = []
    for _, leaf in iter_records(log):
        if len(hashes) == size:
            break
        hashes.append(leaf_hash(leaf))
    return hashes


def witness_log(
    st: WitnessState, log: Path, ring: AuditKeyring, *, name: str, key: Ed25519PrivateKey, now: int
) -> Outcome:
    """Cosign the latest checkpoint of the log at ``log`` if it is consistent with what the witness
    saw of its origin; the outcome (a refusal is an outcome, not an exception)."""
    note = read_checkpoint(log)
    if note is None:
        return Outcome(log, "?", 0, 404, "the log has no checkpoint yet")
    try:
        cp, _ = unverified_checkpoint(note)
    except NoteError as e:
        return Outcome(log, "?", 0, 400, f"malformed checkpoint: {e}")
    seen = st.load(cp.origin)
    if seen is not None and (seen.size, seen.root) == (cp.size, cp.root):
        return Outcome(log, cp.origin, cp.size, 304, f"size {cp.size} cosigned before")
    old = seen.size if seen is not None else 0
    proof: list[bytes] = []
    if seen is not None and 0 < old < cp.size:
        hashes = _leaf_hashes(log, cp.size)
        if len(hashes) < cp.size:
            return Outcome(
                log, cp.origin, cp.size, 422, f"the log holds {len(hashes)} records, not {cp.size}"
            )
        proof = consistency_proof(old, cp.size, hashes)
    try:
        new, line = add_checkpoint(seen, note, old, proof, ring, name=name, key=key, now=now)
    except WitnessError as e:
        return Outcome(log, cp.origin, cp.size, e.status, str(e))
    cosigned = note + line
    st.save(new, cosigned)
    kid = cosigner_key_hash(name, key.public_key()).hex()
    out = log / COSIGNED_DIR
    out.mkdir(exist_ok=True)
    fd = open_dir(out)
    try:
        write_once(fd, out, f"{cp.size}.{kid}.note", cosigned)
    finally:
        os.close(fd)
    return Outcome(log, cp.origin, cp.size, 200, f"cosigned size {cp.size}", out / f"{cp.size}.{kid}.note")


def witnessed_notes(
    log: Path, witnesses: list[tuple[str, Ed25519PublicKey]]
) -> tuple[list[tuple[str, bytes | str]], list[str]]:
    """The log's checkpoints cosigned by ``witnesses`` (``cosignatures/<size>.<key id>.note``):
    ``(file, note)`` when the cosignature verifies, ``(file, why not)`` otherwise; and one line per
    witness that cosigned none (naming the files of other, untrusted keys, if any)."""
    d = log / COSIGNED_DIR
    names = sorted(n for n in (os.listdir(d) if d.is_dir() else []) if n.endswith(".note"))
    ids = {cosigner_key_hash(w, k).hex(): (w, k) for w, k in witnesses}
    out: list[tuple[str, bytes | str]] = []
    found: set[str] = set()
    for fname in names:
        kid = fname[:-5].rpartition(".")[2]
        if kid not in ids:
            continue
        wname, wkey = ids[kid]
        try:
            data = (d / fname).read_bytes()
            open_cosignatures(data, wname, wkey)
        except OSError as e:
            out.append((f"{COSIGNED_DIR}/{fname}", f"unreadable: {e.strerror}"))
            continue
        except NoteError as e:
            out.append((f"{COSIGNED_DIR}/{fname}", str(e)))
            continue
        found.add(kid)
        out.append((f"{COSIGNED_DIR}/{fname}", data))
    others = [n for n in names if n[:-5].rpartition(".")[2] not in ids]
    missing = []
    for kid, (wname, _) in ids.items():
        if kid not in found:
            by = (
                f" ({COSIGNED_DIR}/ holds only notes by untrusted keys: {', '.join(others)})"
                if others
                else ""
            )
            missing.append(f"no checkpoint of this log is cosigned by witness {wname}+{kid}{by}")
    return out, missing
