"""Build and verify a signed policy bundle in OPA's bundle format.

A semgov bundle is an OPA bundle (a tar.gz) holding::

    /.manifest          {"revision": "42", "metadata": {"semgov": {"schema": "semgov.bundle/v1", ...}}}
    /policy/...         the policy: policy.yaml, or the *.rego modules of a Rego policy directory
    /keyring.json       the trust keyring decisions and provenance are verified with
    /.signatures.json   {"signatures": ["<compact JWS, ES256>"]}

The JWS payload lists every other member with its SHA-256 digest (:mod:`semgov.bundle.canonical`,
as OPA hashes them) and names the signing key (``kid`` header and the ``keyid`` claim), so
``opa run --bundle --verification-key`` and ``semgov bundle verify`` check the same thing.

:func:`verify_bundle` is pure (bytes in, a :class:`VerifiedBundle` out): it refuses, naming the
bundle and the member, a bundle that is unsigned or signed by a key that is not trusted, a member
changed, added or removed after signing, a malformed archive (:mod:`semgov.bundle.archive`), and a
revision older than the one running (unless forced).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from semgov.bundle.archive import read_tarball, write_tarball
from semgov.bundle.canonical import HASH_ALGORITHM, file_digest, parse_json, revision_number
from semgov.bundle.jws import BundleSigner, TrustedBundleKey, verify
from semgov.errors import BundleError

SCHEMA = "semgov.bundle/v1"
MANIFEST = ".manifest"
SIGNATURES = ".signatures.json"
POLICY_DIR = "policy"
KEYRING = "keyring.json"


@dataclass(frozen=True, slots=True)
class VerifiedBundle:
    """A bundle whose signature, member digests and revision order checked out."""

    source: str
    revision: str
    key_id: str
    digest: str  # sha256:<hex> of the tar.gz bytes
    files: dict[str, bytes]  # every member but .signatures.json, by name
    manifest: dict[str, Any]

    @property
    def number(self) -> int:
        return revision_number(self.revision, source=self.source)

    def policy_files(self) -> dict[str, bytes]:
        """The policy's files, by path below ``policy/``; raises unless this is a semgov bundle."""
        meta = self.manifest.get("metadata")
        ours = meta.get("semgov") if isinstance(meta, dict) else None
        if not isinstance(ours, dict) or ours.get("schema") != SCHEMA:
            raise BundleError(
                f"not a semgov policy bundle (manifest metadata.semgov.schema is not {SCHEMA})",
                source=self.source,
                field=MANIFEST,
            )
        out = {n[len(POLICY_DIR) + 1 :]: b for n, b in self.files.items() if n.startswith(POLICY_DIR + "/")}
        if not out:
            raise BundleError(f"holds no {POLICY_DIR}/ files", source=self.source)
        return out

    def keyring(self) -> bytes:
        if KEYRING not in self.files:
            raise BundleError(f"holds no {KEYRING}", source=self.source)
        return self.files[KEYRING]


def manifest_for(revision: str) -> bytes:
    """The ``.manifest`` of a semgov bundle at ``revision``."""
    doc = {
        "revision": revision,
        "metadata": {"semgov": {"schema": SCHEMA, "policy": POLICY_DIR + "/", "keyring": KEYRING}},
    }
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def build_bundle(files: dict[str, bytes], revision: str, signer: BundleSigner, *, issued_at: int) -> bytes:
    """The signed tar.gz of ``files`` (member name -> bytes; ``policy/...`` and ``keyring.json``)
    at ``revision``: a ``.manifest`` is added and every member is listed in the signature."""
    revision_number(revision, source="--revision")
    members = {MANIFEST: manifest_for(revision), **files}
    for name in members:
        if name.endswith("signatures.json"):
            raise BundleError("a member named *signatures.json is read by OPA as the signatures", field=name)
    listed = [
        {"name": n, "hash": file_digest(n, b, source=n), "algorithm": HASH_ALGORITHM}
        for n, b in sorted(members.items())
    ]
    payload = {"files": listed, "iat": issued_at, "iss": "semgov", "keyid": signer.key_id}
    sigs = json.dumps({"signatures": [signer.sign(payload)]}, indent=1).encode()
    return write_tarball({**members, SIGNATURES: sigs})


def _signed_files(
    members: dict[str, bytes], trust: dict[str, TrustedBundleKey], source: str
) -> tuple[dict[str, str], str]:
    """Digest by name from the one trusted JWS in ``.signatures.json``, and the key id that signed it."""
    if SIGNATURES not in members:
        raise BundleError("missing: the bundle is not signed", source=source, field=SIGNATURES)
    doc = parse_json(members[SIGNATURES], source=source, field=SIGNATURES)
    tokens = doc.get("signatures") if isinstance(doc, dict) else None
    if not isinstance(tokens, list) or len(tokens) != 1 or not isinstance(tokens[0], str):
        raise BundleError('expected {"signatures": ["<one JWS>"]}', source=source, field=SIGNATURES)
    payload, kid = verify(tokens[0], trust, source=source)
    listed = payload.get("files")
    if not isinstance(listed, list):
        raise BundleError("the signed payload has no files list", source=source, field=SIGNATURES)
    digests: dict[str, str] = {}
    for f in listed:
        if (
            not isinstance(f, dict)
            or not isinstance(f.get("name"), str)
            or not isinstance(f.get("hash"), str)
        ):
            raise BundleError("a signed file entry is malformed", source=source, field=SIGNATURES)
        name = f["name"].removeprefix("/")
        if f.get("algorithm") != HASH_ALGORITHM:
            raise BundleError(
                f"signed with hash {str(f.get('algorithm'))[:20]!r}, expected SHA-256",
                source=source,
                field=name,
            )
        if name in digests:
            raise BundleError("listed twice in the signature", source=source, field=name)
        digests[name] = f["hash"].lower()
    return digests, kid


def check_order(revision: str, running: str | None, *, source: str, force: bool = False) -> None:
    """Refuse a revision older than ``running`` (or another label at the same number), unless forced."""
    new = revision_number(revision, source=source)
    if running is None or force:
        return
    old = revision_number(running, source="running revision")
    if new < old:
        raise BundleError(
            f"revision {revision} is older than the running revision {running}: "
            "a rollback is refused unless forced",
            source=source,
            field=MANIFEST,
        )
    if new == old and revision != running:
        raise BundleError(
            f"revision {revision} has the same number as the running revision {running}",
            source=source,
            field=MANIFEST,
        )


def verify_bundle(
    data: bytes,
    trust: dict[str, TrustedBundleKey],
    *,
    source: str,
    running: str | None = None,
    force: bool = False,
) -> VerifiedBundle:
    """Verify a bundle's bytes; raises :class:`BundleError` naming ``source`` and the member at fault."""
    members = read_tarball(data, source=source)
    for name in members:
        if name != SIGNATURES and name.endswith("signatures.json"):
            raise BundleError(
                "OPA reads any *signatures.json member as the signatures", source=source, field=name
            )
    digests, kid = _signed_files(members, trust, source)
    files = {n: b for n, b in members.items() if n != SIGNATURES}
    for name, body in files.items():
        if name not in digests:
            raise BundleError(
                "not included in the bundle signature (added after signing)", source=source, field=name
            )
        if file_digest(name, body, source=source) != digests[name]:
            raise BundleError("digest mismatch: changed after signing", source=source, field=name)
    for name in sorted(set(digests) - set(files)):
        raise BundleError(
            "signed but missing from the bundle (removed after signing)", source=source, field=name
        )
    if MANIFEST not in files:
        raise BundleError("missing: the bundle has no revision", source=source, field=MANIFEST)
    manifest = parse_json(files[MANIFEST], source=source, field=MANIFEST)
    revision = manifest.get("revision") if isinstance(manifest, dict) else None
    if type(revision) is not str:  # NOTE: a JSON number parses to a str subclass
        raise BundleError("no revision string", source=source, field=MANIFEST)
    check_order(revision, running, source=source, force=force)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    return VerifiedBundle(source, revision, kid, digest, files, manifest)


__all__ = [
    "KEYRING",
    "MANIFEST",
    "POLICY_DIR",
    "SCHEMA",
    "SIGNATURES",
    "VerifiedBundle",
    "build_bundle",
    "check_order",
    "manifest_for",
    "verify_bundle",
]
