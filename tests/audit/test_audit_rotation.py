"""Key rotation (issue 12, item 7): a log signed by several keys verifies against a keyring with validity.

End to end through the command line: two keys made with ``semgov keys generate``, decisions appended
with ``semgov check --audit`` under the first and then the second key, the log verified with a
keyring, then with the first key revoked (exactly its records and checkpoints are named).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from semgov.audit.errors import CheckpointConflictError
from semgov.audit.keyring import AuditKeyring
from semgov.audit.store import AuditLog
from semgov.audit.verify_dir import make_bundle, verify_log
from semgov.cli.main import main
from semgov.errors import InputError
from semgov.signing.keys import key_id_for, load_public_key, load_signing_key
from tests.audit_fixtures import decisions, record_payloads, write_log
from tests.conftest import ASSETS, DEFAULT_POLICY_DIR

ORIGIN = "semgov/rotation-test"


@dataclass
class Key:
    private: Path
    public: Path
    key_id: str

    @property
    def pem(self) -> str:
        return self.public.read_text()


@dataclass
class Rotated:
    log: Path
    k1: Key
    k2: Key
    base: Path

    def keyring(self, name: str, *entries: dict[str, Any]) -> Path:
        path = self.base / name
        path.write_text(json.dumps({"keys": list(entries)}))
        return path

    def entry(self, key: Key, **validity: Any) -> dict[str, Any]:
        return {"key_id": key.key_id, "public_key": key.pem, **validity}


def _generate(out: Path) -> Key:
    assert main(["keys", "generate", "--out", str(out)]) == 0
    priv, pub = out / "signing-key.pem", out / "signing-key.pub.pem"
    return Key(priv, pub, key_id_for(load_public_key(pub)))


def _check(key: Key, log: Path, *extra: str) -> None:
    args = ["check", str(ASSETS / "captured-small.jsonl"), "--policy", str(DEFAULT_POLICY_DIR),
            "--trust", str(ASSETS / "keyring.json"), "--signing-key", str(key.private),
            "--audit", str(log), "--audit-origin", ORIGIN, *extra]  # fmt: skip
    assert main(args) == 2  # the fixture holds one malformed line (its donor is denied, and logged)


@pytest.fixture(scope="module")
def rotated(tmp_path_factory: pytest.TempPathFactory) -> Rotated:
    """Records 0..3 signed (and checkpointed) by k1, then the key rotated: records 4..7 by k2."""
    base = tmp_path_factory.mktemp("rotation")
    k1, k2 = _generate(base / "k1"), _generate(base / "k2")
    r = Rotated(base / "log", k1, k2, base)
    _check(k1, r.log)
    previous = r.keyring("previous.json", r.entry(k1))  # what the new writer is told to trust
    _check(k2, r.log, "--audit-keyring", str(previous))
    return r


@pytest.fixture
def copy(rotated: Rotated, tmp_path: Path) -> Rotated:
    d = tmp_path / "log"
    shutil.copytree(rotated.log, d, ignore=shutil.ignore_patterns("LOCK"))
    return Rotated(d, rotated.k1, rotated.k2, tmp_path)


def _verify(r: Rotated, keyring: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(["audit", "verify", str(r.log), "--keyring", str(keyring), "--workers", "1"])
    return rc, capsys.readouterr().out


def test_rotated_log_verifies_against_a_keyring(rotated: Rotated, capsys: pytest.CaptureFixture[str]) -> None:
    """k1 valid for records 0..3, k2 from record 4: every record, seal and checkpoint verifies, exit 0."""
    kr = rotated.keyring(
        "rotated.json",
        rotated.entry(rotated.k1, not_after_size=4),
        rotated.entry(rotated.k2, not_before_size=4),
    )
    rc, out = _verify(rotated, kr, capsys)
    assert rc == 0, out
    assert "OK: every record, seal and checkpoint verifies" in out
    assert f"key {rotated.k1.key_id}: records 0..3" in out and f"key {rotated.k2.key_id}: records 4..7" in out
    rep = verify_log(rotated.log, keyring=AuditKeyring.load(kr), workers=1)
    assert rep.ok and rep.records == 8 and rep.anchored == 8 and rep.signatures_checked == 8


def test_one_public_key_cannot_verify_a_rotated_log(
    rotated: Rotated, capsys: pytest.CaptureFixture[str]
) -> None:
    """--pubkey with either key fails on the other key's first record, naming the key."""
    for key, first in ((rotated.k1, 4), (rotated.k2, 0)):
        rc = main(["audit", "verify", str(rotated.log), "--pubkey", str(key.public), "--workers", "1"])
        out = capsys.readouterr().out
        assert rc == 1 and f"FAILED: record {first}: signed by key" in out


def test_revoking_the_old_key_names_exactly_what_it_affects(
    rotated: Rotated, capsys: pytest.CaptureFixture[str]
) -> None:
    """k1 revoked: records 0..3 and the checkpoint of size 4 are named; nothing of k2's is."""
    kr = rotated.keyring(
        "revoked.json",
        rotated.entry(rotated.k1, revoked=True, not_after_size=4),
        rotated.entry(rotated.k2, not_before_size=4),
    )
    rc, out = _verify(rotated, kr, capsys)
    assert rc == 1
    kid = rotated.k1.key_id
    assert f"revoked key {kid}: records 0..3 (4 records) are signed by it" in out
    assert "checkpoints signed only by it: size 4" in out
    assert "records anchored only by it: none" in out
    rep = verify_log(rotated.log, keyring=AuditKeyring.load(kr), workers=1)
    impact = rep.revoked[kid]
    assert impact.records == [(0, 4)] and impact.checkpoints == [4] and impact.anchored_only is None
    assert rep.anchored == 8  # k2's seals and checkpoint at 8 still anchor records 0..7
    assert {p.index for p in rep.problems} == {0, None}
    assert rotated.k2.key_id not in rep.revoked


def test_a_key_used_outside_its_validity_is_an_error(
    rotated: Rotated, capsys: pytest.CaptureFixture[str]
) -> None:
    """k1 valid only for records 0..1: records 2..3 and its checkpoint of size 4 are outside its validity."""
    kr = rotated.keyring(
        "short.json",
        rotated.entry(rotated.k1, not_after_size=2),
        rotated.entry(rotated.k2, not_before_size=4),
    )
    rc, out = _verify(rotated, kr, capsys)
    assert rc == 1
    assert f"records 2..3 are signed by key {rotated.k1.key_id} outside its validity (records 0..1" in out
    assert f"checkpoint 4.note: signed by key {rotated.k1.key_id} outside its validity" in out


def test_a_key_may_be_limited_to_records_or_checkpoints(
    rotated: Rotated, capsys: pytest.CaptureFixture[str]
) -> None:
    """A keyring entry with signs=["checkpoints"] does not vouch for records signed by that key."""
    kr = rotated.keyring(
        "roles.json",
        rotated.entry(rotated.k1, not_after_size=4, signs=["checkpoints"]),
        rotated.entry(rotated.k2, not_before_size=4),
    )
    rc, out = _verify(rotated, kr, capsys)
    assert (
        rc == 1 and f"records 0..3 are signed by key {rotated.k1.key_id}, which may not sign records" in out
    )


def test_writer_refuses_a_log_checkpointed_by_a_key_it_was_not_given(copy: Rotated) -> None:
    """Opening a log checkpointed by k2 with k1 and no keyring is refused, naming k2 and the fix."""
    with pytest.raises(CheckpointConflictError) as exc:
        AuditLog.open(copy.log, signing_key=load_signing_key(copy.k1.private), origin=ORIGIN)
    assert copy.k2.key_id in str(exc.value) and "keyring" in str(exc.value)


def test_a_stolen_old_key_cannot_extend_the_log(copy: Rotated, capsys: pytest.CaptureFixture[str]) -> None:
    """Records, seals and checkpoints by k1 past its not_after_size fail; its records stay unanchored."""
    k1 = load_signing_key(copy.k1.private)
    trusts_k2 = AuditKeyring.load(copy.keyring("k2.json", copy.entry(copy.k2)))
    forged = record_payloads(copy.log)[0]  # any record signed by k1: a second copy of record 0
    with AuditLog.open(copy.log, signing_key=k1, origin=ORIGIN, keyring=trusts_k2) as w:
        w.append(forged)
    kr = copy.keyring(
        "rotated.json", copy.entry(copy.k1, not_after_size=4), copy.entry(copy.k2, not_before_size=4)
    )
    rep = verify_log(copy.log, keyring=AuditKeyring.load(kr), workers=1)
    messages = [str(p) for p in rep.problems]
    assert rep.anchored == 8
    assert any(f"record 8: signed by key {copy.k1.key_id} outside its validity" in m for m in messages)
    assert any("1 record (8) is not anchored by any signature" in m for m in messages)


def test_proof_bundle_after_rotation_verifies_with_the_keyring(
    rotated: Rotated, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bundle for a k1 record proved against k2's checkpoint verifies with --keyring, not with one key."""
    rec = json.loads(record_payloads(rotated.log)[1])
    bundle = tmp_path / "bundle.json"
    bundle.write_text(json.dumps(make_bundle(rotated.log, rec["decision_id"])))
    kr = rotated.keyring(
        "bundle.json", rotated.entry(rotated.k1, not_after_size=4), rotated.entry(rotated.k2)
    )
    assert main(["audit", "verify-proof", str(bundle), "--keyring", str(kr)]) == 0
    assert f"OK: decision {rec['decision_id']}" in capsys.readouterr().out
    assert main(["audit", "verify-proof", str(bundle), "--pubkey", str(rotated.k1.public)]) == 1


@pytest.mark.parametrize(
    "entry, field, why",
    [
        (
            {"not_before_size": 5, "not_after_size": 4},
            "keys.0",
            "not_after_size 4 is below not_before_size 5",
        ),
        ({"not_before_size": -1}, "keys.0.not_before_size", "greater than or equal to 0"),
        ({"signs": ["records", "bogus"]}, "keys.0.signs.1", "'records' or 'checkpoints'"),
        ({"signs": []}, "keys.0.signs", "at least 1 item"),
        ({"valid_from": 3}, "keys.0.valid_from", "Extra inputs are not permitted"),
        ({"not_after_size": 4.0}, "keys.0.not_after_size", "valid integer"),
    ],
)
def test_keyring_errors_name_the_file_and_field(
    tmp_path: Path, entry: dict[str, Any], field: str, why: str
) -> None:
    """A malformed audit keyring entry is refused naming the file, the field and the reason."""
    pem = (ASSETS / "decision-signing-key.pub.pem").read_text()
    path = tmp_path / "kr.json"
    path.write_text(json.dumps({"keys": [{"key_id": "ed25519:x", "public_key": pem, **entry}]}))
    with pytest.raises(InputError) as exc:
        AuditKeyring.load(path)
    assert exc.value.source == str(path) and exc.value.field == field and why in str(exc.value)


def test_keyring_refuses_duplicate_ids_and_follows_revoked_key_material(tmp_path: Path, keys: Any) -> None:
    """Duplicate key ids are refused; a key revoked under one id is revoked under every id naming it."""
    pem = (ASSETS / "decision-signing-key.pub.pem").read_text()
    path = tmp_path / "kr.json"
    path.write_text(
        json.dumps({"keys": [{"key_id": "a", "public_key": pem}, {"key_id": "a", "public_key": pem}]})
    )
    with pytest.raises(InputError, match="duplicate key_id 'a'"):
        AuditKeyring.load(path)
    path.write_text(
        json.dumps(
            {
                "keys": [
                    {"key_id": "a", "public_key": pem, "revoked": True},
                    {"key_id": "b", "public_key": pem},
                ]
            }
        )
    )
    kr = AuditKeyring.load(path)
    entry = kr.get("b")
    assert entry is not None and entry.revoked


def test_a_provenance_keyring_file_is_an_audit_keyring(tmp_path: Path, keys: Any) -> None:
    """A provenance keyring file (key_id, public_key, revoked) loads as an audit keyring valid everywhere."""
    kr = AuditKeyring.load(ASSETS / "keyring.json")
    assert len(kr) >= 1
    for k in kr:
        assert (
            k.not_before_size == 0
            and k.not_after_size is None
            and k.signs == frozenset({"records", "checkpoints"})
        )
    d = tmp_path / "log"
    write_log(d, decisions(keys, load_signing_key(ASSETS / "decision-signing-key.pem"), 2))
    assert verify_log(
        d, keyring=AuditKeyring.single(load_public_key(ASSETS / "decision-signing-key.pub.pem"))
    ).ok
