"""``semgov keys generate``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser("keys", help="manage Ed25519 signing keys", description="Manage Ed25519 signing keys.")
    ks = p.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    g = ks.add_parser(
        "generate",
        help="create a signing key pair",
        description="Create an Ed25519 key pair: DIR/signing-key.pem (PKCS#8 PEM, mode 0600) and "
        "DIR/signing-key.pub.pem (SubjectPublicKeyInfo PEM). Prints the key id decision records will name.",
    )
    g.add_argument("--out", required=True, type=Path, metavar="DIR", help="directory for the pair (created)")
    g.add_argument("--force", action="store_true", help="overwrite an existing pair")
    g.set_defaults(func=run_generate)


def run_generate(args: argparse.Namespace) -> int:
    from semgov.signing.keys import generate_keypair, key_id_for, load_signing_key

    priv, pub = generate_keypair(args.out, overwrite=args.force)
    kid = key_id_for(load_signing_key(priv).public_key)
    print(f"wrote {priv} (private, mode 0600)")
    print(f"wrote {pub} (public)")
    print(f"key id {kid}")
    return 0
