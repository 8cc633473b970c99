"""The docs agree with the code: commands marked runnable run as written, and the policy-input
fields docs/rego.md names are the schema's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "audit" / "README.md", ROOT / "examples" / "README.md",
        *sorted((ROOT / "docs").glob("*.md"))]  # fmt: skip
BLOCK = re.compile(r"^( *)```sh runnable\n(.*?)^\1```", re.S | re.M)
EXIT = re.compile(r"#\s*exit (\d+)")


def commands(text: str) -> list[tuple[str, int]]:
    """``(command, expected exit status)`` of every ``sh runnable`` block, in order: continuation
    lines joined, comment-only lines skipped, ``# exit N`` the expected status (default 0)."""
    out: list[tuple[str, int]] = []
    for m in BLOCK.finditer(text):
        body = textwrap.dedent(m.group(2))
        for cmd in re.sub(r"\\\n\s*", " ", body).splitlines():
            if cmd.strip() and not cmd.lstrip().startswith("#"):
                status = EXIT.search(cmd)
                out.append((cmd, int(status.group(1)) if status else 0))
    return out


RUNNABLE = [(doc, commands(doc.read_text(encoding="utf-8"))) for doc in DOCS]


def test_some_blocks_are_runnable() -> None:
    """README.md and docs/policy.md mark their policy roll-out commands runnable."""
    names = {doc.name for doc, cmds in RUNNABLE if cmds}
    assert {"README.md", "policy.md"} <= names


@pytest.mark.parametrize(("doc", "cmds"), [r for r in RUNNABLE if r[1]], ids=lambda x: getattr(x, "name", ""))
def test_runnable_commands_run_as_written(doc: Path, cmds: list[tuple[str, int]], tmp_path: Path) -> None:
    """Each file's runnable commands run in order in a scratch directory holding the repository's
    examples/ and policies/, `semgov` being this checkout's CLI, each with its documented exit status."""
    for name in ("examples", "policies"):
        (tmp_path / name).symlink_to(ROOT / name)
    bin_dir = tmp_path / ".bin"
    bin_dir.mkdir()
    shim = bin_dir / "semgov"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m semgov.cli.main "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    for cmd, status in cmds:
        proc = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=900)  # fmt: skip
        assert proc.returncode == status, f"{doc.name}: {cmd}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"


def _schema_fields() -> dict[str, set[str]]:
    schema = json.loads((ROOT / "schemas" / "policy_input.schema.json").read_text())
    defs = schema["$defs"]
    return {name: set(d.get("properties", {})) for name, d in defs.items()}


def test_rego_md_names_only_policy_input_fields() -> None:
    """Every field docs/rego.md lists for facts.provenance, facts.donor, facts.pii and facts.tokens is
    in the policy input schema, and none of the schema's is missing from the list."""
    text = (ROOT / "docs" / "rego.md").read_text(encoding="utf-8")
    defs = _schema_fields()
    for row, model in (("facts.provenance", "ProvenanceFacts"), ("facts.donor", "DonorFacts"),
                       ("facts.pii", "PiiFacts"), ("facts.tokens", "TokenFacts")):  # fmt: skip
        line = next(ln for ln in text.splitlines() if ln.startswith(f"| `{row}` |"))
        cell = line.split("|")[2]
        named = set(re.findall(r"[a-z][a-z0-9_]*", " ".join(re.findall(r"`([^`]*)`", cell))))
        fields = defs[model] | (defs["SpanFacts"] if model == "TokenFacts" else set())  # NOTE: spans[] items
        assert fields <= named, (row, sorted(fields - named))
        words = {w for w in named if "_" in w}  # NOTE: field names have an underscore; prose words may not
        assert words <= fields, (row, sorted(words - fields))
