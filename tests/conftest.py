"""Shared fixtures: real Ed25519 keys, a keyring, and a builder for captured requests."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import structlog
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from semgov import Evaluator, Keyring, SigningKey, load_policy, provenance_payload, sign_provenance
from semgov.facts.pii import PiiScanner
from semgov.policy.yaml.model import Policy, parse_policy
from semgov.signing.keys import TrustedKey
from semgov.wire.models import CapturedRequest

ROOT = Path(__file__).resolve().parents[1]
ASSETS = Path(__file__).resolve().parent / "assets"
DEFAULT_POLICY_DIR = ROOT / "policies" / "default"
CONTRACT = {"id": "financials", "schema_sha256": "ab" * 32}
TASK = {"id": "extract_financials", "version": "1"}

# A donor prompt: system | instruction | evidence | question.
SYSTEM = list(range(100, 120))
INSTRUCTION = list(range(200, 230))
EVIDENCE = list(range(1000, 1300))
QUESTION = list(range(500, 520))


def segs(*parts: tuple[str, list[int]]) -> dict[str, Any]:
    """Prompt dict from (role, tokens) parts, with tiling segments."""
    toks: list[int] = []
    out = []
    for role, t in parts:
        out.append({"role": role, "start": len(toks), "end": len(toks) + len(t)})
        toks.extend(t)
    return {"token_ids": toks, "segments": out}


class Keys:
    """Provenance keys: k1 trusted, k2 revoked, k9 not in the keyring."""

    def __init__(self) -> None:
        self.k1 = SigningKey.from_private(Ed25519PrivateKey.generate(), "k1")
        self.k2 = SigningKey.from_private(Ed25519PrivateKey.generate(), "k2")
        self.k9 = SigningKey.from_private(Ed25519PrivateKey.generate(), "k9")
        self.decision = SigningKey.from_private(Ed25519PrivateKey.generate())
        self.keyring = Keyring(
            [TrustedKey("k1", self.k1.public_key, False), TrustedKey("k2", self.k2.public_key, True)]
        )


@pytest.fixture(autouse=True)
def _structlog_isolated() -> Iterator[None]:
    """Every test starts and ends with structlog unconfigured: a CLI run in-process or the hostile
    campaign (which filters below CRITICAL) configures it, and a later test's stderr diagnostics
    must not depend on which tests ran before it."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


@pytest.fixture(scope="session")
def keys() -> Keys:
    return Keys()


@pytest.fixture(scope="session")
def default_policy() -> Policy:
    return load_policy(DEFAULT_POLICY_DIR)


@pytest.fixture(scope="session")
def pii_scanner() -> PiiScanner:
    return PiiScanner()


def payload_for(donor_id: str, prompt: dict[str, Any], **over: Any) -> dict[str, Any]:
    """A valid payload for the standard donor; ``over`` replaces fields (even with invalid values)."""
    p = provenance_payload(
        donor_id=donor_id,
        tenant="acme",
        namespace="research/entity-042",
        task=TASK,
        response_contract=CONTRACT,
        created_at=datetime(2026, 11, 28, 10, tzinfo=UTC),
        expires_at=datetime(2026, 12, 5, 10, tzinfo=UTC),
        policy_version="default@1",
        token_ids=prompt["token_ids"],
        segments=prompt["segments"],
        text=prompt.get("text"),
    )
    p.update(over)
    return p


def candidate(
    keys: Keys,
    donor_id: str = "r-03",
    prompt: dict[str, Any] | None = None,
    *,
    similarity: float = 0.9,
    signer: str = "k1",
    **payload_over: Any,
) -> dict[str, Any]:
    prompt = (
        prompt
        if prompt is not None
        else segs(
            ("system", SYSTEM), ("instruction", INSTRUCTION), ("evidence", EVIDENCE), ("question", QUESTION)
        )
    )
    payload = payload_for(donor_id, prompt, **payload_over)
    key: SigningKey = getattr(keys, signer)
    return {
        "donor_id": donor_id,
        "similarity": similarity,
        "prompt": prompt,
        "provenance": sign_provenance(payload, key),
    }


def with_text(keys: Keys, cand: dict[str, Any], text: str, signer: str = "k1") -> dict[str, Any]:
    """``cand`` with donor ``text``, its provenance re-signed over the text's hash (the producer saw it)."""
    from semgov._internal.bindings import text_sha256

    out = copy.deepcopy(cand)
    out["prompt"]["text"] = text
    payload = {**out["provenance"]["payload"], "text_sha256": text_sha256(text)}
    out["provenance"] = sign_provenance(payload, getattr(keys, signer))
    return out


def request(cands: list[dict[str, Any]], prompt: dict[str, Any] | None = None, **over: Any) -> dict[str, Any]:
    prompt = (
        prompt
        if prompt is not None
        else segs(
            ("system", SYSTEM), ("instruction", INSTRUCTION), ("evidence", EVIDENCE), ("question", QUESTION)
        )
    )
    r: dict[str, Any] = {
        "schema": "semgov.captured_request/v1",
        "request_id": "r-17",
        "received_at": "2026-11-29T10:00:00Z",
        "tenant": "acme",
        "namespace": "research/entity-042",
        "task": dict(TASK),
        "response_contract": dict(CONTRACT),
        "prompt": prompt,
        "candidates": cands,
    }
    r.update(over)
    return r


def parse(req: dict[str, Any]) -> CapturedRequest:
    return CapturedRequest.model_validate_json(json.dumps(req))


@pytest.fixture
def evaluator(keys: Keys, default_policy: Policy, pii_scanner: PiiScanner) -> Evaluator:
    return Evaluator(default_policy, keys.keyring, keys.decision, pii_scanner=pii_scanner)


def gate(decision_record: dict[str, Any], name: str) -> dict[str, Any]:
    return next(g for g in decision_record["gates"] if g["gate"] == name)


def policy_with(text: str) -> Policy:
    """The default policy with extra YAML appended/overridden (top-level sections replaced)."""
    import yaml

    base = yaml.safe_load((DEFAULT_POLICY_DIR / "policy.yaml").read_text())
    base.update(yaml.safe_load(text))
    return parse_policy(yaml.safe_dump(base, explicit_end=True).encode(), "<test policy>")


def deep(d: dict[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(d)
