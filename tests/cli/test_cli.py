"""The semgov command line, end to end on the committed fixtures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def test_check_capture_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`semgov check DIR` reads the directory's capture files in name order as one stream; a malformed
    line is reported at its file and its line in that file."""
    first, bad, last = SMALL.read_text().splitlines()
    d = tmp_path / "cap"
    d.mkdir()
    (d / "capture-2.jsonl").write_text(bad + "\n" + last + "\n")
    (d / "capture-1.jsonl").write_text(first + "\n")
    (d / "README.txt").write_text("not a capture\n")
    rc = main(["check", str(d), *BASE, "--expect"])
    out, err = capsys.readouterr()
    assert rc == 2
    assert f"{d / 'capture-2.jsonl'}:1: skipped malformed request: capture-2.jsonl line 1: " in err
    assert "requests 3 (1 malformed)" in out and "expectations: 3 checked, 0 mismatches" in out
    (d / "capture-2.jsonl").write_text(last + "\n")
    assert main(["check", str(d), *BASE, "--expect"]) == 0
    assert "requests 2 (0 malformed)" in capsys.readouterr().out
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["check", str(empty), *BASE]) == 2
    assert f"no capture files (*.jsonl, *.jsonl.gz) in {empty}" in capsys.readouterr().err


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


# ---- hostile --trust keyrings and decision records (benchmarks/hostile.py) ---------------------------------


def _unknown_oid_keyring() -> bytes:
    import base64

    der = bytes.fromhex("301a300506032a0304031100") + bytes(16)  # SPKI, algorithm OID 1.2.3.4
    pem = "-----BEGIN PUBLIC KEY-----\n" + base64.b64encode(der).decode() + "\n-----END PUBLIC KEY-----\n"
    return json.dumps({"keys": [{"key_id": "k1", "public_key": pem}]}).encode()


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b'{"keys": [{"key_id": "\xff"}]}', "not UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested deeper"),
        (b'{"keys": ' + b"1" * 5000 + b"}", "digits"),
        (_unknown_oid_keyring(), "keys.0.public_key: not an Ed25519 public key"),
        (
            (ASSETS / "keyring.json")
            .read_bytes()
            .replace(b'"revoked": false', b'"revoked": true, "revoked": false'),
            "duplicate key 'revoked'",
        ),
    ],
)
def test_check_bad_trust_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: bytes, needle: str
) -> None:
    """`semgov check --trust X` with a hostile keyring exits 2 with one line naming X and the problem."""
    if needle.startswith("duplicate"):
        assert data != (ASSETS / "keyring.json").read_bytes()
    trust = tmp_path / "keyring.json"
    trust.write_bytes(data)
    args = ["check", str(SMALL), *BASE]
    args[args.index(str(ASSETS / "keyring.json"))] = str(trust)
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert f"{trust}: " in err and needle in err, err


def _record_lines() -> list[str]:
    return (ASSETS / "decisions.jsonl").read_text().splitlines()


def _verify(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(["verify-decision", str(path), "--pubkey", str(ASSETS / "decision-signing-key.pub.pem")])
    out, err = capsys.readouterr()
    return rc, out, err


def test_verify_decision_deep_nesting_is_a_bad_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A line of 100,000 nested brackets is a bad record reported by line, not a RecursionError."""
    good = _record_lines()[0]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join([good, "[" * 100_000 + "]" * 100_000, good]) + "\n")
    rc, out, err = _verify(path, capsys)
    assert rc == 1 and "3 records: 2 valid, 1 invalid" in out
    assert f"{path}:2: not a JSON record: nested deeper" in err


def test_verify_decision_duplicate_key_is_invalid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A signed record with ``"decision":"deny","decision":"allow"`` is invalid, not `1 valid`."""
    line = next(x for x in _record_lines() if '"decision":"allow"' in x)
    path = tmp_path / "d.jsonl"
    path.write_text(line.replace('"decision":"allow"', '"decision":"deny","decision":"allow"', 1) + "\n")
    rc, out, err = _verify(path, capsys)
    assert rc == 1 and "1 records: 0 valid, 1 invalid" in out
    assert f"{path}:1: not a JSON record: duplicate key 'decision'" in err


def test_verify_decision_reports_every_bad_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Non-UTF-8, NaN, a non-object and a huge integer are each reported with their line number."""
    good = _record_lines()[0].encode()
    lines = [good, b'{"schema": "\xff"}', b'{"approved_tokens": NaN}', b"[1, 2]", b"1" * 5000, good]
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    rc, out, err = _verify(path, capsys)
    assert rc == 1 and "6 records: 2 valid, 4 invalid" in out
    for n, needle in [(2, "not UTF-8"), (3, "NaN"), (4, "not a JSON object"), (5, "digits")]:
        assert f"{path}:{n}: " in err and needle in err.splitlines()[n - 2], err


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda r: r.update(approved_tokens=str(r["approved_tokens"])), "approved_tokens"),
        (lambda r: r.update(approved_tokens=True), "approved_tokens"),
        (lambda r: r.update(evaluated_at=0), "evaluated_at"),
        (lambda r: r.update(evaluated_at="2026-11-29"), "evaluated_at"),
        (lambda r: r.update(evaluated_at="2026-11-29T10:00:00"), "evaluated_at"),
        (lambda r: r.update(evaluated_at="2026-11-29 10:00:00Z"), "evaluated_at"),
        (lambda r: r.update(schema_=r.pop("schema")), "schema"),
        (lambda r: r.update(approved_tokens=2**60), "RFC 8785"),
    ],
)
def test_verify_decision_refuses_a_signed_record_off_the_schema(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Any, needle: str
) -> None:
    """A record signed by the right key but off decision.schema.json (coerced types, bad times) is invalid."""
    from semgov.signing.canonical import canonicalize
    from semgov.signing.keys import load_signing_key

    key = load_signing_key(ASSETS / "decision-signing-key.pem")
    rec = json.loads(_record_lines()[0])
    rec.pop("signature")
    edit(rec)
    try:
        rec["signature"] = key.sign(canonicalize(rec))
    except ValueError:  # no RFC 8785 form: any signature will do, the shape is refused first
        rec["signature"] = key.sign(b"")
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    rc, out, err = _verify(path, capsys)
    assert rc == 1 and "0 valid, 1 invalid" in out
    assert f"{path}:1: not a decision record: " in err and needle in err, err
