"""The wire formats' names, with no dependency: schema ids, gate names, engine event kinds.

:mod:`semgov.wire.models` (pydantic) types the records; this module only names them, so that code
which reads records as plain JSON (``semgov audit show``, ``stats``) and the command line's
argument choices start without loading pydantic. ``tests/wire`` holds these equal to the models'
``Literal`` types.
"""

from __future__ import annotations

CAPTURED_REQUEST_SCHEMA = "semgov.captured_request/v1"
PROVENANCE_SCHEMA = "semgov.provenance/v1"
DECISION_SCHEMA = "semgov.decision/v3"
# NOTE: every decision schema semgov reads; v1 records (no realization plan) and v2 records (no
# donor scope) still verify.
DECISION_SCHEMAS = ("semgov.decision/v1", "semgov.decision/v2", DECISION_SCHEMA)
# The fields a semgov.decision/v3 record has and older ones do not.
DECISION_V3_FIELDS = ("donor_tenant", "donor_namespace", "cross_boundary")
POLICY_INPUT_SCHEMA = "semgov.policy_input/v1"
SHADOW_DECISION_SCHEMA = "semgov.shadow_decision/v1"
ENGINE_EVENT_SCHEMA = "semgov.engine_event/v2"
# NOTE: every engine event schema semgov reads; v1 records (the four original kinds) still verify.
ENGINE_EVENT_SCHEMAS = ("semgov.engine_event/v1", ENGINE_EVENT_SCHEMA)

# The gates, in the order every decision record lists them.
GATE_NAMES = (
    "tenant",
    "namespace",
    "provenance",
    "expiry",
    "policy_version",
    "pii",
    "task",
    "response_contract",
    "similarity",
    "token_verification",
)
ENGINE_EVENT_KINDS = (
    "realization",
    "realization_failed",
    "invariant_violation",
    "reuse_disabled",
    "canary",
    "shifted_reuse_disabled",
    "policy_loaded",
    "policy_load_failed",
)


def disagrees(decision: object, live_decision: object) -> bool:
    """Whether a shadow decision differs from the live one (no live decision counts as a deny:
    nothing was reused)."""
    return decision != (live_decision or "deny")
