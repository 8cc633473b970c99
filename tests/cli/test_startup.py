"""Start-up of the command line (issue 17): `semgov`, `--help` and `--version` import no heavy
dependency, and a command imports only its own module. Times are a benchmark's job
(benchmarks/cli_startup.py); these tests check what is imported, which is what makes them fast."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from semgov.cli.main import COMMANDS, HIDDEN, build_parser, command_of

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("numpy", "pydantic", "structlog", "cryptography", "yaml", "presidio_analyzer", "regorus")

PROBE = """
import json, sys
from semgov.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in HEAVY or m.startswith('semgov.cli.'))),
      file=sys.stderr)
"""


def imported(*argv: str) -> list[str]:
    """The heavy and semgov.cli modules a fresh interpreter has loaded after `semgov ARGV`."""
    code = f"HEAVY = {HEAVY!r}\n" + PROBE
    out = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, cwd=str(ROOT), timeout=120
    )
    return list(json.loads(out.stderr.strip().splitlines()[-1]))


@pytest.mark.parametrize("argv", [(), ("--help",), ("--version",), ("nonsense",)], ids=str)
def test_help_and_version_import_nothing_heavy(argv: tuple[str, ...]) -> None:
    """The bare command, --help, --version and an unknown command load no heavy dependency and no
    command module."""
    assert imported(*argv) == ["semgov.cli.main"]


def test_a_command_imports_only_its_own_module() -> None:
    """`semgov keys --help` loads semgov.cli.keys and none of the other commands."""
    mods = [m for m in imported("keys", "--help") if m.startswith("semgov.cli.")]
    assert mods == ["semgov.cli.keys", "semgov.cli.main"]


def test_top_level_help_matches_each_commands_own_help() -> None:
    """COMMANDS (what --help lists without importing) says what each command's module registers."""
    full = build_parser()
    sub = next(a for a in full._actions if a.dest == "command")
    registered = {c.dest: c.help for c in sub._choices_actions}
    listed = {name: help_text for name, (_, help_text) in COMMANDS.items() if name not in HIDDEN}
    assert registered == listed
    assert list(registered) == list(listed)


def test_developer_commands_run_but_are_not_listed() -> None:
    """`semgov schema` is not in `semgov --help` (nor with every module registered) but still parses."""
    for parser in (build_parser(), build_parser(only="")):
        assert "schema" not in parser.format_help()
    args = build_parser(only="schema").parse_args(["schema", "--check"])
    assert args.command == "schema" and args.check


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["check", "x"], "check"),
        (["--log-format", "json", "audit", "show", "d"], "audit"),
        (["--log-format=json", "diff"], "diff"),
        (["--version"], ""),
        (["frobnicate"], ""),
        ([], ""),
    ],
)
def test_command_of_finds_the_command_word(argv: list[str], command: str) -> None:
    """The command is the first word that is neither an option nor --log-format's value."""
    assert command_of(argv) == command


LEAVES = [
    ("check",), ("diff",), ("policy", "test"), ("policy", "check"), ("policy", "eval"), ("policy", "input"),
    ("audit", "verify"), ("audit", "show"), ("audit", "stats"), ("audit", "report"), ("audit", "prove"),
    ("audit", "verify-proof"), ("audit", "witness"), ("keys", "generate"), ("provenance", "sign"),
    ("provenance", "verify"),
    ("gateway", "serve"), ("gateway", "key"), ("verify-decision",), ("bench",), ("calibrate",), ("docs",),
]  # fmt: skip


@pytest.mark.parametrize("argv", LEAVES, ids=" ".join)
def test_every_commands_help_imports_nothing_heavy(argv: tuple[str, ...]) -> None:
    """`semgov CMD --help` loads none of numpy, pydantic, structlog, cryptography, YAML, Presidio or
    regorus: a command's work is imported when it runs (semgov.cli.check_run, diff_run, policy_run)."""
    heavy = sorted({m.split(".")[0] for m in imported(*argv, "--help") if m.split(".")[0] in HEAVY})
    assert heavy == []
