"""Ed25519 keys: generation, loading, key ids, keyrings, signing and verification."""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, rsa, x448, x25519
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from pydantic import BaseModel, ConfigDict, ValidationError

from semgov.errors import InputError, KeyFileError
from semgov.wire.strictjson import StrictJSONError
from semgov.wire.strictjson import loads as strict_loads

PRIVATE_KEY_FILE = "signing-key.pem"
PUBLIC_KEY_FILE = "signing-key.pub.pem"


def key_id_for(public_key: Ed25519PublicKey) -> str:
    """Stable id of a public key: ``ed25519:`` + first 16 hex of SHA-256 of its raw bytes."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:16]


def public_pem(public_key: Ed25519PublicKey) -> str:
    return public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode("ascii")


@dataclass(frozen=True)
class SigningKey:
    """A private key with the id that decision records name."""

    private_key: Ed25519PrivateKey
    key_id: str

    @classmethod
    def from_private(cls, private_key: Ed25519PrivateKey, key_id: str | None = None) -> SigningKey:
        return cls(private_key, key_id or key_id_for(private_key.public_key()))

    def sign(self, message: bytes) -> str:
        """Base64 Ed25519 signature over ``message``."""
        return base64.b64encode(self.private_key.sign(message)).decode("ascii")

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self.private_key.public_key()


def generate_keypair(out_dir: Path, *, overwrite: bool = False) -> tuple[Path, Path]:
    """Write a new Ed25519 pair: PKCS#8 PEM private key (mode 0600) and SPKI PEM public key."""
    out_dir.mkdir(parents=True, exist_ok=True)
    priv_path = out_dir / PRIVATE_KEY_FILE
    pub_path = out_dir / PUBLIC_KEY_FILE
    if not overwrite:
        for p in (priv_path, pub_path):
            if p.exists():
                raise KeyFileError("already exists; refusing to overwrite a key", source=str(p))
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    fd = os.open(priv_path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, pem)
    finally:
        os.close(fd)
    pub_path.write_text(public_pem(key.public_key()), encoding="ascii")
    return priv_path, pub_path


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise KeyFileError(f"cannot read key file: {e.strerror}", source=str(path)) from e


def _kind(key: object) -> str:
    """What kind of key this is, in words (for "not an Ed25519 key" errors)."""
    kinds: list[tuple[type, str]] = [
        (rsa.RSAPublicKey, "an RSA"),
        (rsa.RSAPrivateKey, "an RSA"),
        (dsa.DSAPublicKey, "a DSA"),
        (dsa.DSAPrivateKey, "a DSA"),
        (ed448.Ed448PublicKey, "an Ed448"),
        (ed448.Ed448PrivateKey, "an Ed448"),
        (x25519.X25519PublicKey, "an X25519"),
        (x25519.X25519PrivateKey, "an X25519"),
        (x448.X448PublicKey, "an X448"),
        (x448.X448PrivateKey, "an X448"),
    ]
    if isinstance(key, ec.EllipticCurvePublicKey | ec.EllipticCurvePrivateKey):
        return f"an elliptic-curve ({key.curve.name})"
    for cls, name in kinds:
        if isinstance(key, cls):
            return name
    return f"a {type(key).__name__}"


def load_signing_key(path: Path, keyring: Keyring | None = None) -> SigningKey:
    """Load a PKCS#8 PEM Ed25519 private key.

    Its key id is the one ``keyring`` gives its public key, when the keyring holds it (records
    and provenance then name the key as their verifiers look it up: a keyring that calls the key
    ``k1`` gets signatures by ``k1``, not by ``ed25519:...``); otherwise, or when the keyring
    holds it under its own :func:`key_id_for` id too, that id. A key the keyring names under
    several other ids, or holds only as revoked, raises :class:`KeyFileError`.
    """
    key = _load_private(path)
    if keyring is None:
        return key
    named = keyring.naming(key.public_key)
    live = [k.key_id for k in named if not k.revoked]
    if key.key_id in live:
        return key  # NOTE: its own id is listed: signatures keep the name they always had
    if len(live) > 1:
        raise KeyFileError(
            f"the keyring names this key under several ids ({', '.join(live)}): keep one", source=str(path)
        )
    if named and not live:
        raise KeyFileError(
            f"the keyring holds this key only as revoked ({', '.join(k.key_id for k in named)})",
            source=str(path),
        )
    return SigningKey(key.private_key, live[0]) if live else key


def _load_private(path: Path) -> SigningKey:
    data = _read(path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except UnsupportedAlgorithm as e:
        raise KeyFileError(
            f"not an Ed25519 private key (unsupported key algorithm: {e})", source=str(path)
        ) from e
    except (ValueError, TypeError) as e:
        raise KeyFileError(f"not an unencrypted PKCS#8 PEM private key ({e})", source=str(path)) from e
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"not an Ed25519 private key: it is {_kind(key)} key", source=str(path))
    return SigningKey.from_private(key)


_PEM_BEGIN = re.compile(rb"-----BEGIN ([^-\r\n]*)-----")


def parse_public_pem(data: bytes, *, source: str, field: str | None = None) -> Ed25519PublicKey:
    """Parse one Ed25519 SubjectPublicKeyInfo PEM block (explanatory text around it is allowed).

    Raises :class:`KeyFileError` naming ``source`` (and ``field``) for anything else: not ASCII, no or
    several PEM blocks, a private key, a damaged block, or a key of another algorithm.
    """

    def bad(msg: str) -> KeyFileError:
        return KeyFileError(msg, source=source, field=field)

    if not data.isascii():
        raise bad("not a PEM public key: holds non-ASCII characters")
    labels = _PEM_BEGIN.findall(data)
    if not labels:
        raise bad("not a PEM public key: no '-----BEGIN PUBLIC KEY-----' block")
    if len(labels) > 1:
        raise bad(f"holds {len(labels)} PEM blocks; give exactly one Ed25519 public key")
    if b"PRIVATE KEY" in labels[0]:
        raise bad("holds a private key, not a public key; give the SubjectPublicKeyInfo PEM public key")
    if labels[0] != b"PUBLIC KEY":
        label = labels[0].decode("ascii")
        raise bad(f"not a SubjectPublicKeyInfo PEM public key: block is {label!r}, not 'PUBLIC KEY'")
    try:
        key = serialization.load_pem_public_key(data)
    except UnsupportedAlgorithm as e:
        raise bad(f"not an Ed25519 public key (unsupported key algorithm: {e})") from e
    except (ValueError, TypeError) as e:
        raise bad(f"not a valid SubjectPublicKeyInfo PEM public key ({e})") from e
    if not isinstance(key, Ed25519PublicKey):
        raise bad(f"not an Ed25519 public key: it is {_kind(key)} key")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    return parse_public_pem(_read(path), source=str(path))


def verify_signature(public_key: Ed25519PublicKey, signature_b64: str, message: bytes) -> bool:
    """True iff ``signature_b64`` is a valid base64 Ed25519 signature over ``message``."""
    try:
        sig = base64.b64decode(signature_b64, validate=True)
    except (binascii.Error, ValueError):
        return False
    if len(sig) != 64:
        return False
    try:
        public_key.verify(sig, message)
    except InvalidSignature:
        return False
    return True


class _KeyEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    key_id: str
    public_key: str
    revoked: bool = False


class _KeyringFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    keys: list[_KeyEntry]


def _raw(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


_JSON_LINE = re.compile(r"\(line (\d+), column \d+\)")


@dataclass(frozen=True)
class TrustedKey:
    key_id: str
    public_key: Ed25519PublicKey
    revoked: bool


class Keyring:
    """Trusted provenance keys by id, looked up byte for byte. Absent or revoked keys are not trusted.

    Revocation follows the key material: a public key revoked under one id is revoked under
    every id that names it, so relabelling a revoked key's signatures with another id of the
    same key gains nothing.
    """

    def __init__(self, keys: list[TrustedKey]) -> None:
        revoked = {_raw(k.public_key) for k in keys if k.revoked}
        self._keys = {
            k.key_id: k
            if k.revoked or _raw(k.public_key) not in revoked
            else TrustedKey(k.key_id, k.public_key, True)
            for k in keys
        }

    def get(self, key_id: str) -> TrustedKey | None:
        return self._keys.get(key_id)

    def trusted(self) -> dict[str, Ed25519PublicKey]:
        """The keys not revoked, by id."""
        return {k.key_id: k.public_key for k in self._keys.values() if not k.revoked}

    def naming(self, public_key: Ed25519PublicKey) -> list[TrustedKey]:
        """Every entry whose key material is ``public_key`` (revoked ones included), by id."""
        raw = _raw(public_key)
        return sorted((k for k in self._keys.values() if _raw(k.public_key) == raw), key=lambda k: k.key_id)

    def __len__(self) -> int:
        return len(self._keys)

    @classmethod
    def load(cls, path: Path) -> Keyring:
        """Load ``{"keys": [{"key_id", "public_key" (SPKI PEM), "revoked"}]}``."""
        return cls.parse(_read(path), str(path))

    @classmethod
    def parse(cls, raw: bytes, src: str) -> Keyring:
        """A keyring from the bytes of a keyring file (read once: a caller that also hashes them
        names exactly the keyring it uses); errors name ``src``."""
        try:
            doc = strict_loads(raw)
        except StrictJSONError as e:
            why = str(e).removeprefix("not JSON: ")
            m = _JSON_LINE.search(why)
            line = int(m.group(1)) if m else None
            raise InputError(f"keyring is not valid JSON: {why}", source=src, line=line) from e
        try:
            parsed = _KeyringFile.model_validate(doc)
        except ValidationError as e:
            err = e.errors()[0]
            loc = ".".join(str(p) for p in err["loc"])
            raise InputError(f"invalid keyring: {err['msg']}", source=src, field=loc) from e
        keys: list[TrustedKey] = []
        seen: set[str] = set()
        for i, entry in enumerate(parsed.keys):
            if entry.key_id in seen:
                raise InputError(f"duplicate key_id {entry.key_id!r}", source=src, field=f"keys.{i}")
            seen.add(entry.key_id)
            pk = parse_public_pem(entry.public_key.encode("utf-8"), source=src, field=f"keys.{i}.public_key")
            keys.append(TrustedKey(entry.key_id, pk, entry.revoked))
        return cls(keys)
