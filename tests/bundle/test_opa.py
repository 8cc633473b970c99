"""What real OPA checks of a semgov bundle, through the OPA (v1.20.2) embedded in
opa-golib-python-bindings: its JWT code verifies the bundle signature, and its hashing of the
policy and of the manifest's canonical JSON gives the digests the signature lists.

NOTE: no `opa` executable or Go toolchain is available offline here, so OPA's own bundle loader
(`opa run --bundle --verification-key`) is not run; these are the parts of it OPA exposes to Rego."""

from __future__ import annotations

import base64
import json

import pytest

from tests.bundle.conftest import Keys, members

opa_bindings = pytest.importorskip("opa_bindings")

CHECK = """package check
signature_ok := io.jwt.verify_es256(input.token, input.pem)
payload := io.jwt.decode(input.token)[1]
policy_hash := crypto.sha256(input.policy)
manifest_hash := crypto.sha256(json.marshal(json.unmarshal(input.manifest)))
"""


def _opa(keys: Keys, token: str, files: dict[str, bytes]) -> dict[str, object]:
    engine = opa_bindings.OpaEngine()
    try:
        engine.add_policy("check.rego", CHECK)
        pem = keys.signer.public_pem()
        doc = {
            "token": token,
            "pem": pem,
            "policy": files["/policy/policy.yaml"].decode(),
            "manifest": files["/.manifest"].decode(),
        }
        result: dict[str, object] = engine.eval_document("check", doc)
        return result
    finally:
        engine.close()


def test_opa_verifies_the_signature_and_the_digests(keys: Keys) -> None:
    """OPA's io.jwt.verify_es256 accepts the bundle's JWS; OPA's SHA-256 of the policy and of the
    manifest's canonical JSON equal the digests the signed payload lists."""
    files = members(keys.build("42"))
    token = json.loads(files["/.signatures.json"])["signatures"][0]
    out = _opa(keys, token, files)
    listed = {f["name"]: f["hash"] for f in out["payload"]["files"]}  # type: ignore[index]
    assert out["signature_ok"] is True
    assert listed["policy/policy.yaml"] == out["policy_hash"]
    assert listed[".manifest"] == out["manifest_hash"]


def test_opa_refuses_a_tampered_signature(keys: Keys) -> None:
    """A payload changed after signing does not verify in OPA either."""
    files = members(keys.build("42"))
    h, p, s = json.loads(files["/.signatures.json"])["signatures"][0].split(".")
    payload = json.loads(base64.urlsafe_b64decode(p + "=" * (-len(p) % 4)))
    payload["files"] = payload["files"][1:]
    forged = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()
    assert _opa(keys, f"{h}.{forged}.{s}", files)["signature_ok"] is False
