"""Key generation, loading, keyrings, and signature round trips."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from semgov import InputError, KeyFileError, Keyring, generate_keypair, load_public_key, load_signing_key
from semgov.keys import key_id_for, public_pem, verify_signature


def test_generate_writes_pkcs8_0600_and_spki(tmp_path: Path) -> None:
    """keys generate: private PKCS#8 PEM with mode 0600, public SubjectPublicKeyInfo PEM."""
    priv, pub = generate_keypair(tmp_path / "k")
    assert stat.S_IMODE(priv.stat().st_mode) == 0o600
    assert priv.read_text().startswith("-----BEGIN PRIVATE KEY-----")
    assert pub.read_text().startswith("-----BEGIN PUBLIC KEY-----")
    sk = load_signing_key(priv)
    assert key_id_for(load_public_key(pub)) == sk.key_id


def test_generate_refuses_to_overwrite(tmp_path: Path) -> None:
    """An existing key is never silently replaced."""
    generate_keypair(tmp_path)
    with pytest.raises(KeyFileError, match="refusing to overwrite"):
        generate_keypair(tmp_path)


def test_sign_verify_round_trip_and_tamper(tmp_path: Path) -> None:
    """A signature verifies over its message and fails for any other message or key."""
    sk = load_signing_key(generate_keypair(tmp_path / "a")[0])
    other = load_signing_key(generate_keypair(tmp_path / "b")[0])
    sig = sk.sign(b"hello")
    assert verify_signature(sk.public_key, sig, b"hello")
    assert not verify_signature(sk.public_key, sig, b"hellp")
    assert not verify_signature(other.public_key, sig, b"hello")
    assert not verify_signature(sk.public_key, "not base64!", b"hello")


def test_bad_key_files_are_named(tmp_path: Path) -> None:
    """Missing, non-PEM and wrong-kind key files raise KeyFileError naming the file."""
    with pytest.raises(KeyFileError, match="cannot read"):
        load_signing_key(tmp_path / "nope.pem")
    junk = tmp_path / "junk.pem"
    junk.write_text("hello")
    with pytest.raises(KeyFileError) as e:
        load_signing_key(junk)
    assert str(junk) in str(e.value)
    _, pub = generate_keypair(tmp_path / "c")
    with pytest.raises(KeyFileError):
        load_signing_key(pub)  # a public key is not a signing key


def _keyring(tmp_path: Path, doc: object) -> Path:
    p = tmp_path / "keyring.json"
    p.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return p


def test_keyring_loads_and_marks_revoked(tmp_path: Path) -> None:
    """A keyring maps ids to keys and keeps the revoked flag."""
    pk = load_signing_key(generate_keypair(tmp_path)[0]).public_key
    pk2 = load_signing_key(generate_keypair(tmp_path / "2")[0]).public_key
    kr = Keyring.load(
        _keyring(
            tmp_path,
            {
                "keys": [
                    {"key_id": "k1", "public_key": public_pem(pk)},
                    {"key_id": "k2", "public_key": public_pem(pk2), "revoked": True},
                ]
            },
        )
    )
    k1, k2 = kr.get("k1"), kr.get("k2")
    assert k1 is not None and not k1.revoked and k2 is not None and k2.revoked
    assert kr.get("k3") is None
    assert isinstance(k1.public_key, Ed25519PublicKey)


@pytest.mark.parametrize(
    ("doc", "needle"),
    [
        ("{not json", "not valid JSON"),
        ({"keys": [{"key_id": "k1"}]}, "keys.0.public_key"),
        ({"keys": [], "extra": 1}, "extra"),
        (
            {
                "keys": [
                    {
                        "key_id": "k1",
                        "public_key": "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n",
                    }
                ]
            },
            "public key",
        ),
        ({"keys": [{"key_id": "k1", "public_key": "x", "revoked": "no"}]}, "revoked"),
    ],
)
def test_keyring_errors_name_the_problem(tmp_path: Path, doc: object, needle: str) -> None:
    """Malformed keyrings are refused with the file and the field."""
    path = _keyring(tmp_path, doc)
    with pytest.raises((InputError, KeyFileError)) as e:
        Keyring.load(path)
    assert str(path) in str(e.value) and needle in str(e.value)


def test_keyring_duplicate_ids_refused(tmp_path: Path) -> None:
    """Two entries with one key id would make trust ambiguous: refused."""
    pem = public_pem(load_signing_key(generate_keypair(tmp_path)[0]).public_key)
    path = _keyring(
        tmp_path, {"keys": [{"key_id": "k", "public_key": pem}, {"key_id": "k", "public_key": pem}]}
    )
    with pytest.raises(InputError, match="duplicate"):
        Keyring.load(path)


def test_key_id_is_stable_over_raw_bytes(tmp_path: Path) -> None:
    """The key id depends only on the raw public key."""
    sk = load_signing_key(generate_keypair(tmp_path)[0])
    raw = sk.public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert key_id_for(Ed25519PublicKey.from_public_bytes(raw)) == sk.key_id
