"""Signed bundles: a round trip, and every kind of tampering refused naming the file and the problem."""

from __future__ import annotations

import json

import pytest

from semgov.bundle.bundle import build_bundle, check_order, verify_bundle
from semgov.bundle.canonical import file_digest
from semgov.bundle.jws import b64url, parse_trust
from semgov.errors import BundleError
from tests.bundle.conftest import POLICY, Keys, make_signer, members, raw_tarball, repack, trust_json


def refused(data: bytes, keys: Keys, **kw: object) -> str:
    """The diagnostic verifying ``data`` as ``b.tar.gz`` raises."""
    with pytest.raises(BundleError) as e:
        verify_bundle(data, keys.trust, source="b.tar.gz", **kw)  # type: ignore[arg-type]
    return e.value.diagnostic()


def test_a_built_bundle_verifies_and_carries_the_policy_and_keyring(keys: Keys) -> None:
    """Build then verify: the revision, the signing key and the policy's and keyring's bytes come back."""
    v = verify_bundle(keys.build("42"), keys.trust, source="b.tar.gz")
    assert (v.revision, v.key_id) == ("42", "release")
    assert v.policy_files() == {"policy.yaml": (POLICY / "policy.yaml").read_bytes()}
    assert json.loads(v.keyring())["keys"]
    assert sorted(members(keys.build())) == [
        "/.manifest",
        "/.signatures.json",
        "/keyring.json",
        "/policy/policy.yaml",
    ]


def test_a_bundle_signed_by_an_untrusted_key_is_refused(keys: Keys, tmp_path: object) -> None:
    """A well-formed bundle signed by a key the verifier does not trust names the key and the file."""
    from pathlib import Path

    other = make_signer(Path(str(tmp_path)) / "other", "intruder")
    data = build_bundle({"keyring.json": b"{}"}, "43", other, issued_at=1)
    assert refused(data, keys) == "b.tar.gz: .signatures.json: signed by key 'intruder', which is not trusted"


def test_a_signature_by_another_key_under_a_trusted_key_id_is_refused(keys: Keys, tmp_path: object) -> None:
    """A key that claims a trusted key id does not verify."""
    from pathlib import Path

    impostor = make_signer(Path(str(tmp_path)) / "imp", "release")
    data = build_bundle({"keyring.json": b"{}"}, "43", impostor, issued_at=1)
    assert "signature does not verify with trusted key 'release'" in refused(data, keys)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"policy/policy.yaml": b"name: evil\n"},
            "b.tar.gz: policy/policy.yaml: digest mismatch: changed after signing",
        ),
        ({"keyring.json": b'{"keys": []}'}, "b.tar.gz: keyring.json: digest mismatch: changed after signing"),
        (
            {"policy/extra.rego": b"package x\n"},
            "b.tar.gz: policy/extra.rego: not included in the bundle signature (added after signing)",
        ),
        (
            {"policy/policy.yaml": None},
            "b.tar.gz: policy/policy.yaml: signed but missing from the bundle (removed after signing)",
        ),
        ({".signatures.json": None}, "b.tar.gz: .signatures.json: missing: the bundle is not signed"),
        (
            {".manifest": None},
            "b.tar.gz: .manifest: signed but missing from the bundle (removed after signing)",
        ),
    ],
    ids=["changed", "keyring-changed", "added", "removed", "unsigned", "no-manifest"],
)
def test_a_changed_added_or_removed_member_is_refused(
    keys: Keys, change: dict[str, bytes | None], expected: str
) -> None:
    """Each member changed, added or removed after signing is refused, naming it."""
    assert refused(repack(keys.build(), change), keys) == expected


def test_the_manifest_is_compared_as_json_not_bytes(keys: Keys) -> None:
    """As in OPA, re-indenting the .manifest keeps its digest; changing its revision does not."""
    data = keys.build("42")
    manifest = json.loads(members(data)["/.manifest"])
    same = repack(data, {".manifest": json.dumps(manifest, separators=(",", ":")).encode()})
    assert verify_bundle(same, keys.trust, source="b").revision == "42"
    manifest["revision"] = "99"
    assert refused(repack(data, {".manifest": json.dumps(manifest).encode()}), keys) == (
        "b.tar.gz: .manifest: digest mismatch: changed after signing"
    )


def test_a_rollback_is_refused_unless_forced(keys: Keys) -> None:
    """Revision 41 while 42 runs is refused naming both; forced, it verifies; 42 and 43 pass."""
    old = keys.build("41")
    assert refused(old, keys, running="42") == (
        "b.tar.gz: .manifest: revision 41 is older than the running revision 42: "
        "a rollback is refused unless forced"
    )
    assert verify_bundle(old, keys.trust, source="b", running="42", force=True).revision == "41"
    assert verify_bundle(keys.build("43"), keys.trust, source="b", running="42").revision == "43"
    assert verify_bundle(keys.build("42"), keys.trust, source="b", running="42").revision == "42"


def test_revisions_are_ordered_by_their_number() -> None:
    """Labels do not order: 10-b is newer than 9-z; the same number under another label is refused."""
    check_order("10-b", "9-z", source="b")
    with pytest.raises(BundleError, match="same number"):
        check_order("10-a", "10-b", source="b")
    with pytest.raises(BundleError, match="not a number optionally followed by a label"):
        check_order("v1.2", None, source="b")


def test_a_bundle_with_two_signatures_or_a_bad_token_is_refused(keys: Keys) -> None:
    """OPA takes exactly one JWT; a malformed one is refused naming .signatures.json."""
    data = keys.build()
    token = json.loads(members(data)["/.signatures.json"])["signatures"][0]
    two = repack(data, {".signatures.json": json.dumps({"signatures": [token, token]}).encode()})
    assert refused(two, keys) == 'b.tar.gz: .signatures.json: expected {"signatures": ["<one JWS>"]}'
    bad = repack(data, {".signatures.json": json.dumps({"signatures": ["a.b"]}).encode()})
    assert refused(bad, keys).startswith("b.tar.gz: .signatures.json: not a compact JWS")
    h, p, s = token.split(".")
    payload = json.loads(__import__("base64").urlsafe_b64decode(p + "=="))
    payload["files"] = payload["files"][:1]
    forged = repack(
        data,
        {
            ".signatures.json": json.dumps(
                {"signatures": [f"{h}.{b64url(json.dumps(payload).encode())}.{s}"]}
            ).encode()
        },
    )
    assert "signature does not verify" in refused(forged, keys)


def test_an_opa_style_bundle_with_data_json_verifies(keys: Keys) -> None:
    """A bundle laid out as `opa build` writes it (/data.json, /.manifest, a module, leading slashes)
    verifies: data.json and .manifest digests are taken of their canonical JSON."""
    data_json = b'{"b": 1.50, "a": ["x", {"z": null, "y": true}]}'
    manifest = b'{"revision": "7", "roots": [""]}'
    files = {"data.json": data_json, ".manifest": manifest, "x/policy.rego": b"package x\nallow := true\n"}
    listed = [
        {
            "name": "/" + n if n != ".manifest" else n,
            "hash": file_digest(n, b, source=n),
            "algorithm": "SHA-256",
        }
        for n, b in files.items()
    ]
    token = keys.signer.sign({"files": listed})
    sigs = json.dumps({"signatures": [token]}).encode()
    data = raw_tarball([("/" + n, b) for n, b in files.items()] + [("/.signatures.json", sigs)])
    v = verify_bundle(data, keys.trust, source="opa.tar.gz")
    assert v.revision == "7" and sorted(v.files) == [".manifest", "data.json", "x/policy.rego"]
    with pytest.raises(BundleError, match="not a semgov policy bundle"):
        v.policy_files()


def test_a_signing_key_that_is_not_p256_is_refused(tmp_path: object) -> None:
    """An Ed25519 key (semgov's own kind) cannot sign a bundle: refused naming the file."""
    from pathlib import Path

    from semgov.bundle.jws import BundleSigner
    from semgov.signing.keys import generate_keypair

    priv, _ = generate_keypair(Path(str(tmp_path)) / "ed")
    with pytest.raises(Exception, match=f"{priv}: not an ECDSA P-256 private key"):
        BundleSigner.load(priv)


def test_trust_files_refuse_other_algorithms_and_keys(keys: Keys) -> None:
    """Only ES256 P-256 keys are trusted; each wrong entry is named."""
    with pytest.raises(Exception, match="semgov bundles are signed with ES256"):
        parse_trust(b'{"k": {"algorithm": "RS256", "key": "x"}}', source="t.json")
    with pytest.raises(Exception, match="t.json: k: not a PEM public key"):
        parse_trust(b'{"k": {"algorithm": "ES256", "key": "x"}}', source="t.json")
    assert set(parse_trust(trust_json(keys.signer), source="t")) == {"release"}
