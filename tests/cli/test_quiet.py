"""-q/--quiet on every command: nothing on stdout, errors still logged, the same exit status."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from semgov.cli.main import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
ASSETS = ROOT / "tests" / "assets"
CHECK = ["check", str(ASSETS / "captured-small.jsonl"), "--policy", str(ROOT / "policies" / "default"),
         "--trust", str(ASSETS / "keyring.json"),
         "--signing-key", str(ASSETS / "decision-signing-key.pem")]  # fmt: skip


def _leaves(p: argparse.ArgumentParser, name: str = "semgov") -> list[tuple[str, argparse.ArgumentParser]]:
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [(name, p)]
    return [leaf for a in subs for n, c in a.choices.items() for leaf in _leaves(c, f"{name} {n}")]


def test_every_command_takes_quiet() -> None:
    """Every runnable command of `semgov` accepts --quiet (and -q where the command has no -q of its own)."""
    leaves = _leaves(build_parser())
    assert len(leaves) > 20
    missing = [n for n, p in leaves if "--quiet" not in p._option_string_actions]
    assert missing == []


def test_check_quiet_prints_nothing_and_keeps_the_exit_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`semgov check -q` prints nothing on stdout, only the errors (here, the asset's malformed line) on
    stderr, exits as without -q, and still writes --out."""
    loud = main([*CHECK, "--expect"])
    out = capsys.readouterr()
    assert "decisions" in out.out and "malformed" in out.err
    records = tmp_path / "records.jsonl"
    assert main([*CHECK, "--expect", "-q", "--out", str(records)]) == loud
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == out.err
    assert records.stat().st_size > 0


def test_quiet_still_reports_errors(capsys: pytest.CaptureFixture[str]) -> None:
    """A missing input under -q is still an error on stderr, exit 2."""
    assert main(["check", "nope.jsonl", *CHECK[2:], "-q"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "nope.jsonl" in captured.err


def test_a_quiet_run_leaves_later_logging_alone() -> None:
    """After a -q command, configuring the log again (another command in the process, a host) is not quiet."""
    from semgov import log

    assert main(["docs", "-q"]) == 0
    assert log._quiet
    log.configure("json")
    assert not log._quiet
