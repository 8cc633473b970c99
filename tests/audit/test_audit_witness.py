"""Witnessed checkpoints (issue 36, part 2): C2SP cosignature/v1, and a witness that never cosigns a
fork or a rollback (c2sp.org/tlog-witness add-checkpoint rules), checked again by ``audit verify``.

Logs are real (the writer, real signed decisions); the witness key is a fresh Ed25519 key. A fork
is a second log written under the same origin; a rollback is an older copy of the log.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from semgov.audit.cosign import cosign, cosigner_vkey, open_cosignatures, parse_cosigner_vkey
from semgov.audit.keyring import AuditKeyring
from semgov.audit.merkle import consistency_proof, leaf_hash
from semgov.audit.note import NoteError, vkey
from semgov.audit.reader import read_checkpoint
from semgov.audit.witness import Seen, WitnessError, add_checkpoint
from semgov.cli.main import main
from semgov.signing.keys import generate_keypair, load_signing_key
from tests.audit_fixtures import KEY, PUB, PUB_PEM, decisions, record_payloads, write_log

RING = AuditKeyring.single(PUB)


@pytest.fixture
def witness(tmp_path: Path) -> tuple[Path, str]:
    """A fresh witness key (private PEM path) and its verifier key under the name w.example/1."""
    priv, _ = generate_keypair(tmp_path / "wkey")
    return priv, cosigner_vkey("w.example/1", load_signing_key(priv).public_key)


def _witness(capsys: pytest.CaptureFixture[str], key: Path, state: Path, *logs: Path) -> tuple[int, str]:
    argv = ["audit", "witness", "--key", str(key), "--name", "w.example/1", "--state", str(state)]
    code = main([*argv, "--pubkey", PUB_PEM, *map(str, logs)])
    return code, capsys.readouterr().out


def _verify(capsys: pytest.CaptureFixture[str], log: Path, vk: str) -> tuple[int, str]:
    code = main(["audit", "verify", str(log), "--pubkey", PUB_PEM, "--workers", "1", "--witness-key", vk])
    return code, capsys.readouterr().out


def test_cosignature_round_trip_and_key_rules() -> None:
    """A cosignature/v1 verifies with its vkey (type 0x04), not on another body, and a 0x01 key is refused."""
    key = Ed25519PrivateKey.generate()
    body = b"semgov/x\n3\n" + b"A" * 43 + b"=\n"
    note = body + b"\n" + cosign(body, "w.example/1", key, 1700000000)
    name, pub = parse_cosigner_vkey(cosigner_vkey("w.example/1", key.public_key()))
    assert open_cosignatures(note, name, pub) == [1700000000]
    with pytest.raises(NoteError, match="invalid cosignature"):
        open_cosignatures(note.replace(b"\n3\n", b"\n4\n", 1), name, pub)
    with pytest.raises(NoteError, match="not 0x04"):
        parse_cosigner_vkey(vkey("w.example/1", key.public_key()))


def test_add_checkpoint_refuses_by_the_tlog_witness_rules(tmp_path: Path, keys: Any) -> None:
    """Pure rules: 409 on a wrong old size, a rollback or a fork; 422 on a bad proof; 403 unsigned."""
    a, b = tmp_path / "a", tmp_path / "b"
    write_log(a, decisions(keys, KEY, 4), origin="semgov/o")
    write_log(b, decisions(keys, KEY, 4, start=10), origin="semgov/o")
    note_a, note_b = read_checkpoint(a), read_checkpoint(b)
    assert note_a is not None and note_b is not None
    key = Ed25519PrivateKey.generate()
    kw: dict[str, Any] = {"name": "w.example/1", "key": key, "now": 1}
    seen, line = add_checkpoint(None, note_a, 0, [], RING, **kw)
    assert seen.size == 4 and line.startswith("\u2014 w.example/1 ".encode())
    for old, want in (
        (0, "old size 0 is not the size 4"),
        (4, "fork: size 4 was cosigned with another root"),
    ):
        with pytest.raises(WitnessError, match=want) as e:
            add_checkpoint(seen, note_b, old, [], RING, **kw)
        assert e.value.status == 409
    bigger = Seen("semgov/o", 9, seen.root, 1)
    with pytest.raises(WitnessError, match="rollback: size 4 is smaller than the size 9") as e:
        add_checkpoint(bigger, note_a, 9, [], RING, **kw)
    assert e.value.status == 409
    smaller = Seen("semgov/o", 2, leaf_hash(b"x"), 1)
    hashes = [leaf_hash(r) for r in record_payloads(a)]
    with pytest.raises(WitnessError, match="not consistent with the cosigned size 2") as e:
        add_checkpoint(smaller, note_a, 2, consistency_proof(2, 4, hashes), RING, **kw)
    assert e.value.status == 422
    with pytest.raises(WitnessError, match="no signature by a trusted log key") as e:
        add_checkpoint(None, note_a, 0, [], AuditKeyring.single(key.public_key()), **kw)
    assert e.value.status == 403


def test_witness_cosigns_and_verify_checks_the_cosignature(
    tmp_path: Path, keys: Any, witness: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The witness cosigns a log's checkpoint, then a consistent larger one; verify --witness-key passes."""
    log, state = tmp_path / "log", tmp_path / "state"
    recs = decisions(keys, KEY, 6)
    write_log(log, recs[:3], origin="semgov/o")
    code, out = _witness(capsys, witness[0], state, log)
    assert code == 0 and "semgov/o size 3: cosigned size 3" in out, out
    write_log(log, recs[3:], origin="semgov/o")
    code, out = _witness(capsys, witness[0], state, log)
    assert code == 0 and "cosigned size 6" in out, out
    code, out = _witness(capsys, witness[0], state, log)
    assert code == 0 and "size 6 cosigned before" in out
    kid = witness[1].split("+")[1]
    assert sorted(p.name for p in (log / "cosignatures").iterdir()) == [f"3.{kid}.note", f"6.{kid}.note"]
    code, out = _verify(capsys, log, witness[1])
    assert code == 0 and "witnessed: checkpoints of size 3, 6 carry a verified cosignature" in out, out
    doc = json.loads(next((state / "logs").glob("*.json")).read_text())
    assert (doc["origin"], doc["size"]) == ("semgov/o", 6)


def test_witness_refuses_a_rollback_and_keeps_its_state(
    tmp_path: Path, keys: Any, witness: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """An older copy of a log cosigned at a larger size is refused; the state stays at the larger."""
    log, old, state = tmp_path / "log", tmp_path / "old", tmp_path / "state"
    recs = decisions(keys, KEY, 5)
    write_log(log, recs[:2], origin="semgov/o")
    shutil.copytree(log, old)
    write_log(log, recs[2:], origin="semgov/o")
    assert _witness(capsys, witness[0], state, log)[0] == 0
    code, out = _witness(capsys, witness[0], state, old)
    assert code == 1
    assert (
        f"REFUSED {old}/checkpoint: semgov/o size 2: 409 rollback: size 2 is smaller than the size 5" in out
    )
    assert json.loads(next((state / "logs").glob("*.json")).read_text())["size"] == 5
    assert not (old / "cosignatures").exists()


def test_witness_refuses_a_fork_across_workers(
    tmp_path: Path, keys: Any, witness: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Two workers' logs under one origin, other records: the later are refused (fork, inconsistent)."""
    fleet, state = tmp_path / "fleet", tmp_path / "state"
    write_log(fleet / "w0", decisions(keys, KEY, 3), origin="semgov/o")
    write_log(fleet / "w1", decisions(keys, KEY, 3, start=10), origin="semgov/o")
    write_log(fleet / "w2", decisions(keys, KEY, 5, start=20), origin="semgov/o")
    code, out = _witness(capsys, witness[0], state, fleet)
    assert code == 1
    assert f"{fleet / 'w0'}: semgov/o size 3: cosigned size 3" in out
    assert f"REFUSED {fleet / 'w1'}/checkpoint: semgov/o size 3: 409 fork: size 3 was cosigned" in out
    assert (
        f"REFUSED {fleet / 'w2'}/checkpoint: semgov/o size 5: 422 not consistent with the cosigned size 3"
        in out
    )


def test_verify_catches_a_log_rewritten_after_it_was_witnessed(
    tmp_path: Path, keys: Any, witness: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A log replaced by another history, cosignatures kept: verify names the note and the fork."""
    log, state, other = tmp_path / "log", tmp_path / "state", tmp_path / "other"
    write_log(log, decisions(keys, KEY, 4), origin="semgov/o")
    assert _witness(capsys, witness[0], state, log)[0] == 0
    write_log(other, decisions(keys, KEY, 4, start=50), origin="semgov/o")
    shutil.copytree(log / "cosignatures", other / "cosignatures")
    code, out = _verify(capsys, other, witness[1])
    kid = witness[1].split("+")[1]
    assert code == 1
    assert f"witnessed checkpoint cosignatures/4.{kid}.note's root" in out
    assert "(the witness saw another history: a fork)" in out, out


def test_verify_refuses_a_cosignature_by_an_untrusted_key_or_a_forged_one(
    tmp_path: Path, keys: Any, witness: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Cosigned only by an untrusted witness: none by the trusted one; an altered cosignature fails."""
    log, state = tmp_path / "log", tmp_path / "state"
    write_log(log, decisions(keys, KEY, 3), origin="semgov/o")
    assert _witness(capsys, witness[0], state, log)[0] == 0
    trusted = cosigner_vkey("w.example/1", Ed25519PrivateKey.generate().public_key())
    code, out = _verify(capsys, log, trusted)
    assert code == 1
    assert (
        f"FAILED: no checkpoint of this log is cosigned by witness w.example/1+{trusted.split('+')[1]}" in out
    )
    assert "holds only notes by untrusted keys: 3." in out
    (note,) = (log / "cosignatures").iterdir()
    data = bytearray(note.read_bytes())
    data[-10] = ord("A") if data[-10] != ord("A") else ord("B")
    note.write_bytes(bytes(data))
    code, out = _verify(capsys, log, witness[1])
    assert code == 1 and f"witnessed checkpoint cosignatures/{note.name} rejected: invalid cosignature" in out


def test_one_witness_run_at_a_time(tmp_path: Path) -> None:
    """A second run on a locked state directory is refused: a check and its store are one step."""
    from semgov.audit.errors import AuditLogError
    from semgov.audit.witness_dir import WitnessState

    with WitnessState(tmp_path / "state"):
        with pytest.raises(AuditLogError, match="another witness run holds the state's lock"):
            WitnessState(tmp_path / "state")
    with WitnessState(tmp_path / "state") as st:  # released: the next run proceeds
        assert st.load("semgov/o") is None
