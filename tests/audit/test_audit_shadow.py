"""An audit log with shadow decision records among the decisions and engine events: verification,
review (show, stats) and proofs. Shadow records are checked like decisions and never counted as them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from semgov import Evaluator, load_policy
from semgov.audit.errors import AuditLogError
from semgov.audit.frames import LOG_FILE
from semgov.audit.merkle import inclusion_proof, leaf_hash
from semgov.audit.query import Filter, is_event, is_shadow, select, tally
from semgov.audit.verify import is_decision_record, is_shadow_record, verify_bundle
from semgov.audit.verify_dir import make_bundle, verify_log
from semgov.cli.main import main
from semgov.signing.canonical import canonicalize_record
from semgov.signing.records import sign_record_canonical
from semgov.signing.shadow import shadow_record
from semgov.wire.models import SHADOW_DECISION_SCHEMA
from tests.audit_fixtures import KEY, PUB, PUB_PEM, realization, record_payloads, reframe, write_log
from tests.conftest import DEFAULT_POLICY_DIR, candidate, parse, policy_with, request

N = 6  # requests with a live decision; every third is denied (similarity 0.2), the rest allowed (0.9)
# Per request: the live decision, its realization (allow only), then the shadow record. Requests
# 0..2 are shadowed by a strict policy (similarity 0.95: every one denied), 3..5 (and r-6, which
# has no live decision) by a lenient one (similarity 0.1: every one allowed).
LAYOUT = ["decision", "shadow", "decision", "realization", "shadow", "decision", "realization", "shadow",
          "decision", "shadow", "decision", "realization", "shadow", "decision", "realization", "shadow",
          "shadow"]  # fmt: skip
SHADOWS = [i for i, k in enumerate(LAYOUT) if k == "shadow"]


def _records(keys: Any) -> list[bytes]:
    live = Evaluator(load_policy(DEFAULT_POLICY_DIR), keys.keyring, KEY)
    strict = Evaluator(policy_with("similarity: {min: 0.95}"), keys.keyring, KEY)
    lenient = Evaluator(policy_with("similarity: {min: 0.1}"), keys.keyring, KEY)
    out: list[bytes] = []
    for i in range(N + 1):
        req = parse(
            request([candidate(keys, f"d-{i}", similarity=0.2 if i % 3 == 0 else 0.9)], request_id=f"r-{i}")
        )
        [sh] = (strict if i < 3 else lenient).evaluate(req)
        if i == N:  # the live policy made no decision for this donor
            out.append(shadow_record(sh, None, KEY).canonical)
            continue
        [d] = live.evaluate(req)
        out.append(d.canonical)
        if d.decision == "allow":
            out.append(realization(d.canonical, KEY))
        out.append(shadow_record(sh, d, KEY).canonical)
    return out


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory, keys: Any) -> Path:
    d = tmp_path_factory.mktemp("shadow") / "log"
    write_log(d, _records(keys))
    return d


@pytest.fixture
def log(pristine: Path, tmp_path: Path) -> Path:
    d = tmp_path / "log"
    shutil.copytree(pristine, d)
    return d


def _recs(d: Path) -> list[dict[str, Any]]:
    return [json.loads(b) for b in record_payloads(d)]


def _rewrite(d: Path, index: int, record: bytes) -> None:
    """Replace record ``index`` and recompute every frame (what anyone with write access can do)."""
    recs = record_payloads(d)
    recs[index] = record
    (d / LOG_FILE).write_bytes(b"".join(reframe(i, r) for i, r in enumerate(recs)))


def test_layout_of_the_fixture(pristine: Path) -> None:
    """The log interleaves 6 live decisions, 4 realizations and 7 shadow records as LAYOUT says."""
    recs = _recs(pristine)
    kinds = ["shadow" if is_shadow(r) else r["kind"] if is_event(r) else "decision" for r in recs]
    assert kinds == LAYOUT
    assert [recs[i]["decision"] for i in SHADOWS] == ["deny"] * 3 + ["allow"] * 4
    assert [recs[i]["live_decision"] for i in SHADOWS] == [
        "deny",
        "allow",
        "allow",
        "deny",
        "allow",
        "allow",
        None,
    ]


def test_log_with_shadow_records_verifies(pristine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every decision, event and shadow signature checks out; `audit verify` says OK."""
    rep = verify_log(pristine, public_key=PUB, workers=1)
    assert rep.ok, rep.problems
    assert rep.records == rep.signatures_checked == len(LAYOUT)
    assert main(["audit", "verify", str(pristine), "--pubkey", PUB_PEM, "--workers", "2"]) == 0
    assert "OK: every record, seal and checkpoint verifies" in capsys.readouterr().out


def test_tampered_shadow_record_fails_naming_it(log: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A shadow record whose live outcome is rewritten (frames recomputed) fails as a shadow decision."""
    rec = _recs(log)[SHADOWS[1]]
    rec["live_decision"] = "deny"  # make an allow->deny disagreement look like an agreement
    _rewrite(log, SHADOWS[1], canonicalize_record(rec))
    rep = verify_log(log, public_key=PUB, workers=1)
    assert [(p.index, p.message) for p in rep.problems if p.index == SHADOWS[1]] == [
        (SHADOWS[1], "shadow decision signature does not verify")
    ]
    assert main(["audit", "verify", str(log), "--pubkey", PUB_PEM, "--workers", "1"]) == 1
    assert (
        f"FAILED: record {SHADOWS[1]}: shadow decision signature does not verify" in capsys.readouterr().out
    )


def test_shadow_record_reusing_a_live_decision_id_repeats_it(pristine: Path, tmp_path: Path) -> None:
    """Decision ids are unique across live and shadow records: a shadow record with a live id is a repeat."""
    leaves, recs = record_payloads(pristine), _recs(pristine)
    forged = {**recs[SHADOWS[0]], "decision_id": recs[0]["decision_id"]}
    leaves[SHADOWS[0]] = sign_record_canonical(forged, KEY)[1]  # validly signed, written by the real writer
    write_log(tmp_path / "log", leaves)
    rep = verify_log(tmp_path / "log", public_key=PUB, workers=1)
    assert [str(p) for p in rep.problems] == [
        f"record {SHADOWS[0]}: decision_id {recs[0]['decision_id']!r} repeats record 0 "
        "(a record logged twice, or a replay)"
    ]


def test_stats_count_shadow_records_apart(pristine: Path) -> None:
    """tally counts shadow records by outcome and disagreement, never as decisions, gates or tokens."""
    recs = _recs(pristine)
    st = tally(recs)
    live = [r for r in recs if r["schema"] == "semgov.decision/v3"]
    assert st.records == len(LAYOUT) and st.schemas[SHADOW_DECISION_SCHEMA] == 7
    assert st.decisions == {"allow": 4, "deny": 2}
    assert st.gate_fail == {"similarity": 2}  # the shadows' 3 similarity failures are not counted
    assert st.approved_tokens == {("acme", "research/entity-042"): sum(r["approved_tokens"] for r in live)}
    assert st.engines == {"default@1 (yaml)": 6}
    assert st.shadow.decisions == {"allow": 4, "deny": 3}
    assert st.shadow.disagreements == {"allow->deny": 2, "deny->allow": 1, "none->allow": 1}
    assert st.shadow.without_live == 1 and st.shadow.policies.total() == 7
    assert st.by_period["2026-11-29"] == {"allow": 4, "deny": 2, "event": 4, "shadow": 7}


def test_cli_stats_shadow_section(pristine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`audit stats` prints live decisions as before, then the shadow records and their disagreements."""
    assert main(["audit", "stats", str(pristine)]) == 0
    out = capsys.readouterr().out.splitlines()
    schemas = f"semgov.decision/v3 6, semgov.engine_event/v2 4, {SHADOW_DECISION_SCHEMA} 7"
    assert out[0] == f"{len(LAYOUT)} records: {schemas}"
    assert out[1] == "6 decisions: allow 4, deny 2"
    assert out[3] == "policies: default@1 (yaml) x6"
    assert out[4] == "7 shadow decisions (never acted on): allow 4, deny 3 (1 without a live decision)"
    assert out[5] == (
        "shadow disagreements with live: 4 of 7 (57.1%): "
        "allow->deny 2, deny->allow 1, none->allow 1 (live->shadow)"
    )
    assert out[6] == "shadow policies: default@1 (yaml) x7"
    assert next(x for x in out if x.startswith("similarity")).split() == ["similarity", "2", "0"]
    assert out[-2].split() == ["day", "allow", "deny", "events", "shadow"]
    assert out[-1].split() == ["2026-11-29", "4", "2", "4", "7"]


def test_cli_stats_without_shadow_records_is_unchanged(
    pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--shadow exclude gives exactly the output of the same log written without its shadow records."""
    plain = tmp_path / "plain"
    write_log(plain, [b for i, b in enumerate(record_payloads(pristine)) if i not in SHADOWS])
    assert main(["audit", "stats", str(plain)]) == 0
    expected = capsys.readouterr().out
    assert "shadow" not in expected
    assert main(["audit", "stats", str(pristine), "--shadow", "exclude"]) == 0
    assert capsys.readouterr().out == expected


def test_cli_show_marks_shadow_records(pristine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """show puts `shadow` in the decision column, the outcomes and DISAGREE last, and counts them apart."""
    recs = _recs(pristine)
    assert main(["audit", "show", str(pristine)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "6 decision(s), 4 engine event(s), 7 shadow decision(s)"
    row = out[1 + SHADOWS[1]].split()
    rec = recs[SHADOWS[1]]
    assert row[:3] == [str(SHADOWS[1]), rec["evaluated_at"], "shadow"] and row[6:8] == ["r-1", "d-1"]
    assert row[3:6] == ["acme", "research/entity-042", "default@1"]
    assert row[9:] == ["deny,", "live", "allow", rec["live_decision_id"], "DISAGREE;", "failed", "similarity"]
    assert out[1 + SHADOWS[4]].split()[9:] == [
        "allow,",
        "live",
        "allow",
        recs[SHADOWS[4]]["live_decision_id"],
    ]
    assert out[1 + SHADOWS[6]].split()[9:] == ["allow,", "live", "none", "DISAGREE"]
    assert out[1].split()[2] == "deny"  # a live decision's row is as before


@pytest.mark.parametrize(
    ("args", "indices"),
    [
        (["--shadow", "only"], SHADOWS),
        (["--shadow", "exclude"], [i for i in range(len(LAYOUT)) if i not in SHADOWS]),
        (["--shadow", "only", "--decision", "allow"], SHADOWS[3:]),
        (["--shadow", "only", "--gate", "similarity"], SHADOWS[:3]),
        (["--request", "r-1"], [2, 3, 4]),
        (["--donor", "d-6"], [16]),
        (["--kind", "realization"], [3, 6, 11, 14]),
        (["--tenant", "acme", "--shadow", "exclude"], [0, 2, 5, 8, 10, 13]),
    ],
    ids=["only", "exclude", "decision", "gate", "request", "donor", "kind", "tenant"],
)
def test_cli_show_filters(
    pristine: Path, capsys: pytest.CaptureFixture[str], args: list[str], indices: list[int]
) -> None:
    """Decision filters apply to shadow records as to decisions; --kind skips them; --shadow picks them."""
    assert main(["audit", "show", str(pristine), "--format", "jsonl", *args]) == 0
    assert [json.loads(x)["index"] for x in capsys.readouterr().out.splitlines()] == indices


def test_decision_id_finds_the_shadow_records_of_a_live_decision(pristine: Path) -> None:
    """A live decision id selects the decision, its realization and its shadow record; a shadow id, itself."""
    recs = _recs(pristine)
    live_id, shadow_id = recs[2]["decision_id"], recs[4]["decision_id"]
    pairs = list(enumerate(recs))
    assert [i for i, _ in select(pairs, Filter(decision_id=live_id))] == [2, 3, 4]
    assert [i for i, _ in select(pairs, Filter(decision_id=live_id, shadow="exclude"))] == [2, 3]
    assert [i for i, _ in select(pairs, Filter(decision_id=shadow_id))] == [4]


def test_proof_bundle_refuses_a_shadow_id(pristine: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A proof bundle proves live decisions: a shadow record's id is refused, naming it as one."""
    leaves = record_payloads(pristine)
    shadow_id = json.loads(leaves[SHADOWS[0]])["decision_id"]
    assert not is_decision_record(leaves[SHADOWS[0]], shadow_id)
    assert is_shadow_record(leaves[SHADOWS[0]], shadow_id) and not is_shadow_record(leaves[0], shadow_id)
    with pytest.raises(AuditLogError, match=f"record {SHADOWS[0]} with decision_id .* is a shadow decision"):
        make_bundle(pristine, shadow_id)
    assert main(["audit", "prove", str(pristine), "--decision-id", shadow_id]) == 2
    assert "never acted on" in capsys.readouterr().err


def test_proof_bundle_of_a_live_decision_skips_its_shadow(pristine: Path) -> None:
    """Proving a live decision finds the decision record, not the shadow record naming it."""
    leaves = record_payloads(pristine)
    bundle = make_bundle(pristine, json.loads(leaves[2])["decision_id"])
    assert bundle["index"] == 2 and verify_bundle(bundle, PUB)["schema"] == "semgov.decision/v3"


def test_hand_made_shadow_bundle_says_shadow(
    pristine: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bundle someone built around a shadow record verifies as included; verify-proof calls it SHADOW."""
    leaves = record_payloads(pristine)
    bundle = make_bundle(pristine, json.loads(leaves[2])["decision_id"])
    hashes = [leaf_hash(r) for r in leaves[: bundle["tree_size"]]]
    i = SHADOWS[1]
    bundle.update(
        record=leaves[i].decode(), index=i, inclusion_proof=[h.hex() for h in inclusion_proof(i, hashes)]
    )
    assert verify_bundle(bundle, PUB)["schema"] == SHADOW_DECISION_SCHEMA
    path = tmp_path / "shadow.json"
    path.write_text(json.dumps(bundle))
    assert main(["audit", "verify-proof", str(path), "--pubkey", PUB_PEM]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK: SHADOW decision ") and "never acted on" in out and "OK: decision" not in out
