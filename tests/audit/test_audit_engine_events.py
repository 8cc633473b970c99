"""An audit log mixing decision records and engine events: verification, review and proofs."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from semgov import Evaluator, load_policy, load_signing_key
from semgov.audit.frames import FRAME_HEADER, LOG_FILE
from semgov.audit.merkle import inclusion_proof, leaf_hash
from semgov.audit.store import AuditLog
from semgov.audit.verify import verify_bundle
from semgov.audit.verify_dir import make_bundle, verify_log
from semgov.cli.main import main
from semgov.signing.canonical import canonicalize, canonicalize_record
from semgov.signing.engine_events import engine_event, sign_engine_event
from semgov.signing.keys import load_public_key
from tests.audit.test_audit_verify import bodies, frames, reframe
from tests.conftest import ASSETS, DEFAULT_POLICY_DIR, candidate, parse, request

KEY = load_signing_key(ASSETS / "decision-signing-key.pem")
PUB = load_public_key(ASSETS / "decision-signing-key.pub.pem")
PUB_PEM = str(ASSETS / "decision-signing-key.pub.pem")
AT = datetime(2026, 11, 29, 10, 0, 0, 500000, tzinfo=UTC)
N = 6  # requests; each gives one decision, and each allow one realization event


def _event(kind: str, dec: dict[str, Any] | None, **kw: Any) -> bytes:
    ids = {}
    if dec is not None:
        ids = {
            "request_id": dec["request_id"],
            "decision_id": dec["decision_id"],
            "donor_id": dec["donor_id"],
        }
    unsigned = engine_event(kind, engine="sglang 0.5.23", at=AT, **ids, **kw)
    return sign_engine_event(unsigned, KEY).canonical


def _records(keys: Any) -> list[bytes]:
    """Decisions, each allow followed by its realization; one failed realization; reuse disabled."""
    ev = Evaluator(load_policy(DEFAULT_POLICY_DIR), keys.keyring, KEY)
    out: list[bytes] = []
    for i in range(N):
        cand = candidate(keys, f"d-{i}", similarity=0.2 if i % 3 == 0 else 0.9)
        [d] = ev.evaluate(parse(request([cand], request_id=f"r-{i}")))
        out.append(d.canonical)
        if d.decision == "allow":
            spans = [{k: v for k, v in s.items() if k != "recompute"} for s in d.approved_spans]
            tokens = sum(s["length"] for s in spans)
            kind = "realization_failed" if i == 4 else "realization"
            if kind == "realization":
                slots = range(64 * i, 64 * i + tokens)
                out.append(_event(kind, d.record, materialized_tokens=tokens, slots=slots, spans=spans))
            else:
                out.append(_event(kind, d.record, detail="KV pool exhausted"))
    out.append(_event("reuse_disabled", None, detail="invariant checker tripped"))
    return out


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory, keys: Any) -> Path:
    d = tmp_path_factory.mktemp("mixed") / "log"
    with AuditLog.open(d, signing_key=KEY, origin="semgov/mixed", commit_interval=0) as log:
        for r in _records(keys):
            log.append(r)
    return d


@pytest.fixture
def log(pristine: Path, tmp_path: Path) -> Path:
    d = tmp_path / "log"
    shutil.copytree(pristine, d)
    return d


def _kinds(d: Path) -> list[str]:
    return [str(json.loads(b).get("kind", "decision")) for b in bodies(d)]


def test_layout_of_the_fixture(pristine: Path) -> None:
    """The mixed log interleaves 6 decisions with 3 realizations, 1 failed realization, 1 reuse_disabled."""
    assert _kinds(pristine) == ["decision", "decision", "realization", "decision", "realization", "decision",
                                "decision", "realization_failed", "decision", "realization",
                                "reuse_disabled"]  # fmt: skip


def test_mixed_log_verifies(pristine: Path) -> None:
    """Every decision and engine event signature checks out, and the checkpoint covers all of them."""
    rep = verify_log(pristine, public_key=PUB, workers=1)
    assert rep.ok, rep.problems
    assert rep.records == rep.signatures_checked == 11
    assert rep.checkpoint is not None and rep.checkpoint.size == 11


def test_flipped_byte_in_an_event_names_the_record(log: Path) -> None:
    """A flipped byte inside the engine event at index 7 is reported at index 7."""
    a, _ = frames(log)[7]
    data = bytearray((log / LOG_FILE).read_bytes())
    data[a + FRAME_HEADER.size + 30] ^= 0x01
    (log / LOG_FILE).write_bytes(bytes(data))
    rep = verify_log(log, public_key=PUB, workers=1)
    p = rep.first()
    assert p is not None and p.index == 7 and "SHA-256" in p.message


def test_rehashed_event_edit_fails_its_signature(log: Path) -> None:
    """An edited event with recomputed frame hashes fails the engine event signature at its index."""
    recs = bodies(log)
    edited = json.loads(recs[4])
    edited["materialized_tokens"] += 100
    recs[4] = canonicalize_record(edited)
    (log / LOG_FILE).write_bytes(b"".join(reframe(i, r) for i, r in enumerate(recs)))
    rep = verify_log(log, public_key=PUB, workers=1)
    assert any(p.index == 4 and p.message == "engine event signature does not verify" for p in rep.problems)


KNOWN = (
    "semgov.decision/v1, semgov.decision/v2, semgov.decision/v3, semgov.shadow_decision/v1, "
    "semgov.engine_event/v1, "
    "semgov.engine_event/v2, semgov.audit_recovery/v1"
)


def test_unknown_schema_is_a_problem(log: Path) -> None:
    """A signed record of any other schema is named as neither a decision nor an engine event."""
    recs = bodies(log)
    other = {k: v for k, v in json.loads(recs[2]).items() if k not in ("key_id", "signature")}
    other["schema"] = "semgov.engine_event/v3"
    recs[2] = canonicalize({**other, "key_id": KEY.key_id, "signature": KEY.sign(canonicalize(other))})
    (log / LOG_FILE).write_bytes(b"".join(reframe(i, r) for i, r in enumerate(recs)))
    rep = verify_log(log, public_key=PUB, workers=1)
    assert any(p.index == 2 and p.message == f"not a {KNOWN} record" for p in rep.problems)


def test_cli_show_lists_events(pristine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """show prints each event's kind, request, decision id and tokens ("-" for the tenant, namespace
    and policy it has none of), and counts both kinds of record."""
    recs = [json.loads(b) for b in bodies(pristine)]
    assert main(["audit", "show", str(pristine)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "6 decision(s), 5 engine event(s)"
    row = out[1 + 2].split()
    real = recs[2]
    assert row[:6] == ["2", real["at"], "event", "-", "-", "-"]
    assert row[6:9] == [real["request_id"], real["donor_id"], "370"]
    assert row[9:11] == ["realization", "decision"] and row[11] == real["decision_id"]
    assert "realization_failed" in out[1 + 7] and "KV pool exhausted" in out[1 + 7]
    last = out[1 + 10]
    assert last.split()[2:9] == ["event", "-", "-", "-", "-", "-", "0"]
    assert last.endswith("  reuse_disabled invariant checker tripped")


@pytest.mark.parametrize(
    ("args", "indices"),
    [
        (["--decision", "allow"], [1, 3, 6, 8]),
        (["--tenant", "acme"], [0, 1, 3, 5, 6, 8]),
        (["--kind", "realization"], [2, 4, 9]),
        (["--request", "r-4"], [6, 7]),
        (["--since", "2026-11-29T10:00:00.4Z"], [2, 4, 7, 9, 10]),
    ],
    ids=["decision", "tenant", "kind", "request", "since"],
)
def test_cli_show_filters(
    pristine: Path, capsys: pytest.CaptureFixture[str], args: list[str], indices: list[int]
) -> None:
    """Decision-only filters skip events, --kind skips decisions, shared fields and time match both."""
    assert main(["audit", "show", str(pristine), "--format", "jsonl", *args]) == 0
    assert [json.loads(x)["index"] for x in capsys.readouterr().out.splitlines()] == indices


def test_cli_show_by_decision_id(pristine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--decision-id finds a decision and the engine events that name it."""
    did = json.loads(bodies(pristine)[3])["decision_id"]
    assert main(["audit", "show", str(pristine), "--format", "jsonl", "--decision-id", did]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [(r["index"], r["schema"]) for r in rows] == [
        (3, "semgov.decision/v3"),
        (4, "semgov.engine_event/v2"),
    ]


def test_cli_stats_counts_schemas_and_kinds(pristine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """stats counts records by schema, decisions by outcome, events by kind and tokens materialized."""
    assert main(["audit", "stats", str(pristine), "--by", "day"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "11 records: semgov.decision/v3 6, semgov.engine_event/v2 5"
    assert out[1] == "6 decisions: allow 4, deny 2"
    assert out[2] == (
        "5 engine events: realization 3, realization_failed 1, reuse_disabled 1 (1110 tokens materialized)"
    )
    assert out[-2].split() == ["day", "allow", "deny", "events"]
    assert out[-1].split() == ["2026-11-29", "4", "2", "5"]


def test_cli_stats_with_a_decision_filter_skips_events(
    pristine: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A decision-only filter leaves engine events out of the tallies."""
    assert main(["audit", "stats", str(pristine), "--decision", "deny"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "2 records: semgov.decision/v3 2" and out[2].startswith("0 engine events")


def test_bundle_proves_the_decision_not_an_event_naming_it(pristine: Path, tmp_path: Path) -> None:
    """make_bundle by decision id picks the decision record even when an event naming it comes first."""
    recs = bodies(pristine)
    recs[2], recs[1] = recs[1], recs[2]  # the realization logged before its decision
    d = tmp_path / "reordered"
    with AuditLog.open(d, signing_key=KEY, origin="semgov/mixed", commit_interval=0) as lg:
        for r in recs:
            lg.append(r)
    bundle = make_bundle(d, json.loads(recs[2])["decision_id"])
    assert bundle["index"] == 2 and verify_bundle(bundle, PUB)["schema"] == "semgov.decision/v3"


def test_event_bundle_verifies_offline(
    pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A proof bundle carrying an engine event verifies, and verify-proof describes the event."""
    recs = bodies(pristine)
    bundle = make_bundle(pristine, json.loads(recs[1])["decision_id"])
    hashes = [leaf_hash(r) for r in recs[: bundle["tree_size"]]]
    bundle.update(
        record=recs[2].decode(), index=2, inclusion_proof=[h.hex() for h in inclusion_proof(2, hashes)]
    )
    assert verify_bundle(bundle, PUB)["kind"] == "realization"
    path = tmp_path / "event.json"
    path.write_text(json.dumps(bundle))
    assert main(["audit", "verify-proof", str(path), "--pubkey", PUB_PEM]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK: engine event ") and "(realization, request r-1, decision " in out


def test_time_filter_uses_the_event_time(pristine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--until before the events' time keeps only the decisions evaluated earlier."""
    until = (AT - timedelta(milliseconds=1)).isoformat()
    assert main(["audit", "show", str(pristine), "--until", until]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "6 decision(s)"
