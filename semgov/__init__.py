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

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from semgov.decide import Evaluator, SignedDecision
    from semgov.errors import InputError, KeyFileError, PolicyError, SemgovError, SignatureError
    from semgov.policy.source import load_policy_source, make_engine
    from semgov.policy.yaml.model import Policy, load_policy, parse_policy
    from semgov.signing.canonical import canonicalize
    from semgov.signing.keys import Keyring, SigningKey, generate_keypair, load_public_key, load_signing_key
    from semgov.signing.provenance import provenance_payload, sign_provenance
    from semgov.signing.records import sign_record, verify_record
    from semgov.wire.models import CapturedRequest, DecisionRecord

# NOTE: the public names are imported on first use (PEP 562), so that `import semgov` and the
# command line's --help and --version load none of the heavy dependencies.
_EXPORTS: dict[str, str] = {
    "Evaluator": "semgov.decide",
    "SignedDecision": "semgov.decide",
    "InputError": "semgov.errors",
    "KeyFileError": "semgov.errors",
    "PolicyError": "semgov.errors",
    "SemgovError": "semgov.errors",
    "SignatureError": "semgov.errors",
    "load_policy_source": "semgov.policy.source",
    "make_engine": "semgov.policy.source",
    "Policy": "semgov.policy.yaml.model",
    "load_policy": "semgov.policy.yaml.model",
    "parse_policy": "semgov.policy.yaml.model",
    "canonicalize": "semgov.signing.canonical",
    "Keyring": "semgov.signing.keys",
    "SigningKey": "semgov.signing.keys",
    "generate_keypair": "semgov.signing.keys",
    "load_public_key": "semgov.signing.keys",
    "load_signing_key": "semgov.signing.keys",
    "provenance_payload": "semgov.signing.provenance",
    "sign_provenance": "semgov.signing.provenance",
    "sign_record": "semgov.signing.records",
    "verify_record": "semgov.signing.records",
    "CapturedRequest": "semgov.wire.models",
    "DecisionRecord": "semgov.wire.models",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'semgov' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


__version__ = "0.1.0"


def tokens_sha256(token_ids: list[int]) -> str:
    """SHA-256 hex of token ids as little-endian uint32 (provenance ``token_ids_sha256``)."""
    from semgov.facts.tokens import as_tokens, token_hash

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
