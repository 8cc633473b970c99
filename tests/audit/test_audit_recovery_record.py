"""Every recovery leaves a signed record in the log, and the review tools show it (issue 31, item 6).

Opening a log used to cut a torn tail, unsealed frames or sealed batches by a key the writer does
not trust (a rollback to its last trusted seal or checkpoint) and say so only in a log line. Now
the writer appends a ``semgov.audit_recovery/v1`` record, signed like every record, naming what
was cut, where it went and why, durable before ``AuditLog.open`` returns; ``semgov audit
verify``, ``show`` and ``report`` surface it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from semgov.audit.frames import LOG_FILE, STATE_FILE, seal_frame
from semgov.audit.keyring import key_name_for
from semgov.audit.merkle import Frontier, leaf_hash
from semgov.audit.note import Checkpoint, sign_checkpoint
from semgov.audit.reader import iter_records
from semgov.audit.store import AuditLog
from semgov.audit.verify_dir import verify_log
from semgov.cli.main import main
from semgov.signing.keys import SigningKey
from tests.audit_fixtures import KEY, ORIGIN, PUB, PUB_PEM, decisions, reframe, write_log

OTHER = SigningKey.from_private(Ed25519PrivateKey.from_private_bytes(bytes(range(32))))


def _torn(d: Path, keys: Any) -> tuple[int, bytes]:
    """A 3-record log with half a frame after it (a crash mid-write); (records kept, the torn bytes)."""
    write_log(d, decisions(keys, KEY, 3))
    torn = reframe(3, decisions(keys, KEY, 1, start=3)[0])[:30]
    with (d / LOG_FILE).open("ab") as f:
        f.write(torn)
    return 3, torn


def _recovery(d: Path, index: int) -> dict[str, Any]:
    rec: dict[str, Any] = json.loads(dict(iter_records(d))[index])
    assert rec["schema"] == "semgov.audit_recovery/v1" and rec["key_id"] == KEY.key_id
    return rec


def test_a_torn_tail_cut_leaves_a_signed_durable_recovery_record(tmp_path: Path, keys: Any) -> None:
    """Cutting a torn tail appends a signed record of the cut (before open returns) that verifies."""
    n, torn = _torn(tmp_path, keys)
    with AuditLog.open(tmp_path, signing_key=KEY, origin=ORIGIN) as log:
        assert log.recovery.size == n and log.size == n + 1
        rec = _recovery(tmp_path, n)  # read while the writer is still open: already durable
        quarantined = Path(log.recovery.quarantine_file).read_bytes()
    assert rec["cause"] == "torn_write" and rec["origin"] == ORIGIN
    cut = rec["cut"]
    assert cut == {
        "first_record": n, "records": 0, "bytes": len(torn), "offset": cut["offset"], "seals": 0,
        "untrusted_signers": [], "torn": cut["torn"], "quarantine_file": cut["quarantine_file"],
        "sha256": hashlib.sha256(torn).hexdigest(),
    }  # fmt: skip
    assert quarantined == torn and cut["torn"] and cut["quarantine_file"].startswith(f"{n}-at-")
    fr = Frontier()
    for _, r in list(iter_records(tmp_path))[:n]:
        fr.append(leaf_hash(r))
    assert rec["resumed"] == {"size": n, "log_bytes": rec["resumed"]["log_bytes"], "root": fr.root().hex(),
                              "from": "seal"}  # fmt: skip
    rep = verify_log(tmp_path, public_key=PUB, workers=1)
    assert rep.ok, rep.problems
    assert [i for i, _ in rep.recoveries] == [n] and "torn_write" in rep.recoveries[0][1]


def test_sealed_batches_by_an_untrusted_key_are_recorded_as_a_rollback(tmp_path: Path, keys: Any) -> None:
    """Batches sealed by a key the writer does not trust are cut and recorded as a rollback naming it."""
    recs = decisions(keys, KEY, 5)
    write_log(tmp_path, recs[:3])
    fr = Frontier()
    for r in recs[:5]:
        fr.append(leaf_hash(r))
    note = sign_checkpoint(Checkpoint(ORIGIN, 5, fr.root()), key_name_for(OTHER.key_id), OTHER.private_key)
    with (tmp_path / LOG_FILE).open("ab") as f:  # someone else's sealed batch after the last checkpoint
        f.write(reframe(3, recs[3]) + reframe(4, recs[4]) + seal_frame(5, note))
    (tmp_path / STATE_FILE).unlink()
    with AuditLog.open(tmp_path, signing_key=KEY, origin=ORIGIN) as log:
        assert log.recovery.size == 3 and log.recovery.cut_seals == 1
    rec = _recovery(tmp_path, 3)
    assert rec["cause"] == "rollback" and rec["cut"]["records"] == 2 and rec["cut"]["seals"] == 1
    assert rec["cut"]["untrusted_signers"] == [key_name_for(OTHER.key_id)]
    assert "rolled back" in rec["detail"] and rec["resumed"]["size"] == 3
    assert verify_log(tmp_path, public_key=PUB, workers=1).ok


def test_a_clean_reopen_writes_no_recovery_record(tmp_path: Path, keys: Any) -> None:
    """Reopening a cleanly closed log, or one only rebuilt from a missing state.json, appends nothing."""
    write_log(tmp_path, decisions(keys, KEY, 2))
    (tmp_path / STATE_FILE).unlink()
    with AuditLog.open(tmp_path, signing_key=KEY, origin=ORIGIN) as log:
        assert log.recovery.rebuilt and log.size == 2
    assert verify_log(tmp_path, public_key=PUB, workers=1).recoveries == []


def test_verify_show_stats_and_report_surface_the_recovery(
    tmp_path: Path, keys: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """verify prints RECOVERY, show lists it, stats counts it apart from decisions, the report names it."""
    n, _ = _torn(tmp_path, keys)
    AuditLog.open(tmp_path, signing_key=KEY, origin=ORIGIN).close()
    capsys.readouterr()
    assert main(["audit", "verify", str(tmp_path), "--pubkey", PUB_PEM, "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert f"RECOVERY at record {n}: torn_write" in out and "1 recovery record(s)" in out
    assert main(["audit", "show", str(tmp_path), "--kind", "audit_recovery", "--format", "jsonl"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["index"] for r in rows] == [n] and rows[0]["cause"] == "torn_write"
    assert main(["audit", "show", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "audit_recovery recovery on open cut" in table and f"{n} decision(s), 1 engine event(s)" in table
    assert main(["audit", "stats", str(tmp_path)]) == 0
    assert "audit_recovery 1" in capsys.readouterr().out
    page = tmp_path / "report.html"
    args = ["audit", "report", str(tmp_path), "--out", str(page), "--pubkey", PUB_PEM, "--workers", "1"]
    assert main(args) == 0
    assert "1 RECOVERY record(s)" in capsys.readouterr().out
    html = page.read_text()
    assert f"RECOVERY at record {n}: torn_write" in html and "audit_recovery" in html
