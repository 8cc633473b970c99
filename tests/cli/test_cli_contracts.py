"""`semgov contracts check` and `semgov contracts compare`: exit statuses, output, -q and --help."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from semgov.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "contracts.yaml"
REV1 = "b7d82735950e554b3cf434b16748ea040ecf593a5a125beb6facb8f03c4dbf5d"


def _answers(tmp_path: Path, cold: str, warm: str) -> list[str]:
    (tmp_path / "cold.txt").write_text(cold + "\n", encoding="utf-8")
    (tmp_path / "warm.txt").write_text(warm + "\n", encoding="utf-8")
    return ["--cold", str(tmp_path / "cold.txt"), "--warm", str(tmp_path / "warm.txt")]


def test_check_accepts_the_example_contracts_with_a_line_per_contract(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """examples/contracts.yaml checks: exit 0, a summary line, one line per contract with its line."""
    assert main(["contracts", "check", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{EXAMPLE}: OK (6 contracts; any other compares exact)"
    assert len(out) == 7
    assert out[1].startswith(
        "  line 10: financials@b7d82735950e: required_values, JSON schema, 9 required paths"
    )
    assert "risk_summary (any revision): required_values, 2 patterns: amount, percent" in out[6]


def test_check_reports_a_problem_at_its_line_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file with a bad regular expression: exit 2, file:line: problem on stderr, nothing on stdout."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "version: 1\ncontracts:\n  - id: c\n    compare: required_values\n    patterns: {p: '('}\n"
    )
    assert main(["contracts", "check", str(bad)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and f"{bad}:5: patterns.p: not a regular expression" in captured.err


def test_compare_prints_lost_and_gained_values_and_exits_1_on_a_regression(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Free text under a patterns contract: a changed figure is lost and gained, exit 1."""
    files = _answers(
        tmp_path, "Revenue was $4,182.7 million, up 6.1%.", "Revenue was $4,182 million, up 6.1%."
    )
    assert main(["contracts", "compare", str(EXAMPLE), "--contract", "financials", *files]) == 1
    out = capsys.readouterr().out
    assert "contract: financials (any revision): required_values, 3 patterns" in out
    assert "  lost:   amount=$4,182.7 million\n  gained: amount=$4,182 million\n" in out
    assert out.endswith("regressed: yes\n")


def test_compare_exits_0_when_only_the_wording_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same figures in other words: answer changed, required values not, exit 0."""
    files = _answers(tmp_path, "Revenue was $4,182.7 million.", "It reported revenue of $4,182.7 million.")
    assert main(["contracts", "compare", str(EXAMPLE), "--contract", "financials", *files]) == 0
    out = capsys.readouterr().out
    assert "answer changed: yes\nrequired values changed: no\n" in out and "regressed: no" in out


def test_compare_picks_the_revision_named_after_the_at_sign(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ID@SHA256 selects that revision's JSON schema entry; its required values decide."""
    cold = json.dumps({"revenue_musd": 4182.7, "headcount": 12000, "note": "a"})
    warm = json.dumps({"headcount": 12000.0, "revenue_musd": 4182.7, "note": "b"})
    files = _answers(tmp_path, cold, warm)
    argv = [
        "contracts",
        "compare",
        str(EXAMPLE),
        "--contract",
        f"financials@{REV1}",
        *files,
        "--format",
        "json",
    ]
    assert main(argv) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["contract"].startswith("financials@b7d82735950e: required_values, JSON schema")
    assert got["answer_changed"] is True and got["values_changed"] is False and got["regressed"] is False


def test_compare_under_a_contract_the_file_does_not_list_is_exact(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A contract not in the file compares exact: any change regresses; the output says it is the default."""
    files = _answers(tmp_path, "Hello.", "Hello!")
    assert main(["contracts", "compare", str(EXAMPLE), "--contract", "chat", *files]) == 1
    assert "contract: chat (any revision): exact (the whole answer) (not in the file: the default)" in (
        capsys.readouterr().out
    )


def test_compare_quiet_prints_nothing_and_keeps_the_exit_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-q: nothing on stdout, the same exit status (1: regressed)."""
    files = _answers(tmp_path, "12%", "13%")
    assert main(["contracts", "compare", str(EXAMPLE), "--contract", "risk_summary", *files, "-q"]) == 1
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("contract", ["financials@abc", "@" + REV1, "a@b@" + REV1])
def test_compare_refuses_a_malformed_contract(contract: str, tmp_path: Path) -> None:
    """--contract that is not ID or ID@SHA256 is a usage error (exit 2)."""
    with pytest.raises(SystemExit) as e:
        main(["contracts", "compare", str(EXAMPLE), "--contract", contract, *_answers(tmp_path, "a", "b")])
    assert e.value.code == 2


def test_compare_refuses_an_answer_that_is_not_utf8(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unreadable or non-UTF-8 answer file: exit 2 naming it."""
    files = _answers(tmp_path, "a", "b")
    (tmp_path / "warm.txt").write_bytes(b"\xff\xfe")
    assert main(["contracts", "compare", str(EXAMPLE), "--contract", "chat", *files]) == 2
    assert "warm.txt: answer is not UTF-8" in capsys.readouterr().err


def test_help_explains_both_actions(capsys: pytest.CaptureFixture[str]) -> None:
    """--help of compare says what the exit statuses mean and how answers are compared."""
    with pytest.raises(SystemExit):
        main(["contracts", "compare", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "Exit 0: warm did not regress; 1: it did" in out and "--contract ID[@SHA256]" in out
    with pytest.raises(SystemExit):
        main(["contracts", "check", "--help"])
    assert "2 with file:line: problem" in " ".join(capsys.readouterr().out.split())
