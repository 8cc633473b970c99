"""`semgov policy test --explain` (why a test failed) and the gate table of `--coverage` (issue 17)."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from semgov.cli.main import main
from semgov.policy.explain import GATE_FACTS

ROOT = Path(__file__).resolve().parents[2]
YAML_POLICY = ROOT / "policies" / "default"
REGO_POLICY = ROOT / "policies" / "rego" / "default"


def _line_of(path: Path, text: str) -> int:
    """1-based line of the first line of ``path`` that starts with ``text`` (after indentation)."""
    return next(i for i, x in enumerate(path.read_text().splitlines(), 1) if x.strip().startswith(text))


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


@pytest.fixture
def yaml_dir(tmp_path: Path) -> Path:
    d = tmp_path / "yaml"
    shutil.copytree(YAML_POLICY, d)
    return d


@pytest.fixture
def rego_dir(tmp_path: Path) -> Path:
    d = tmp_path / "rego"
    shutil.copytree(REGO_POLICY, d)
    shutil.copy(YAML_POLICY / "policy_test.yaml", d / "policy_test.yaml")
    return d


def _explained(capsys: pytest.CaptureFixture[str], name: str) -> list[str]:
    """The explanation lines printed under the FAIL line of test ``name``."""
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("FAIL ") and name in x)
    out = []
    for x in lines[start + 1 :]:
        if not x.startswith("    "):
            break
        out.append(x.strip())
    return out


def test_yaml_case_names_gate_facts_and_the_setting_line(
    yaml_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A case denied by a raised similarity bar is explained by the deny set, the similarity the
    input carried, and the line of `similarity.min` in policy.yaml."""
    _edit(yaml_dir / "policy.yaml", "  min: 0.6", "  min: 0.95")
    assert main(["policy", "test", str(yaml_dir), "--explain", "--run", "exact repeat"]) == 1
    why = _explained(capsys, "exact repeat is allowed")
    line = _line_of(yaml_dir / "policy.yaml", "min: 0.95")
    assert why[0] == "deny set: similarity fail"
    assert why[1].startswith("similarity fail: similarity 0.9 < 0.95")
    assert why[2] == "facts: candidate.similarity=0.9"
    assert why[3] == f"rule: {yaml_dir / 'policy.yaml'}:{line} (similarity.min)"
    assert len(why) == 4  # gates that passed as the case expected are not listed


def test_yaml_case_names_the_sharing_rule_that_let_a_donor_through(
    yaml_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unexpected allow across namespaces points at the `namespace.sharing[i]` entry that allowed it."""
    _edit(
        yaml_dir / "policy.yaml",
        "  sharing: []",
        "  sharing:\n    - {donor: 'research/entity-043', recipients: ['research/*']}",
    )
    assert main(["policy", "test", str(yaml_dir), "--explain", "--run", "another namespace"]) == 1
    why = _explained(capsys, "another namespace")
    line = _line_of(yaml_dir / "policy.yaml", "- {donor: 'research/entity-043'")
    assert "deny set: (empty: every gate passed)" in why
    assert any(x.startswith("namespace pass: shared by namespace.sharing[0]") for x in why)
    assert f"rule: {yaml_dir / 'policy.yaml'}:{line} (namespace.sharing[0])" in why
    assert any(
        x.startswith('facts: request.namespace="research/entity-042", facts.donor.namespace=') for x in why
    )


def test_rego_case_names_the_deny_rule_that_fired_and_its_setting(
    rego_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under Rego the explanation names the `deny` rule that produced the entry and the constant
    setting it reads, each by file and line."""
    _edit(rego_dir / "policy.rego", "similarity_min := 0.6", "similarity_min := 0.95")
    assert main(["policy", "test", str(rego_dir), "--explain", "--run", "exact repeat"]) == 1
    why = _explained(capsys, "exact repeat is allowed")
    rego = rego_dir / "policy.rego"
    deny_line = _line_of(rego, 'deny contains {"gate": "similarity"')
    assert f"rule: {rego}:{deny_line}" in why
    assert f"setting: similarity_min := 0.95 ({rego}:{_line_of(rego, 'similarity_min :=')})" in why


def test_rego_unexpected_allow_names_the_gates_rules_and_settings(
    rego_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """When no deny rule fired, the explanation lists the rules that could have and the settings
    they read (here the flipped `allow_public_donors`)."""
    _edit(rego_dir / "policy.rego", "allow_public_donors := false", "allow_public_donors := true")
    assert (
        main(["policy", "test", str(rego_dir), "--explain", "--run", "public donor of another tenant"]) == 1
    )
    why = _explained(capsys, "public donor of another tenant is denied")
    rego = rego_dir / "policy.rego"
    assert "deny set: (empty: every gate passed)" in why
    assert 'facts: request.tenant="acme", facts.donor.tenant="globex", facts.donor.visibility="public"' in why
    tenant_rule = _line_of(rego, 'deny contains {"gate": "tenant"')
    assert f"rule: no deny rule fired for this gate (deny rules for tenant: {rego}:{tenant_rule})" in why
    assert f"setting: allow_public_donors := true ({rego}:{_line_of(rego, 'allow_public_donors :=')})" in why


def test_rego_test_rule_names_the_first_statement_that_fails_and_its_values(
    rego_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failing `test_*` rule is explained by its first statement that does not hold, with the
    local values it read (not "undefined")."""
    _edit(rego_dir / "policy_test.rego", "\tcount(ds) == 2\n", "\tcount(ds) == 3\n")
    assert (
        main(["policy", "test", str(rego_dir), "--explain", "--run", "test_deny_entries_are_gate_and_detail"])
        == 1
    )
    why = _explained(capsys, "test_deny_entries_are_gate_and_detail")
    test = rego_dir / "policy_test.rego"
    assert why[0] == f"{test}:{_line_of(test, 'count(ds) == 3')}: `count(ds) == 3` is false or undefined"
    ds = json.loads(why[1].removeprefix("ds = "))
    assert sorted(d["gate"] for d in ds) == ["namespace", "tenant"]


def test_rego_test_rule_with_input_shows_the_deny_set_under_that_input(
    rego_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """When the failing statement is evaluated `with input as ...`, the explanation gives the
    package's deny set under the same input."""
    _edit(rego_dir / "policy.rego", "similarity_min := 0.6", "similarity_min := 0.95")
    assert main(["policy", "test", str(rego_dir), "--explain", "--run", "test_base_allows$"]) == 1
    why = _explained(capsys, "test_base_allows")
    assert why[0].endswith("`count(ds) == 0` is false or undefined")
    assert why[1].startswith("ds = ") and "similarity 0.9 < 0.95" in why[1]
    _edit(
        rego_dir / "policy_test.rego", "\tds := reuse.deny with input as base_input\n\tcount(ds) == 0\n", ""
    )
    assert main(["policy", "test", str(rego_dir), "--explain", "--run", "test_base_allows$"]) == 1
    why = _explained(capsys, "test_base_allows")
    assert why[0].endswith("`reuse.allow with input as base_input` is false or undefined")
    assert why[1].startswith("deny set (with input as base_input) = ") and "similarity 0.9 < 0.95" in why[1]


def test_explanations_only_on_request_and_in_every_format(
    yaml_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --explain nothing is explained; with it, json carries `explanation` and junit the
    failure's body."""
    _edit(yaml_dir / "policy.yaml", "  min: 0.6", "  min: 0.95")
    args = ["policy", "test", str(yaml_dir), "--run", "exact repeat"]
    assert main(args) == 1
    assert "deny set" not in capsys.readouterr().out
    assert main([*args, "--explain", "--format", "json"]) == 1
    [test] = [t for t in json.loads(capsys.readouterr().out)["tests"] if t["status"] == "FAIL"]
    assert test["explanation"][0] == "deny set: similarity fail"
    assert main([*args, "--explain", "--format", "junit"]) == 1
    failure = ET.fromstring(capsys.readouterr().out).find(".//failure")
    assert failure is not None and (failure.text or "").startswith("deny set: similarity fail")


def test_gate_facts_name_fields_of_the_policy_input_schema() -> None:
    """Every input path the explanation shows for a gate is a property of the policy input schema."""
    schema = json.loads((ROOT / "schemas" / "policy_input.schema.json").read_text())
    defs = schema.get("$defs", {})

    def has(node: dict[str, object], parts: list[str]) -> bool:
        while "$ref" in node or "anyOf" in node:
            if "$ref" in node:
                node = defs[str(node["$ref"]).split("/")[-1]]
            else:
                node = next(x for x in node["anyOf"] if isinstance(x, dict) and x.get("type") != "null")  # type: ignore[attr-defined]
        if not parts:
            return True
        props = node.get("properties", {})
        assert isinstance(props, dict)
        return parts[0] in props and has(props[parts[0]], parts[1:])

    for gate, paths in GATE_FACTS.items():
        for path in paths:
            assert has(schema, path.split(".")), f"{gate}: {path}"


def test_gate_coverage_names_a_gate_no_case_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A case file without any tenant denial leaves the tenant gate flagged as never failing;
    a Rego policy without case files says no case decided a gate."""
    d = tmp_path / "p"
    d.mkdir()
    shutil.copy(YAML_POLICY / "policy.yaml", d / "policy.yaml")
    text = (YAML_POLICY / "policy_test.yaml").read_text()
    head = text.split("\ncases:\n", 1)[0]
    cases = """
  - {name: the base is allowed, expect: allow}
  - {name: low similarity is denied, patch: {candidate: {similarity: 0.1}}, expect: deny}
"""
    (d / "policy_test.yaml").write_text(head + "\ncases:\n" + cases)
    assert main(["policy", "test", str(d), "--coverage"]) == 0
    out = capsys.readouterr().out.splitlines()
    (tenant,) = [x for x in out if x.strip().startswith("tenant ")]
    assert tenant.split()[2] == "0" and tenant.endswith("<- no case fails this gate")
    (sim,) = [x for x in out if x.strip().startswith("similarity ")]
    assert sim.split()[1:4] == ["1", "1", "0"] and not sim.endswith("<- no case fails this gate")
    assert main(["policy", "test", str(REGO_POLICY), "--coverage"]) == 0
    assert "gate coverage: no *_test.yaml case decided" in capsys.readouterr().out


def test_an_engine_error_is_explained_by_the_facts_of_every_gate(
    rego_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A case whose engine answer is malformed (a deny entry naming no gate) is an ERROR whose
    explanation still shows the facts each gate would have read."""
    _edit(
        rego_dir / "policy.rego", 'deny contains {"gate": "similarity"', 'deny contains {"gate": "simularity"'
    )
    assert main(["policy", "test", str(rego_dir), "--explain", "--run", "similarity just below"]) == 1
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, x in enumerate(lines) if x.startswith("ERROR ") and "similarity" in x)
    assert "names no known gate" in lines[start]
    assert lines[start + 1].strip() == "the engine decided nothing (see the error); facts of every gate:"
    assert any(
        x.strip().startswith("similarity: candidate.similarity=") for x in lines[start + 2 : start + 12]
    )
