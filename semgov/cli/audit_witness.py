"""``semgov audit witness``: a second party that cosigns logs' checkpoints (c2sp.org/tlog-witness)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

WITNESS_EPILOG = (
    "exit status: 0 every log's latest checkpoint is cosigned (now or before); 1 the witness refused "
    "at least one (each refusal is printed with its log, its tlog-witness status and why: 403 not "
    "signed by a trusted log key, 409 a rollback or a fork at a size it cosigned, 422 not consistent "
    "with what it cosigned before); 2 bad input."
)


def register_witness(a: Any) -> None:
    w = a.add_parser(
        "witness",
        help="cosign logs' checkpoints as a witness (C2SP cosignature/v1), refusing forks and rollbacks",
        description="For each log, check its latest checkpoint against the one this witness last "
        "cosigned for the same origin (kept in --state): signed by a trusted log key, not smaller, "
        "the same root at the same size, and consistent with it by an RFC 6962 consistency proof "
        "computed from the log's records; then cosign it (c2sp.org/tlog-cosignature, cosignature/v1), "
        "store the new state atomically, and write the cosigned note into the log's cosignatures/ "
        "directory, where `semgov audit verify --witness-key` checks it. A fork or rollback is never "
        "cosigned. The first checkpoint of an origin the witness never saw is taken on first use.",
        epilog=WITNESS_EPILOG,
    )
    w.add_argument(
        "logs", type=Path, nargs="*", metavar="LOGDIR", help="log directories, or fleet directories"
    )
    w.add_argument("--key", type=Path, required=True, metavar="KEY", help="the witness's Ed25519 private PEM")
    w.add_argument("--name", default="semgov-witness", help="the witness's key name (default semgov-witness)")
    w.add_argument("--state", type=Path, required=True, metavar="DIR", help="the witness's state directory")
    keys = w.add_mutually_exclusive_group(required=True)
    keys.add_argument(
        "--pubkey", type=Path, metavar="KEY", help="the logs' checkpoint signing key (public PEM)"
    )
    keys.add_argument("--keyring", type=Path, metavar="FILE", help="audit keyring of the logs' keys")
    w.add_argument("--print-key", action="store_true", help="print the witness's verifier key and exit")
    w.set_defaults(func=run_witness)


def run_witness(args: argparse.Namespace) -> int:
    import time

    from semgov.audit.cosign import cosigner_vkey
    from semgov.audit.fleet_dir import find_logs
    from semgov.audit.keyring import AuditKeyring
    from semgov.audit.note import NoteError
    from semgov.audit.witness_dir import WitnessState, witness_log
    from semgov.errors import InputError
    from semgov.signing.keys import load_public_key, load_signing_key

    key = load_signing_key(args.key).private_key
    try:
        vkey = cosigner_vkey(args.name, key.public_key())
    except NoteError as e:
        raise InputError(f"--name: {e}") from None
    print(f"witness key: {vkey}")
    if args.print_key:
        return 0
    if not args.logs:
        raise InputError("give the log directories to witness")
    ring = (
        AuditKeyring.single(load_public_key(args.pubkey)) if args.pubkey else AuditKeyring.load(args.keyring)
    )
    logs = find_logs(args.logs) or [(args.logs[0].name, args.logs[0])]
    refused = 0
    with WitnessState(args.state) as st:
        for _, d in logs:
            out = witness_log(st, d, ring, name=args.name, key=key, now=int(time.time()))
            if out.status in (200, 304):
                where = f" -> {out.note}" if out.note is not None else ""
                print(f"{d}: {out.origin} size {out.size}: {out.message}{where}")
            else:
                refused += 1
                print(f"REFUSED {d}/checkpoint: {out.origin} size {out.size}: {out.status} {out.message}")
    return 1 if refused else 0
