"""The policy input document: request, candidate, computed facts and clock.

Every policy engine (the native YAML engine, and Rego engines) decides over this
same document and nothing else: facts are computed first by typed code, then a
policy decides. Versioned as ``semgov.policy_input/v1``; its JSON Schema is
``schemas/policy_input.schema.json``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from semgov.models import ResponseContract, Role, TaskRef


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RequestFacts(_Doc):
    request_id: str
    tenant: str
    namespace: str
    task: TaskRef
    response_contract: ResponseContract
    prompt_tokens: int


class CandidateFacts(_Doc):
    donor_id: str
    similarity: float
    prompt_tokens: int
    key_id: str
    has_text: bool


class ProvenanceFacts(_Doc):
    """Outcome of checking the donor's signed provenance."""

    key_status: Literal["trusted", "unknown", "revoked"]
    signature_valid: bool
    payload_valid: bool
    payload_error: str | None = None
    donor_id_matches: bool
    token_hash_matches: bool


class DonorFacts(_Doc):
    """What the provenance payload claims about the donor (present when it parsed)."""

    tenant: str
    namespace: str
    task: TaskRef
    response_contract: ResponseContract
    created_at: str = Field(description="RFC 3339, UTC, 'Z' suffix")
    expires_at: str = Field(description="RFC 3339, UTC, 'Z' suffix")
    created_at_unix: float
    expires_at_unix: float
    policy_version: str
    visibility: Literal["tenant", "public"]


class PiiFacts(_Doc):
    provenance_scanned: bool
    provenance_entities: list[str]
    text_scanned: bool
    text_entities: list[str]


class SpanFacts(_Doc):
    recipient_start: int
    donor_start: int
    length: int
    kind: Literal["prefix", "shifted"]
    recipient_role: Role
    donor_role: Role


class TokenFacts(_Doc):
    recipient_length: int
    donor_length: int
    common_prefix: int
    spans: list[SpanFacts] = Field(description="exact identical runs, split at segment boundaries")


class Facts(_Doc):
    provenance: ProvenanceFacts | None
    donor: DonorFacts | None
    pii: PiiFacts | None
    tokens: TokenFacts | None
    errors: dict[str, str] = Field(
        default_factory=dict, description="fact name -> error; gates depending on it report 'error'"
    )


class PolicyInput(_Doc):
    schema_: Literal["semgov.policy_input/v1"] = Field(alias="schema", default="semgov.policy_input/v1")
    now: str = Field(description="decision clock, RFC 3339 UTC; policies must not read another clock")
    now_unix: float
    request: RequestFacts
    candidate: CandidateFacts
    facts: Facts

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
