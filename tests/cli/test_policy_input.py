"""`semgov policy input CAPTURED --request ID --donor ID`: a captured candidate as a test case."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from semgov.cli.main import main
from semgov.policy.testing import load_case_file
from tests.conftest import DEFAULT_POLICY_DIR, ROOT

CAPTURED = str(ROOT / "tests" / "assets" / "captured-small.jsonl")
KEYRING = str(ROOT / "tests" / "assets" / "keyring.json")


def _input(capsys: pytest.CaptureFixture[str], request: str, donor: str) -> tuple[int, str, str]:
    rc = main(["policy", "input", CAPTURED, "--request", request, "--donor", donor,
               "--policy", str(DEFAULT_POLICY_DIR), "--trust", KEYRING])  # fmt: skip
    out, err = capsys.readouterr()
    return rc, out, err


def test_dumped_case_is_a_case_file_that_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The output is a case file holding the candidate's exact input; the policy passes it."""
    rc, out, _ = _input(capsys, "r-17", "r-03")
    assert rc == 0
    d = tmp_path / "pol"
    shutil.copytree(DEFAULT_POLICY_DIR, d)
    (d / "policy_test.yaml").write_text(out)
    [case] = load_case_file(d / "policy_test.yaml")
    assert case.name == "captured request r-17, donor r-03"
    assert case.doc.request.request_id == "r-17" and case.doc.candidate.donor_id == "r-03"
    assert set(case.gates) == {"tenant", "namespace", "provenance", "expiry", "policy_version", "pii",
                               "task", "response_contract", "similarity", "token_verification"}  # fmt: skip
    assert main(["policy", "test", str(d), "-v"]) == 0
    assert "PASS captured request r-17, donor r-03" in capsys.readouterr().out


def test_dumped_case_pastes_under_an_existing_cases_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Everything after `cases:` appended to an existing case file adds one passing case."""
    _, out, _ = _input(capsys, "r-17", "r-04")
    d = tmp_path / "pol"
    shutil.copytree(DEFAULT_POLICY_DIR, d)
    case_file = d / "policy_test.yaml"
    case_file.write_text(case_file.read_text() + out.split("\ncases:\n", 1)[1])
    n = len(load_case_file(DEFAULT_POLICY_DIR / "policy_test.yaml"))
    assert len(load_case_file(case_file)) == n + 1
    assert main(["policy", "test", str(d)]) == 0


@pytest.mark.parametrize(
    ("request_id", "donor", "needle"),
    [
        ("r-99", "r-03", "request 'r-99' is not in the capture (2 request(s) read: 'r-17', 'r-18')"),
        ("r-17", "r-99", "request 'r-17' has no candidate with donor_id 'r-99' (its donors: 'r-03', 'r-04')"),
        ("r-bad", "r-05", "captured-small.jsonl:2: request 'r-bad' is malformed: "),
    ],
)
def test_request_or_donor_not_in_the_capture_is_a_clear_error(
    request_id: str, donor: str, needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown request or donor, or a malformed request: exit 2 saying what the capture holds."""
    rc, out, err = _input(capsys, request_id, donor)
    assert rc == 2 and out == "" and needle in err, err


@pytest.mark.parametrize("value", [1e-07, 0.9, 1e20, 2.5e-12, 0.0])
def test_input_floats_read_back_as_the_same_number(tmp_path: Path, value: float) -> None:
    """Any float written into a dumped case reads back as the same number (never as a string)."""
    from semgov.cli.policy_input import case_yaml
    from semgov.wire.policy_input import to_json_dict

    [base] = load_case_file(DEFAULT_POLICY_DIR / "policy_test.yaml")[:1]
    doc = to_json_dict(base.doc)
    doc["candidate"]["similarity"] = value
    f = tmp_path / "x_test.yaml"
    f.write_text(case_yaml("x", doc, "deny", {}, ["a comment"]))
    [case] = load_case_file(f)
    assert case.doc.candidate.similarity == value and to_json_dict(case.doc) == doc
