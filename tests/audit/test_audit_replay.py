"""Replayed records (issue 12, item 5): never anchored, never signed over by the writer, ids unique."""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from semgov.audit.errors import CheckpointConflictError, CorruptLogError
from semgov.audit.frames import CHECKPOINT_FILE, CHECKPOINTS_DIR, LOG_FILE, STATE_FILE
from semgov.audit.keyring import key_name_for
from semgov.audit.merkle import Frontier, leaf_hash
from semgov.audit.note import Checkpoint, open_checkpoint, sign_checkpoint
from semgov.audit.reader import iter_records, read_checkpoint
from semgov.audit.store import AuditLog
from semgov.audit.verify_dir import verify_log
from semgov.cli.main import main
from semgov.signing.keys import SigningKey
from tests.audit_fixtures import (
    KEY,
    ORIGIN,
    PUB,
    PUB_PEM,
    decisions,
    realization,
    record_payloads,
    reframe,
    write_log,
)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory, keys: Any) -> Path:
    """A cleanly closed log: six decisions, a realization after each allow (every record checkpointed)."""
    records: list[bytes] = []
    for dec in decisions(keys, KEY, 6):
        records.append(dec)
        if b'"decision":"allow"' in dec:
            records.append(realization(dec, KEY))
    d = tmp_path_factory.mktemp("replay") / "log"
    write_log(d, records, checkpoint_every=3)
    return d


@pytest.fixture
def log(pristine: Path, tmp_path: Path) -> Path:
    d = tmp_path / "log"
    shutil.copytree(pristine, d)
    return d


def _replay(d: Path) -> tuple[int, bytes]:
    """Append copies of a genuine allow and its realization at the next indexes; return (first, bytes)."""
    recs = record_payloads(d)
    allow = next(i for i, r in enumerate(recs) if b'"decision":"allow"' in r)
    n = len(recs)
    tail = reframe(n, recs[allow]) + reframe(n + 1, recs[allow + 1])
    with (d / LOG_FILE).open("ab") as f:
        f.write(tail)
    return n, tail


def _checkpoint_size(d: Path) -> int:
    note = read_checkpoint(d)
    assert note is not None
    return open_checkpoint(note, key_name_for(KEY.key_id), PUB).size


def test_replayed_records_fail_verify_as_not_anchored(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Copies of signed records appended after the last checkpoint: verify says 2 records are not anchored."""
    n, _ = _replay(log)
    assert main(["audit", "verify", str(log), "--pubkey", PUB_PEM, "--workers", "1"]) == 1
    out = capsys.readouterr().out
    assert "OK" not in out
    assert f"2 records ({n}..{n + 1}) are not anchored by any signature" in out
    rep = verify_log(log, public_key=PUB, workers=1)
    assert rep.records == n + 2 and rep.anchored == n and not rep.ok


def test_allow_unanchored_turns_the_finding_into_a_note(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--allow-unanchored reports the unanchored records as a note; the duplicate ids still fail."""
    n, _ = _replay(log)
    args = ["audit", "verify", str(log), "--pubkey", PUB_PEM, "--workers", "1", "--allow-unanchored"]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert f"note: 2 records ({n}..{n + 1}) are not anchored by any signature" in out
    assert "repeats record" in out


def test_writer_moves_replayed_records_aside_and_never_signs_them(log: Path) -> None:
    """The next writer quarantines the replayed frames (kept verbatim) and checkpoints only what it sealed."""
    before = (log / LOG_FILE).read_bytes()
    kept = read_checkpoint(log)
    n, tail = _replay(log)
    with AuditLog.open(log, signing_key=KEY, origin=ORIGIN) as w:
        recovery = w.recovery
        assert recovery.size == n and w.size == n + 1  # record n: the signed record of the recovery
    assert _checkpoint_size(log) == n + 1
    assert (log / LOG_FILE).read_bytes().startswith(before)
    assert recovery.quarantined_records == 2 and recovery.truncated_bytes == len(tail)
    assert Path(recovery.quarantine_file).read_bytes() == tail
    assert Path(recovery.quarantine_file).parent == log / "quarantine"
    rep = verify_log(log, public_key=PUB, kept_checkpoint=kept, workers=1)
    assert rep.ok, rep.problems
    assert [i for i, _ in rep.recoveries] == [n] and "unsealed_frames" in rep.recoveries[0][1]


def test_writer_refuses_replays_that_state_json_calls_durable(log: Path) -> None:
    """Replays and a state.json rewritten to cover them: the writer refuses, naming them, touching nothing."""
    n, _ = _replay(log)
    fr = Frontier()
    for _, r in iter_records(log):
        fr.append(leaf_hash(r))
    state = json.loads((log / STATE_FILE).read_bytes())
    state.update(size=n + 2, log_bytes=(log / LOG_FILE).stat().st_size, frontier=fr.to_json())
    (log / STATE_FILE).write_text(json.dumps(state))
    files = {p: p.read_bytes() for p in log.rglob("*") if p.is_file() and p.name != "LOCK"}
    with pytest.raises(CorruptLogError) as exc:
        AuditLog.open(log, signing_key=KEY, origin=ORIGIN)
    assert exc.value.index == n and f"records {n}..{n + 1}" in str(exc.value)
    assert "no seal or checkpoint by a trusted key" in str(exc.value)
    assert {p: p.read_bytes() for p in log.rglob("*") if p.is_file() and p.name != "LOCK"} == files


def test_writer_refuses_a_checkpoint_signed_by_a_key_it_does_not_trust(log: Path) -> None:
    """Replays under a checkpoint signed by another key: the writer refuses to open, verify fails."""
    n, _ = _replay(log)
    fr = Frontier()
    for _, r in iter_records(log):
        fr.append(leaf_hash(r))
    forger = SigningKey.from_private(Ed25519PrivateKey.generate())
    note = sign_checkpoint(
        Checkpoint(ORIGIN, n + 2, fr.root()), key_name_for(forger.key_id), forger.private_key
    )
    (log / CHECKPOINT_FILE).write_bytes(note)
    (log / CHECKPOINTS_DIR / f"{n + 2}.note").write_bytes(note)
    with pytest.raises(
        CheckpointConflictError, match=f"not signed by a key this writer trusts.*{forger.key_id}"
    ):
        AuditLog.open(log, signing_key=KEY, origin=ORIGIN)
    assert not (log / "quarantine").exists()
    rep = verify_log(log, public_key=PUB, workers=1)
    assert not rep.ok and any("latest checkpoint rejected" in p.message for p in rep.problems)


def test_duplicate_decision_and_event_ids_are_errors_naming_both_records(tmp_path: Path, keys: Any) -> None:
    """A decision or engine event logged twice (even by the writer itself) is an error naming both indexes."""
    dec = next(r for r in decisions(keys, KEY, 3) if b'"decision":"allow"' in r)
    event = realization(dec, KEY)
    other = decisions(keys, KEY, 1, start=10)[0]
    write_log(tmp_path, [dec, event, other, dec, event])
    rep = verify_log(tmp_path, public_key=PUB, workers=1)
    assert not rep.ok and rep.anchored == 5
    decision_id, event_id = json.loads(dec)["decision_id"], json.loads(event)["event_id"]
    messages = [str(p) for p in rep.problems]
    assert (
        f"record 3: decision_id {decision_id!r} repeats record 0 (a record logged twice, or a replay)"
        in messages
    )
    assert (
        f"record 4: event_id {event_id!r} repeats record 1 (a record logged twice, or a replay)" in messages
    )
    assert len(messages) == 2


def test_a_crash_tail_stays_recoverable_in_quarantine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whole frames of a batch whose write was cut short go to quarantine verbatim; acknowledged ones stay."""
    log = AuditLog.open(tmp_path, signing_key=KEY, origin=ORIGIN, commit_interval=0.0)
    for i in range(3):
        log.append(b"record %d" % i)
    assert log.flush() == 3
    sealed = (tmp_path / LOG_FILE).read_bytes()
    real_write = os.write

    def half_then_full(fd: int, data: Any) -> int:
        if fd == log._log_fd:
            real_write(fd, bytes(data[: len(data) * 3 // 4]))  # whole frames of the batch, not its seal
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", half_then_full)
    for i in range(3, 9):
        log.append(b"record %d" % i)
    with pytest.raises(Exception, match="No space left on device"):
        log.close()
    monkeypatch.undo()
    torn = (tmp_path / LOG_FILE).read_bytes()[len(sealed) :]
    with AuditLog.open(tmp_path, signing_key=KEY, origin=ORIGIN) as again:
        assert again.recovery.size == 3 and again.size == 4
        rec = again.recovery
    assert rec.truncated_bytes == len(torn) and rec.quarantined_records >= 1
    assert Path(rec.quarantine_file).read_bytes() == torn
    got = [r for _, r in iter_records(tmp_path)]
    assert got[:3] == [b"record %d" % i for i in range(3)] and b"semgov.audit_recovery/v1" in got[3]


def test_stats_says_how_many_records_are_not_sealed(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`audit stats` over a log with replayed records warns that they are not sealed (counts unverified)."""
    _replay(log)
    assert main(["audit", "stats", str(log)]) == 0
    captured = capsys.readouterr()
    assert "the last 2 records are not sealed" in captured.err


def test_state_json_of_an_empty_log_cannot_hide_appended_frames(tmp_path: Path, keys: Any) -> None:
    """Frames under a state.json claiming an empty log (no checkpoint) are refused, not silently skipped."""
    frames = b"".join(reframe(i, r) for i, r in enumerate(decisions(keys, KEY, 2)))
    (tmp_path / LOG_FILE).write_bytes(frames)
    state = {"size": 0, "log_bytes": len(frames), "frontier": Frontier().to_json(), "checkpoint_size": 0}
    (tmp_path / STATE_FILE).write_text(json.dumps(state))
    with pytest.raises(CorruptLogError, match="records 0..1"):
        AuditLog.open(tmp_path, signing_key=KEY, origin=ORIGIN)
    (tmp_path / STATE_FILE).unlink()
    with AuditLog.open(tmp_path, signing_key=KEY, origin=ORIGIN) as w:
        assert w.recovery.size == 0 and w.recovery.quarantined_records == 2
        assert w.size == 1  # the recovery's own record
    assert not (tmp_path / LOG_FILE).read_bytes().startswith(frames[:100])


def _state_size(d: Path) -> int | None:
    try:
        return int(json.loads((d / STATE_FILE).read_bytes())["size"])
    except (OSError, ValueError, KeyError):
        return None


def _crashed_with_sealed_tail(tmp_path: Path) -> tuple[Path, int]:
    """A copy of a live log (3 checkpointed records, 2 more sealed, acknowledged) and its checkpoint size."""
    live, copy = tmp_path / "live", tmp_path / "copy"
    log = AuditLog.open(live, signing_key=KEY, origin=ORIGIN, commit_interval=0.0, checkpoint_every=3,
                        checkpoint_interval=3600.0)  # fmt: skip
    for i in range(3):
        log.append(b"record %d" % i)
    log.flush()
    for i in range(3, 5):
        log.append(b"record %d" % i)
    assert log.flush() == 5
    deadline = time.monotonic() + 10  # state.json is rewritten just after the batch is durable
    while _state_size(live) != 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    shutil.copytree(live, copy, ignore=shutil.ignore_patterns("LOCK", ".*.tmp"))
    log.close()
    return copy, _checkpoint_size(copy)


@pytest.mark.parametrize("state", ["kept", "deleted"])
def test_writer_refuses_an_acknowledged_record_altered_past_the_checkpoint(
    tmp_path: Path, state: str
) -> None:
    """A sealed record past the checkpoint, edited and re-hashed: refused as corruption, not quarantined."""
    d, cp_size = _crashed_with_sealed_tail(tmp_path)
    assert cp_size == 3
    data = (d / LOG_FILE).read_bytes()
    genuine = reframe(4, b"record 4")
    assert data.count(genuine) == 1
    (d / LOG_FILE).write_bytes(data.replace(genuine, reframe(4, b"record 4, rewritten")))
    if state == "deleted":
        (d / STATE_FILE).unlink()
    files = {p: p.read_bytes() for p in d.rglob("*") if p.is_file() and p.name != "LOCK"}
    with pytest.raises(CorruptLogError) as exc:
        AuditLog.open(d, signing_key=KEY, origin=ORIGIN)
    assert exc.value.reason == "seal_mismatch" and exc.value.index == 5
    assert "the 5 records before it do not hash to its root" in str(exc.value)
    assert {p: p.read_bytes() for p in d.rglob("*") if p.is_file() and p.name != "LOCK"} == files


def test_writer_refuses_a_log_shorter_than_state_json_acknowledged(tmp_path: Path) -> None:
    """The last acknowledged batch cut off at a frame boundary: refused; deleting state.json is the way on."""
    d, _ = _crashed_with_sealed_tail(tmp_path)
    data = (d / LOG_FILE).read_bytes()
    cut = data.index(reframe(3, b"record 3"))
    (d / LOG_FILE).write_bytes(data[:cut])
    with pytest.raises(CorruptLogError) as exc:
        AuditLog.open(d, signing_key=KEY, origin=ORIGIN)
    assert exc.value.reason == "log_shorter_than_acknowledged" and exc.value.index == 5
    assert f"records.log has {cut} bytes but state.json records {len(data)} bytes" in str(exc.value)
    assert (d / LOG_FILE).read_bytes() == data[:cut]
    (d / STATE_FILE).unlink()
    with AuditLog.open(d, signing_key=KEY, origin=ORIGIN) as w:
        assert w.size == 3 and w.recovery.clean is False
