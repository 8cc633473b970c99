"""semgov: policy-as-code governance for semantic KV-cache reuse.

Public API by task:

- decide: :class:`Evaluator` (captured request -> signed decisions), :class:`SignedDecision`
- policies: :func:`load_policy`, :func:`parse_policy`, :class:`Policy`
- keys: :func:`generate_keypair`, :func:`load_signing_key`, :func:`load_public_key`, :class:`Keyring`
- records: :func:`verify_record`, :func:`canonicalize`
- provenance (producer side): :func:`provenance_payload`, :func:`sign_provenance`
- tokens: :func:`tokens_sha256` (the provenance token hash)
"""

from __future__ import annotations

from semgov._internal.tokens import as_tokens, token_hash
from semgov.canonical import canonicalize
from semgov.decide import Evaluator, SignedDecision
from semgov.errors import InputError, KeyFileError, PolicyError, SemgovError, SignatureError
from semgov.keys import Keyring, SigningKey, generate_keypair, load_public_key, load_signing_key
from semgov.models import CapturedRequest, DecisionRecord
from semgov.policy import Policy, load_policy, parse_policy
from semgov.provenance import provenance_payload, sign_provenance
from semgov.records import sign_record, verify_record

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
    "load_public_key",
    "load_signing_key",
    "parse_policy",
    "provenance_payload",
    "sign_provenance",
    "sign_record",
    "tokens_sha256",
    "verify_record",
]
