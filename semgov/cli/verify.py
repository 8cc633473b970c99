"""``semgov verify-decision``: check decision record signatures."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from semgov import log
from semgov.errors import InputError, SignatureError


def register(sub: Any) -> None:
    p = sub.add_parser(
        "verify-decision",
        help="check the signatures of decision records",
        description="Verify decision records (JSON Lines, as written by `semgov check --format jsonl` "
        "or --out) against a public key. Reports every bad record by line; exit 1 if any fails.",
    )
    p.add_argument("file", metavar="FILE", help="decision records, one JSON object per line ('-' for stdin)")
    p.add_argument(
        "--pubkey", required=True, type=Path, metavar="KEY", help="SubjectPublicKeyInfo PEM public key"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from semgov.signing.keys import load_public_key
    from semgov.signing.records import verify_record_json

    logger = log.get_logger()
    key = load_public_key(args.pubkey)
    name = args.file
    try:
        f = open(0 if name == "-" else name, "rb")  # noqa: SIM115
    except OSError as e:
        raise InputError(f"cannot open: {e.strerror}", source=name) from e
    good = bad = 0
    with f:
        for n, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                verify_record_json(raw, key)
                good += 1
            except SignatureError as e:
                bad += 1
                logger.error(f"{name}:{n}: {e}")
    print(f"{good + bad} records: {good} valid, {bad} invalid")
    if good + bad == 0:
        logger.error(f"{name}: no decision records found")
    return 1 if bad or good == 0 else 0
