"""``semgov docs [TOPIC]``: the project's documentation, offline, wherever semgov is installed.

The docs are README.md, audit/README.md and docs/*.md of the source. A wheel installs them under
``<prefix>/share/semgov/docs`` (pyproject.toml, ``data-files``); a source checkout reads them in
place. ``semgov docs`` lists the topics; ``semgov docs policy`` prints docs/policy.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from semgov.errors import InputError

_SOURCE = Path(__file__).resolve().parents[2]
_INSTALLED = Path(sys.prefix) / "share" / "semgov" / "docs"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "docs",
        help="read the documentation offline (topics: semgov docs)",
        description="List the documentation topics, or print one (Markdown) to stdout.",
    )
    p.add_argument(
        "topic", nargs="?", metavar="TOPIC", help="a topic from the list, e.g. policy, gateway, audit"
    )
    p.set_defaults(func=run)


def topics() -> dict[str, Path]:
    """Topic name -> file: from a source checkout if this is one, else the installed copies."""
    if (_SOURCE / "docs" / "policy.md").is_file():
        found = {"readme": _SOURCE / "README.md", "audit": _SOURCE / "audit" / "README.md"}
        found |= {f.stem: f for f in sorted((_SOURCE / "docs").glob("*.md"))}
        return {k: v for k, v in found.items() if v.is_file()}
    if _INSTALLED.is_dir():
        found = {("readme" if f.stem == "README" else f.stem): f for f in sorted(_INSTALLED.glob("*.md"))}
        audit = _INSTALLED / "audit" / "README.md"
        return found | ({"audit": audit} if audit.is_file() else {})
    return {}


def _title(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    return ""


def run(args: argparse.Namespace) -> int:
    found = topics()
    if not found:
        raise InputError(f"no documentation found (looked in {_SOURCE / 'docs'} and {_INSTALLED})")
    if args.topic is None:
        width = max(map(len, found))
        for name, path in found.items():
            print(f"{name:<{width}}  {_title(path)}")
        return 0
    chosen = found.get(args.topic.lower().removesuffix(".md"))
    if chosen is None:
        raise InputError(f"no topic {args.topic!r}; topics: {', '.join(found)}")
    sys.stdout.write(chosen.read_text(encoding="utf-8"))
    return 0
