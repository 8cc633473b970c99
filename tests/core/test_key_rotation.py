"""Rotating the hook's keys (issue 12, item 7): the signing/checkpoint key and the gateway context key.

The hook's governor is built from real settings files (``make_hook_files``): a signing key rotated
while its audit log continues (``SEMGOV_AUDIT_KEYRING`` names the previous key), and a gateway
context key rotated with a grace period (``SEMGOV_CONTEXT_KEY_PREVIOUS``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine_hooks.core.governor import Governor
from engine_hooks.core.settings import HookConfigError, HookSettings
from semgov.audit.keyring import AuditKeyring
from semgov.audit.verify_dir import verify_log
from semgov.context import make_context_token
from semgov.signing.keys import generate_keypair, key_id_for, load_public_key
from tests.core.files import AUDIENCE, CONTRACT, TASK, HookFiles

ENGINE = "sglang 0.5.23"


def _governor(files: HookFiles, **env: str) -> Governor:
    return Governor(HookSettings.from_env(files.env(SEMGOV_DETOKENIZER="none", **env)), engine_name=ENGINE)


def _token(secret: bytes) -> str:
    return make_context_token(
        secret, audience=AUDIENCE, tenant="acme", namespace="docs", task=TASK, response_contract=CONTRACT
    )


def _entry(pub: Path, **validity: int) -> dict[str, object]:
    return {"key_id": key_id_for(load_public_key(pub)), "public_key": pub.read_text(), **validity}


def test_hook_signing_key_rotation_continues_its_audit_log(hook_files: HookFiles, tmp_path: Path) -> None:
    """A new SEMGOV_SIGNING_KEY continues the log only given SEMGOV_AUDIT_KEYRING; a keyring verifies it."""
    gov = _governor(hook_files)
    gov.event("reuse_disabled", detail="before the rotation")
    gov.close()
    old_pub = hook_files.signing_key.with_name("signing-key.pub.pem")
    new_priv, new_pub = generate_keypair(tmp_path / "new-key")
    trust = json.loads(hook_files.trust.read_text())
    trust["keys"].append(_entry(new_pub))
    hook_files.trust.write_text(json.dumps(trust))
    with pytest.raises(HookConfigError, match="SEMGOV_AUDIT_KEYRING"):
        _governor(hook_files, SEMGOV_SIGNING_KEY=str(new_priv))
    previous = tmp_path / "audit-keyring.json"
    previous.write_text(json.dumps({"keys": [_entry(old_pub)]}))
    gov = _governor(hook_files, SEMGOV_SIGNING_KEY=str(new_priv), SEMGOV_AUDIT_KEYRING=str(previous))
    gov.event("reuse_disabled", detail="after the rotation")
    gov.close()
    rotated = tmp_path / "rotated.json"
    rotated.write_text(
        json.dumps({"keys": [_entry(old_pub, not_after_size=1), _entry(new_pub, not_before_size=1)]})
    )
    rep = verify_log(hook_files.audit_dir, keyring=AuditKeyring.load(rotated), workers=1)
    assert rep.ok and rep.records == 2 and rep.anchored == 2, rep.problems


def test_previous_context_key_is_accepted_only_during_its_grace_period(
    hook_files: HookFiles, tmp_path: Path
) -> None:
    """Tokens MACed with the previous gateway key verify only while SEMGOV_CONTEXT_KEY_PREVIOUS names it."""
    old_secret = hook_files.context_secret
    new_key = tmp_path / "context-new.key"
    new_key.write_bytes(b"the-next-gateway-secret-0123456789abcdefgh")
    old_token, new_token = _token(old_secret), _token(new_key.read_bytes())
    gov = _governor(hook_files, SEMGOV_CONTEXT_KEY=str(new_key))
    try:
        assert gov.context_of(new_token) is not None and gov.context_of(old_token) is None
    finally:
        gov.close()
    gov = _governor(
        hook_files, SEMGOV_CONTEXT_KEY=str(new_key), SEMGOV_CONTEXT_KEY_PREVIOUS=str(hook_files.context_key)
    )
    try:
        old_ctx, new_ctx = gov.context_of(old_token), gov.context_of(new_token)
        assert old_ctx is not None and old_ctx == new_ctx
        # Scopes and tree keys come from the current key only: one scope per tenant during the grace period.
        assert old_ctx.scope(gov.context_key) == new_ctx.scope(gov.context_key)
        assert gov.context_of(_token(b"some-other-gateway-secret-0123456789abcd")) is None
    finally:
        gov.close()


@pytest.mark.parametrize(
    "content, why",
    [(b"short", "at least 32 bytes"), (None, "the same key as SEMGOV_CONTEXT_KEY")],
)
def test_previous_context_key_is_checked(
    hook_files: HookFiles, tmp_path: Path, content: bytes | None, why: str
) -> None:
    """SEMGOV_CONTEXT_KEY_PREVIOUS must be a real key (>= 32 bytes) other than the current one."""
    prev = tmp_path / "previous.key"
    prev.write_bytes(hook_files.context_secret if content is None else content)
    with pytest.raises(HookConfigError, match=f"SEMGOV_CONTEXT_KEY_PREVIOUS={prev}: .*{why}"):
        _governor(hook_files, SEMGOV_CONTEXT_KEY_PREVIOUS=str(prev))


def test_a_trust_keyring_that_names_the_hooks_key_k1_is_used_as_named(hook_files: HookFiles) -> None:
    """SEMGOV_TRUST calling the hook's own key "k1" (as the example keyring does): the governor
    starts and signs as k1, so its donors' provenance and its records verify under that name
    (before: refused at start, "does not hold the hook's own key ed25519:...")."""
    pub = hook_files.signing_key.with_name("signing-key.pub.pem")
    hook_files.trust.write_text(json.dumps({"keys": [{"key_id": "k1", "public_key": pub.read_text()}]}))
    gov = _governor(hook_files)
    try:
        assert gov.signing_key.key_id == "k1"
        assert gov.wait_idle() and [w.error for w in gov.warmups] == [None]
        gov.event("reuse_disabled", detail="signed as k1")
    finally:
        gov.close()
    audit_keyring = hook_files.dir / "audit-keyring.json"
    audit_keyring.write_text(json.dumps({"keys": [{"key_id": "k1", "public_key": pub.read_text()}]}))
    rep = verify_log(hook_files.audit_dir, keyring=AuditKeyring.load(audit_keyring), workers=1)
    assert rep.ok and rep.records == 1, rep.problems
