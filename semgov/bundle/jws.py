"""ES256 JWS for bundle signatures, and the bundle signing keys a verifier trusts.

A bundle is signed with an ECDSA P-256 key (JWS ``ES256``: the signature is ``r || s``, 32 bytes
each). OPA verifies RS*, PS*, ES* and HS* bundle signatures; semgov's own Ed25519 keys (decision
records, provenance) are not used for bundles, so bundle signing keys are configured apart from
the policy's keyring. The trusted keys (``--trust``, ``SEMGOV_BUNDLE_TRUST``) are a JSON object in
the shape of OPA's ``keys`` configuration::

    {"bundle-signer": {"algorithm": "ES256", "key": "-----BEGIN PUBLIC KEY-----\\n..."}}

so the same keys verify a bundle in semgov and in ``opa run --verification-key``.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from semgov.errors import BundleError, KeyFileError

ALGORITHM = "ES256"
_MAX_KEYS = 64
_MAX_TRUST_BYTES = 1 << 20


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    if not text or any(
        c not in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_" for c in text
    ):
        raise ValueError("not base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True, slots=True)
class TrustedBundleKey:
    """One key bundles may be signed with: its id, and its P-256 public key (PEM)."""

    key_id: str
    pem: str
    scope: str = ""


def parse_trust(raw: bytes, *, source: str) -> dict[str, TrustedBundleKey]:
    """Trusted bundle keys from OPA-shaped ``keys`` JSON; raises :class:`KeyFileError` naming the entry."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise KeyFileError(f"not a JSON object of bundle keys ({e})", source=source) from e
    if not isinstance(doc, dict) or not doc or len(doc) > _MAX_KEYS:
        raise KeyFileError(f"expected a JSON object of 1 to {_MAX_KEYS} bundle keys by key id", source=source)
    out: dict[str, TrustedBundleKey] = {}
    for kid, entry in doc.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("key"), str):
            raise KeyFileError('expected {"algorithm": "ES256", "key": "<PEM>"}', source=source, field=kid)
        if entry.get("algorithm", ALGORITHM) != ALGORITHM:
            raise KeyFileError(
                f"algorithm {entry.get('algorithm')!r}: semgov bundles are signed with ES256",
                source=source,
                field=kid,
            )
        try:
            key = serialization.load_pem_public_key(entry["key"].encode("ascii"))
        except (ValueError, UnicodeEncodeError) as e:
            raise KeyFileError(f"not a PEM public key ({e})", source=source, field=kid) from e
        if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
            raise KeyFileError("not an ECDSA P-256 public key (ES256)", source=source, field=kid)
        scope = entry.get("scope", "")
        out[kid] = TrustedBundleKey(kid, entry["key"], scope if isinstance(scope, str) else "")
    return out


def read_trust(path: Path) -> dict[str, TrustedBundleKey]:
    """:func:`parse_trust` of a file (bounded read)."""
    try:
        with path.open("rb") as f:
            raw = f.read(_MAX_TRUST_BYTES + 1)
    except OSError as e:
        raise KeyFileError(f"cannot read ({e.strerror})", source=str(path)) from e
    if len(raw) > _MAX_TRUST_BYTES:
        raise KeyFileError(f"over {_MAX_TRUST_BYTES} bytes", source=str(path))
    return parse_trust(raw, source=str(path))


@dataclass(frozen=True, slots=True)
class BundleSigner:
    """A P-256 private key and the key id its signatures name (JWS ``kid``)."""

    key_id: str
    private_pem: bytes

    @classmethod
    def load(cls, path: Path, key_id: str | None = None) -> BundleSigner:
        """Read a PEM P-256 private key; ``key_id`` defaults to the file's name without ``.pem``."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        try:
            raw = path.read_bytes()
            key = serialization.load_pem_private_key(raw, password=None)
        except OSError as e:
            raise KeyFileError(f"cannot read ({e.strerror})", source=str(path)) from e
        except (ValueError, TypeError) as e:
            raise KeyFileError(f"not an unencrypted PEM private key ({e})", source=str(path)) from e
        if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
            raise KeyFileError(
                "not an ECDSA P-256 private key (bundles are signed with ES256)", source=str(path)
            )
        return cls(key_id or path.name.removesuffix(".pem"), raw)

    def public_pem(self) -> str:
        from cryptography.hazmat.primitives import serialization

        key = serialization.load_pem_private_key(self.private_pem, password=None)
        return (
            key.public_key()
            .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
            .decode("ascii")
        )

    def sign(self, payload: dict[str, Any]) -> str:
        """A compact JWS (``ES256``, ``kid``) over ``payload``."""
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

        key = serialization.load_pem_private_key(self.private_pem, password=None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        header = b64url(json.dumps({"alg": ALGORITHM, "kid": self.key_id}, separators=(",", ":")).encode())
        body = b64url(json.dumps(payload, separators=(",", ":")).encode())
        signing_input = f"{header}.{body}".encode("ascii")
        r, s = decode_dss_signature(key.sign(signing_input, ec.ECDSA(hashes.SHA256())))
        return f"{header}.{body}.{b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def verify(token: str, trust: dict[str, TrustedBundleKey], *, source: str) -> tuple[dict[str, Any], str]:
    """The payload of a compact JWS signed by a trusted key, and that key's id (from the header's
    ``kid``, else the payload's ``keyid``, as OPA does); raises :class:`BundleError` naming
    ``.signatures.json``."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

    field = ".signatures.json"
    try:
        h64, p64, s64 = token.split(".")
        header = json.loads(b64url_decode(h64))
        payload = json.loads(b64url_decode(p64))
        sig = b64url_decode(s64)
    except (ValueError, binascii.Error, UnicodeDecodeError) as e:
        raise BundleError(f"not a compact JWS ({e})", source=source, field=field) from e
    if not isinstance(header, dict) or not isinstance(payload, dict):
        raise BundleError("JWS header or payload is not a JSON object", source=source, field=field)
    kid = header.get("kid") or payload.get("keyid")
    if not isinstance(kid, str) or not kid:
        raise BundleError("the signature names no key id (kid)", source=source, field=field)
    entry = trust.get(kid)
    if entry is None:
        raise BundleError(f"signed by key {kid[:80]!r}, which is not trusted", source=source, field=field)
    if header.get("alg") != ALGORITHM:
        raise BundleError(
            f"algorithm {str(header.get('alg'))[:20]!r}, expected ES256", source=source, field=field
        )
    key = serialization.load_pem_public_key(entry.pem.encode("ascii"))
    assert isinstance(key, ec.EllipticCurvePublicKey)
    if len(sig) != 64:
        raise BundleError("signature does not verify (wrong length)", source=source, field=field)
    der = encode_dss_signature(int.from_bytes(sig[:32], "big"), int.from_bytes(sig[32:], "big"))
    try:
        key.verify(der, f"{h64}.{p64}".encode("ascii"), ec.ECDSA(hashes.SHA256()))
    except InvalidSignature as e:
        raise BundleError(
            f"signature does not verify with trusted key {kid!r}", source=source, field=field
        ) from e
    if (payload.get("scope") or "") != entry.scope:
        raise BundleError("scope mismatch", source=source, field=field)
    return payload, kid


__all__ = ["ALGORITHM", "BundleSigner", "TrustedBundleKey", "parse_trust", "read_trust", "verify"]
