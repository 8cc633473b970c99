"""C2SP cosignatures (c2sp.org/tlog-cosignature, ``cosignature/v1``, Ed25519): pure, no I/O.

A cosignature is a signed-note signature line on a checkpoint, by a *witness*, that states: as of
``time``, this is the largest tree of this origin the witness has seen, and it is consistent
with every earlier one it saw. The line is::

    — <witness name> base64(key ID[4] || timestamp u64 BE[8] || Ed25519 signature[64])

with key ID ``SHA-256(name || "\\n" || 0x04 || 32-byte public key)[:4]`` (signature type 0x04,
distinct from a plain note signature's 0x01, so a log key's signature can never pass for a
witness's), and the signature over ``"cosignature/v1\\n" + "time <unix>\\n" + the checkpoint body``
(the whole note text, extension lines included). A witness's verifier key is the vkey
``<name>+<hex key ID>+base64(0x04 || public key)``.

Verification follows the spec and golang.org/x/mod/sumdb/note: lines by other keys are ignored;
every line with this key's name and key ID must verify. Failures raise :class:`NoteError`.
"""

from __future__ import annotations

import base64
import hashlib
import struct

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from semgov.audit.note import SIG_PREFIX, NoteError, _b64decode_strict, _check_key_name

SIG_COSIGNATURE_V1 = 0x04  # c2sp.org/signed-note signature type of an Ed25519 cosignature/v1
HEADER = b"cosignature/v1\n"
_MAX_TIME = 2**63 - 1
_KEY_ID, _TIME, _SIG = 4, 8, 64


def cosigner_key_hash(name: str, public_key: Ed25519PublicKey) -> bytes:
    """The 4-byte key ID of a cosigner: SHA-256(name || "\\n" || 0x04 || public key)[:4]."""
    _check_key_name(name)
    raw = public_key.public_bytes_raw()
    return hashlib.sha256(name.encode() + b"\n" + bytes([SIG_COSIGNATURE_V1]) + raw).digest()[:_KEY_ID]


def cosigner_vkey(name: str, public_key: Ed25519PublicKey) -> str:
    """The witness's verifier key: ``<name>+<hex key ID>+base64(0x04 || public key)``."""
    kid = cosigner_key_hash(name, public_key).hex()
    raw = base64.b64encode(bytes([SIG_COSIGNATURE_V1]) + public_key.public_bytes_raw()).decode()
    return f"{name}+{kid}+{raw}"


def parse_cosigner_vkey(s: str) -> tuple[str, Ed25519PublicKey]:
    """``(name, public key)`` of a cosignature/v1 verifier key; NoteError when malformed or not 0x04."""
    name, sep1, rest = s.strip().partition("+")
    kid_hex, sep2, key_b64 = rest.partition("+")
    if not sep1 or not sep2:
        raise NoteError(f"malformed witness key {s!r}: want <name>+<key id>+<key>")
    try:
        _check_key_name(name)
    except NoteError as e:
        raise NoteError(f"malformed witness key {s!r}: {e}") from None
    key = _b64decode_strict(key_b64)
    if key is None or len(key) != 33:
        raise NoteError(f"malformed witness key {s!r}: want base64 of 33 bytes (type, Ed25519 key)")
    if key[0] != SIG_COSIGNATURE_V1:
        raise NoteError(
            f"witness key {s!r} has signature type 0x{key[0]:02x}, not 0x04 (an Ed25519 cosignature/v1 "
            "key; a log's checkpoint key is not a witness key)"
        )
    public_key = Ed25519PublicKey.from_public_bytes(key[1:])
    if cosigner_key_hash(name, public_key).hex() != kid_hex.lower() or len(kid_hex) != 8:
        raise NoteError(f"witness key {s!r}: key id does not match the name and key")
    return name, public_key


def signed_message(body: bytes, timestamp: int) -> bytes:
    """What a cosignature/v1 signs: the header line, ``time <timestamp>`` and the checkpoint body."""
    if not 0 <= timestamp <= _MAX_TIME:
        raise NoteError(f"cosignature timestamp {timestamp} is out of range 0..2^63-1")
    return HEADER + f"time {timestamp}\n".encode() + body


def cosign(body: bytes, name: str, private_key: Ed25519PrivateKey, timestamp: int) -> bytes:
    """One cosignature line (ending in a newline) on the checkpoint whose note text is ``body``."""
    _check_key_name(name)
    kid = cosigner_key_hash(name, private_key.public_key())
    sig = private_key.sign(signed_message(body, timestamp))
    payload = base64.b64encode(kid + struct.pack(">Q", timestamp) + sig).decode()
    return SIG_PREFIX + name.encode() + b" " + payload.encode() + b"\n"


def split_note(note: bytes) -> tuple[bytes, list[bytes]]:
    """The text of a signed note and its signature lines (without newlines); NoteError if malformed."""
    split = note.rfind(b"\n\n")
    if split < 0 or not note.endswith(b"\n"):
        raise NoteError("malformed note: no blank line before the signatures")
    lines = note[split + 2 : -1].split(b"\n") if note[split + 2 :] else []
    if not lines or any(not line.startswith(SIG_PREFIX) for line in lines):
        raise NoteError("malformed note: a signature line does not start with '\u2014 '")
    return note[: split + 1], lines


def open_cosignatures(note: bytes, name: str, public_key: Ed25519PublicKey) -> list[int]:
    """The timestamps of the cosignatures by (name, key) on ``note``, all verified; NoteError if
    there is none, or one by this key does not verify (a forged or altered checkpoint)."""
    body, lines = split_note(note)
    want = cosigner_key_hash(name, public_key)
    label = f"{name}+{want.hex()}"
    out: list[int] = []
    for line in lines:
        who, _, b64 = line[len(SIG_PREFIX) :].decode("utf-8", "replace").partition(" ")
        raw = _b64decode_strict(b64)
        if who != name or raw is None or raw[:_KEY_ID] != want:
            continue
        if len(raw) != _KEY_ID + _TIME + _SIG:
            raise NoteError(f"cosignature by witness {label} is {len(raw)} bytes, want 76")
        (ts,) = struct.unpack(">Q", raw[_KEY_ID : _KEY_ID + _TIME])
        try:
            public_key.verify(raw[_KEY_ID + _TIME :], signed_message(body, ts))
        except InvalidSignature:
            raise NoteError(f"invalid cosignature by witness {label}") from None
        out.append(ts)
    if not out:
        raise NoteError(f"no cosignature by witness {label}")
    return out
