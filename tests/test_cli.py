"""The semgov command line, end to end on the committed fixtures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from semgov.cli.main import main
from tests.conftest import ASSETS, DEFAULT_POLICY_DIR

SMALL = ASSETS / "captured-small.jsonl"
BASE = [
    "--policy",
    str(DEFAULT_POLICY_DIR),
    "--trust",
    str(ASSETS / "keyring.json"),
    "--signing-key",
    str(ASSETS / "decision-signing-key.pem"),
]


def _good_only(tmp_path: Path) -> Path:
    lines = SMALL.read_text().splitlines()
    p = tmp_path / "good.jsonl"
    p.write_text("\n".join(x for x in lines if '"r-bad"' not in x) + "\n")
    return p


def test_check_table_reports_and_continues_past_malformed(capsys: pytest.CaptureFixture[str]) -> None:
    """A malformed line is reported with its number; the others are decided; exit 2."""
    rc = main(["check", str(SMALL), *BASE, "--expect"])
    out, err = capsys.readouterr()
    assert rc == 2
    assert f"{SMALL}:2: skipped malformed request" in err and "tile" in err
    assert "requests 3 (1 malformed)" in out
    assert "decisions 4: allow 1, deny 3" in out
    assert "expectations: 3 checked, 0 mismatches" in out


def test_check_expect_all_agree_exits_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With only well-formed lines and matching expectations the exit status is 0."""
    assert main(["check", str(_good_only(tmp_path)), *BASE, "--expect"]) == 0
    assert "0 mismatches" in capsys.readouterr().out


def test_check_expect_mismatch_exits_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A decision that differs from `expect` is listed and the exit status is 1."""
    pol = tmp_path / "pol"
    pol.mkdir()
    text = (DEFAULT_POLICY_DIR / "policy.yaml").read_text().replace("min: 0.6", "min: 0.1")
    (pol / "policy.yaml").write_text(text)
    args = ["check", str(_good_only(tmp_path)), *BASE, "--expect"]
    args[args.index(str(DEFAULT_POLICY_DIR))] = str(pol)
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "MISMATCH" in out and "request r-18 donor r-05: expected deny, got allow" in out


def test_check_jsonl_then_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Records printed as JSONL and written with --out verify; a tampered one is reported by line."""
    out_file = tmp_path / "d.jsonl"
    rc = main(["check", str(SMALL), *BASE, "--format", "jsonl", "--out", str(out_file)])
    stdout = capsys.readouterr().out
    assert rc == 2
    assert stdout.splitlines() == out_file.read_text().splitlines()
    recs = [json.loads(x) for x in stdout.splitlines()]
    bad = [r for r in recs if r["request_id"] == "r-bad"]
    assert len(bad) == 1 and bad[0]["decision"] == "deny"
    assert all(g["result"] == "error" and "line 2" in g["detail"] for g in bad[0]["gates"])
    pub = str(ASSETS / "decision-signing-key.pub.pem")
    assert main(["verify-decision", str(out_file), "--pubkey", pub]) == 0
    assert "4 records: 4 valid, 0 invalid" in capsys.readouterr().out
    lines = out_file.read_text().splitlines()
    lines[2] = lines[2].replace('"decision":"deny"', '"decision":"allow"')
    out_file.write_text("\n".join(lines) + "\n")
    assert main(["verify-decision", str(out_file), "--pubkey", pub]) == 1
    _, err = capsys.readouterr()
    assert f"{out_file}:3: signature does not verify" in err


def test_check_now_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--now moves the decision clock: far in the future every donor is expired."""
    assert (
        main(
            ["check", str(_good_only(tmp_path)), *BASE, "--now", "2030-01-01T00:00:00Z", "--format", "jsonl"]
        )
        == 0
    )
    recs = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert {r["decision"] for r in recs} == {"deny"}
    assert all(r["evaluated_at"] == "2030-01-01T00:00:00Z" for r in recs)


def test_bad_policy_exits_two_with_location(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An invalid policy stops before any decision, naming file, line and field."""
    pol = tmp_path / "pol"
    pol.mkdir()
    (pol / "policy.yaml").write_text("name: p\nversion: '1'\nsimilarity:\n  minimum: 0.7\n")
    args = ["check", str(SMALL), *BASE]
    args[args.index(str(DEFAULT_POLICY_DIR))] = str(pol)
    assert main(args) == 2
    assert f"{pol / 'policy.yaml'}:4: similarity.minimum: unknown key" in capsys.readouterr().err


def test_missing_input_and_bad_now(capsys: pytest.CaptureFixture[str]) -> None:
    """Unreadable input and a bad --now are clear errors with exit status 2."""
    assert main(["check", "/nonexistent.jsonl", *BASE]) == 2
    assert "/nonexistent.jsonl: cannot open" in capsys.readouterr().err
    assert main(["check", str(SMALL), *BASE, "--now", "tomorrow"]) == 2
    assert "--now" in capsys.readouterr().err


def test_keys_generate_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """keys generate writes the pair and prints the key id; a second run refuses to overwrite."""
    assert main(["keys", "generate", "--out", str(tmp_path / "k")]) == 0
    assert "key id ed25519:" in capsys.readouterr().out
    assert main(["keys", "generate", "--out", str(tmp_path / "k")]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err


def test_console_script_and_json_logs(tmp_path: Path) -> None:
    """The installed `semgov` entry point runs, and --log-format json emits JSON diagnostics."""
    proc = subprocess.run(
        [sys.executable, "-m", "semgov.cli.main", "--log-format", "json", "check", str(SMALL), *BASE],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    events = [json.loads(x) for x in proc.stderr.splitlines() if x.startswith("{")]
    assert any("skipped malformed request" in e["event"] and e["level"] == "error" for e in events)


def test_schema_check_cli(capsys: pytest.CaptureFixture[str]) -> None:
    """`semgov schema --check` passes on the committed schemas."""
    from tests.conftest import ROOT

    assert main(["schema", "--check", "--dir", str(ROOT / "schemas")]) == 0
