"""The JSON Schemas in schemas/ are generated from the models and must not drift."""

from __future__ import annotations

import json

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
