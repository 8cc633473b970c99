"""semgov: policy-as-code governance for semantic KV-cache reuse.

Public API by task:

- decide: :class:`Evaluator` (captured request -> signed decisions -> a sink), :class:`SignedDecision`
- policies in any language: :func:`load_policy_source` (YAML or Rego), :func:`make_engine` (the one
  engine registry); the YAML policy: :func:`load_policy`, :func:`parse_policy`, :class:`Policy`
- keys: :func:`generate_keypair`, :func:`load_signing_key`, :func:`load_public_key`, :class:`Keyring`
- records: :func:`verify_record`, :func:`canonicalize`
- provenance (producer side): :func:`provenance_payload`, :func:`sign_provenance`
- tokens: :func:`tokens_sha256` (the provenance token hash)
- types an adapter implements or receives: :mod:`semgov.typing`

The packages follow the data path: ``intake`` (captured traffic, limits) -> ``facts`` (typed
fact computation) -> ``wire.policy_input`` -> ``policy`` (engines) -> ``decide`` (the evaluator)
-> ``signing`` (records, provenance, engine events) -> ``audit`` (the tamper-evident log).
``wire`` holds the formats, ``cli`` is a thin adapter, ``_internal`` is private.
"""

from __future__ import annotations

from semgov.decide import Evaluator, SignedDecision
from semgov.errors import InputError, KeyFileError, PolicyError, SemgovError, SignatureError
from semgov.facts.tokens import as_tokens, token_hash
from semgov.policy.source import load_policy_source, make_engine
from semgov.policy.yaml.model import Policy, load_policy, parse_policy
from semgov.signing.canonical import canonicalize
from semgov.signing.keys import Keyring, SigningKey, generate_keypair, load_public_key, load_signing_key
from semgov.signing.provenance import provenance_payload, sign_provenance
from semgov.signing.records import sign_record, verify_record
from semgov.wire.models import CapturedRequest, DecisionRecord

__version__ = "0.1.0"


def tokens_sha256(token_ids: list[int]) -> str:
    """SHA-256 hex of token ids as little-endian uint32 (provenance ``token_ids_sha256``)."""
    return token_hash(as_tokens(token_ids))


__all__ = [
    "CapturedRequest",
    "DecisionRecord",
    "Evaluator",
    "InputError",
    "KeyFileError",
    "Keyring",
    "Policy",
    "PolicyError",
    "SemgovError",
    "SignatureError",
    "SignedDecision",
    "SigningKey",
    "canonicalize",
    "generate_keypair",
    "load_policy",
    "load_policy_source",
    "load_public_key",
    "load_signing_key",
    "make_engine",
    "parse_policy",
    "provenance_payload",
    "sign_provenance",
    "sign_record",
    "tokens_sha256",
    "verify_record",
]
