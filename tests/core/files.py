"""Real keys, a keyring, a context key and a policy on disk, as a governed server has them: the
files every test of the governed-serving core (and of the engine adapters on top of it) starts from."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_POLICY = ROOT / "policies" / "default"
# NOTE: the harness's policy plans no recompute (tests place spans exactly); test_hold_back's plan
# test serves the default policy's own quality section.
NO_RECOMPUTE = "quality: {shifted_recompute_percent: 0, min_recompute_tokens: 0}\n"

AUDIENCE = "semgov-test"  # SEMGOV_CONTEXT_AUDIENCE of the hook under test, the aud of its tokens
TASK = {"id": "qa", "version": "1"}
CONTRACT = {"id": "answer-json", "schema_sha256": "a" * 64}


@dataclass
class HookFiles:
    """Real keys, keyring, context key and policy for one test (all on disk, as a server has them)."""

    dir: Path
    signing_key: Path
    trust: Path
    context_key: Path
    context_secret: bytes
    audit_dir: Path
    policy: Path

    def env(self, **over: str) -> dict[str, str]:
        env = {
            "SEMGOV_POLICY": str(self.policy),
            "SEMGOV_TRUST": str(self.trust),
            "SEMGOV_SIGNING_KEY": str(self.signing_key),
            "SEMGOV_CONTEXT_KEY": str(self.context_key),
            "SEMGOV_CONTEXT_AUDIENCE": AUDIENCE,
            "SEMGOV_AUDIT_DIR": str(self.audit_dir),
            "SEMGOV_MIN_UNMATCHED_TOKENS": "128",
            "SEMGOV_ASYNC_REGISTRATION": "0",
            # The decision thread decides in-process here (tests patch what it calls); the
            # decision process has its own tests (test_hold_back.py) and runs in the real server.
            "SEMGOV_DECISION_PROCESS": "0",
            "SEMGOV_STRICT": "1",
            "SEMGOV_DETOKENIZER": "tests.sglang_hook.scenario:detokenizer",
            # Behaviour, not speed, is under test: a loaded CI machine must not turn an allow into a
            # timeout deny. The tests of the timeouts themselves set them low.
            "SEMGOV_DECISION_TIMEOUT_MS": "30000",
            "SEMGOV_AUDIT_WAIT_MS": "10000",
        }
        env.update(over)
        return env


def make_hook_files(tmp_path: Path) -> HookFiles:
    from semgov.signing.keys import generate_keypair, key_id_for, load_public_key

    priv, pub = generate_keypair(tmp_path / "keys")
    kid = key_id_for(load_public_key(pub))
    trust = tmp_path / "keyring.json"
    trust.write_text(json.dumps({"keys": [{"key_id": kid, "public_key": pub.read_text()}]}))
    secret = b"gateway-secret-for-tests-0123456789abcdef"
    ck = tmp_path / "context.key"
    ck.write_bytes(secret)
    return HookFiles(tmp_path, priv, trust, ck, secret, tmp_path / "audit", copy_policy(tmp_path))


def copy_policy(tmp_path: Path, quality: str = NO_RECOMPUTE) -> Path:
    """The default policy with its ``quality`` section replaced (by default: no recompute planned,
    so a shifted span is realized whole, exactly where the tests' layouts put it)."""
    text = (DEFAULT_POLICY / "policy.yaml").read_text()
    d = tmp_path / "policy"
    d.mkdir(exist_ok=True)
    (d / "policy.yaml").write_text(text[: text.index("\nquality:")] + "\n" + quality + "...\n")
    return d
