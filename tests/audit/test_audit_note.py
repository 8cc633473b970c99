"""C2SP signed notes and tlog checkpoints: published vectors, layout, and every way to fail.

Published vectors:
- golang.org/x/mod/sumdb/note, note_test.go (BSD-3-Clause): the PeterNeumann signing and
  verifier keys, the note it signs byte for byte, the EnochRoot second signature, the
  malformed-message table and the verifier-key manglings of TestNewVerifier.
- c2sp.org/signed-note example key and note ("example.com/foo"), as quoted by several
  independent implementations citing the spec (v1.1.0); the current spec text no longer
  carries it. It verifies here, which the key ID (530d903a) and Ed25519 check both confirm.
"""

from __future__ import annotations

import base64
import hashlib

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from hypothesis import given, settings
from hypothesis import strategies as st

from semgov.audit.note import (
    Checkpoint,
    NoteError,
    open_checkpoint,
    open_note,
    parse_vkey,
    sign_checkpoint,
    sign_note,
    verifier_key_hash,
    vkey,
)

# --- golang.org/x/mod/sumdb/note vectors ---
PETER_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
PETER_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
ENOCH_VKEY = "EnochRoot+af0cfe78+ATtqJ7zOtqQtYqOo0CpvDXNlMhV3HeJDpjrASKGLWdop"
GO_TEXT = (
    b"If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n"
)
PETER_SIG = (
    "\u2014 PeterNeumann "
    "x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"
).encode()
ENOCH_SIG = (
    "\u2014 EnochRoot "
    "rwz+eBzmZa0SO3NbfRGzPCpDckykFXSdeX+MNtCOXm2/5n2tiOHp+vAF1aGrQ5ovTG01oOTGwnWLox33WWd1RvMc+QQ=\n"
).encode()

# --- c2sp.org/signed-note example ---
C2SP_VKEY = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
C2SP_NOTE = (
    "This is an example message.\n\n\u2014 example.com/foo "
    "Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM=\n"
).encode()

# --- Our fixed key and checkpoint (self-generated; Ed25519 is deterministic) ---
NAME = "semgov.example/audit"
KEY = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
PUB = KEY.public_key()
ROOT8 = bytes.fromhex("5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328")  # RFC 6962 vector
CP = Checkpoint(NAME, 8, ROOT8)
PINNED_NOTE = (
    "semgov.example/audit\n8\nXcnaeacGWamtVZy3Ad7ZoqudgjqtL0lgz+Nw7/RgQyg=\n\n"
    "\u2014 semgov.example/audit "
    "7CuBchz8Y9J9EyTDP+38WczlDb8apgGG4YuzYQ3nrG4Z0ih5ZQfF5sLI39jJlgs3PaedyP78WRe0YpXZ/+0W4ZbVkQE=\n"
).encode()
PINNED_VKEY = "semgov.example/audit+ec2b8172+AQOhB7/zzhC+HXDdGOdLwJln5NYwm6UNXx3chmQSVTG4"


def peter_private() -> Ed25519PrivateKey:
    raw = base64.b64decode(PETER_SKEY.split("+", 4)[4])  # the key itself may hold "+"
    assert raw[0] == 0x01
    return Ed25519PrivateKey.from_private_bytes(raw[1:])


def other_key(seed: int) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(bytes([seed]) * 32)


def resign_line(note: bytes, mutate: int) -> bytes:
    """``note`` with byte ``mutate`` of its decoded signature value XOR 1, re-encoded."""
    head, _, line = note.rpartition("\u2014 ".encode())
    name, b64 = line.decode().rstrip("\n").split(" ")
    raw = bytearray(base64.b64decode(b64))
    raw[mutate] ^= 1
    return head + f"\u2014 {name} {base64.b64encode(bytes(raw)).decode()}\n".encode()


# --- Published vectors ---


def test_go_sign_vector_byte_for_byte() -> None:
    """Signing the Go test text with the PeterNeumann key reproduces Go's signed note byte for byte."""
    assert sign_note(GO_TEXT, "PeterNeumann", peter_private()) == GO_TEXT + b"\n" + PETER_SIG
    assert vkey("PeterNeumann", peter_private().public_key()) == PETER_VKEY


def test_go_open_vector_with_two_signers() -> None:
    """The Go note signed by PeterNeumann and EnochRoot opens with either key alone."""
    note = GO_TEXT + b"\n" + PETER_SIG + ENOCH_SIG
    for vk in (PETER_VKEY, ENOCH_VKEY):
        name, pub = parse_vkey(vk)
        assert open_note(note, name, pub) == GO_TEXT
    name, pub = parse_vkey(ENOCH_VKEY)
    assert verifier_key_hash(name, pub).hex() == "af0cfe78"


def test_go_malformed_messages_are_rejected() -> None:
    """Go's table of malformed messages (TestOpen badMsgs) is rejected as malformed."""
    name, pub = parse_vkey(PETER_VKEY)
    bad_msgs = [
        GO_TEXT,
        GO_TEXT + b"\n",
        GO_TEXT + b"\n" + PETER_SIG[:-1],
        b"\x01" + GO_TEXT + b"\n" + PETER_SIG,
        b"\xff" + GO_TEXT + b"\n" + PETER_SIG,
        GO_TEXT
        + b"\n"
        + "\u2014 Bad Name x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKv"
        "qfqdngotpRZb6KE6RyyBwJnAM=".encode(),
        GO_TEXT + b"\n" + PETER_SIG + b"Unexpected line.\n",
    ]
    for msg in bad_msgs:
        with pytest.raises(NoteError, match="malformed"):
            open_note(msg, name, pub)


def test_go_invalid_signature_is_rejected() -> None:
    """Go's corrupted PeterNeumann signature (four base64 characters inserted) fails to verify."""
    name, pub = parse_vkey(PETER_VKEY)
    with pytest.raises(NoteError, match=r"invalid signature by key PeterNeumann\+c74f20a3"):
        open_note(GO_TEXT + b"\n" + PETER_SIG[:60] + b"ABCD" + PETER_SIG[60:], name, pub)


def test_go_verifier_key_manglings_are_rejected() -> None:
    """Every proper substring and one-byte increment of Go's verifier key is refused (TestNewVerifier)."""
    name, pub = parse_vkey(PETER_VKEY)
    assert name == "PeterNeumann" and vkey(name, pub) == PETER_VKEY
    b = PETER_VKEY.encode()
    mangled = [b[i:j] for i in range(len(b) + 1) for j in range(i + 1, len(b) + 1) if (i, j) != (0, len(b))]
    mangled += [b[:i] + bytes([b[i] + 1]) + b[i + 1 :] for i in range(len(b))]
    for m in mangled:
        with pytest.raises(NoteError):
            parse_vkey(m.decode("latin-1"))
    # Wrong key length and unknown algorithm, each with a key hash adjusted to match.
    for s in (
        "PeterNeumann+cc469956+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TWBADKEY==",
        "PeterNeumann+173116ae+ZRpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
    ):
        with pytest.raises(NoteError):
            parse_vkey(s)


def test_c2sp_signed_note_example_verifies() -> None:
    """The signed-note spec's example note verifies under its example verifier key."""
    name, pub = parse_vkey(C2SP_VKEY)
    assert name == "example.com/foo"
    assert open_note(C2SP_NOTE, name, pub) == b"This is an example message.\n"
    assert vkey(name, pub) == C2SP_VKEY


# --- Layout and round trips ---


def test_signed_checkpoint_layout_byte_for_byte() -> None:
    """A signed checkpoint is body, blank line, then '— name base64(keyID||sig)' with the spec's key ID."""
    body = b"semgov.example/audit\n8\n" + base64.b64encode(ROOT8) + b"\n"
    assert CP.body() == body
    key_id = hashlib.sha256(NAME.encode() + b"\n\x01" + PUB.public_bytes_raw()).digest()[:4]
    assert verifier_key_hash(NAME, PUB) == key_id
    expected = body + b"\n" + "\u2014 ".encode() + NAME.encode() + b" "
    expected += base64.b64encode(key_id + KEY.sign(body)) + b"\n"
    note = sign_checkpoint(CP, NAME, KEY)
    assert note == expected == PINNED_NOTE  # PINNED_NOTE: self-generated regression pin
    assert "\u2014".encode() == b"\xe2\x80\x94"
    assert open_checkpoint(note, NAME, PUB) == CP


def test_vkey_round_trip() -> None:
    """vkey() gives name+hex key ID+base64(0x01||key), and parse_vkey() gives back the same key."""
    assert vkey(NAME, PUB) == PINNED_VKEY
    name, pub = parse_vkey(PINNED_VKEY)
    assert name == NAME and pub.public_bytes_raw() == PUB.public_bytes_raw()
    assert parse_vkey(PINNED_VKEY.replace("ec2b8172", "EC2B8172"))[0] == NAME  # hex case is free


# One line of note text: no surrogates, no control characters (so no newline either).
_line_text = st.text(alphabet=st.characters(exclude_categories=("Cs", "Cc")), min_size=1, max_size=40)


@settings(max_examples=100, deadline=None)
@given(
    origin=_line_text,
    size=st.integers(0, 2**64 - 1),
    root=st.binary(min_size=32, max_size=32),
    extensions=st.lists(_line_text, max_size=3),
)
def test_checkpoint_round_trip(origin: str, size: int, root: bytes, extensions: list[str]) -> None:
    """Any valid checkpoint survives sign_checkpoint then open_checkpoint unchanged."""
    cp = Checkpoint(origin, size, root, tuple(extensions))
    assert Checkpoint.from_body(cp.body()) == cp
    assert open_checkpoint(sign_checkpoint(cp, NAME, KEY), NAME, PUB) == cp


def test_signatures_by_other_keys_are_ignored() -> None:
    """A note cosigned by another key opens with either key; the order of lines does not matter."""
    other = other_key(7)
    ours = sign_checkpoint(CP, NAME, KEY)
    theirs = sign_checkpoint(CP, "witness.example/w1", other)
    both = ours + theirs.split(b"\n\n", 1)[1]
    assert open_checkpoint(both, NAME, PUB) == CP
    assert open_checkpoint(both, "witness.example/w1", other.public_key()) == CP
    reversed_order = theirs + ours.split(b"\n\n", 1)[1]
    assert open_checkpoint(reversed_order, NAME, PUB) == CP


# --- Failures ---


def test_wrong_key_name_is_rejected() -> None:
    """A signature under another key name does not count."""
    with pytest.raises(NoteError, match=r"no signature by key semgov\.example/other\+"):
        open_checkpoint(sign_checkpoint(CP, NAME, KEY), "semgov.example/other", PUB)


def test_wrong_key_is_rejected() -> None:
    """A signature by another key under the same name does not count (its key ID differs)."""
    with pytest.raises(NoteError, match="no signature by key"):
        open_checkpoint(sign_checkpoint(CP, NAME, other_key(1)), NAME, PUB)


def test_flipped_body_byte_is_rejected() -> None:
    """Changing one character of the body breaks the signature."""
    note = sign_checkpoint(CP, NAME, KEY)
    tampered = note.replace(b"\n8\n", b"\n9\n", 1)
    with pytest.raises(NoteError, match="invalid signature by key"):
        open_checkpoint(tampered, NAME, PUB)


def test_flipped_signature_byte_is_rejected() -> None:
    """A flipped bit in the signature fails; one in the key ID makes the line someone else's."""
    note = sign_checkpoint(CP, NAME, KEY)
    for i in (4, 30, 67):
        with pytest.raises(NoteError, match="invalid signature by key"):
            open_checkpoint(resign_line(note, i), NAME, PUB)
    for i in range(4):
        with pytest.raises(NoteError, match="no signature by key"):
            open_checkpoint(resign_line(note, i), NAME, PUB)


def test_a_bad_signature_by_the_key_spoils_a_good_one() -> None:
    """Every line naming the key must verify, even when another line by it does."""
    note = sign_checkpoint(CP, NAME, KEY)
    bad_line = resign_line(note, 10).split(b"\n\n", 1)[1]
    with pytest.raises(NoteError, match="invalid signature"):
        open_checkpoint(note + bad_line, NAME, PUB)


def test_missing_signature_lines_are_rejected() -> None:
    """A body alone, or a body and blank line with no signature line, is malformed."""
    body = CP.body()
    for note in (body, body + b"\n"):
        with pytest.raises(NoteError, match="malformed note"):
            open_checkpoint(note, NAME, PUB)


def test_too_many_signature_lines_are_rejected() -> None:
    """More than 100 signature lines is malformed (Go's limit; the spec requires at least 16)."""
    note = sign_checkpoint(CP, NAME, KEY)
    line = note.split(b"\n\n", 1)[1]
    assert open_checkpoint(note + line * 15, NAME, PUB) == CP
    with pytest.raises(NoteError, match="more than 100"):
        open_checkpoint(note + line * 100, NAME, PUB)


def test_every_single_bit_flip_of_a_signed_checkpoint_is_rejected() -> None:
    """Flipping any one bit anywhere in a signed checkpoint makes it fail to open."""
    note = sign_checkpoint(CP, NAME, KEY)
    for i in range(len(note)):
        for bit in range(8):
            tampered = note[:i] + bytes([note[i] ^ (1 << bit)]) + note[i + 1 :]
            with pytest.raises(NoteError):
                open_checkpoint(tampered, NAME, PUB)


R64 = base64.b64encode(ROOT8).decode()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (f"\n8\n{R64}\n", "empty origin"),
        (f"o\n08\n{R64}\n", "leading zeros"),
        (f"o\n00\n{R64}\n", "leading zeros"),
        (f"o\n8a\n{R64}\n", "not a decimal"),
        (f"o\n+8\n{R64}\n", "not a decimal"),
        (f"o\n-1\n{R64}\n", "not a decimal"),
        (f"o\n 8\n{R64}\n", "not a decimal"),
        (f"o\n\n{R64}\n", "not a decimal"),
        (f"o\n\u0668\n{R64}\n", "not a decimal"),  # ARABIC-INDIC DIGIT EIGHT
        (f"o\n{2**64}\n{R64}\n", "not a decimal uint64"),
        ("o\n8\nnot base64!\n", "not canonical base64"),
        (f"o\n8\n{R64.rstrip('=')}\n", "not canonical base64"),
        (f"o\n8\n{R64[:-2]}B=\n", "not canonical base64"),  # non-zero padding bits
        (f"o\n8\n{base64.b64encode(ROOT8[:31]).decode()}\n", "31 bytes, want 32"),
        (f"o\n8\n{base64.b64encode(ROOT8 + b'x').decode()}\n", "33 bytes, want 32"),
        ("o\n8\n", "at least 3 lines"),
        (f"o\n8\n{R64}\n\next\n", "empty extension line"),
        (f"o\n8\n{R64}", "end in a newline"),
        (f"o\t1\n8\n{R64}\n", "control character"),
        ("", "end in a newline"),
    ],
)
def test_malformed_bodies_are_rejected(body: str, message: str) -> None:
    """Malformed checkpoint bodies are rejected on parse, and inside a validly signed note."""
    raw = body.encode()
    with pytest.raises(NoteError, match=message):
        Checkpoint.from_body(raw)
    if raw.endswith(b"\n") and "control" not in message:
        with pytest.raises(NoteError, match=message):
            open_checkpoint(sign_note(raw, NAME, KEY), NAME, PUB)


def test_invalid_utf8_body_is_rejected() -> None:
    """A body that is not UTF-8 is malformed."""
    with pytest.raises(NoteError, match="not valid UTF-8"):
        Checkpoint.from_body(b"o\xff\n8\n" + base64.b64encode(ROOT8) + b"\n")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"origin": ""}, "origin must be a non-empty string"),
        ({"origin": "a\nb"}, "must not contain newlines"),
        ({"size": -1}, "size must be an integer"),
        ({"size": 2**64}, "size must be an integer"),
        ({"size": True}, "size must be an integer"),
        ({"root": ROOT8[:31]}, "root must be 32 bytes"),
        ({"extensions": ("",)}, "extension lines"),
        ({"extensions": ("a\nb",)}, "extension lines"),
        ({"extensions": "ext"}, "not one string"),
    ],
)
def test_invalid_checkpoints_cannot_be_built(kwargs: dict[str, object], message: str) -> None:
    """Checkpoint refuses fields that could not be written as a well-formed body."""
    fields: dict[str, object] = {"origin": "o", "size": 1, "root": ROOT8, **kwargs}
    with pytest.raises(NoteError, match=message):
        Checkpoint(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["", "a b", "a+b", "a\tb", "a\u00a0b", "a\u2003b"])
def test_key_names_with_spaces_or_plus_are_refused(name: str) -> None:
    """Key names must be non-empty with no Unicode spaces and no '+', for signing and for vkeys."""
    with pytest.raises(NoteError, match="key name"):
        sign_checkpoint(CP, name, KEY)
    with pytest.raises(NoteError, match="key name"):
        vkey(name, PUB)


def test_parse_vkey_rejects_other_algorithms_and_bad_ids() -> None:
    """parse_vkey refuses non-Ed25519 keys, key IDs that do not match, and malformed fields."""
    raw = PUB.public_bytes_raw()
    ecdsa = "n+00000000+" + base64.b64encode(b"\x02" + raw).decode()
    with pytest.raises(NoteError, match="only Ed25519"):
        parse_vkey(ecdsa)
    with pytest.raises(NoteError, match="does not match"):
        parse_vkey(PINNED_VKEY.replace("ec2b8172", "ec2b8173"))
    for s in ("no-plus", "a+b", "a+1234567+AQ==", "a+1234567g+AQ==", "a+12345678+%%%"):
        with pytest.raises(NoteError, match="malformed verifier key"):
            parse_vkey(s)
    assert isinstance(parse_vkey(PINNED_VKEY)[1], Ed25519PublicKey)
