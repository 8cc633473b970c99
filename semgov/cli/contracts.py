"""``semgov contracts``: check a response contracts file, and compare two answers the way it says.

``check`` lints the file (exit 0 and one line per contract, 2 with ``file:line: problem``);
``compare`` compares a cold and a warm answer under one contract (exit 1 when warm regressed).
docs/policy.md "Comparing answers: response contracts" says how a team writes a contract.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from semgov.errors import InputError

MAX_ANSWER_FILE_BYTES = 16 << 20
_CONTRACT = re.compile(r"(?P<id>.+?)(?:@(?P<sha>[0-9a-f]{64}))?")

_COMPARE = """\
The answers are the files' text (one trailing line break is not part of it); without token ids,
an answer changed when its text did. Under an exact contract (and any contract the file does not
list) the whole answer is the required value; under required_values, the values its patterns match
or its JSON schema marks required. Exit 0: warm did not regress; 1: it did (exact: the answer
changed; required_values: a required value changed); 2: bad input."""


def _contract(text: str) -> dict[str, str]:
    """``--contract ID[@SHA256]``: a response contract as a request names it."""
    m = _CONTRACT.fullmatch(text)
    if m is None or "@" in m.group("id"):
        raise argparse.ArgumentTypeError(f"not ID or ID@SHA256 (64 lowercase hex digits): {text!r}")
    out = {"id": m.group("id")}
    if m.group("sha"):
        out["schema_sha256"] = m.group("sha")
    return out


def register(sub: Any) -> None:
    p = sub.add_parser(
        "contracts",
        help="check response contracts and compare two answers the way a contract says",
        description="A response contract says how two answers to a request are compared: exactly, or "
        "by the required values its JSON schema or named patterns pick out (docs/policy.md, 'Comparing "
        "answers: response contracts'). semgov bench compares by it (--contracts).",
    )
    ps = p.add_subparsers(dest="contracts_command", metavar="ACTION", required=True)
    c = ps.add_parser(
        "check",
        help="check a contracts file",
        description="Load FILE as semgov bench does: exit 0 with one line per contract (its revision and "
        "how it compares), 2 with file:line: problem (unknown keys, wrong types, a regular expression that "
        "does not compile, a contract listed twice, ...).",
    )
    c.add_argument("file", type=Path, metavar="FILE")
    c.set_defaults(func=run_check)
    m = ps.add_parser(
        "compare",
        help="compare a cold and a warm answer under one contract",
        description="Compare the answer in --warm with the one in --cold under contract --contract of "
        "FILE, and print what changed (answer, required values, the values lost and gained). " + _COMPARE,
    )
    m.add_argument("file", type=Path, metavar="FILE", help="the contracts file")
    m.add_argument(
        "--contract",
        required=True,
        type=_contract,
        metavar="ID[@SHA256]",
        help="the request's response contract: its id, and its schema_sha256 to pick that revision's entry",
    )
    m.add_argument("--cold", required=True, type=Path, metavar="TEXTFILE", help="the answer served cold")
    m.add_argument("--warm", required=True, type=Path, metavar="TEXTFILE", help="the answer with reuse")
    m.add_argument(
        "--format", choices=("text", "json"), default="text", help="text (default) or one JSON object"
    )
    m.set_defaults(func=run_compare)


def run_check(args: argparse.Namespace) -> int:
    from semgov.contracts import load_contracts

    contracts = load_contracts(args.file)
    print(f"{args.file}: OK ({len(contracts.entries)} contracts; any other compares exact)")
    for spec in contracts.entries:
        print(f"  line {spec.line}: {spec.describe()}")
    return 0


def _answer(path: Path) -> str:
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_ANSWER_FILE_BYTES + 1)
    except OSError as e:
        raise InputError(f"cannot read the answer ({e.strerror or e})", source=str(path)) from e
    if len(raw) > MAX_ANSWER_FILE_BYTES:
        raise InputError(f"answer file larger than {MAX_ANSWER_FILE_BYTES >> 20} MiB", source=str(path))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"answer is not UTF-8 (byte {e.start})", source=str(path)) from e
    return text.removesuffix("\n").removesuffix("\r")


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def run_compare(args: argparse.Namespace) -> int:
    from semgov.contracts import load_contracts

    spec = load_contracts(args.file).spec(args.contract)
    result = spec.compare_answers(_answer(args.cold), _answer(args.warm))
    if args.format == "json":
        print(json.dumps({"contract": spec.describe(), **result.as_dict()}, ensure_ascii=False))
    else:
        listed = "" if spec.line is not None else " (not in the file: the default)"
        print(f"contract: {spec.describe()}{listed}")
        print(f"answer changed: {_yes(result.answer_changed)}")
        print(f"required values changed: {_yes(result.values_changed)}")
        for v in result.lost:
            print(f"  lost:   {v}")
        for v in result.gained:
            print(f"  gained: {v}")
        print(f"detail: {result.detail}")
        print(f"regressed: {_yes(result.regressed)}")
    return 1 if result.regressed else 0
