"""`semgov policy test` and `semgov policy check` on Rego and YAML policy directories."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

from semgov.cli.main import main
from semgov.errors import PolicyError
from tests.conftest import DEFAULT_POLICY_DIR
from tests.policy.test_rego_policy import MINIMAL, write

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
    """policy check prints file:line diagnostics and exits 2 (invalid policy); a clean directory exits 0."""
    assert main(["policy", "check", str(DEFAULT_POLICY_DIR)]) == 0
    bad = write(tmp_path, MINIMAL + "\nt := time.now_ns()\n")
    assert main(["policy", "check", str(bad)]) == 2
    out = capsys.readouterr().out
    assert f"{bad / 'policy.rego'}:{MINIMAL.count(chr(10)) + 2}: time.now_ns() is not allowed" in out
    ydir = tmp_path / "y"
    ydir.mkdir()
    (ydir / "policy.yaml").write_text("name: p\nversion: '1'\nsimilarity:\n  minimum: 1\n")
    assert main(["policy", "check", str(ydir)]) == 2
    assert "policy.yaml:4: similarity.minimum: unknown key" in capsys.readouterr().out


# ---- case files are validated strictly, as a whole, before anything is decided ---------------------------


def _case_dir(tmp_path: Path, cases: str, base: str | None = None) -> Path:
    """A copy of the default policy directory whose case file holds ``cases`` (and the default base)."""
    d = tmp_path / "pol"
    shutil.copytree(DEFAULT_POLICY_DIR, d)
    text = (d / "policy_test.yaml").read_text()
    head = text[: text.index("\ncases:\n")] if base is None else base
    (d / "policy_test.yaml").write_text(head + "\ncases:\n" + cases)
    return d


def _case_error(d: Path) -> PolicyError:
    from semgov.policy.testing import load_case_file

    with pytest.raises(PolicyError) as e:
        load_case_file(d / "policy_test.yaml")
    return e.value


def _line_of(d: Path, needle: str) -> int:
    lines = (d / "policy_test.yaml").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if needle in line)


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ('{candidate: {similarity: "0.9"}}', "candidate.similarity"),
        ('{facts: {provenance: {signature_valid: "true"}}}', "facts.provenance.signature_valid"),
        ("{facts: {provenance: {donor_id_matches: 1}}}", "facts.provenance.donor_id_matches"),
        ("{candidate: {has_text: 'false'}}", "candidate.has_text"),
        ("{candidate: {prompt_tokens: true}}", "candidate.prompt_tokens"),
        ("{now_ns: '1795946400000000000'}", "now_ns"),
        ("{facts: {tokens: {spans: [{recipient_start: 0.0}]}}}", "facts.tokens.spans.0.recipient_start"),
        ("{candidate: {similarity: .inf}}", "candidate.similarity"),
        ("{now: 2026-11-29T10:00:00Z}", "now"),
    ],
)
def test_case_document_types_are_exact(
    tmp_path: Path, patch: str, field: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A mistyped patch ("0.9", "true", 1, .inf) is a PolicyError at file:line and field, never decided."""
    d = _case_dir(tmp_path, f"  - name: coerced\n    patch: {patch}\n    expect: allow\n")
    e = _case_error(d)
    assert (e.line, e.field) == (_line_of(d, "patch:"), field), e
    assert e.source == str(d / "policy_test.yaml") and "case 'coerced'" in e.message, e
    assert main(["policy", "test", str(d)]) == 2
    assert "PASS" not in capsys.readouterr().out
    assert main(["policy", "check", str(d)]) == 2
    assert f"policy_test.yaml:{e.line}: {field}: " in capsys.readouterr().out


def test_case_document_error_points_at_base_or_input(tmp_path: Path) -> None:
    """A bad field written in the base (or in a case's full input) is reported at that line."""
    d = _case_dir(tmp_path, "  - name: ok\n    expect: allow\n")
    text = (d / "policy_test.yaml").read_text().replace("similarity: 0.9,", "similarity: '0.9',", 1)
    (d / "policy_test.yaml").write_text(text)
    e = _case_error(d)
    assert (e.line, e.field) == (_line_of(d, "similarity: '0.9'"), "candidate.similarity"), e
    text = (DEFAULT_POLICY_DIR / "policy_test.yaml").read_text()
    block = text[text.index("base:\n") + 6 : text.index("\ncases:\n")]  # indented by 2
    block = block.replace("prompt_tokens: 370\n", "prompt_tokens: '370'\n", 1)
    case = "  - name: full\n    input:\n" + textwrap.indent(block, "    ") + "\n    expect: deny\n"
    d2 = _case_dir(tmp_path / "2", case, base="")
    e = _case_error(d2)
    assert (e.line, e.field) == (_line_of(d2, "prompt_tokens: '370'"), "request.prompt_tokens"), e


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("  - name: both\n    input: {}\n    patch: {}\n    expect: deny\n", "not both"),
        ("  - name: gate\n    expect: deny\n    gates: {tenancy: fail}\n", "unknown gate"),
        ("  - name: outcome\n    expect: deny\n    gates: {tenant: failed}\n", "pass, fail or error"),
        ("  - name: expect\n    expect: 'yes'\n", "allow or deny"),
        ("  - name: patch\n    patch: [1]\n    expect: deny\n", "must be a mapping"),
        ("  - name: extra\n    expect: deny\n    skip: true\n", "unknown key"),
        ("  - {expect: deny}\n", "needs a `name`"),
        ("  - name: ok\n    patch: {candidate: {similarity: 1e-07}}\n    expect: deny\n", "ambiguous"),
    ],
)
def test_case_structure_is_strict(tmp_path: Path, case: str, needle: str) -> None:
    """Malformed cases (input and patch, unknown gate or outcome, bad expect) are PolicyErrors with a line."""
    good = "  - name: fine\n    expect: allow\n"
    d = _case_dir(tmp_path, good + case)
    e = _case_error(d)
    assert needle in e.message and e.line is not None and e.line > _line_of(d, "name: fine"), e


def test_case_file_base_must_be_a_mapping(tmp_path: Path) -> None:
    """``base: null`` or a list is refused (it used to make every patch a whole document)."""
    for base in ("base: null", "base: [1]"):
        d = _case_dir(tmp_path / base[6:], "  - name: a\n    patch: {}\n    expect: deny\n", base=base)
        e = _case_error(d)
        assert (e.field, e.line) == ("base", 1), e


def test_json_case_document_reads_as_json(tmp_path: Path) -> None:
    """A case written as JSON reads as JSON would: ``1e-07`` is refused as ambiguous, never a string."""
    import json

    import yaml

    from semgov.policy.testing import load_case_file

    base = yaml.safe_load((DEFAULT_POLICY_DIR / "policy_test.yaml").read_text())["base"]
    doc = dict(base, now=1e-07)
    f = tmp_path / "json_test.yaml"
    f.write_text(json.dumps({"cases": [{"name": "j", "input": doc, "expect": "allow"}]}))
    with pytest.raises(PolicyError, match="ambiguous value 1e-07"):
        load_case_file(f)
    doc["now"] = "2026-11-29T10:00:00Z"
    f.write_text(json.dumps({"cases": [{"name": "j", "input": doc, "expect": "allow"}]}))
    assert [c.name for c in load_case_file(f)] == ["j"]


MALFORMED = """\
  - name: fine
    expect: allow
  - name: typo in a case key
    pach: {candidate: {similarity: 0.1}}
    expect: deny
  - name: typo in a gate
    expect: deny
    gates: {tenancy: fail}
  - name: typo in the document
    patch: {candidate: {similarty: 0.1, prompt_tokens: '370'}}
    expect: deny
"""


def test_every_malformed_case_is_reported_in_the_lint_wording(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every problem of a case file is listed as `file:line: field: message`, with `did you mean`."""
    d = _case_dir(tmp_path, MALFORMED)
    f = d / "policy_test.yaml"
    want = [
        f"{f}:{_line_of(d, 'pach:')}: cases.1.pach: case 'typo in a case key': unknown key "
        "(did you mean 'patch'?)",
        f"{f}:{_line_of(d, 'tenancy')}: cases.2.gates.tenancy: case 'typo in a gate': unknown gate "
        "(did you mean 'tenant'?)",
        f"{f}:{_line_of(d, 'similarty')}: candidate.prompt_tokens: case 'typo in the document': "
        "Input should be a valid integer (got '370')",
        f"{f}:{_line_of(d, 'similarty')}: candidate.similarty: case 'typo in the document': unknown key "
        "(did you mean 'similarity'?)",
    ]
    e = _case_error(d)
    assert len(e.all_diagnostics()) == 4 and "[and 3 more problems]" in e.message
    assert main(["policy", "test", str(d)]) == 2
    out, err = capsys.readouterr()
    assert "PASS" not in out
    got = [x for x in err.splitlines() if x.startswith(str(f))]
    assert [x.split(" (keys:")[0].split(" (gates:")[0].split(" [and")[0] for x in got] == want, err
    assert "4 problem(s) in its case files; no test ran" in err
    assert (
        main(["policy", "check", str(d)]) == 2
    )  # NOTE: a malformed case file is bad input, as for every command
    out = capsys.readouterr().out
    assert all(w.split(": case")[0] in out for w in want) and "4 problem(s)" in out


def test_case_structure_and_documents_are_checked_in_one_pass(tmp_path: Path) -> None:
    """A case file's top-level problems and its cases' problems come together, the first first."""
    d = _case_dir(tmp_path, "  - name: a\n    expect: maybe\n", base="bsae: {}")
    e = _case_error(d)
    assert "unknown key (did you mean 'base'?)" in e.message and e.line == 1
    assert [o.field for o in e.others] == ["cases.0.expect"]


def test_policy_test_names_its_human_format_table_like_check_and_diff(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`policy test --format table` is the default human format; `text`, its old name, prints the same."""
    from pathlib import Path

    from semgov.cli.main import main

    policy = str(Path(__file__).resolve().parents[2] / "policies" / "default")
    assert main(["policy", "test", policy, "--format", "table"]) == 0
    table = capsys.readouterr().out
    assert main(["policy", "test", policy, "--format", "text"]) == 0
    text = capsys.readouterr().out
    assert main(["policy", "test", policy]) == 0
    default = capsys.readouterr().out
    strip = lambda out: [ln.split(" (")[0] for ln in out.splitlines()]  # noqa: E731 - timings differ
    assert strip(table) == strip(text) == strip(default) and table.rstrip().endswith("0 failures")
