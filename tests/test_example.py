"""The shipped example workload: reproducible from its generator, and every decision as expected."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from semgov.cli.main import main
from tests.conftest import DEFAULT_POLICY_DIR, ROOT

EX = ROOT / "examples"
ARGS = [
    "--policy",
    str(DEFAULT_POLICY_DIR),
    "--trust",
    str(EX / "keyring.json"),
    "--signing-key",
    str(EX / "keys" / "decision-signing-key.pem"),
]


def test_generator_reproduces_the_shipped_file(tmp_path: Path) -> None:
    """Running the generator with defaults reproduces the shipped workload line for line."""
    out = tmp_path / "w.jsonl.gz"
    subprocess.run(
        [sys.executable, str(EX / "generate_workload.py"), "--out", str(out)], check=True, capture_output=True
    )
    # NOTE: compare the JSON Lines, not the gzip bytes, which depend on the zlib build.
    assert gzip.decompress(out.read_bytes()) == gzip.decompress((EX / "captured.jsonl.gz").read_bytes())


def test_check_expect_agrees_on_every_candidate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """semgov check --expect on the example: every decision matches and no deny-expected one is allowed."""
    out = tmp_path / "d.jsonl"
    rc = main(["check", str(EX / "captured.jsonl.gz"), *ARGS, "--expect", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    expect = {}
    with gzip.open(EX / "captured.jsonl.gz", "rt") as f:
        for line in f:
            r = json.loads(line)
            for donor, want in r["expect"].items():
                expect[(r["request_id"], donor)] = want
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(recs) == len(expect) > 3000
    got = Counter((expect[(r["request_id"], r["donor_id"])], r["decision"]) for r in recs)
    assert got[("deny", "allow")] == 0 and got[("allow", "deny")] == 0
    assert got[("allow", "allow")] > 1000 and got[("deny", "deny")] > 1000
    # every single-gate mutation is caught by its gate: all ten gates deny somebody
    failing = {g["gate"] for r in recs for g in r["gates"] if g["result"] == "fail"}
    assert len(failing) == 10


def test_check_with_the_rego_default_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """semgov check --policy policies/rego/default agrees with every expectation, engine regorus."""
    out = tmp_path / "d.jsonl"
    args = [a if a != str(DEFAULT_POLICY_DIR) else str(ROOT / "policies" / "rego" / "default") for a in ARGS]
    rc = main(["check", str(EX / "captured.jsonl.gz"), *args, "--expect", "--out", str(out)])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "engine regorus" in text and "0 mismatches" in text
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert {r["policy"]["engine"] for r in recs} == {"regorus"}
    assert {r["policy"]["name"] for r in recs} == {"default"}
