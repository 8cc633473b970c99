"""Tamper evidence: every alteration of the log or its checkpoints is found, naming the record index."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from semgov import Evaluator, load_policy, load_signing_key
from semgov.audit.frames import (
    CHECKPOINT_FILE,
    CHECKPOINTS_DIR,
    FRAME_HEADER,
    LOG_FILE,
    SEAL_FLAG,
    STATE_FILE,
)
from semgov.audit.store import AuditLog
from semgov.audit.verify import verify_bundle
from semgov.audit.verify_dir import make_bundle, verify_log
from semgov.cli.main import main
from semgov.signing.canonical import canonicalize_record
from semgov.signing.keys import load_public_key
from tests.conftest import ASSETS, DEFAULT_POLICY_DIR, candidate, parse, request

KEY = load_signing_key(ASSETS / "decision-signing-key.pem")
PUB = load_public_key(ASSETS / "decision-signing-key.pub.pem")
N = 25


def _records(keys: Any) -> list[bytes]:
    ev = Evaluator(load_policy(DEFAULT_POLICY_DIR), keys.keyring, KEY)
    out = []
    for i in range(N):
        cand = candidate(keys, f"d-{i}", similarity=0.9 if i % 3 else 0.2)
        out += [d.canonical for d in ev.evaluate(parse(request([cand], request_id=f"r-{i}")))]
    return out


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory, keys: Any) -> Path:
    d = tmp_path_factory.mktemp("audit") / "log"
    with AuditLog.open(
        d, signing_key=KEY, origin="semgov/test", checkpoint_every=5, commit_interval=0
    ) as log:
        for i, r in enumerate(_records(keys), start=1):
            log.append(r)
            if i % 5 == 0:
                log.flush()  # one batch per 5 records: a checkpoint at 5, 10, 15, 20, 25
    assert sorted(p.name for p in (d / CHECKPOINTS_DIR).iterdir()) == [
        f"{n}.note" for n in (10, 15, 20, 25, 5)
    ]
    return d


@pytest.fixture
def log(pristine: Path, tmp_path: Path) -> Path:
    d = tmp_path / "log"
    shutil.copytree(pristine, d)
    return d


def frames(d: Path) -> list[tuple[int, int]]:
    """(offset, end) of every record frame (seal frames skipped: rewriting from these drops the seals)."""
    data = (d / LOG_FILE).read_bytes()
    out, off = [], 0
    while off < len(data):
        index, length, _ = FRAME_HEADER.unpack_from(data, off)
        if not index & SEAL_FLAG:
            out.append((off, off + FRAME_HEADER.size + length))
        off += FRAME_HEADER.size + length
    return out


def reframe(index: int, record: bytes) -> bytes:
    """A well-formed frame for ``record`` at ``index``, as an attacker could write it."""
    digest = hashlib.sha256(struct.pack(">Q", index) + record).digest()
    return FRAME_HEADER.pack(index, len(record), digest) + record


def bodies(d: Path) -> list[bytes]:
    data = (d / LOG_FILE).read_bytes()
    return [data[a + FRAME_HEADER.size : b] for a, b in frames(d)]


def first(d: Path, **kw: Any) -> Any:
    rep = verify_log(d, public_key=PUB, workers=1, **kw)
    assert not rep.ok
    return rep.first()


def test_pristine_log_verifies(pristine: Path) -> None:
    """An untouched log: every record, signature and checkpoint verifies, with history."""
    rep = verify_log(pristine, public_key=PUB, workers=1)
    assert rep.ok, rep.problems
    assert rep.records == N and rep.signatures_checked == N
    assert rep.checkpoint is not None and rep.checkpoint.size == N and rep.checkpoints_checked >= 5


def test_the_latest_checkpoint_is_counted_once(pristine: Path) -> None:
    """The latest checkpoint, also kept under checkpoints/, counts once: as many as the key signed."""
    rep = verify_log(pristine, public_key=PUB, workers=1)
    (use,) = rep.keys.values()
    assert rep.checkpoints_checked == len(use.checkpoints) == len(list((pristine / "checkpoints").iterdir()))


def test_flipped_byte_names_the_record(log: Path) -> None:
    """A flipped byte inside record 7 is reported at index 7."""
    a, _ = frames(log)[7]
    data = bytearray((log / LOG_FILE).read_bytes())
    data[a + FRAME_HEADER.size + 40] ^= 0x20
    (log / LOG_FILE).write_bytes(bytes(data))
    p = first(log)
    assert p.index == 7 and "SHA-256" in p.message


def test_rehashed_edit_fails_the_signature(log: Path) -> None:
    """An edit with a recomputed frame hash still fails record 7's decision signature."""
    recs = bodies(log)
    edited = json.loads(recs[7])
    edited["request_id"] = "r-forged"
    recs[7] = canonicalize_record(edited)
    (log / LOG_FILE).write_bytes(b"".join(reframe(i, r) for i, r in enumerate(recs)))
    p = first(log)
    assert p.index == 7 and "signature does not verify" in p.message


@pytest.mark.parametrize("how", ["delete", "reorder", "insert"])
def test_moved_records_name_the_index(log: Path, how: str) -> None:
    """Deleting, reordering or inserting a frame is reported where it happened (record 10)."""
    data = (log / LOG_FILE).read_bytes()
    fr = frames(log)
    pieces = [data[a:b] for a, b in fr]
    if how == "delete":
        del pieces[10]
    elif how == "reorder":
        pieces[10], pieces[11] = pieces[11], pieces[10]
    else:
        pieces.insert(10, pieces[3])
    (log / LOG_FILE).write_bytes(b"".join(pieces))
    p = first(log)
    assert p.index == 10 and "belongs" in p.message


def test_rewritten_log_is_caught_by_checkpoints(log: Path) -> None:
    """Deleting record 12 and rewriting every later frame is caught by the checkpoints, near 12."""
    recs = bodies(log)
    del recs[12]
    (log / LOG_FILE).write_bytes(b"".join(reframe(i, r) for i, r in enumerate(recs)))
    (log / STATE_FILE).unlink()
    p = first(log)
    assert p.index is not None and 10 <= p.index <= 12  # between the checkpoints at 10 and 15
    assert "do not hash to" in p.message


def test_truncation_below_a_kept_checkpoint(log: Path, pristine: Path) -> None:
    """Cutting the log to 15 records and rolling its checkpoints back is caught by a kept checkpoint."""
    kept = (pristine / CHECKPOINTS_DIR / "20.note").read_bytes()
    a, _ = frames(log)[15]
    with open(log / LOG_FILE, "r+b") as f:
        f.truncate(a)
    (log / CHECKPOINT_FILE).write_bytes((log / CHECKPOINTS_DIR / "15.note").read_bytes())
    for n in ("20.note", "25.note"):
        (log / CHECKPOINTS_DIR / n).unlink(missing_ok=True)
    (log / STATE_FILE).unlink()
    assert verify_log(log, public_key=PUB, workers=1).ok  # the rolled-back log is self-consistent
    p = first(log, kept_checkpoint=kept)
    assert p.index == 15 and "truncated" in p.message and "kept checkpoint covers 20" in p.message


def test_truncation_without_rollback_is_caught_by_the_log_itself(log: Path) -> None:
    """Cutting the tail while the latest checkpoint still covers it names the first missing record."""
    a, _ = frames(log)[22]
    with open(log / LOG_FILE, "r+b") as f:
        f.truncate(a)
    p = first(log)
    assert p.index == 22 and "truncated" in p.message


def test_swapped_checkpoint_signature(log: Path, pristine: Path) -> None:
    """A checkpoint carrying another checkpoint's signature line is rejected."""
    latest = (log / CHECKPOINT_FILE).read_bytes()
    other = (pristine / CHECKPOINTS_DIR / "10.note").read_bytes()
    body, sig = latest.rsplit(b"\n\n", 1)[0], other.rsplit(b"\n\n", 1)[1]
    (log / CHECKPOINT_FILE).write_bytes(body + b"\n\n" + sig)
    rep = verify_log(log, public_key=PUB, workers=1)
    assert any("latest checkpoint rejected" in p.message for p in rep.problems)


def test_kept_checkpoint_consistency_is_proved(log: Path, pristine: Path) -> None:
    """A reviewer's older checkpoint is proved consistent with the latest one."""
    kept = (pristine / CHECKPOINTS_DIR / "10.note").read_bytes()
    rep = verify_log(log, public_key=PUB, workers=1, kept_checkpoint=kept)
    assert rep.ok and any("consistent" in n for n in rep.notes)


def test_parallel_and_serial_checks_agree(log: Path) -> None:
    """Signature checks in worker processes find the same first problem as in-process."""
    recs = bodies(log)
    edited = json.loads(recs[5])
    edited["donor_id"] = "x"
    recs[5] = canonicalize_record(edited)
    (log / LOG_FILE).write_bytes(b"".join(reframe(i, r) for i, r in enumerate(recs)))
    serial = verify_log(log, public_key=PUB, workers=1).first()
    parallel = verify_log(log, public_key=PUB, workers=2).first()
    assert serial == parallel and serial is not None and serial.index == 5


def test_proof_bundle_round_trip_and_tamper(pristine: Path) -> None:
    """A bundle verifies offline; editing its record, proof or checkpoint makes it fail."""
    from semgov.audit.merkle import ProofError

    rid = json.loads(bodies(pristine)[6])["decision_id"]
    bundle = make_bundle(pristine, rid)
    assert verify_bundle(bundle, PUB)["decision_id"] == rid
    for mutate in (
        lambda b: b.update(record=b["record"].replace('"r-', '"x-', 1)),
        lambda b: b.update(index=b["index"] + 1),
        lambda b: b["inclusion_proof"].__setitem__(0, "00" * 32),
        lambda b: b.update(checkpoint=b["checkpoint"].replace("semgov/test", "semgov/tesT")),
    ):
        bad = json.loads(json.dumps(bundle))
        mutate(bad)
        with pytest.raises(ProofError):
            verify_bundle(bad, PUB)


def test_cli_verify_prove_and_review(log: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The audit CLI: verify OK then FAILED with the index; show, stats, prove, verify-proof."""
    pub = str(ASSETS / "decision-signing-key.pub.pem")
    assert main(["audit", "verify", str(log), "--pubkey", pub, "--workers", "1"]) == 0
    assert "OK: every record" in capsys.readouterr().out
    assert main(["audit", "show", str(log), "--decision", "deny", "--gate", "similarity"]) == 0
    out = capsys.readouterr().out
    assert "deny" in out and f"{sum(1 for i in range(N) if i % 3 == 0)} decision(s)" in out
    assert main(["audit", "stats", str(log)]) == 0
    assert f"{N} decisions" in capsys.readouterr().out
    rid = json.loads(bodies(log)[3])["decision_id"]
    bundle = tmp_path / "b.json"
    assert main(["audit", "prove", str(log), "--decision-id", rid, "--out", str(bundle)]) == 0
    assert main(["audit", "verify-proof", str(bundle), "--pubkey", pub]) == 0
    assert "OK: decision" in capsys.readouterr().out
    a, _ = frames(log)[4]
    data = bytearray((log / LOG_FILE).read_bytes())
    data[a + FRAME_HEADER.size + 10] ^= 1
    (log / LOG_FILE).write_bytes(bytes(data))
    assert main(["audit", "verify", str(log), "--pubkey", pub, "--workers", "1"]) == 1
    assert "FAILED: record 4:" in capsys.readouterr().out


def test_check_appends_to_an_audit_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """semgov check --audit appends every decision durably and signs a checkpoint that verifies."""
    d = tmp_path / "audit"
    key = str(ASSETS / "decision-signing-key.pem")
    args = ["check", str(ASSETS / "captured-small.jsonl"), "--policy", str(DEFAULT_POLICY_DIR),
            "--trust", str(ASSETS / "keyring.json"), "--signing-key", key, "--audit", str(d)]  # fmt: skip
    assert main(args) == 2  # the fixture has a malformed line; its donor is denied and logged too
    rep = verify_log(d, public_key=PUB, workers=1)
    assert rep.ok and rep.records == 4 and rep.checkpoint is not None and rep.checkpoint.size == 4
    assert main(args) == 2  # a second run appends to the same log
    assert verify_log(d, public_key=PUB, workers=1).records == 8


# ---- hostile input: a problem or a clear error, never a traceback, never OK -------------------------


_HOSTILE_RECORDS: dict[str, Callable[[bytes], bytes]] = {
    "lone surrogate": lambda r: r.replace(b'"request_id":"', b'"request_id":"\\ud800', 1),
    "1e400": lambda r: r.replace(b'"approved_tokens":', b'"approved_tokens":1e400,"x":', 1),
    "NaN": lambda r: r.replace(b'"approved_tokens":', b'"approved_tokens":NaN,"x":', 1),
    "deep nesting": lambda r: b"[" * 100_000 + b"]" * 100_000,
    "deep member": lambda r: r.replace(
        b'"request_id":', b'"y":' + b"[" * 900 + b"]" * 900 + b',"request_id":', 1
    ),
    "duplicate key": lambda r: r.replace(b'"decision":', b'"decision":"allow","decision":', 1),
    "not UTF-8": lambda r: r.replace(b'"request_id":"', b'"request_id":"\xff', 1),
}


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("name", sorted(_HOSTILE_RECORDS))
def test_hostile_record_is_a_problem_not_a_crash(
    log: Path, name: str, workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A re-hashed record 0 with a lone surrogate, 1e400, NaN, deep nesting or a duplicate key: problem."""
    import semgov.audit.verify_dir

    monkeypatch.setattr(semgov.audit.verify_dir, "_CHUNK", 4)  # several ranges: the worker-process path too
    recs = bodies(log)
    recs[0] = _HOSTILE_RECORDS[name](recs[0])
    assert recs[0] != bodies(log)[0]
    (log / LOG_FILE).write_bytes(b"".join(reframe(i, r) for i, r in enumerate(recs)))
    rep = verify_log(log, public_key=PUB, workers=workers)
    p = rep.first()
    assert p is not None and p.index == 0 and "canonical JSON" in p.message, rep.problems
    assert not any(q.index not in (0, None) for q in rep.problems if q.exact), rep.problems


def test_record_problem_never_raises_on_hostile_leaves() -> None:
    """record_problem returns a reason (naming canonical JSON) for every hostile leaf instead of raising."""
    from semgov.audit.verify import record_problem
    from semgov.signing.keys import key_id_for

    leaf = (ASSETS / "decisions.jsonl").read_bytes().splitlines()[0]
    kid = key_id_for(PUB)
    for name, edit in _HOSTILE_RECORDS.items():
        why = record_problem(edit(leaf), PUB, kid)
        assert why is not None and "canonical JSON" in why, (name, why)
    assert record_problem(b'{"schema":' * 50_000, PUB, kid) is not None


def test_cli_verify_reports_a_hostile_record(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`semgov audit verify` on a record of 100,000 nested arrays says FAILED at record 0, exit 1."""
    recs = bodies(log)
    recs[0] = b"[" * 100_000 + b"]" * 100_000
    (log / LOG_FILE).write_bytes(b"".join(reframe(i, r) for i, r in enumerate(recs)))
    pub = str(ASSETS / "decision-signing-key.pub.pem")
    assert main(["audit", "verify", str(log), "--pubkey", pub, "--workers", "1"]) == 1
    assert "FAILED: record 0: not canonical JSON: nested too deeply" in capsys.readouterr().out


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("which", [0, 7])
def test_frame_index_field_is_checked(
    log: Path, which: int, workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A frame whose 8-byte index field was altered (record, hash intact): a problem at index and offset."""
    import semgov.audit.verify_dir

    monkeypatch.setattr(semgov.audit.verify_dir, "_CHUNK", 4)
    a, _ = frames(log)[which]
    data = bytearray((log / LOG_FILE).read_bytes())
    data[a + 7] ^= 0x01  # the low byte of the index field
    (log / LOG_FILE).write_bytes(bytes(data))
    rep = verify_log(log, public_key=PUB, workers=workers)
    p = rep.first()
    assert p is not None and p.index == which, rep.problems
    assert f"byte offset {a}" in p.message and "index field" in p.message


def test_cli_frame_index_field_is_not_ok(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`semgov audit verify` after flipping a bit of byte 7 of records.log fails at record 0, not OK."""
    data = bytearray((log / LOG_FILE).read_bytes())
    data[7] ^= 0x01
    (log / LOG_FILE).write_bytes(bytes(data))
    pub = str(ASSETS / "decision-signing-key.pub.pem")
    assert main(["audit", "verify", str(log), "--pubkey", pub]) == 1
    out = capsys.readouterr().out
    assert "FAILED: record 0: frame at byte offset 0: its index field says 1, not 0" in out


@pytest.fixture
def bundle_text(pristine: Path) -> str:
    rid = json.loads(bodies(pristine)[6])["decision_id"]
    return json.dumps(make_bundle(pristine, rid), indent=2) + "\n"


@pytest.mark.parametrize(
    "field, value, why",
    [
        ("index", float("inf"), '"index" must be a JSON integer'),
        ("index", False, '"index" must be a JSON integer'),
        ("index", 6.0, '"index" must be a JSON integer'),
        ("index", "6", '"index" must be a JSON integer'),
        ("index", -1, '"index" -1 is out of range'),
        ("index", 25, '"index" 25 is out of range'),
        ("tree_size", 25.9, '"tree_size" must be a JSON integer'),
        ("tree_size", True, '"tree_size" must be a JSON integer'),
        ("tree_size", 2**64, '"tree_size" 18446744073709551616 is out of range'),
        ("record", {"a": 1}, '"record" must be a JSON string'),
        ("record", "\ud800", '"record" holds a lone surrogate'),
        ("checkpoint", None, '"checkpoint" must be a JSON string'),
        ("inclusion_proof", "00" * 32, '"inclusion_proof" must be a JSON array'),
        ("inclusion_proof", [[]], '"inclusion_proof"[0] must be 64 lower-case hex digits'),
        ("inclusion_proof", ["AB" * 32], '"inclusion_proof"[0] must be 64 lower-case hex digits'),
        ("inclusion_proof", ["00" * 32] * 65, '"inclusion_proof" has 65 hashes'),
        ("index", None, '"index" must be a JSON integer'),
    ],
)
def test_bundle_fields_must_have_their_exact_type(bundle_text: str, field: str, value: Any, why: str) -> None:
    """Every bundle field must be of its exact JSON type and in range; the ProofError names the field."""
    from semgov.audit.merkle import ProofError

    bundle = json.loads(bundle_text)
    bundle[field] = value
    with pytest.raises(ProofError, match=f"malformed bundle: {__import__('re').escape(why)}"):
        verify_bundle(bundle, PUB)
    del bundle[field]
    with pytest.raises(ProofError, match=f'malformed bundle: "{field}" is missing'):
        verify_bundle(bundle, PUB)


@pytest.mark.parametrize(
    "old, new, why",
    [
        ('"index": 6,', '"index": 999, "index": 6,', "duplicate key 'index'"),
        ('"tree_size": 25,', '"tree_size": 25.9,', '"tree_size" must be a JSON integer, got 25.9'),
        ('"index": 6,', '"index": 1e400,', '"index" must be a JSON integer, got inf'),
        ('"index": 6,', '"index": NaN,', "NaN is not JSON"),
        ('"index": 6,', '"index": false,', '"index" must be a JSON integer, got False'),
    ],
)
def test_bundle_bytes_are_read_strictly(bundle_text: str, old: str, new: str, why: str) -> None:
    """verify_bundle on a bundle file's bytes refuses duplicate keys, 1e400, NaN, 25.9 and false."""
    from semgov.audit.merkle import ProofError

    assert verify_bundle(bundle_text.encode(), PUB)["decision_id"]  # the real one verifies
    assert old in bundle_text
    with pytest.raises(ProofError, match=__import__("re").escape(why)):
        verify_bundle(bundle_text.replace(old, new, 1).encode(), PUB)


@pytest.mark.parametrize(
    "edit, why",
    [
        (lambda t: "[" * 100_000 + "]" * 100_000, "cannot read proof bundle: nested deeper than"),
        (lambda t: t.replace('"index": 6,', '"index": 999, "index": 6,', 1), "duplicate key 'index'"),
        (lambda t: t.replace('"index": 6,', '"index": 1e400,', 1), '"index" must be a JSON integer'),
        (lambda t: t.replace('"tree_size": 25,', '"tree_size": 25.9,', 1), '"tree_size" must be a JSON'),
        (lambda t: t.replace('"index": 6,', '"index": false,', 1), '"index" must be a JSON integer'),
    ],
)
def test_cli_verify_proof_refuses_malformed_bundles(
    bundle_text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Any, why: str
) -> None:
    """`semgov audit verify-proof` on a deep, duplicate-key or non-integer bundle fails with a reason."""
    pub = str(ASSETS / "decision-signing-key.pub.pem")
    f = tmp_path / "bundle.json"
    f.write_text(bundle_text)
    assert main(["audit", "verify-proof", str(f), "--pubkey", pub]) == 0
    assert "record 6 of the log at size 25" in capsys.readouterr().out
    f.write_text(edit(bundle_text))
    assert main(["audit", "verify-proof", str(f), "--pubkey", pub]) in (1, 2)
    captured = capsys.readouterr()
    assert "OK" not in captured.out and why in captured.out + captured.err


def test_show_and_stats_survive_hostile_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`semgov audit show/stats` on odd-typed records print them; a deep record is an error naming it."""
    d = tmp_path / "log"
    odd = b'{"approved_tokens":1e400,"decision":null,"gates":5,"policy":[],"schema":"semgov.decision/v1"}'
    event = b'{"kind":"realization","materialized_tokens":"8","schema":"semgov.engine_event/v1"}'
    with AuditLog.open(d, signing_key=KEY, origin="semgov/test") as log:
        log.append(odd)
        log.append(event)
    assert main(["audit", "show", str(d)]) == 0
    assert "1 decision(s), 1 engine event(s)" in capsys.readouterr().out
    assert main(["audit", "stats", str(d), "--gate", "tenant"]) == 0
    assert main(["audit", "stats", str(d)]) == 0
    assert "2 records" in capsys.readouterr().out
    d2 = tmp_path / "deep"
    with AuditLog.open(d2, signing_key=KEY, origin="semgov/test") as log:
        log.append(b"[" * 100_000 + b"]" * 100_000)
    assert main(["audit", "show", str(d2)]) == 2
    captured = capsys.readouterr()
    assert "record 0 is not JSON: nested deeper than" in captured.out + captured.err
