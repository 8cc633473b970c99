"""`semgov check` on a first run (issue 35, item 3): what the table says about candidates not
compared and about a run without --expect, --signing-key only when records are written, an
invalid policy exiting 2 with every problem, and each location naming the captured file and line."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from semgov.cli.main import main
from semgov.intake.capture import MalformedLine, parse_line
from tests.cli.test_cli import SMALL, _good_only
from tests.conftest import ASSETS, DEFAULT_POLICY_DIR, ROOT
from tests.policy.test_policy_lint import broken_yaml

NO_KEY = ["--policy", str(DEFAULT_POLICY_DIR), "--trust", str(ASSETS / "keyring.json")]
KEY = ["--signing-key", str(ASSETS / "decision-signing-key.pem")]


def test_cross_tenant_candidates_not_compared_are_explained_and_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An example request with another tenant's private donor: token_verification errors, the run
    passes (--expect), and the table says the donor was deliberately not compared."""
    with gzip.open(ROOT / "examples" / "captured.jsonl.gz", "rt") as f:
        line = next(x for x in f if '"request_id":"req-000157"' in x)
    p = tmp_path / "one.jsonl"
    p.write_text(line)
    trust = str(ROOT / "examples" / "keyring.json")
    assert main(["check", str(p), "--policy", str(DEFAULT_POLICY_DIR), "--trust", trust, "--expect"]) == 0
    out = capsys.readouterr().out
    row = next(x for x in out.splitlines() if x.strip().startswith("token_verification"))
    assert int(row.split()[-1]) >= 1
    assert "token_verification error(s): another tenant's private donor, deliberately not compared" in out


def test_without_expect_the_table_says_nothing_was_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --expect the table says expectations were not compared and what a test then checks."""
    assert main(["check", str(_good_only(tmp_path)), *NO_KEY]) == 0
    out = capsys.readouterr().out
    assert "expectations: not compared (no --expect)" in out
    assert main(["check", str(_good_only(tmp_path)), *NO_KEY, "--expect"]) == 0
    assert "expectations: 3 checked" in capsys.readouterr().out


def test_signing_key_is_needed_only_when_records_are_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A summary needs no --signing-key; --out, --audit or --format jsonl without it is exit 2 naming it."""
    good = str(_good_only(tmp_path))
    assert main(["check", good, *NO_KEY, "--format", "sarif"]) == 0
    capsys.readouterr()
    for extra in (
        ["--out", str(tmp_path / "d.jsonl")],
        ["--format", "jsonl"],
        ["--audit", str(tmp_path / "a")],
    ):
        assert main(["check", good, *NO_KEY, *extra]) == 2
        assert "--signing-key KEY is needed" in capsys.readouterr().err
    assert main(["check", good, *NO_KEY, *KEY, "--format", "jsonl"]) == 0


def test_an_invalid_policy_exits_2_from_every_command_with_every_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A policy with three mistakes: check, policy test and policy check all exit 2, listing all three."""
    d = broken_yaml(tmp_path)
    good = str(_good_only(tmp_path))
    assert main(["check", good, "--policy", str(d), "--trust", str(ASSETS / "keyring.json")]) == 2
    err = capsys.readouterr().err
    assert err.count(str(d / "policy.yaml")) == 3 and "similarty" in err, err
    assert main(["policy", "test", str(d)]) == 2
    assert capsys.readouterr().err.count(str(d / "policy.yaml")) == 3
    assert main(["policy", "check", str(d)]) == 2
    assert "3 problem(s)" in capsys.readouterr().out


def test_a_cut_short_line_is_described_as_such() -> None:
    """A line that ends inside a string is reported as cut short, not at a JSON 'line 2 column 0'."""
    item = parse_line(b'{"request_id": "r1", "tenant": "ac\n', 7)
    assert isinstance(item, MalformedLine) and item.line == 7
    assert "cut short" in item.reason and "line 2" not in item.reason, item.reason
    bad = parse_line(b'{"request_id": "r1", x}\n', 1)
    assert isinstance(bad, MalformedLine) and bad.reason.endswith("at column 22"), bad.reason


def test_mismatch_lines_name_the_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A MISMATCH line starts with the captured file and the request's line number."""
    rows = [json.loads(x) for x in _good_only(tmp_path).read_text().splitlines()]
    donor = next(iter(rows[1]["expect"]))
    rows[1]["expect"][donor] = "allow" if rows[1]["expect"][donor] == "deny" else "deny"
    p = tmp_path / "wrong.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["check", str(p), *NO_KEY, "--expect"]) == 1
    out = capsys.readouterr().out
    assert f"MISMATCH {p}:2: request {rows[1]['request_id']} donor {donor}: expected" in out


def test_capture_directory_annotations_name_the_file_and_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In a capture directory a malformed line is annotated at its own file and its line in that file."""
    lines = SMALL.read_text().splitlines(keepends=True)
    bad = next(i for i, x in enumerate(lines) if '"r-bad"' in x)
    d = tmp_path / "cap"
    d.mkdir()
    (d / "a.jsonl").write_text("".join(x for i, x in enumerate(lines) if i != bad))
    (d / "b.jsonl").write_text(lines[bad])
    assert main(["check", str(d), *NO_KEY, "--format", "github"]) == 2
    out = capsys.readouterr().out
    assert f"::error file={d / 'b.jsonl'},line=1," in out, out
