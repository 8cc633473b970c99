"""C2SP signed notes with Ed25519 (c2sp.org/signed-note) and tlog checkpoints (c2sp.org/tlog-checkpoint).

A signed note is a text ending in a newline, a blank line, then signature lines::

    <text, ending in \\n>
    \\n
    — <key name> <base64(key ID[4] || Ed25519 signature[64])>\\n

The dash is U+2014 EM DASH followed by a space. The Ed25519 signature is over the text bytes
(up to and including its final newline, without the blank line). The key ID is
SHA-256(key name || 0x0A || 0x01 || 32-byte public key)[:4]. A checkpoint is a note whose
text is ``origin\\nsize\\nbase64(root)\\n`` followed by optional extension lines.

Verification follows the spec and golang.org/x/mod/sumdb/note: signatures by other keys are
ignored, a signature whose key name and key ID match the given key must verify, and at least
one must. Every failure raises :class:`NoteError`. This module does no I/O.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

SIG_ED25519 = 0x01  # c2sp.org/signed-note signature type byte for Ed25519
SIG_PREFIX = "\u2014 ".encode()  # EM DASH, space
MAX_SIGNATURES = 100  # the spec asks verifiers to accept at least 16; Go's limit is 100
_KEY_ID_SIZE = 4
_ED25519_SIG_SIZE = 64
_ROOT_SIZE = 32
_MAX_SIZE = 2**64 - 1
_DECIMAL = re.compile(r"0|[1-9][0-9]{0,19}")  # ASCII digits only, no leading zero
_HEX_KEY_ID = re.compile(r"[0-9a-fA-F]{8}")


class NoteError(Exception):
    """A signed note, checkpoint or verifier key is malformed, unsigned by the key, or forged."""


def _b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _b64decode_strict(text: str) -> bytes | None:
    """Standard base64 with padding, canonical only (re-encodes to the same text); else None."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if _b64encode(raw) == text else None


def _bad_char(text: str) -> str | None:
    """The first ASCII control character other than newline, if any."""
    for ch in text:
        if ch < " " and ch != "\n":
            return ch
    return None


def _check_key_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise NoteError("key name must be a non-empty string")
    if "+" in name or any(ch.isspace() or ch < " " for ch in name):
        raise NoteError(f"key name {name!r} must not contain spaces, control characters or '+'")
    return name


def _raw_public(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes_raw()


def verifier_key_hash(key_name: str, public_key: Ed25519PublicKey) -> bytes:
    """The 4-byte key ID: SHA-256(key name || "\\n" || 0x01 || raw public key)[:4]."""
    _check_key_name(key_name)
    material = key_name.encode() + b"\n" + bytes([SIG_ED25519]) + _raw_public(public_key)
    return hashlib.sha256(material).digest()[:_KEY_ID_SIZE]


def vkey(key_name: str, public_key: Ed25519PublicKey) -> str:
    """The verifier key string ``<name>+<hex key ID>+<base64(0x01 || public key)>``."""
    key_id = verifier_key_hash(key_name, public_key)
    return f"{key_name}+{key_id.hex()}+{_b64encode(bytes([SIG_ED25519]) + _raw_public(public_key))}"


def parse_vkey(s: str) -> tuple[str, Ed25519PublicKey]:
    """Parse a verifier key string into (key name, public key); NoteError if malformed."""
    if not isinstance(s, str):
        raise NoteError(f"verifier key must be a string, got {type(s).__name__}")
    name, sep1, rest = s.partition("+")
    key_id_hex, sep2, key_b64 = rest.partition("+")  # base64 may itself contain '+'
    if not sep1 or not sep2:
        raise NoteError(f"malformed verifier key {s!r}: want <name>+<key id>+<key>")
    try:
        _check_key_name(name)
    except NoteError as e:
        raise NoteError(f"malformed verifier key {s!r}: {e}") from None
    if not _HEX_KEY_ID.fullmatch(key_id_hex):
        raise NoteError(f"malformed verifier key {s!r}: key id must be 8 hex digits")
    key = _b64decode_strict(key_b64)
    if key is None or not key:
        raise NoteError(f"malformed verifier key {s!r}: key is not canonical base64")
    if key[0] != SIG_ED25519:
        raise NoteError(f"verifier key {s!r} has signature type 0x{key[0]:02x}, only Ed25519 (0x01)")
    if len(key) != 1 + 32:
        raise NoteError(f"malformed verifier key {s!r}: Ed25519 key must be 32 bytes, got {len(key) - 1}")
    public_key = Ed25519PublicKey.from_public_bytes(key[1:])
    if verifier_key_hash(name, public_key) != bytes.fromhex(key_id_hex):
        raise NoteError(f"verifier key {s!r}: key id does not match the name and key")
    return name, public_key


def _check_text(text: bytes, what: str) -> str:
    """Decode note text: UTF-8, no control characters but newline, non-empty, ends in newline."""
    if not isinstance(text, bytes):
        raise NoteError(f"{what} must be bytes, got {type(text).__name__}")
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError:
        raise NoteError(f"malformed {what}: not valid UTF-8") from None
    bad = _bad_char(decoded)
    if bad is not None:
        raise NoteError(f"malformed {what}: control character {bad!r}")
    if not decoded.endswith("\n"):
        raise NoteError(f"malformed {what}: must be non-empty and end in a newline")
    return decoded


def sign_note(text: bytes, key_name: str, private_key: Ed25519PrivateKey) -> bytes:
    """A signed note: ``text`` (ending in a newline), a blank line, one Ed25519 signature line."""
    _check_text(text, "note text")
    _check_key_name(key_name)
    key_id = verifier_key_hash(key_name, private_key.public_key())
    sig = private_key.sign(text)
    line = SIG_PREFIX + key_name.encode() + b" " + _b64encode(key_id + sig).encode("ascii") + b"\n"
    return text + b"\n" + line


def open_note(note: bytes, key_name: str, public_key: Ed25519PublicKey) -> bytes:
    """The text of ``note`` once a signature by (key_name, public_key) verifies; NoteError otherwise.

    Parsing follows golang.org/x/mod/sumdb/note ``Open``: the text ends at the last blank line;
    every signature line must be well formed, whoever signed it; lines by other keys are
    ignored; every line naming this key (same name and key ID) must verify.
    """
    _check_key_name(key_name)
    if not isinstance(note, bytes):
        raise NoteError(f"note must be bytes, got {type(note).__name__}")
    _check_text(note, "note")
    split = note.rfind(b"\n\n")
    if split < 0:
        raise NoteError("malformed note: no blank line before the signatures")
    text, block = note[: split + 1], note[split + 2 :]
    if not block:
        raise NoteError("malformed note: no signature lines after the blank line")
    lines = block[:-1].split(b"\n")  # the block ends in a newline: _check_text saw to it
    if len(lines) > MAX_SIGNATURES:
        raise NoteError(f"malformed note: more than {MAX_SIGNATURES} signature lines")
    want_id = verifier_key_hash(key_name, public_key)
    ours: list[bytes] = []
    for n, line in enumerate(lines, 1):
        if not line.startswith(SIG_PREFIX):
            raise NoteError(f"malformed note: signature line {n} does not start with '\u2014 '")
        name, sep, sig_b64 = line[len(SIG_PREFIX) :].decode("utf-8").partition(" ")
        try:
            _check_key_name(name)
        except NoteError as e:
            raise NoteError(f"malformed note: signature line {n}: {e}") from None
        raw = _b64decode_strict(sig_b64) if sep else None
        if raw is None or len(raw) <= _KEY_ID_SIZE:
            raise NoteError(f"malformed note: signature line {n} is not '<name> <base64 signature>'")
        if name == key_name and raw[:_KEY_ID_SIZE] == want_id:
            ours.append(raw[_KEY_ID_SIZE:])
    label = f"{key_name}+{want_id.hex()}"
    if not ours:
        raise NoteError(f"note has no signature by key {label}")
    for sig in ours:
        if len(sig) != _ED25519_SIG_SIZE:
            raise NoteError(f"invalid signature by key {label}: {len(sig)} bytes, want 64")
        try:
            public_key.verify(sig, text)
        except InvalidSignature:
            raise NoteError(f"invalid signature by key {label}") from None
    return text


@dataclass(frozen=True)
class Checkpoint:
    """A tlog checkpoint: the log's origin, tree size and RFC 6962 root, plus extension lines."""

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.origin, str) or not self.origin:
            raise NoteError("checkpoint origin must be a non-empty string")
        if "\n" in self.origin or _bad_char(self.origin) is not None:
            raise NoteError("checkpoint origin must not contain newlines or control characters")
        if not isinstance(self.size, int) or isinstance(self.size, bool) or not 0 <= self.size <= _MAX_SIZE:
            raise NoteError(f"checkpoint size must be an integer in 0..2^64-1, got {self.size!r}")
        if not isinstance(self.root, bytes) or len(self.root) != _ROOT_SIZE:
            raise NoteError("checkpoint root must be 32 bytes")
        if isinstance(self.extensions, str | bytes):
            raise NoteError("checkpoint extensions must be a sequence of lines, not one string")
        exts = tuple(self.extensions)
        for e in exts:
            if not isinstance(e, str) or not e or "\n" in e or _bad_char(e) is not None:
                raise NoteError(f"checkpoint extension lines must be non-empty single lines, got {e!r}")
        object.__setattr__(self, "extensions", exts)

    def body(self) -> bytes:
        """The note text: ``origin\\nsize\\nbase64(root)\\n`` then one line per extension."""
        lines = [self.origin, str(self.size), _b64encode(self.root), *self.extensions]
        return "".join(line + "\n" for line in lines).encode("utf-8")

    @classmethod
    def from_body(cls, body: bytes) -> Checkpoint:
        """Parse a checkpoint body (the note text); NoteError when malformed."""
        text = _check_text(body, "checkpoint")
        lines = text[:-1].split("\n")
        if len(lines) < 3:
            raise NoteError(f"malformed checkpoint: want at least 3 lines, got {len(lines)}")
        origin, size_s, root_s, *exts = lines
        if not origin:
            raise NoteError("malformed checkpoint: empty origin line")
        if not _DECIMAL.fullmatch(size_s) or int(size_s) > _MAX_SIZE:
            raise NoteError(
                f"malformed checkpoint: size {size_s!r} is not a decimal uint64 without leading zeros"
            )
        root = _b64decode_strict(root_s)
        if root is None:
            raise NoteError(f"malformed checkpoint: root hash {root_s!r} is not canonical base64")
        if len(root) != _ROOT_SIZE:
            raise NoteError(f"malformed checkpoint: root hash is {len(root)} bytes, want 32")
        if any(not e for e in exts):
            raise NoteError("malformed checkpoint: empty extension line")
        return cls(origin, int(size_s), root, tuple(exts))


def sign_checkpoint(cp: Checkpoint, key_name: str, private_key: Ed25519PrivateKey) -> bytes:
    """The signed note for ``cp``: its body, a blank line, one Ed25519 signature line."""
    return sign_note(cp.body(), key_name, private_key)


def open_checkpoint(note: bytes, key_name: str, public_key: Ed25519PublicKey) -> Checkpoint:
    """Verify a signed checkpoint against one key, then parse its body; NoteError on any failure.

    The body is parsed only after the signature verifies. Checking that the origin is the
    expected log is the caller's job.
    """
    return Checkpoint.from_body(open_note(note, key_name, public_key))


def unverified_checkpoint(note: bytes) -> tuple[Checkpoint, list[str]]:
    """The checkpoint in a signed note and the key names of its signature lines, *unverified*.

    For finding which keys to check a note with (and for structure-only checks); NoteError when
    the note or its body is malformed. Verify with :func:`open_note` before trusting anything.
    """
    if not isinstance(note, bytes):
        raise NoteError(f"note must be bytes, got {type(note).__name__}")
    split = note.rfind(b"\n\n")
    if split < 0:
        raise NoteError("malformed note: no blank line before the signatures")
    cp = Checkpoint.from_body(note[: split + 1])
    names = [
        line[len(SIG_PREFIX) :].decode("utf-8", "replace").split(" ")[0]
        for line in note[split + 2 :].split(b"\n")
        if line.startswith(SIG_PREFIX)
    ]
    return cp, names
