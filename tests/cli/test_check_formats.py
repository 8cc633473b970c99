"""`semgov check` for CI (issue 17): json, junit, sarif and github formats, the closing
`N tests, N passed, N warnings, N failures` line, and a non-zero exit when decisions were made by
errors alone (the policy engine failed), on the committed fixtures and a broken Rego policy."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from semgov.cli.main import main
from tests.cli.test_cli import BASE, _good_only
from tests.conftest import DEFAULT_POLICY_DIR

REGO = Path(__file__).resolve().parents[2] / "policies" / "rego" / "default"


def lying_rego(tmp_path: Path) -> Path:
    """The default Rego policy with every gate passing and a span no token verification found:
    the evaluator's checks turn each such answer into a deny decided by an error alone."""
    d = tmp_path / "lying"
    shutil.copytree(REGO, d)
    (d / "policy_test.rego").unlink()
    text = (d / "policy.rego").read_text()
    text = text.replace("allow if count(deny) == 0", "allow if true")
    text = text.replace(
        "approved_spans := [out |",
        'approved_spans := [{"recipient_start": 0, "donor_start": 0, "length": 99999, "kind": "prefix", '
        '"recompute": 0}]\n\n_unused_spans := [out |',
    )
    text = text.replace("deny contains", "_never contains") + "\ndeny := set()\n"
    (d / "policy.rego").write_text(text)
    return d


def check(tmp_path: Path, *extra: str, policy: Path | None = None) -> list[str]:
    args = ["check", str(_good_only(tmp_path)), *BASE, *extra]
    if policy is not None:
        args[args.index(str(DEFAULT_POLICY_DIR))] = str(policy)
    return args


def test_table_ends_with_the_closing_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The table's last line counts tests, passes, warnings and failures."""
    assert main(check(tmp_path, "--expect")) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "3 tests, 3 passed, 0 warnings, 0 failures"


def test_decisions_made_by_errors_alone_fail_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An engine whose every answer is invalid: every decision is a deny by an error alone, each is
    listed, the exit status is 1; --max-errors tolerates them."""
    policy = lying_rego(tmp_path)
    assert main(check(tmp_path, policy=policy)) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == "3 tests, 0 passed, 0 warnings, 3 failures"
    assert err.count("ERROR request") == 3 and "made by errors alone" in err
    assert main(check(tmp_path, "--max-errors", "3", policy=policy)) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "3 tests, 3 passed, 0 warnings, 0 failures"


def test_json_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--format json: one document with the summary, per-gate counts and every finding."""
    assert main(check(tmp_path, "--format", "json", policy=lying_rego(tmp_path))) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "semgov.check_report/v1"
    assert doc["summary"] | {"tests": 3, "failures": 3, "errors": 3, "passed": 0} == doc["summary"]
    assert {f["rule"] for f in doc["findings"]} == {"semgov/error-decision"}
    assert doc["gates"]["token_verification"]["error"] == 3 and doc["policy"]["engine"] == "regorus"


def test_junit_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--format junit: valid XML whose suite counts the tests and errors, one testcase per finding."""
    main(check(tmp_path, "--format", "junit", policy=lying_rego(tmp_path)))
    root = ET.fromstring(capsys.readouterr().out)
    suite = root.find("testsuite")
    assert suite is not None and suite.get("tests") == "3" and suite.get("errors") == "3"
    assert len(suite.findall("testcase/error")) == 3 and len(suite.findall("testcase")) == 3


def test_junit_counts_agree_with_the_decisions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--format junit --expect: one testcase per decision, a mismatch a <failure>, a decision without an
    expectation a <skipped>, and the suite's counts are those of its elements and the closing line's."""
    rows = [json.loads(x) for x in _good_only(tmp_path).read_text().splitlines()]
    donor = next(iter(rows[0]["expect"]))
    rows[0]["expect"][donor] = "allow" if rows[0]["expect"][donor] == "deny" else "deny"
    rows[1]["expect"] = {}
    p = tmp_path / "mixed.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["check", str(p), *BASE, "--expect", "--format", "junit"]) == 1
    suite = ET.fromstring(capsys.readouterr().out).find("testsuite")
    assert suite is not None
    cases, skipped = suite.findall("testcase"), suite.findall("testcase/skipped")
    assert int(suite.get("tests", "")) == len(cases) == sum(len(r["candidates"]) for r in rows)
    assert suite.get("failures") == "1" == str(len(suite.findall("testcase/failure")))
    assert suite.get("skipped") == str(len(skipped)) and len(skipped) >= 1
    closing = suite.findtext("system-out") or ""
    assert (
        closing
        == f"{len(cases)} tests, {len(cases) - 1 - len(skipped)} passed, {len(skipped)} warnings, 1 failures"
    )


def test_sarif_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--format sarif: valid SARIF 2.1.0 with check's own rules, one error result per finding at the file."""
    import jsonschema

    from tests.conftest import ASSETS

    main(check(tmp_path, "--format", "sarif", policy=lying_rego(tmp_path)))
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, json.loads((ASSETS / "sarif-schema-2.1.0.json").read_text()))
    run = doc["runs"][0]
    assert doc["version"] == "2.1.0" and run["tool"]["driver"]["name"] == "semgov"
    rules = {r["id"] for r in run["tool"]["driver"]["rules"]}
    assert rules == {"semgov/decision-mismatch", "semgov/error-decision", "semgov/malformed-request"}
    assert len(run["results"]) == 3 and {r["ruleId"] for r in run["results"]} <= rules
    assert run["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith(
        "good.jsonl"
    )


def test_github_annotations(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--format github: one ::error workflow command per finding (message escaped), a ::notice summary."""
    main(check(tmp_path, "--format", "github", policy=lying_rego(tmp_path)))
    lines = capsys.readouterr().out.splitlines()
    errors = [x for x in lines if x.startswith("::error file=")]
    assert len(errors) == 3 and all("\n" not in x for x in errors)
    assert lines[-2].startswith("::notice title=semgov check::3 tests, 0 passed")


def test_malformed_lines_are_failures_with_their_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A malformed request is a failure in every format, located at its line; the exit status is 2."""
    from tests.cli.test_cli import SMALL

    assert main(["check", str(SMALL), *BASE, "--format", "github"]) == 2
    out = capsys.readouterr().out
    assert ",line=2," in out and "::error" in out


def test_a_negative_max_errors_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--max-errors below 0 is bad input (exit 2, named)."""
    assert main(check(tmp_path, "--max-errors", "-1")) == 2
    assert "--max-errors" in capsys.readouterr().err


def test_policy_check_catches_an_unconditional_allow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`policy check` asks the engine one probe per gate: a policy that allows them all is a problem
    (exit 1) and each gate that let its probe through is a warning; the shipped policies are clean."""
    assert main(["policy", "check", str(lying_rego(tmp_path))]) == 1
    out = capsys.readouterr().out
    assert "`allow` is unconditional" in out and out.count("warning: gate ") == 9
    for shipped in (DEFAULT_POLICY_DIR, REGO):
        assert main(["policy", "check", str(shipped)]) == 0
        assert "0 problem(s), 0 warning(s)" in capsys.readouterr().out


def test_policy_check_warns_about_one_gate_that_lets_its_probe_through(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A YAML policy with a similarity bar of 0 passes a similarity-0 candidate: a warning naming the gate."""
    d = tmp_path / "p"
    d.mkdir()
    (d / "policy.yaml").write_text(
        (DEFAULT_POLICY_DIR / "policy.yaml").read_text().replace("min: 0.6", "min: 0.0")
    )
    assert main(["policy", "check", str(d)]) == 0
    out = capsys.readouterr().out
    assert "warning: gate similarity allows a candidate of similarity 0" in out, out
