"""The files a bundle is built from, and where a verified bundle is unpacked for loading.

:func:`collect` reads what loading a policy reads (:func:`semgov.policy.files.policy_paths`: a
directory's ``policy.yaml`` or its ``*.rego`` modules, never hidden entries or temporary copies;
a single ``.yaml`` file becomes ``policy/policy.yaml``) and the keyring, and checks that both load
before anything is signed. :func:`unpack` writes a verified bundle's policy and keyring into a
new directory, completely, before it is renamed into place.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from semgov.bundle.archive import member_name
from semgov.bundle.bundle import KEYRING, POLICY_DIR, VerifiedBundle
from semgov.errors import BundleError
from semgov.policy.files import POLICY_FILE, policy_paths


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise BundleError(f"cannot read ({e.strerror})", source=str(path)) from e


def collect(policy: Path, keyring: Path) -> dict[str, bytes]:
    """Member name -> bytes for a semgov bundle of ``policy`` and ``keyring`` (both must load)."""
    from semgov.policy.source import load_policy_source
    from semgov.signing.keys import Keyring

    load_policy_source(policy)  # NOTE: raises PolicyError naming the file: nothing unloadable is signed
    ring = _read(keyring)
    Keyring.parse(ring, str(keyring))
    if policy.is_dir():
        files = {f"{POLICY_DIR}/{p.relative_to(policy).as_posix()}": _read(p) for p in policy_paths(policy)}
    else:
        files = {f"{POLICY_DIR}/{POLICY_FILE}": _read(policy)}
    return {**files, KEYRING: ring}


def unpack(bundle: VerifiedBundle, parent: Path) -> Path:
    """Write ``bundle``'s ``policy/`` and ``keyring.json`` under ``parent/<revision>-<digest>/``
    (written in a temporary directory, then renamed); returns that directory."""
    final = parent / f"{member_name(bundle.revision, source=bundle.source)}-{bundle.digest[7:19]}"
    if final.is_dir():
        return final  # NOTE: the same bytes were unpacked before (the name holds their digest)
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=parent))
    try:
        for name, body in bundle.policy_files().items():
            target = tmp / POLICY_DIR / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(body)
        (tmp / KEYRING).write_bytes(bundle.keyring())
        os.replace(tmp, final)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BundleError(f"cannot unpack into {parent} ({e.strerror})", source=bundle.source) from e
    return final


__all__ = ["collect", "unpack"]
