"""The policy input document: request, candidate, computed facts and clock.

Every policy engine (the native YAML engine, and Rego engines) decides over this
same document and nothing else: facts are computed first by typed code, then a
policy decides. Versioned as ``semgov.policy_input/v1``; its JSON Schema is
``schemas/policy_input.schema.json`` and :func:`to_json_dict` gives the JSON form.

These are slotted dataclasses rather than pydantic models: one document is built
per candidate on the decision path, and construction must cost well under a
microsecond per object. Pydantic still generates their schema and dumps them.

When a document is validated (``semgov policy test`` case files), its types are
exact, as the JSON Schema says: no coercion of ``"0.9"`` to a number, ``"true"``
or ``1`` to a boolean, ``true`` or ``"5"`` to an integer, no non-finite numbers.
The field types below say so (``Strict``); they do not change the schema.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cache
from typing import Annotated, Any, Final, Literal

from pydantic import AllowInfNan, ConfigDict, Field, Strict, TypeAdapter

from semgov.wire.models import ResponseContract, Role, TaskRef

POLICY_INPUT_SCHEMA: Final = "semgov.policy_input/v1"
_CONFIG = ConfigDict(extra="forbid")

# Exact JSON types. NOTE: not ConfigDict(strict=True): in strict mode pydantic accepts only
# dataclass instances, never mappings, for the nested documents.
Str = Annotated[str, Strict()]
Int = Annotated[int, Strict()]
Bool = Annotated[bool, Strict()]
Number = Annotated[float, Strict(), AllowInfNan(False)]  # an int is a number too, as in JSON


@dataclass(frozen=True, slots=True)
class RequestFacts:
    __pydantic_config__ = _CONFIG
    request_id: Str
    tenant: Str
    namespace: Str
    task: TaskRef
    response_contract: ResponseContract
    prompt_tokens: Int


@dataclass(frozen=True, slots=True)
class CandidateFacts:
    __pydantic_config__ = _CONFIG
    donor_id: Str
    similarity: Number
    prompt_tokens: Int
    key_id: Str
    has_text: Bool


@dataclass(frozen=True, slots=True)
class ProvenanceFacts:
    """Outcome of checking the donor's signed provenance."""

    __pydantic_config__ = _CONFIG
    key_status: Literal["trusted", "unknown", "revoked"]
    signature_valid: Bool
    payload_valid: Bool
    payload_error: Str | None
    donor_id_matches: Bool
    token_hash_matches: Bool
    # The candidate's segments are the ones signed (payload segments_sha256).
    segments_hash_matches: Bool
    # The candidate carries no text, or exactly the text signed (payload text_sha256).
    text_hash_matches: Bool


@dataclass(frozen=True, slots=True)
class DonorFacts:
    """What the provenance payload claims about the donor (present when it parsed)."""

    __pydantic_config__ = _CONFIG
    tenant: Str
    namespace: Str
    task: TaskRef
    response_contract: ResponseContract
    created_at: Annotated[Str, Field(description="RFC 3339, UTC, 'Z' suffix")]
    expires_at: Annotated[Str, Field(description="RFC 3339, UTC, 'Z' suffix")]
    created_at_ns: Annotated[Int, Field(description="nanoseconds since the Unix epoch (exact)")]
    expires_at_ns: Annotated[Int, Field(description="nanoseconds since the Unix epoch (exact)")]
    policy_version: Str
    visibility: Literal["tenant", "public"]


@dataclass(frozen=True, slots=True)
class PiiFacts:
    """PII findings: what provenance declared, and semgov's own scan of donor text.

    ``text_entities`` lists the policy's forbidden types found in the donor text
    (semgov scans for exactly those types).
    """

    __pydantic_config__ = _CONFIG
    provenance_scanned: Bool
    provenance_entities: list[Str]
    text_scanned: Bool
    text_entities: list[Str]


@dataclass(frozen=True, slots=True)
class SpanFacts:
    """An exact run of identical tokens, inside one segment of each prompt."""

    __pydantic_config__ = _CONFIG
    recipient_start: Int
    donor_start: Int
    length: Int
    kind: Literal["prefix", "shifted"]
    recipient_role: Role
    donor_role: Role


@dataclass(frozen=True, slots=True)
class TokenFacts:
    __pydantic_config__ = _CONFIG
    recipient_length: Int
    donor_length: Int
    common_prefix: Int
    spans: list[SpanFacts]


@dataclass(frozen=True, slots=True)
class Facts:
    __pydantic_config__ = _CONFIG
    provenance: ProvenanceFacts | None
    donor: DonorFacts | None
    pii: PiiFacts | None
    tokens: TokenFacts | None
    errors: Annotated[
        dict[str, str], Field(description="fact name -> error; gates depending on it report 'error'")
    ] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PolicyInput:
    """The document every policy engine sees. ``schema`` is ``semgov.policy_input/v1``."""

    __pydantic_config__ = _CONFIG
    now: Annotated[Str, Field(description="decision clock, RFC 3339 UTC; policies read no other clock")]
    now_ns: Annotated[Int, Field(description="the clock, nanoseconds since the Unix epoch (exact)")]
    request: RequestFacts
    candidate: CandidateFacts
    facts: Facts
    schema: Literal["semgov.policy_input/v1"] = POLICY_INPUT_SCHEMA


@cache
def _adapter() -> TypeAdapter[PolicyInput]:
    return TypeAdapter(PolicyInput)


def to_json_dict(doc: PolicyInput) -> dict[str, Any]:
    """The document as plain JSON data (what Rego engines receive as ``input``)."""
    out: dict[str, Any] = _adapter().dump_python(doc, mode="json")
    return out


def json_schema() -> dict[str, Any]:
    return _adapter().json_schema(mode="serialization")
