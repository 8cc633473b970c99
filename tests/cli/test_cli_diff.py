"""``semgov diff`` end to end on the shipped example: counts held to an independent comparison."""

from __future__ import annotations

import gzip
import json
import re
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


_OUT: dict[tuple[str, ...], tuple[int, str]] = {}


def _diff(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``semgov diff ARGS`` once per module (exit status, stdout): each run decides every candidate twice."""
    if args not in _OUT:
        rc = main(["diff", *args])
        _OUT[args] = (rc, capsys.readouterr().out)
    return _OUT[args]


def _base(captured: Path, strict: Path) -> tuple[str, ...]:
    return (str(captured), "--policy", str(DEFAULT_POLICY_DIR), "--policy", str(strict), "--trust", TRUST)


def _summary(captured: Path, strict: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    rc, out = _diff(capsys, *_base(captured, strict), "--format", "json")
    assert rc == 1
    summary: dict[str, Any] = json.loads(out)["summary"]
    return summary


def test_sarif_is_valid_and_points_at_the_changed_policy_line_then_the_captured_line(
    captured: Path, strict: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On the shipped example, each SARIF result (valid SARIF 2.1.0) is located at the policy line the
    change edited for its gate, then at a captured line holding one of its example requests."""
    import jsonschema

    rc, out = _diff(capsys, *_base(captured, strict), "--format", "sarif")
    assert rc == 1
    doc = json.loads(out)
    jsonschema.validate(doc, json.loads((ASSETS / "sarif-schema-2.1.0.json").read_text()))
    run = doc["runs"][0]
    assert [r["id"] for r in run["tool"]["driver"]["rules"]] == [
        "semgov/diff/deny-to-allow",
        "semgov/diff/allow-to-deny",
        "semgov/diff/span-change",
        "semgov/diff/deny-reason-change",
        "semgov/malformed-request",
    ]
    new = (strict / "policy.yaml").read_text().splitlines()
    old = (DEFAULT_POLICY_DIR / "policy.yaml").read_text().splitlines()
    changed = {n + 1: line for n, line in enumerate(new) if line != old[n]}
    assert len(changed) == 2
    want = {"similarity": "min: 0.8", "token_verification": "allow_shifted: true"}
    cap = captured.read_text().splitlines()
    summary = _summary(captured, strict, capsys)
    flips = {"deny->allow": 0, "allow->deny": 0}
    for r in run["results"]:
        policy, first = (loc["physicalLocation"] for loc in r["locations"])
        p = r["properties"]
        assert policy["artifactLocation"]["uri"] == str(strict / "policy.yaml")
        assert want[p["gate"]] in changed[policy["region"]["startLine"]], r["message"]["text"]
        assert first["artifactLocation"]["uri"] == str(captured)
        example = json.loads(cap[first["region"]["startLine"] - 1])
        assert example["request_id"] == p["examples"][0]["request_id"]
        flips[p["direction"]] = flips.get(p["direction"], 0) + p["count"]
        assert r["level"] == ("warning" if p["direction"] == "reasons" else "error")
    assert flips["deny->allow"] == summary["deny->allow"] > 0
    assert flips["allow->deny"] == summary["allow->deny"] > 0
    assert flips["reasons"] == summary["reasons"]


_ANNOTATION = re.compile(r"^::(error|warning|notice) (file=[^,:]+,line=[1-9][0-9]*,)?title=[^:]*::.+$")


def test_github_annotations_group_changes_by_cause(
    captured: Path, strict: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--format github: one well-formed annotation per (policy line, gate, direction), at the policy
    file and line, counting its changes; deny-reason changes are warnings; the closing line last."""
    summary = _summary(captured, strict, capsys)
    rc, out = _diff(capsys, *_base(captured, strict), "--format", "github")
    lines = out.splitlines()
    assert rc == 1 and all(_ANNOTATION.match(x) for x in lines[:-1]), lines
    errors = [x for x in lines if x.startswith("::error ")]
    warnings = [x for x in lines if x.startswith("::warning ")]
    assert 2 <= len(errors) <= 10 and warnings
    assert all(x.startswith(f"::error file={strict}/policy.yaml,line=") for x in errors)
    count = re.compile(r"::(\d+) decision\(s\)")
    failing = summary["allow->deny"] + summary["deny->allow"] + summary["spans"]
    assert sum(int(count.search(x).group(1)) for x in errors) == failing  # type: ignore[union-attr]
    assert sum(int(count.search(x).group(1)) for x in warnings) == summary["reasons"]  # type: ignore[union-attr]
    n, reasons = summary["decisions_compared"], summary["reasons"]
    assert lines[-1] == f"{n} tests, {n - failing - reasons} passed, {reasons} warnings, {failing} failures"


def test_junit_has_one_testcase_per_decision_and_counts_that_agree(
    captured: Path, strict: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--format junit: tests = testcases = decisions compared; failures = flips and span changes
    (each a <failure>), skipped = deny-reason changes (each a <skipped>)."""
    import xml.etree.ElementTree as ET

    summary = _summary(captured, strict, capsys)
    rc, out = _diff(capsys, *_base(captured, strict), "--format", "junit")
    suite = ET.fromstring(out).find("testsuite")
    assert rc == 1 and suite is not None
    cases = suite.findall("testcase")
    failing = summary["allow->deny"] + summary["deny->allow"] + summary["spans"]
    assert int(suite.get("tests", "")) == len(cases) == summary["decisions_compared"]
    assert int(suite.get("failures", "")) == len(suite.findall("testcase/failure")) == failing
    assert int(suite.get("skipped", "")) == len(suite.findall("testcase/skipped")) == summary["reasons"]


def test_fail_on_picks_the_direction_that_fails(
    captured: Path, strict: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--fail-on allow-to-deny fails on lost reuse only: other flips become warnings; with a change
    that only loses reuse, --fail-on deny-to-allow exits 0 and reports the flips as warnings."""
    summary = _summary(captured, strict, capsys)
    rc, out = _diff(capsys, *_base(captured, strict), "--fail-on", "allow-to-deny", "--format", "github")
    n, a2d = summary["decisions_compared"], summary["allow->deny"]
    warned = n - a2d - (n - sum(summary[k] for k in ("allow->deny", "deny->allow", "spans", "reasons")))
    assert (
        rc == 1
        and out.splitlines()[-1] == f"{n} tests, {n - a2d - warned} passed, {warned} warnings, {a2d} failures"
    )
    assert all("deny->allow" not in x for x in out.splitlines() if x.startswith("::error"))
    rc, out = _diff(capsys, *_base(captured, strict), "--fail-on", "deny-to-allow", "--format", "github")
    assert rc == 1 and any(x.startswith("::warning") and "allow->deny" in x for x in out.splitlines())
    assert all("allow->deny" not in x for x in out.splitlines() if x.startswith("::error"))


def test_fail_on_deny_to_allow_passes_a_change_that_only_loses_reuse(
    captured: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A higher similarity bar only turns allows into denies: --fail-on deny-to-allow exits 0, the
    default (any) exits 1."""
    d = tmp_path / "bar"
    d.mkdir()
    (d / "policy.yaml").write_text(
        (DEFAULT_POLICY_DIR / "policy.yaml").read_text().replace("  min: 0.6", "  min: 0.8")
    )
    base = (str(captured), "--policy", str(DEFAULT_POLICY_DIR), "--policy", str(d), "--trust", TRUST)
    rc, out = _diff(capsys, *base, "--fail-on", "deny-to-allow", "--format", "github")
    assert rc == 0 and out.splitlines()[-1].endswith(" 0 failures") and "::warning" in out
    assert main(["diff", *base]) == 1


def test_capture_directory_results_name_the_file_and_its_own_line(
    captured: Path, strict: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In a capture directory, each example is located at the file of the directory that holds it
    and its line in that file."""
    lines = captured.read_text().splitlines(keepends=True)
    d = tmp_path / "cap"
    d.mkdir()
    for i in range(0, len(lines), 60):
        (d / f"capture-{i:06d}.jsonl").write_text("".join(lines[i : i + 60]))
    args = (str(d), *_base(captured, strict)[1:], "--format", "sarif")
    rc, out = _diff(capsys, *args)
    assert rc == 1
    for r in json.loads(out)["runs"][0]["results"]:
        for loc in r["relatedLocations"]:
            where = loc["physicalLocation"]
            file = Path(where["artifactLocation"]["uri"])
            assert file.parent == d
            row = json.loads(file.read_text().splitlines()[where["region"]["startLine"] - 1])
            assert row["request_id"] in loc["message"]["text"]


def test_a_rego_change_is_located_at_the_setting_it_changed(
    captured: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rego: a flip caused by a changed constant is located at that constant's line in policy B."""
    rego = ROOT / "policies" / "rego" / "default"
    d = tmp_path / "rego"
    d.mkdir()
    text = (rego / "policy.rego").read_text()
    assert text.count("similarity_min := 0.6\n") == 1
    (d / "policy.rego").write_text(text.replace("similarity_min := 0.6\n", "similarity_min := 0.8\n"))
    line = text.splitlines().index("similarity_min := 0.6") + 1
    small = tmp_path / "small.jsonl"
    small.write_text("".join(captured.read_text().splitlines(keepends=True)[:60]))
    assert (
        main(
            [
                "diff",
                str(small),
                "--policy",
                str(rego),
                "--policy",
                str(d),
                "--trust",
                TRUST,
                "--format",
                "sarif",
            ]
        )
        == 1
    )
    results = json.loads(capsys.readouterr().out)["runs"][0]["results"]
    assert results and all(r["properties"]["gate"] == "similarity" for r in results)
    for r in results:
        where = r["locations"][0]["physicalLocation"]
        assert where["artifactLocation"]["uri"] == str(d / "policy.rego")
        assert where["region"]["startLine"] == line and "similarity_min := 0.8" in r["message"]["text"]
