"""``semgov schema``: write or check the generated JSON Schemas."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from semgov.wire.schemas import render_all


def register(sub: Any) -> None:
    p = sub.add_parser(
        "schema",
        description="The JSON Schemas in schemas/ are generated from semgov's pydantic models. "
        "--write regenerates them; --check exits 1 when the files differ from the models.",
    )
    p.add_argument("--dir", type=Path, default=Path("schemas"), help="schema directory (default: schemas)")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="(re)write every schema file")
    mode.add_argument("--check", action="store_true", help="fail if any schema file is stale")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    stale = []
    for name, text in render_all().items():
        path = args.dir / name
        if args.write:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
        elif not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(path)
    for p in stale:
        print(f"stale: {p} (run `semgov schema --write`)")
    return 1 if stale else 0
