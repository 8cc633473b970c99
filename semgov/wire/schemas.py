"""JSON Schemas generated from the wire types (the files in ``schemas/``)."""

from __future__ import annotations

import json

from pydantic import BaseModel

from semgov.policy.yaml.model import Policy
from semgov.wire.models import (
    CapturedRequest,
    DecisionRecord,
    EngineEvent,
    ProvenancePayload,
    ShadowDecisionRecord,
)
from semgov.wire.policy_input import json_schema as policy_input_schema

SCHEMAS: dict[str, tuple[type[BaseModel], str, str]] = {
    "captured_request.schema.json": (CapturedRequest, "validation", "semgov.captured_request/v1"),
    "provenance.schema.json": (ProvenancePayload, "validation", "semgov.provenance/v1"),
    "decision.schema.json": (DecisionRecord, "serialization", "semgov.decision/v3"),
    "shadow_decision.schema.json": (ShadowDecisionRecord, "serialization", "semgov.shadow_decision/v1"),
    "engine_event.schema.json": (EngineEvent, "serialization", "semgov.engine_event/v2"),
    "policy.schema.json": (Policy, "validation", "semgov policy.yaml"),
}


def render_all() -> dict[str, str]:
    """File name -> schema text (stable, sorted keys, trailing newline)."""
    out = {}
    for name, (model, mode, title) in SCHEMAS.items():
        schema = model.model_json_schema(mode=mode, by_alias=True)  # type: ignore[arg-type]
        schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": title, **schema}
        out[name] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    pi = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "semgov.policy_input/v1"}
    out["policy_input.schema.json"] = (
        json.dumps({**pi, **policy_input_schema()}, indent=2, sort_keys=True) + "\n"
    )
    return dict(sorted(out.items()))
