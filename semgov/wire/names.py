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
    "calibration_released",
)


def disagrees(decision: object, live_decision: object) -> bool:
    """Whether a shadow decision differs from the live one (no live decision counts as a deny:
    nothing was reused)."""
    return decision != (live_decision or "deny")


# Why an allow decision was not realized: the machine-readable head of a ``realization_failed``
# engine event's ``detail`` (``"<reason>: <text>"``), counted by ``semgov audit stats`` / ``report``
# and by the hook's ``semgov:allows_not_realized_total{reason}``. docs/formats.md lists them.
NOT_REALIZED_REASONS = (
    "late",  # the decision came after the engine stopped waiting for it (SEMGOV_DECISION_TIMEOUT_MS)
    "not_durable",  # its record was not durable in the audit log in time (SEMGOV_AUDIT_WAIT_MS)
    "donor_evicted",  # the donor's KV left the engine (tree eviction, the connector's store)
    "unrealizable_plan",  # the engine cannot load or copy what the plan approves
    "prefix_cached",  # the engine's own prefix cache already holds every approved position
    "another_donor_chosen",  # another allowed donor of the same request was realized instead
    "unsealed",  # the engine could not keep the reused KV out of its prefix cache (vLLM)
    "discarded_by_engine",  # the engine dropped the planned load (vLLM: prompt logprobs, ...)
    "canary_off",  # canaries turned shifted reuse off for the scope: nothing left to copy
    "reuse_disabled",  # semantic reuse was off (audit log broken, reuse disabled)
    "copy_failed",  # the copy or load was attempted and failed (the engine recomputes)
    "hook_error",  # the hook failed while planning it (a bug: logged)
    "aborted",  # the request was aborted or finished before the reuse was made
)


def not_realized_reason(detail: object) -> str | None:
    """The reason code heading a ``realization_failed`` event's detail, or None when it has none
    (events written before the codes, or not about an allow)."""
    if not isinstance(detail, str):
        return None
    head = detail.split(":", 1)[0].strip()
    return head if head in NOT_REALIZED_REASONS else None
