"""`semgov bundle keygen|build|verify` end to end, and each refusal naming the file and the problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from semgov.cli.main import main
from tests.bundle.conftest import KEYRING, POLICY


def test_keygen_build_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A generated key signs a bundle that verifies against the generated trust file (exit 0)."""
    k = tmp_path / "k"
    assert main(["bundle", "keygen", "--out", str(k)]) == 0
    assert (k / "bundle-signer.pem").stat().st_mode & 0o777 == 0o600
    out = tmp_path / "b.tar.gz"
    argv = ["bundle", "build", str(POLICY), "--keyring", str(KEYRING), "--key", str(k / "bundle-signer.pem")]
    assert main([*argv, "--revision", "5", "-o", str(out)]) == 0
    capsys.readouterr()
    trust = str(k / "bundle-signer.trust.json")
    assert main(["bundle", "verify", str(out), "--trust", trust, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (got["revision"], got["key_id"]) == ("5", "bundle-signer")
    assert main(["bundle", "verify", str(out), "--trust", trust, "--not-older-than", "6"]) == 2
    assert "b.tar.gz: .manifest: revision 5 is older than the running revision 6" in capsys.readouterr().err


def test_verify_refuses_an_untrusted_signer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bundle signed by a key outside --trust exits 2, naming the bundle and the key."""
    for name in ("a", "b"):
        assert main(["bundle", "keygen", "--out", str(tmp_path), "--name", name]) == 0
    out = tmp_path / "b.tar.gz"
    argv = ["bundle", "build", str(POLICY), "--keyring", str(KEYRING), "--key", str(tmp_path / "a.pem")]
    assert main([*argv, "--revision", "1", "-o", str(out)]) == 0
    capsys.readouterr()
    assert main(["bundle", "verify", str(out), "--trust", str(tmp_path / "b.trust.json")]) == 2
    assert f"{out}: .signatures.json: signed by key 'a', which is not trusted" in capsys.readouterr().err


def test_build_refuses_a_policy_that_does_not_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing unloadable is signed: a broken policy is refused naming its file (exit 2)."""
    assert main(["bundle", "keygen", "--out", str(tmp_path)]) == 0
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "policy.yaml").write_text("name: x\n")
    argv = ["bundle", "build", str(tmp_path / "p"), "--keyring", str(KEYRING), "--revision", "1"]
    assert main([*argv, "--key", str(tmp_path / "bundle-signer.pem"), "-o", str(tmp_path / "o.tar.gz")]) == 2
    assert "policy.yaml" in capsys.readouterr().err and not (tmp_path / "o.tar.gz").exists()
