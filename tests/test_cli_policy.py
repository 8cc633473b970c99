"""`semgov policy test` and `semgov policy check` on Rego and YAML policy directories."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from semgov.cli.main import main
from tests.conftest import DEFAULT_POLICY_DIR
from tests.test_rego_policy import MINIMAL, write

TESTS = """package semgov.reuse_test
import rego.v1
import data.semgov.reuse

test_low_similarity_denied if {
    not reuse.allow with input as {"candidate": {"similarity": 0.1}, "facts": {"tokens": {"spans": []}}}
}

test_high_similarity_allowed if {
    reuse.allow with input as {"candidate": {"similarity": 0.9}, "facts": {"tokens": {"spans": []}}}
}

test_deliberately_wrong if {
    reuse.allow with input as {"candidate": {"similarity": 0.1}, "facts": {"tokens": {"spans": []}}}
}
"""


@pytest.fixture
def rego_dir(tmp_path: Path) -> Path:
    write(tmp_path, MINIMAL)
    return write(tmp_path, TESTS, "policy_test.rego")


@pytest.mark.parametrize("engine", ["regorus", "opa-inprocess"])
def test_rego_tests_report_each_and_fail_the_run(
    rego_dir: Path, engine: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every test_ rule runs; a false one is FAIL and the exit status is 1."""
    assert main(["policy", "test", str(rego_dir), "-v", "--engine", engine]) == 1
    out = capsys.readouterr().out
    assert "PASS data.semgov.reuse_test.test_low_similarity_denied" in out
    assert "PASS data.semgov.reuse_test.test_high_similarity_allowed" in out
    assert "FAIL data.semgov.reuse_test.test_deliberately_wrong" in out
    assert "PASS 2/3, FAIL 1" in out


def test_run_filter_selects_tests(rego_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--run keeps only matching tests; with only passing ones selected the exit status is 0."""
    assert main(["policy", "test", str(rego_dir), "--run", "similarity_"]) == 0
    assert "PASS 2/2" in capsys.readouterr().out
    assert main(["policy", "test", str(rego_dir), "--run", "nomatch"]) == 2
    assert "no tests found" in capsys.readouterr().out


def test_yaml_case_file_of_the_default_policy(capsys: pytest.CaptureFixture[str]) -> None:
    """The default YAML policy's case file passes case by case."""
    assert main(["policy", "test", str(DEFAULT_POLICY_DIR), "-v"]) == 0
    out = capsys.readouterr().out
    assert "PASS exact repeat is allowed" in out and "yaml: PASS" in out


def test_case_file_failure_is_explained(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A case whose expectation is wrong fails with the expected and actual outcomes."""
    d = tmp_path / "pol"
    shutil.copytree(DEFAULT_POLICY_DIR, d)
    case = d / "policy_test.yaml"
    case.write_text(case.read_text().replace("    expect: deny\n    gates: {tenant: fail, namespace: pass}",
                                             "    expect: allow\n    gates: {tenant: pass}", 1))  # fmt: skip
    assert main(["policy", "test", str(d)]) == 1
    out = capsys.readouterr().out
    assert "FAIL donor of another tenant is denied" in out
    assert "expected allow, got deny" in out and "gate tenant: expected pass, got fail" in out


def test_policy_check_reports_file_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """policy check prints file:line diagnostics and exits 1; a clean directory exits 0."""
    assert main(["policy", "check", str(DEFAULT_POLICY_DIR)]) == 0
    bad = write(tmp_path, MINIMAL + "\nt := time.now_ns()\n")
    assert main(["policy", "check", str(bad)]) == 1
    out = capsys.readouterr().out
    assert f"{bad / 'policy.rego'}:{MINIMAL.count(chr(10)) + 2}: time.now_ns() is not allowed" in out
    ydir = tmp_path / "y"
    ydir.mkdir()
    (ydir / "policy.yaml").write_text("name: p\nversion: '1'\nsimilarity:\n  minimum: 1\n")
    assert main(["policy", "check", str(ydir)]) == 1
    assert "policy.yaml:4: similarity.minimum: unknown key" in capsys.readouterr().out
