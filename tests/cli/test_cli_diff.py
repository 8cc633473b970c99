"""``semgov diff`` end to end on the shipped example: counts held to an independent comparison."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from semgov.cli.main import main
from tests.conftest import ASSETS, DEFAULT_POLICY_DIR, ROOT

EXAMPLE = ROOT / "examples" / "captured.jsonl.gz"
TRUST = str(ROOT / "examples" / "keyring.json")
KEY = str(ROOT / "examples" / "keys" / "decision-signing-key.pem")


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 150 requests of the shipped example workload."""
    with gzip.open(EXAMPLE, "rt") as f:
        lines = [next(f) for _ in range(150)]
    p = tmp_path_factory.mktemp("diff") / "captured.jsonl"
    p.write_text("".join(lines))
    return p


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default policy with shifted spans on (deny->allow) and a higher similarity bar (allow->deny)."""
    d = tmp_path_factory.mktemp("strict")
    text = (DEFAULT_POLICY_DIR / "policy.yaml").read_text()
    assert text.count("  allow_shifted: false") == 1  # NOTE: quality's; token_verification's is the ceiling
    text = text.replace("  allow_shifted: false", "  allow_shifted: true").replace("  min: 0.6", "  min: 0.8")
    (d / "policy.yaml").write_text(text)
    return d


def _decisions(
    captured: Path, policy: Path, tmp: Path, capsys: pytest.CaptureFixture[str]
) -> dict[tuple[str, str], dict[str, Any]]:
    out = tmp / f"{policy.name}.jsonl"
    main(
        [
            "check",
            str(captured),
            "--policy",
            str(policy),
            "--trust",
            TRUST,
            "--signing-key",
            KEY,
            "--out",
            str(out),
        ]
    )
    capsys.readouterr()
    return {(r["request_id"], r["donor_id"]): r for r in map(json.loads, out.read_text().splitlines())}


def test_same_policy_twice_changes_nothing_and_exits_zero(
    captured: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Diffing a policy against itself reports 0 flips and exits 0."""
    rc = main(
        [
            "diff",
            str(captured),
            "--policy",
            str(DEFAULT_POLICY_DIR),
            "--policy",
            str(DEFAULT_POLICY_DIR),
            "--trust",
            TRUST,
        ]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "flipped 0 decision(s)" in out and "approved spans changed (both allow) 0" in out


def test_diff_json_equals_an_independent_comparison_of_two_checks(
    captured: Path, strict: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each flip and span change diff reports is what comparing two `semgov check` runs finds; exit 1."""
    a = _decisions(captured, DEFAULT_POLICY_DIR, tmp_path, capsys)
    b = _decisions(captured, strict, tmp_path, capsys)
    assert a.keys() == b.keys()
    want = {
        k: ("allow->deny" if a[k]["decision"] == "allow" else "deny->allow")
        if a[k]["decision"] != b[k]["decision"]
        else "spans"
        for k in a
        if a[k]["decision"] != b[k]["decision"]
        or (a[k]["decision"] == "allow" and a[k]["approved_spans"] != b[k]["approved_spans"])
    }
    assert want, "the stricter policy must change something on this traffic"
    rc = main(
        [
            "diff",
            str(captured),
            "--policy",
            str(DEFAULT_POLICY_DIR),
            "--policy",
            str(strict),
            "--trust",
            TRUST,
            "--format",
            "json",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1
    got = {(c["request_id"], c["donor_id"]): c["kind"] for c in doc["changes"] if c["kind"] != "reasons"}
    assert got == want
    s = doc["summary"]
    assert s["decisions_compared"] == len(a) and s["flipped"] == sum(v != "spans" for v in want.values())
    assert s["allow"] == {
        "a": sum(r["decision"] == "allow" for r in a.values()),
        "b": sum(r["decision"] == "allow" for r in b.values()),
    }
    tokens_a = sum(a[k]["approved_tokens"] for k in want)
    assert sum(r["approved_tokens"]["a"] for r in doc["by"]["tenant"].values()) == tokens_a
    assert doc["policies"]["b"]["path"] == str(strict) and doc["schema"] == "semgov.policy_diff/v1"


def test_diff_of_a_capture_directory_equals_the_file(
    captured: Path, strict: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same requests split over a capture directory's files give the same diff as the one file."""
    lines = captured.read_text().splitlines(keepends=True)
    d = tmp_path / "cap"
    d.mkdir()
    for i in range(0, len(lines), 60):
        (d / f"capture-{i:06d}.jsonl").write_text("".join(lines[i : i + 60]))
    docs = []
    for src in (captured, d):
        args = ["diff", str(src), "--policy", str(DEFAULT_POLICY_DIR), "--policy", str(strict)]
        assert main([*args, "--trust", TRUST, "--format", "json"]) == 1
        docs.append(json.loads(capsys.readouterr().out))
    assert docs[0]["summary"] == docs[1]["summary"] and docs[0]["changes"] == docs[1]["changes"]
    assert docs[1]["captured"] == str(d) and docs[1]["summary"]["requests"] == len(lines)


def test_table_and_jsonl_agree_with_json(
    captured: Path, strict: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The table's summary line and the jsonl lines carry the same counts as the json document."""
    args = [
        "diff",
        str(captured),
        "--policy",
        str(DEFAULT_POLICY_DIR),
        "--policy",
        str(strict),
        "--trust",
        TRUST,
    ]
    main([*args, "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    s = doc["summary"]
    assert main([*args, "--show", "3"]) == 1
    table = capsys.readouterr().out
    assert (
        f"flipped {s['flipped']} decision(s): allow->deny {s['allow->deny']}, deny->allow {s['deny->allow']}"
        in table
    )
    assert "by gate (every gate whose result changed):" in table and "by tenant:" in table
    assert main([*args, "--format", "jsonl"]) == 1
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert lines == doc["changes"]


def test_bad_usage_and_malformed_lines_exit_two(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One --policy is a usage error naming the fix; a malformed line is counted, skipped, exit 2."""
    small = ASSETS / "captured-small.jsonl"
    assert (
        main(
            ["diff", str(small), "--policy", str(DEFAULT_POLICY_DIR), "--trust", str(ASSETS / "keyring.json")]
        )
        == 2
    )
    assert "give --policy exactly twice" in capsys.readouterr().err
    twice = ["--policy", str(DEFAULT_POLICY_DIR)] * 2
    assert main(["diff", str(small), *twice, "--trust", str(ASSETS / "keyring.json")]) == 2
    out, err = capsys.readouterr()
    assert f"{small}:2: skipped malformed request" in err and "requests 3 (1 malformed)" in out


def test_ci_formats_report_each_flip_and_agree_with_json(
    captured: Path, strict: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """junit, sarif and github list one failure per flip or span change (deny-reason changes are
    warnings), with the same counts as --format json; the table ends with the closing line."""
    base = [
        "diff",
        str(captured),
        "--policy",
        str(DEFAULT_POLICY_DIR),
        "--policy",
        str(strict),
        "--trust",
        TRUST,
    ]
    assert main([*base, "--format", "json"]) == 1
    summary = json.loads(capsys.readouterr().out)["summary"]
    failing = summary["allow->deny"] + summary["deny->allow"] + summary["spans"]
    assert failing > 0 and summary["allow->deny"] > 0
    n, reasons = summary["decisions_compared"], summary["reasons"]
    closing = f"{n} tests, {n - failing - reasons} passed, {reasons} warnings, {failing} failures"
    assert main(base) == 1
    assert capsys.readouterr().out.splitlines()[-1] == closing
    assert main([*base, "--format", "github"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len([x for x in out if x.startswith("::error ")]) == failing and out[-1] == closing
    assert main([*base, "--format", "sarif"]) == 1
    sarif = json.loads(capsys.readouterr().out)
    rules = {r["ruleId"] for r in sarif["runs"][0]["results"]}
    assert len(sarif["runs"][0]["results"]) == failing and rules <= {
        "semgov/decision-flip",
        "semgov/span-change",
    }
    assert main([*base, "--format", "junit"]) == 1
    import xml.etree.ElementTree as ET

    suite = ET.fromstring(capsys.readouterr().out).find("testsuite")
    assert suite is not None and suite.get("failures") == str(failing)
    assert suite.get("tests") == str(summary["decisions_compared"]) and suite.get("skipped") == str(
        summary["reasons"]
    )
