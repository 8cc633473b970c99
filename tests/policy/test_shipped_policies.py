"""The shipped policies pass their own tests under every engine, and `semgov policy test` speaks
CI formats (issue 17). The Rego default's tests went stale once (spans gained `recompute`) without
anything failing: this is the test that would have caught it."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from semgov.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = [
    (ROOT / "policies" / "default", "auto"),
    (ROOT / "policies" / "rego" / "default", "regorus"),
    (ROOT / "policies" / "rego" / "default", "opa-inprocess"),
]


@pytest.mark.parametrize(("policy", "engine"), SHIPPED, ids=["yaml", "rego-regorus", "rego-opa"])
def test_shipped_policies_pass_their_own_tests(
    policy: Path, engine: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every test of each shipped policy passes, and the closing line says so."""
    assert main(["policy", "test", str(policy), "--engine", engine]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    n = int(last.split()[0])
    assert n > 20 and last == f"{n} tests, {n} passed, 0 warnings, 0 failures"


def test_policy_test_json_and_junit(capsys: pytest.CaptureFixture[str]) -> None:
    """--format json lists every test with its status; --format junit is XML with the same counts."""
    rego = str(ROOT / "policies" / "rego" / "default")
    assert main(["policy", "test", rego, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "semgov.policy_test_report/v1" and {t["status"] for t in doc["tests"]} == {"PASS"}
    assert main(["policy", "test", rego, "--format", "junit"]) == 0
    suite = ET.fromstring(capsys.readouterr().out).find("testsuite")
    assert suite is not None and suite.get("tests") == str(len(doc["tests"])) and suite.get("failures") == "0"


def test_policy_test_github_annotates_failures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A failing Rego test becomes one ::error annotation naming it; the exit status is 1."""
    import shutil

    d = tmp_path / "rego"
    shutil.copytree(ROOT / "policies" / "rego" / "default", d)
    text = (d / "policy_test.rego").read_text()
    (d / "policy_test.rego").write_text(text + "\ntest_fails_on_purpose if { 1 == 2 }\n")
    assert main(["policy", "test", str(d), "--format", "github"]) == 1
    out = capsys.readouterr().out
    errors = [x for x in out.splitlines() if x.startswith("::error ")]
    assert len(errors) == 1 and "test_fails_on_purpose" in errors[0]


def test_opa_inprocess_without_the_package_prints_the_install_hint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`policy test --engine opa-inprocess` without opa-golib-python-bindings: the pip line, exit 2."""
    import sys

    monkeypatch.setitem(sys.modules, "opa_bindings", None)  # an import of it now raises ImportError
    rego = str(ROOT / "policies" / "rego" / "default")
    assert main(["policy", "test", rego, "--engine", "opa-inprocess"]) == 2
    err = capsys.readouterr().err
    assert "pip install --no-deps --ignore-requires-python opa-golib-python-bindings==0.4.4" in err
    assert "Traceback" not in err


def test_policy_eval_decides_one_document_in_either_language(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`policy eval` decides the case file's base document: allow with the same spans in YAML and
    Rego; a document off the schema is bad input (exit 2) naming the field."""
    import yaml

    base = yaml.safe_load((ROOT / "policies" / "default" / "policy_test.yaml").read_text())["base"]
    doc = tmp_path / "input.json"
    doc.write_text(json.dumps(base))
    answers = []
    for policy in (ROOT / "policies" / "default", ROOT / "policies" / "rego" / "default"):
        assert main(["policy", "eval", str(policy), "--input", str(doc)]) == 0
        answers.append(json.loads(capsys.readouterr().out))
    assert [a["decision"] for a in answers] == ["allow", "allow"]
    assert answers[0]["approved_spans"] == answers[1]["approved_spans"] != []
    base["candidate"]["similarity"] = "0.9"
    doc.write_text(json.dumps(base))
    assert main(["policy", "eval", str(ROOT / "policies" / "default"), "--input", str(doc)]) == 2
    assert "candidate.similarity" in capsys.readouterr().err


def test_rego_coverage_names_the_lines_the_tests_never_reach(capsys: pytest.CaptureFixture[str]) -> None:
    """--coverage prints each policy module's covered lines; fewer tests (--run) cover fewer lines,
    and every line reported not reached is a line of the module."""
    rego = ROOT / "policies" / "rego" / "default"

    def covered(*extra: str) -> tuple[int, int, str]:
        assert main(["policy", "test", str(rego), "--coverage", *extra]) == 0
        out = capsys.readouterr().out.splitlines()
        (line,) = [x for x in out if x.startswith("coverage ")]
        got, total = line.split(": ")[1].split(" ")[0].split("/")
        missing = next((x for x in out if x.strip().startswith("not reached:")), "")
        return int(got), int(total), missing

    full, total, missing = covered()
    part, total2, _ = covered("--run", "similarity_")
    assert total == total2 and 0 < part < full <= total
    n_lines = len((rego / "policy.rego").read_text().splitlines())
    for piece in missing.split(":", 1)[1].split(","):
        assert all(1 <= int(x) <= n_lines for x in piece.strip().split("-"))


def test_yaml_coverage_counts_gate_outcomes(capsys: pytest.CaptureFixture[str]) -> None:
    """For case files --coverage counts, per gate, the cases that saw it pass, fail and error; the
    counts of each gate add up to the cases decided."""
    assert main(["policy", "test", str(ROOT / "policies" / "default"), "--coverage"]) == 0
    out = capsys.readouterr().out.splitlines()
    (head,) = [x for x in out if x.startswith("gate coverage (")]
    n = int(head.split("(")[1].split()[0])
    rows = {x.split()[0]: [int(v) for v in x.split()[1:4]] for x in out[out.index(head) + 1 :][:10]}
    assert set(rows) == {"tenant", "namespace", "provenance", "expiry", "policy_version", "pii", "task",
                         "response_contract", "similarity", "token_verification"}  # fmt: skip
    assert all(sum(v) == n for v in rows.values()) and all(v[1] > 0 for v in rows.values())
