"""Each audit log names its own origin, and a proof is bound to it (issue 31, item 6).

Two logs written with the same key used to share one origin (every SGLang hook process wrote
``semgov-hook``), so a proof bundle from one verified as a proof for the other. Now a log gets a
random origin when it is created (kept in its ``origin`` file, stable across restarts), a
configured one is held to it, older logs keep the origin their checkpoints name, and
``verify_bundle`` / ``semgov audit verify-proof --origin`` refuse a bundle from another log.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from semgov.audit.errors import CheckpointConflictError
from semgov.audit.merkle import ProofError
from semgov.audit.origin import ORIGIN_FILE
from semgov.audit.reader import read_checkpoint
from semgov.audit.store import AuditLog
from semgov.audit.verify import verify_bundle
from semgov.audit.verify_dir import make_bundle, verify_log
from semgov.cli.main import main
from tests.audit_fixtures import KEY, PUB, PUB_PEM, decisions, write_log
from tests.conftest import ASSETS, DEFAULT_POLICY_DIR


def _origin(d: Path) -> str:
    """The origin line of the log's latest signed checkpoint."""
    note = read_checkpoint(d)
    assert note is not None
    return note.decode().split("\n", 1)[0]


def _log_with(d: Path, records: list[bytes], origin: str | None = None) -> str:
    """Write ``records`` to a new log at ``d`` (its own origin unless ``origin``); the origin used."""
    with AuditLog.open(d, signing_key=KEY, origin=origin, commit_interval=0.0) as log:
        for r in records:
            log.append(r).wait(10)
        used = log.origin
    return used


def test_new_logs_get_distinct_origins_that_survive_a_restart(tmp_path: Path, keys: Any) -> None:
    """Two logs opened without an origin get different random ones, each kept across a reopen."""
    recs = decisions(keys, KEY, 2)
    a = _log_with(tmp_path / "a", recs[:1])
    b = _log_with(tmp_path / "b", recs[:1])
    assert a != b and a.startswith("semgov/") and len(a) == len("semgov/") + 32
    assert (tmp_path / "a" / ORIGIN_FILE).read_text() == a + "\n" and _origin(tmp_path / "a") == a
    assert _log_with(tmp_path / "a", recs[1:]) == a  # the same log after a restart: the same name
    assert verify_log(tmp_path / "a", public_key=PUB, workers=1).ok


def test_a_configured_origin_is_kept_and_held_to(tmp_path: Path, keys: Any) -> None:
    """A configured origin is written to the log's origin file; another one later is refused."""
    recs = decisions(keys, KEY, 1)
    assert _log_with(tmp_path, recs, origin="example.com/semgov/prod-eu") == "example.com/semgov/prod-eu"
    assert (tmp_path / ORIGIN_FILE).read_text() == "example.com/semgov/prod-eu\n"
    assert _log_with(tmp_path, []) == "example.com/semgov/prod-eu"  # unset: the log's own
    with pytest.raises(CheckpointConflictError, match="another log's directory"):
        AuditLog.open(tmp_path, signing_key=KEY, origin="example.com/semgov/prod-us")
    with pytest.raises(ValueError, match="origin"):
        AuditLog.open(tmp_path / "new", signing_key=KEY, origin="two\nlines")


def test_a_log_from_before_origins_keeps_its_old_origin(tmp_path: Path, keys: Any) -> None:
    """A log written with the old constant origin (no origin file) reopens under that origin and verifies."""
    recs = decisions(keys, KEY, 2)
    write_log(tmp_path, recs[:1], origin="semgov-hook")
    (tmp_path / ORIGIN_FILE).unlink()  # as a log written before origin files existed
    assert _log_with(tmp_path, recs[1:]) == "semgov-hook"
    assert (tmp_path / ORIGIN_FILE).read_text() == "semgov-hook\n" and _origin(tmp_path) == "semgov-hook"
    rep = verify_log(tmp_path, public_key=PUB, workers=1)
    assert rep.ok and rep.records == 2, rep.problems


def _two_logs(tmp_path: Path, keys: Any) -> tuple[dict[str, Any], str, str]:
    """A bundle from log B, and the origins of logs A and B (same key, same kind of records)."""
    recs = decisions(keys, KEY, 2)
    a = _log_with(tmp_path / "a", recs[:1])
    b = _log_with(tmp_path / "b", recs[1:])
    bundle = make_bundle(tmp_path / "b", json.loads(recs[1])["decision_id"])
    return bundle, a, b


def test_verify_bundle_refuses_a_bundle_from_another_log(tmp_path: Path, keys: Any) -> None:
    """A proof from log B, signed by the same key, is refused when log A's origin is expected."""
    bundle, a, b = _two_logs(tmp_path, keys)
    with pytest.raises(ProofError, match="another log"):
        verify_bundle(bundle, PUB, origin=a)
    assert verify_bundle(bundle, PUB, origin=b)["schema"] == "semgov.decision/v3"


def test_cli_verify_proof_requires_or_prints_the_origin(
    tmp_path: Path, keys: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """verify-proof --origin refuses another log's bundle; without it, the bundle's origin is printed."""
    bundle, a, b = _two_logs(tmp_path, keys)
    f = tmp_path / "bundle.json"
    f.write_text(json.dumps(bundle))
    capsys.readouterr()
    assert main(["audit", "verify-proof", str(f), "--pubkey", PUB_PEM, "--origin", a]) == 1
    assert main(["audit", "verify-proof", str(f), "--pubkey", PUB_PEM, "--origin", b]) == 0
    assert f"origin {b!r} (as expected)" in capsys.readouterr().out
    assert main(["audit", "verify-proof", str(f), "--pubkey", PUB_PEM]) == 0
    out = capsys.readouterr().out
    assert f"ORIGIN NOT CHECKED: this proves the record is in log {b!r}" in out


def test_check_audit_gives_each_log_its_own_origin(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """semgov check --audit without --audit-origin: two logs, two origins (no longer semgov/<key id>)."""
    key = str(ASSETS / "decision-signing-key.pem")
    args = ["check", str(ASSETS / "captured-small.jsonl"), "--policy", str(DEFAULT_POLICY_DIR),
            "--trust", str(ASSETS / "keyring.json"), "--signing-key", key]  # fmt: skip
    for name in ("one", "two"):
        assert main([*args, "--audit", str(tmp_path / name)]) == 2  # the fixture has one malformed line
    assert _origin(tmp_path / "one") != _origin(tmp_path / "two")
    assert _origin(tmp_path / "one") != f"semgov/{KEY.key_id}"
    assert main([*args, "--audit", str(tmp_path / "three"), "--audit-origin", "ci/nightly"]) == 2
    assert _origin(tmp_path / "three") == "ci/nightly"
    capsys.readouterr()
    assert main(["audit", "verify", str(tmp_path / "three"), "--pubkey", PUB_PEM, "--workers", "1"]) == 0
    assert "origin: ci/nightly" in capsys.readouterr().out
