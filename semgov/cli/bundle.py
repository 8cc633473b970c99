"""``semgov bundle keygen|build|verify``: signed policy bundles in OPA's bundle format."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

HELP = "build and verify signed policy bundles (OPA's bundle format)"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "bundle",
        help=HELP,
        description="Signed policy bundles: a policy and its trust keyring in one OPA bundle (tar.gz with "
        ".manifest and .signatures.json), signed with an ES256 key (docs/bundles.md).",
    )
    bs = p.add_subparsers(dest="bundle_command", metavar="ACTION", required=True)
    k = bs.add_parser(
        "keygen",
        help="create an ES256 bundle signing key and the trust file that verifies it",
        description="Write DIR/NAME.pem (P-256 private key, PKCS#8 PEM, mode 0600) and DIR/NAME.trust.json "
        "(the keys object semgov bundle verify --trust, SEMGOV_BUNDLE_TRUST and OPA's keys config take).",
    )
    k.add_argument("--out", required=True, type=Path, metavar="DIR", help="directory for the key (created)")
    k.add_argument("--name", default="bundle-signer", help="key id and file name (default: bundle-signer)")
    k.set_defaults(func=run_keygen)
    b = bs.add_parser(
        "build",
        help="sign a policy and its keyring into a bundle",
        description="Build a signed bundle of POLICY (a policy directory or .yaml file) and the keyring. "
        "Both must load. The revision must be a number, optionally with a label (42, 20261207065300, "
        "1337-3f2a9c1): workers never install a lower number than the one they run unless forced.",
    )
    b.add_argument("policy", type=Path, metavar="POLICY", help="policy directory or .yaml file")
    b.add_argument("--keyring", required=True, type=Path, help="trust keyring JSON the policy decides with")
    b.add_argument("--key", required=True, type=Path, help="ES256 (P-256) private key, PEM")
    b.add_argument("--key-id", default=None, help="key id the signature names (default: the key file's name)")
    b.add_argument("--revision", required=True, help="the bundle revision (a number, optionally -label)")
    b.add_argument("-o", "--out", required=True, type=Path, help="bundle file to write (.tar.gz)")
    b.set_defaults(func=run_build)
    v = bs.add_parser(
        "verify",
        help="check a bundle's signature, every member's digest and its revision",
        description="Verify BUNDLE: signed by a trusted key, no member changed, added or removed, a "
        "well-formed archive, and (with --not-older-than) not a rollback. Exit 0 verified, 2 refused.",
    )
    v.add_argument("bundle", type=Path, metavar="BUNDLE", help="bundle file (.tar.gz)")
    v.add_argument("--trust", required=True, type=Path, help="trusted bundle keys (JSON, OPA's keys shape)")
    v.add_argument("--not-older-than", default=None, metavar="REV", help="refuse a revision below REV")
    v.add_argument("--json", action="store_true", help="print the result as JSON")
    v.set_defaults(func=run_verify)


def run_keygen(args: argparse.Namespace) -> int:
    import os

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from semgov.bundle.jws import ALGORITHM
    from semgov.errors import KeyFileError

    priv_path, trust_path = args.out / f"{args.name}.pem", args.out / f"{args.name}.trust.json"
    if priv_path.exists():
        raise KeyFileError("exists; not overwritten", source=str(priv_path))
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode("ascii")
    )
    args.out.mkdir(parents=True, exist_ok=True)
    fd = os.open(priv_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    trust_path.write_text(json.dumps({args.name: {"algorithm": ALGORITHM, "key": public}}, indent=2) + "\n")
    print(f"wrote {priv_path} (private, mode 0600)")
    print(f"wrote {trust_path} (trusted keys)")
    return 0


def run_build(args: argparse.Namespace) -> int:
    from semgov.bundle.bundle import build_bundle
    from semgov.bundle.files import collect
    from semgov.bundle.jws import BundleSigner

    signer = BundleSigner.load(args.key, args.key_id)
    data = build_bundle(collect(args.policy, args.keyring), args.revision, signer, issued_at=int(time.time()))
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(args.out)  # NOTE: a watcher never sees a half-written bundle under the final name
    print(f"wrote {args.out}: revision {args.revision}, signed by {signer.key_id}, {len(data)} bytes")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    from semgov.bundle.bundle import verify_bundle
    from semgov.bundle.jws import read_trust
    from semgov.errors import BundleError

    trust = read_trust(args.trust)
    try:
        with args.bundle.open("rb") as f:
            data = f.read(64 << 20)
    except OSError as e:
        raise BundleError(f"cannot read ({e.strerror})", source=str(args.bundle)) from e
    v = verify_bundle(data, trust, source=str(args.bundle), running=args.not_older_than)
    result = {"bundle": str(args.bundle), "revision": v.revision, "key_id": v.key_id, "digest": v.digest}
    if args.json:
        print(json.dumps({**result, "files": sorted(v.files)}))
    else:
        print(
            f"{args.bundle}: verified: revision {v.revision}, signed by {v.key_id}, "
            f"{len(v.files)} files, {v.digest}"
        )
    return 0
