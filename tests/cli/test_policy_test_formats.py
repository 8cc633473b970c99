"""`semgov policy test --format sarif|github`: outputs parsed and checked against their specifications."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import jsonschema
import pytest

from semgov.cli.main import main
from semgov.cli.policy_report import split_location
from tests.conftest import DEFAULT_POLICY_DIR, ROOT

SARIF_SCHEMA = json.loads((ROOT / "tests" / "assets" / "sarif-schema-2.1.0.json").read_text())
# A workflow command: ::error file=F,line=N,title=T::message (F and T escaped, no raw `,` or `:`).
ANNOTATION = re.compile(
    r"::error file=(?P<file>[^,:]+),line=(?P<line>[0-9]+),title=(?P<title>[^,:]*)::(?P<msg>.+)"
)


def _line_of(path: Path, text: str) -> int:
    """1-based line of the first line of ``path`` whose stripped text starts with ``text``."""
    return next(i for i, x in enumerate(path.read_text().splitlines(), 1) if x.strip().startswith(text))


@pytest.fixture
def failing_yaml(tmp_path: Path) -> Path:
    """The default YAML policy with one case whose expectation is wrong."""
    d = tmp_path / "yaml"
    shutil.copytree(DEFAULT_POLICY_DIR, d)
    case = d / "policy_test.yaml"
    patch = "    patch: {facts: {donor: {tenant: globex}}}\n"
    case.write_text(case.read_text().replace(f"{patch}    expect: deny", f"{patch}    expect: allow", 1))
    return d


@pytest.fixture
def failing_rego(tmp_path: Path) -> Path:
    """The default Rego policy with one Rego test rule that is false."""
    d = tmp_path / "rego"
    shutil.copytree(ROOT / "policies" / "rego" / "default", d)
    text = (d / "policy_test.rego").read_text()
    (d / "policy_test.rego").write_text(text + "\ntest_fails_on_purpose if { 1 == 2 }\n")
    return d


def test_sarif_is_valid_and_locates_a_failed_case(
    failing_yaml: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--format sarif validates against the SARIF 2.1.0 schema; a failed case is a result at its file:line."""
    assert main(["policy", "test", str(failing_yaml), "--format", "sarif"]) == 1
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, SARIF_SCHEMA)
    [result] = doc["runs"][0]["results"]
    loc = result["locations"][0]["physicalLocation"]
    case_file = failing_yaml / "policy_test.yaml"
    assert loc["artifactLocation"]["uri"] == str(case_file)
    assert loc["region"]["startLine"] == _line_of(case_file, "- name: donor of another tenant is denied")
    assert result["ruleId"] == "semgov/policy-test-failed"
    assert "expected allow, got deny" in result["message"]["text"]


def test_sarif_of_a_passing_run_is_valid_and_empty(capsys: pytest.CaptureFixture[str]) -> None:
    """A run where every test passes is a valid SARIF log with no results; exit 0."""
    assert main(["policy", "test", str(DEFAULT_POLICY_DIR), "--format", "sarif"]) == 0
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, SARIF_SCHEMA)
    assert doc["runs"][0]["results"] == [] and doc["runs"][0]["properties"]["summary"].endswith("0 failures")


def test_github_annotations_carry_file_and_line(
    failing_yaml: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each failed case is `::error file=F,line=N,title=...::message`, F:N the case's line."""
    assert main(["policy", "test", str(failing_yaml), "--format", "github"]) == 1
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("::error")]
    assert len(lines) == 1
    m = ANNOTATION.fullmatch(lines[0])
    assert m is not None, lines[0]
    case_file = failing_yaml / "policy_test.yaml"
    assert m["file"] == str(case_file)
    assert int(m["line"]) == _line_of(case_file, "- name: donor of another tenant is denied")
    assert m["msg"].startswith("expected allow, got deny")


@pytest.mark.parametrize("fmt", ["github", "sarif", "json"])
def test_rego_test_location_has_its_line(
    failing_rego: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failed Rego test rule is located at the line of its definition in every format."""
    assert main(["policy", "test", str(failing_rego), "--format", fmt]) == 1
    out = capsys.readouterr().out
    test_file = failing_rego / "policy_test.rego"
    want = (str(test_file), _line_of(test_file, "test_fails_on_purpose"))
    if fmt == "github":
        [line] = [x for x in out.splitlines() if x.startswith("::error")]
        m = ANNOTATION.fullmatch(line)
        assert m is not None and (m["file"], int(m["line"])) == want
    elif fmt == "sarif":
        doc = json.loads(out)
        jsonschema.validate(doc, SARIF_SCHEMA)
        [r] = doc["runs"][0]["results"]
        loc = r["locations"][0]["physicalLocation"]
        assert (loc["artifactLocation"]["uri"], loc["region"]["startLine"]) == want
    else:
        [t] = [t for t in json.loads(out)["tests"] if t["status"] == "FAIL"]
        assert split_location(t["location"]) == want


def test_split_location() -> None:
    """`file:line` splits into the file and the line; a location without a line keeps it whole."""
    assert split_location("a/b_test.yaml:12") == ("a/b_test.yaml", 12)
    assert split_location("a/b_test.rego") == ("a/b_test.rego", None)
    assert split_location("C:/x/y:3") == ("C:/x/y", 3)


@pytest.mark.parametrize("fmt", ["github", "sarif"])
def test_malformed_case_files_are_reported_in_the_ci_format(
    tmp_path: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each case-file problem is an error at its file:line in SARIF and GitHub annotations; exit 2."""
    d = tmp_path / "yaml"
    shutil.copytree(DEFAULT_POLICY_DIR, d)
    case = d / "policy_test.yaml"
    text = case.read_text()
    case.write_text(text[: text.index("\ncases:\n")] + "\ncases:\n  - name: a\n    expect: maybe\n"
                    "  - name: b\n    expect: deny\n    gates: {tenancy: fail}\n")  # fmt: skip
    want = [_line_of(case, "expect: maybe"), _line_of(case, "gates: {tenancy")]
    assert main(["policy", "test", str(d), "--format", fmt]) == 2
    out = capsys.readouterr().out
    if fmt == "github":
        found = [ANNOTATION.fullmatch(x) for x in out.splitlines() if x.startswith("::error")]
        assert [(m["file"], int(m["line"])) for m in found if m] == [(str(case), n) for n in want]
        assert "unknown gate (did you mean 'tenant'?)" in out
    else:
        doc = json.loads(out)
        jsonschema.validate(doc, SARIF_SCHEMA)
        locs = [r["locations"][0]["physicalLocation"] for r in doc["runs"][0]["results"]]
        assert [(x["artifactLocation"]["uri"], x["region"]["startLine"]) for x in locs] == [
            (str(case), n) for n in want
        ]
