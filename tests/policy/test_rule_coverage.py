"""`semgov policy test --coverage` per rule (sharing rules, scopes, groups, PII entities, quality
rules) and `--threshold` (issue 35, item 2)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from semgov.cli.main import main
from semgov.policy.coverage import case_coverage
from semgov.policy.source import load_policy_source, make_engine
from semgov.policy.testing import run_case_file
from tests.conftest import DEFAULT_POLICY_DIR, ROOT

RULES = {
    "  allow_public_donors: false\n": "  allow_public_donors: false\n  public_donors_for:\n"
    "    - {tenant: acme, namespace: research/*}\n    - {tenant: initech}\n",
    "  sharing: []\n": "  sharing:\n    - {donor: research/shared, recipients: [research/*]}\n"
    "    - {donor: research/*, recipients: [research/*], scope: {tenant: acme}}\n"
    "    - {donor: legal/*, recipients: [research/*]}\n",
    "  compatible_groups: []\n": "  compatible_groups:\n    - [extract_financials@1, extract_financials@2]\n"
    "    - [summarize@1, summarize@2]\n",
    "  rules: []\n": "  rules:\n    - {task: extract_financials, allow_shifted: true}\n"
    "    - {task: summarize}\n",
}
CASES = """
  - name: shared by the scoped rule
    patch: {facts: {donor: {namespace: research/entity-007}}}
    expect: allow
  - name: public donor of another tenant through the first scope
    patch: {facts: {donor: {tenant: globex, visibility: public}}}
    expect: allow
  - name: a compatible task
    patch: {facts: {donor: {task: {id: extract_financials, version: '2'}}}}
    expect: allow
  - name: forbidden email
    patch: {facts: {pii: {provenance_entities: [EMAIL_ADDRESS]}}}
    expect: deny
"""


@pytest.fixture
def ruled(tmp_path: Path) -> Path:
    """The default YAML policy with rules in every ruled section, and cases for some of them."""
    d = tmp_path / "ruled"
    shutil.copytree(DEFAULT_POLICY_DIR, d)
    text = (d / "policy.yaml").read_text()
    for old, new in RULES.items():
        assert old in text
        text = text.replace(old, new, 1)
    (d / "policy.yaml").write_text(text)
    case = d / "policy_test.yaml"
    head = case.read_text()
    case.write_text(head[: head.index("\ncases:\n")] + "\ncases:\n" + CASES)
    return d


def _line_of(path: Path, text: str) -> int:
    """1-based line of the first line of ``path`` containing ``text``."""
    return next(i for i, x in enumerate(path.read_text().splitlines(), 1) if text in x)


def test_each_rule_counts_the_cases_it_decided(ruled: Path) -> None:
    """Each rule counts the decided cases it decided (the first matching scope or sharing rule)."""
    policy = load_policy_source(ruled)
    outcomes = run_case_file(ruled / "policy_test.yaml", make_engine(policy))
    cov = case_coverage(policy, ruled, outcomes)
    counts = {i.name: i.cases for i in cov.rules()}
    assert counts["namespace.sharing[0]"] == 0 and counts["namespace.sharing[1]"] == 1
    assert counts["namespace.sharing[2]"] == 0
    assert counts["tenant.public_donors_for[0]"] == 1 and counts["tenant.public_donors_for[1]"] == 0
    assert counts["task.compatible_groups[0]"] == 1 and counts["task.compatible_groups[1]"] == 0
    assert counts["pii.forbidden_entities: EMAIL_ADDRESS"] == 1
    assert counts["pii.forbidden_entities: US_SSN"] == 0
    assert counts["quality.rules[0]"] == 4 and counts["quality.rules[1]"] == 0
    where = {i.name: i.where for i in cov.rules()}
    policy_file = ruled / "policy.yaml"
    assert where["namespace.sharing[2]"] == f"policy.yaml:{_line_of(policy_file, '{donor: legal/*')}"
    assert cov.decided == 4 and cov.covered == sum(i.cases > 0 for i in cov.items)


def test_coverage_names_each_rule_no_case_exercises(ruled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--coverage prints the share exercised and flags each rule no case exercised, with its line."""
    assert main(["policy", "test", str(ruled), "--coverage"]) == 0
    out = capsys.readouterr().out
    assert "gate outcomes and policy rules exercised" in out
    [legal] = [x for x in out.splitlines() if "namespace.sharing[2]" in x]
    assert f"policy.yaml:{_line_of(ruled / 'policy.yaml', '{donor: legal/*')}" in legal
    assert legal.endswith("<- no case exercises this rule")
    [scoped] = [x for x in out.splitlines() if "namespace.sharing[1]" in x]
    assert "1 case(s)" in scoped and "<-" not in scoped


def test_threshold_fails_a_passing_run_below_it(capsys: pytest.CaptureFixture[str]) -> None:
    """--threshold PCT: exit 1 with the measure that fell short when coverage is below PCT, else 0."""
    d = str(DEFAULT_POLICY_DIR)
    assert main(["policy", "test", d, "--threshold", "100"]) == 1
    out, err = capsys.readouterr()
    assert "32 passed" in out and "rule coverage:" in out
    assert f"{d}: coverage below --threshold 100%: rule coverage " in err
    assert main(["policy", "test", d, "--threshold", "50"]) == 0
    assert "below --threshold" not in capsys.readouterr().err


def test_threshold_of_a_rego_policy_reads_its_line_coverage(capsys: pytest.CaptureFixture[str]) -> None:
    """For a Rego policy without case files --threshold holds the modules' line coverage to PCT."""
    d = str(ROOT / "policies" / "rego" / "default")
    assert main(["policy", "test", d, "--threshold", "100", "--format", "json"]) == 1
    err = capsys.readouterr().err
    assert "coverage below --threshold 100%: line coverage " in err and "rule coverage" not in err
    assert main(["policy", "test", d, "--threshold", "10"]) == 0


def test_rego_rule_constants_are_covered_like_yaml_rules(tmp_path: Path) -> None:
    """A Rego policy's rule constants count the cases they decided, located at their constant's line."""
    d = tmp_path / "rego"
    shutil.copytree(ROOT / "policies" / "rego" / "default", d)
    text = (d / "policy.rego").read_text()
    rules = 'namespace_sharing := [{"donor": "legal/*", "recipients": ["research/*"]}, ' \
        '{"donor": "research/*", "recipients": ["research/*"]}]'  # fmt: skip
    (d / "policy.rego").write_text(text.replace("namespace_sharing := []", rules, 1))
    case = (DEFAULT_POLICY_DIR / "policy_test.yaml").read_text()
    (d / "cases_test.yaml").write_text(case[: case.index("\ncases:\n")] + "\ncases:\n" + CASES)
    policy = load_policy_source(d)
    outcomes = run_case_file(d / "cases_test.yaml", make_engine(policy))
    cov = case_coverage(policy, d, outcomes)
    assert cov.decided == 4
    items = {i.name: (i.where, i.cases) for i in cov.rules()}
    line = _line_of(d / "policy.rego", "namespace_sharing := [")
    assert items["namespace_sharing[0]"] == (f"policy.rego:{line}", 0)
    assert items["namespace_sharing[1]"] == (f"policy.rego:{line}", 1)
    assert items["forbidden_entities: EMAIL_ADDRESS"][1] == 1
    assert items["forbidden_entities: US_SSN"][1] == 0
