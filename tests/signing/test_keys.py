"""Key generation, loading, keyrings, and signature round trips."""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, rsa, x25519
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from semgov import InputError, KeyFileError, Keyring, generate_keypair, load_public_key, load_signing_key
from semgov.signing.keys import key_id_for, public_pem, verify_signature


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


# ---- hostile keyrings (benchmarks/hostile.py, target keyring) ----------------------------------------------


def _spki_pem(der: bytes) -> str:
    return "-----BEGIN PUBLIC KEY-----\n" + base64.b64encode(der).decode() + "\n-----END PUBLIC KEY-----\n"


def _load_bad(path: Path, kind: type[Exception], needle: str) -> str:
    with pytest.raises(kind) as e:
        Keyring.load(path)
    msg = str(e.value)
    assert str(path) in msg and needle in msg and "\n" not in msg, msg
    return msg


def test_keyring_not_utf8_is_an_input_error(tmp_path: Path) -> None:
    """A keyring that is not UTF-8 is an InputError naming the file, not a UnicodeDecodeError."""
    path = tmp_path / "keyring.json"
    path.write_bytes(b'{"keys": [{"key_id": "\xff"}]}')
    _load_bad(path, InputError, "not UTF-8")


def test_keyring_deep_nesting_is_an_input_error(tmp_path: Path) -> None:
    """A keyring of 100,000 nested arrays is an InputError naming the file, not a RecursionError."""
    path = tmp_path / "keyring.json"
    path.write_bytes(b"[" * 100_000 + b"]" * 100_000)
    _load_bad(path, InputError, "nested deeper")


def test_keyring_huge_integer_is_an_input_error(tmp_path: Path) -> None:
    """A keyring with a 5,000-digit integer is an InputError naming the file, not a ValueError."""
    path = tmp_path / "keyring.json"
    path.write_bytes(b'{"keys": ' + b"1" * 5000 + b"}")
    _load_bad(path, InputError, "digits")


def test_keyring_unknown_key_algorithm_is_a_key_file_error(tmp_path: Path) -> None:
    """An SPKI of an unknown algorithm OID is a KeyFileError naming file and field, not a traceback."""
    der = bytes.fromhex("301a300506032a0304031100") + bytes(16)  # OID 1.2.3.4, 16-byte key
    path = _keyring(tmp_path, {"keys": [{"key_id": "k1", "public_key": _spki_pem(der), "revoked": False}]})
    _load_bad(path, KeyFileError, "keys.0.public_key: not an Ed25519 public key")


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda: ec.derive_private_key(7, ec.SECP256R1()).public_key(), "elliptic-curve (secp256r1)"),
        (lambda: rsa.generate_private_key(65537, 1024).public_key(), "RSA"),
        (lambda: ed448.Ed448PrivateKey.from_private_bytes(b"\x09" * 57).public_key(), "Ed448"),
        (lambda: x25519.X25519PrivateKey.from_private_bytes(b"\x07" * 32).public_key(), "X25519"),
    ],
)
def test_keyring_non_ed25519_keys_are_refused_by_kind(tmp_path: Path, make: Any, needle: str) -> None:
    """A valid public key of another algorithm is refused, saying which algorithm it is."""
    pem = make().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    path = _keyring(tmp_path, {"keys": [{"key_id": "k1", "public_key": pem.decode()}]})
    assert needle in _load_bad(path, KeyFileError, "not an Ed25519 public key")


def test_keyring_private_key_or_two_blocks_or_non_ascii_refused(tmp_path: Path) -> None:
    """A private key, two PEM blocks (which one is trusted?) or non-ASCII text in a PEM is refused."""
    sk = Ed25519PrivateKey.generate()
    pem = public_pem(sk.public_key())
    priv = sk.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    other = public_pem(Ed25519PrivateKey.generate().public_key())
    for text, needle in [(priv, "private key"), (pem + other, "2 PEM blocks"), ("é\n" + pem, "non-ASCII")]:
        path = _keyring(tmp_path, {"keys": [{"key_id": "k1", "public_key": text}]})
        _load_bad(path, KeyFileError, needle)


def test_signing_key_unknown_algorithm_is_a_key_file_error(tmp_path: Path) -> None:
    """A PKCS#8 private key with an unknown algorithm OID is a KeyFileError, not UnsupportedAlgorithm."""
    der = bytes.fromhex("302e020100300506032a030404220420") + bytes(32)  # OID 1.2.3.4
    path = tmp_path / "k.pem"
    path.write_text(
        "-----BEGIN PRIVATE KEY-----\n" + base64.b64encode(der).decode() + "\n-----END PRIVATE KEY-----\n"
    )
    with pytest.raises(KeyFileError, match="not an Ed25519 private key") as e:
        load_signing_key(path)
    assert str(path) in str(e.value)


def test_keyring_duplicate_json_key_is_refused(tmp_path: Path) -> None:
    """``"revoked": true, "revoked": false`` is refused, never read as trusted (last one wins)."""
    pem = public_pem(Ed25519PrivateKey.generate().public_key())
    entry = json.dumps({"key_id": "k1", "public_key": pem, "revoked": True})
    path = _keyring(
        tmp_path, '{"keys": [' + entry.replace('"revoked": true', '"revoked": true, "revoked": false') + "]}"
    )
    _load_bad(path, InputError, "duplicate key 'revoked'")


def test_keyring_json_syntax_error_names_the_line(tmp_path: Path) -> None:
    """A JSON syntax error in a keyring still names its line."""
    path = _keyring(tmp_path, '{\n  "keys": [\n    }\n')
    with pytest.raises(InputError) as e:
        Keyring.load(path)
    assert e.value.line == 3 and str(e.value).startswith(f"{path}:3: keyring is not valid JSON")


def _named_keyring(path: Path, *entries: tuple[str, Path, bool]) -> Keyring:
    doc = {
        "keys": [{"key_id": kid, "public_key": pub.read_text(), "revoked": rev} for kid, pub, rev in entries]
    }
    path.write_text(json.dumps(doc))
    return Keyring.load(path)


def test_a_key_loaded_with_a_keyring_takes_the_keyrings_id(tmp_path: Path) -> None:
    """load_signing_key(path, keyring): the id the keyring gives the key's public half (the "k1"
    trap: signatures by ed25519:... that a keyring naming the key k1 would never find)."""
    priv, pub = generate_keypair(tmp_path / "a")
    _, other = generate_keypair(tmp_path / "b")
    assert load_signing_key(priv, _named_keyring(tmp_path / "r1.json", ("k1", pub, False))).key_id == "k1"
    # a keyring that does not hold the key: its own id, as without a keyring
    plain = load_signing_key(priv, _named_keyring(tmp_path / "r2.json", ("k9", other, False)))
    assert plain.key_id == key_id_for(load_public_key(pub))


def test_a_key_the_keyring_names_twice_or_revoked_is_refused(tmp_path: Path) -> None:
    """Two live ids (neither the key's own) for one key, or the key only revoked: KeyFileError
    naming the file and the ids; a keyring listing the key's own id too keeps that id."""
    priv, pub = generate_keypair(tmp_path / "a")
    with pytest.raises(KeyFileError, match="several ids") as e:
        load_signing_key(priv, _named_keyring(tmp_path / "r1.json", ("k1", pub, False), ("k2", pub, False)))
    assert str(priv) in str(e.value) and "k1, k2" in str(e.value)
    with pytest.raises(KeyFileError, match="only as revoked"):
        load_signing_key(priv, _named_keyring(tmp_path / "r2.json", ("k1", pub, True)))
    # listed under its own id as well: that id, as before keyrings could rename a key
    own = key_id_for(load_public_key(pub))
    both = _named_keyring(tmp_path / "r3.json", ("k1", pub, False), (own, pub, False))
    assert load_signing_key(priv, both).key_id == own
