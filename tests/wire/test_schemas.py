"""The JSON Schemas in schemas/ are generated from the models and must not drift."""

from __future__ import annotations

import json

from semgov.wire.models import DecisionFields, DecisionRecord, ShadowDecisionRecord
from semgov.wire.schemas import render_all
from tests.conftest import ROOT


def test_checked_in_schemas_match_models() -> None:
    """Every generated schema equals the committed file (run `semgov schema --write`)."""
    for name, text in render_all().items():
        path = ROOT / "schemas" / name
        assert path.exists(), f"missing {path}"
        assert path.read_text() == text, f"{path} is stale: run `semgov schema --write`"


def test_captured_request_schema_forbids_unknown_keys() -> None:
    """The published schema encodes the same strictness as the loader."""
    s = json.loads(render_all()["captured_request.schema.json"])
    assert s["additionalProperties"] is False
    assert "request_id" in s["required"] and "candidates" in s["required"]


def test_shadow_decision_schema_is_a_v2_decision_plus_its_live_pairing() -> None:
    """The shadow schema: every decision field, its own id, planned spans, and two required live fields."""
    schemas = render_all()
    live = json.loads(schemas["decision.schema.json"])
    shadow = json.loads(schemas["shadow_decision.schema.json"])
    assert shadow["$id"] == "semgov.shadow_decision/v1" and shadow["additionalProperties"] is False
    assert shadow["required"] == [*live["required"], "live_decision_id", "live_decision"]
    assert shadow["properties"]["schema"]["const"] == "semgov.shadow_decision/v1"
    assert shadow["properties"]["approved_spans"]["items"] == {"$ref": "#/$defs/PlannedSpan"}
    assert "recompute" in shadow["$defs"]["PlannedSpan"]["required"]
    assert "live_decision" not in live["properties"]
    assert "semgov.shadow_decision/v1" not in json.dumps(live)


def test_shadow_decision_model_is_not_a_decision_record() -> None:
    """A ShadowDecisionRecord is no DecisionRecord (nothing typed for live decisions accepts one)."""
    assert not issubclass(ShadowDecisionRecord, DecisionRecord)
    assert issubclass(ShadowDecisionRecord, DecisionFields) and issubclass(DecisionRecord, DecisionFields)


def test_the_dependency_free_names_equal_the_models_types() -> None:
    """semgov.wire.names (read without pydantic) names exactly the gates and event kinds the models type."""
    from typing import get_args

    from semgov.wire import names
    from semgov.wire.models import GATES, EngineEventKind

    assert names.GATE_NAMES == GATES
    assert names.ENGINE_EVENT_KINDS == get_args(EngineEventKind)
