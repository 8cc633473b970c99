"""Bundle test helpers: a fresh ES256 signer, the keys that trust it, and a raw tar.gz writer."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from semgov.bundle.bundle import build_bundle
from semgov.bundle.files import collect
from semgov.bundle.jws import BundleSigner, TrustedBundleKey, parse_trust
from tests.conftest import ROOT

POLICY = ROOT / "policies" / "default"
KEYRING = ROOT / "examples" / "keyring.json"


def make_signer(directory: Path, name: str) -> BundleSigner:
    """A new P-256 key written to ``directory/name.pem``, loaded as a signer named ``name``."""
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.pem").write_bytes(pem)
    return BundleSigner.load(directory / f"{name}.pem")


def trust_json(*signers: BundleSigner) -> bytes:
    return json.dumps({s.key_id: {"algorithm": "ES256", "key": s.public_pem()} for s in signers}).encode()


@dataclass
class Keys:
    signer: BundleSigner
    trust: dict[str, TrustedBundleKey]
    trust_file: Path

    def build(self, revision: str = "42", files: dict[str, bytes] | None = None) -> bytes:
        return build_bundle(files or collect(POLICY, KEYRING), revision, self.signer, issued_at=1_700_000_000)


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    signer = make_signer(tmp_path / "keys", "release")
    raw = trust_json(signer)
    (tmp_path / "keys" / "trust.json").write_bytes(raw)
    return Keys(signer, parse_trust(raw, source="trust.json"), tmp_path / "keys" / "trust.json")


def members(data: bytes) -> dict[str, bytes]:
    """The members of a tar.gz by name as written (leading ``/`` kept)."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return {i.name: tar.extractfile(i).read() for i in tar if i.isreg()}  # type: ignore[union-attr]


def raw_tarball(entries: list[tarfile.TarInfo | tuple[str, bytes]]) -> bytes:
    """A tar.gz of ``entries``: ``(name, body)`` regular files, or prepared TarInfo (links, ...)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for e in entries:
            if isinstance(e, tarfile.TarInfo):
                tar.addfile(e)
            else:
                info = tarfile.TarInfo(e[0])
                info.size = len(e[1])
                tar.addfile(info, io.BytesIO(e[1]))
    return gzip.compress(raw.getvalue(), mtime=0)


def repack(data: bytes, changes: dict[str, bytes | None]) -> bytes:
    """``data`` with members replaced, added (a new name) or removed (None); names without ``/``."""
    files = {n.removeprefix("/"): b for n, b in members(data).items()}
    for name, body in changes.items():
        if body is None:
            files.pop(name)
        else:
            files[name] = body
    return raw_tarball([("/" + n, b) for n, b in files.items()])
