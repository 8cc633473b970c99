"""``semgov provenance sign`` and ``verify``: donor provenance outside an engine, checked by the one
verifier a decision's provenance gate uses; a keyring's key id is taken, so the "k1" trap cannot
happen."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from semgov.cli.main import main
from semgov.signing.keys import generate_keypair
from tests.conftest import ASSETS, DEFAULT_POLICY_DIR

FIRST = json.loads((ASSETS / "captured-small.jsonl").read_text().splitlines()[0])


def _donor(tmp_path: Path, **over: Any) -> Path:
    """The donor file of the first captured request's first candidate (its own claims and prompt)."""
    cand = FIRST["candidates"][0]
    pay = cand["provenance"]["payload"]
    claims = ("tenant", "namespace", "task", "response_contract", "policy_version")
    doc = {"donor_id": cand["donor_id"], "prompt": cand["prompt"], "created_at": "2026-11-28T10:00:00Z",
           "expires_at": "2099-01-01T00:00:00Z", "pii": pay["pii"],
           **{k: pay[k] for k in claims}}  # fmt: skip
    doc.update(over)
    path = tmp_path / f"donor-{len(list(tmp_path.glob('donor-*')))}.json"
    path.write_text(json.dumps(doc))
    return path


def _keyring(tmp_path: Path, pub: Path, key_id: str = "gw1", revoked: bool = False) -> Path:
    keys = json.loads((ASSETS / "keyring.json").read_text())["keys"]
    keys.append({"key_id": key_id, "public_key": pub.read_text(), "revoked": revoked})
    path = tmp_path / "keyring.json"
    path.write_text(json.dumps({"keys": keys}))
    return path


def _sign(donor: Path, key: Path, ring: Path, out: Path) -> None:
    assert (
        main(["provenance", "sign", str(donor), "--key", str(key), "--keyring", str(ring), "--out", str(out)])
        == 0
    )


@pytest.fixture
def key(tmp_path: Path) -> tuple[Path, Path]:
    return generate_keypair(tmp_path / "gw-key")


def test_sign_names_the_key_as_the_keyring_does_and_verify_accepts(
    tmp_path: Path, key: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """sign --keyring: the envelope's key_id is the keyring's (gw1, not ed25519:...); verify
    --donor passes every check and exits 0."""
    ring, env, donor = _keyring(tmp_path, key[1]), tmp_path / "prov.json", _donor(tmp_path)
    _sign(donor, key[0], ring, env)
    assert json.loads(env.read_text())["key_id"] == "gw1"
    assert (
        main(["provenance", "verify", str(env), "--keyring", str(ring), "--donor", str(donor), "--json"]) == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] and out["key_status"] == "trusted" and all(out["checks"].values()), out


def test_a_signed_envelope_passes_a_real_decisions_provenance_gate(
    tmp_path: Path, key: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """The candidate's provenance replaced by one `semgov provenance sign` wrote: semgov check's
    provenance gate passes, naming the keyring's id, and the decision is the original's."""
    ring, env = _keyring(tmp_path, key[1]), tmp_path / "prov.json"
    _sign(_donor(tmp_path), key[0], ring, env)
    line = json.loads(json.dumps(FIRST))
    line["candidates"][0]["provenance"] = json.loads(env.read_text())
    captured = tmp_path / "one.jsonl"
    captured.write_text(json.dumps(line) + "\n")
    args = ["--policy", str(DEFAULT_POLICY_DIR), "--signing-key", str(ASSETS / "decision-signing-key.pem"),
            "--format", "jsonl"]  # fmt: skip
    assert main(["check", str(captured), "--trust", str(ring), *args]) in (0, 1)
    ours = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert main(
        ["check", str(ASSETS / "captured-small.jsonl"), "--trust", str(ASSETS / "keyring.json"), *args]
    ) in (0, 1, 2)
    theirs = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    first = next(r for r in ours if r["donor_id"] == FIRST["candidates"][0]["donor_id"])
    gate = next(g for g in first["gates"] if g["gate"] == "provenance")
    assert gate["result"] == "pass" and "'gw1'" in gate["detail"], gate
    original = next(
        r for r in theirs if r["request_id"] == FIRST["request_id"] and r["donor_id"] == first["donor_id"]
    )
    assert first["decision"] == original["decision"] == "allow"


def test_verify_fails_a_tampered_payload_a_revoked_key_and_another_text(
    tmp_path: Path, key: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A payload edited after signing (tenant), a key the keyring revoked, and a donor whose text
    is not the signed one each fail their check; exit 1."""
    ring, env, donor = _keyring(tmp_path, key[1]), tmp_path / "prov.json", _donor(tmp_path)
    _sign(donor, key[0], ring, env)
    doc = json.loads(env.read_text())
    doc["payload"]["tenant"] = "globex"
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["provenance", "verify", str(forged), "--keyring", str(ring), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["checks"]["signature_valid"] is False
    revoked = tmp_path / "revoked"
    revoked.mkdir()
    assert (
        main(
            [
                "provenance",
                "verify",
                str(env),
                "--keyring",
                str(_keyring(revoked, key[1], revoked=True)),
                "--json",
            ]
        )
        == 1
    )
    out = json.loads(capsys.readouterr().out)
    assert out["key_status"] == "revoked" and out["checks"]["key_trusted"] is False
    other = _donor(tmp_path, prompt={**FIRST["candidates"][0]["prompt"], "text": "not what was signed"})
    assert (
        main(["provenance", "verify", str(env), "--keyring", str(ring), "--donor", str(other), "--json"]) == 1
    )
    assert json.loads(capsys.readouterr().out)["checks"]["binds_text"] is False


@pytest.mark.parametrize(
    "content, message",
    [
        ("{not json", "not JSON"),
        ('{"a": 1, "a": 2}', "duplicate key"),
        ("[1, 2]", "expected one JSON object"),
    ],
)
def test_a_bad_donor_file_is_refused_naming_the_file(
    tmp_path: Path, key: tuple[Path, Path], capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    """Malformed, non-strict or non-object donor files: exit 2, the file and the problem named."""
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert main(["provenance", "sign", str(bad), "--key", str(key[0])]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and message in err


def test_bad_segments_a_missing_claim_and_a_keyring_without_the_key_are_refused(
    tmp_path: Path, key: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """A prompt whose segments leave a gap names the field; signing for a keyring that does not hold
    the key is refused (its verifiers would refuse every envelope); a donor without a tenant names it."""
    prompt = {**FIRST["candidates"][0]["prompt"], "segments": [{"role": "system", "start": 1, "end": 2}]}
    assert main(["provenance", "sign", str(_donor(tmp_path, prompt=prompt)), "--key", str(key[0])]) == 2
    assert "prompt" in capsys.readouterr().err
    assert (
        main(
            [
                "provenance",
                "sign",
                str(_donor(tmp_path)),
                "--key",
                str(key[0]),
                "--keyring",
                str(ASSETS / "keyring.json"),
            ]
        )
        == 2
    )
    assert "does not hold this key" in capsys.readouterr().err
    no_tenant = _donor(tmp_path)
    doc = json.loads(no_tenant.read_text())
    del doc["tenant"]
    no_tenant.write_text(json.dumps(doc))
    assert main(["provenance", "sign", str(no_tenant), "--key", str(key[0])]) == 2
    err = capsys.readouterr().err
    assert str(no_tenant) in err and "tenant" in err
