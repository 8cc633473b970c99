"""Wire types: captured requests, provenance, policy input, decision records and engine events.

These pydantic models are the single source of truth for semgov's JSON formats;
``schemas/*.schema.json`` are generated from them (``semgov schema --write``)
and a test fails when the checked-in schemas drift.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from semgov.facts.token_ids import TokenIds
from semgov.wire import names as _names
from semgov.wire.timefmt import Instant

# NOTE: the schema ids are named in semgov.wire.names (no pydantic there).
CAPTURED_REQUEST_SCHEMA = _names.CAPTURED_REQUEST_SCHEMA
DECISION_SCHEMA = _names.DECISION_SCHEMA
DECISION_SCHEMAS = _names.DECISION_SCHEMAS
DECISION_V3_FIELDS = _names.DECISION_V3_FIELDS
ENGINE_EVENT_SCHEMA = _names.ENGINE_EVENT_SCHEMA
ENGINE_EVENT_SCHEMAS = _names.ENGINE_EVENT_SCHEMAS
POLICY_INPUT_SCHEMA = _names.POLICY_INPUT_SCHEMA
PROVENANCE_SCHEMA = _names.PROVENANCE_SCHEMA
SHADOW_DECISION_SCHEMA = _names.SHADOW_DECISION_SCHEMA

Role = Literal["system", "instruction", "evidence", "question", "other"]
Hex64 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Id = Annotated[str, StringConstraints(min_length=1, max_length=512)]
# NOTE: token ids are unsigned 32-bit: the provenance token hash is defined over
# little-endian uint32, so anything outside that range cannot be hashed faithfully.
TokenId = Annotated[int, Field(ge=0, le=0xFFFFFFFF)]

_RFC3339 = re.compile(
    r"(\d{4}-\d{2}-\d{2})[Tt](\d{2}:\d{2}:\d{2})(?:\.(\d+))?([Zz]|[+-]\d{2}:\d{2})", re.ASCII
)


def _rfc3339(v: object) -> object:
    """Accept only an RFC 3339 date-time string with a zone (or an aware datetime from Python).

    NOTE: the lax datetime parser alone would also take Unix times (``1764324000``, seconds or
    milliseconds by magnitude) and times without seconds: other readers of the same signed
    payload could disagree. At most nine fractional digits (nanoseconds) are accepted, and
    kept exactly; a finer time is refused rather than rounded (see :class:`Instant`).
    """
    if isinstance(v, datetime):
        return v
    m = _RFC3339.fullmatch(v) if isinstance(v, str) else None
    if m is None:
        raise ValueError("must be an RFC 3339 date-time string with a zone, e.g. 2026-11-29T10:00:00Z")
    date, time, frac, zone = m.groups()
    frac = frac or ""
    if len(frac) > 9:
        raise ValueError(
            f"has {len(frac)} fractional digits; at most 9 (nanoseconds) can be compared exactly"
        )
    zone = "+00:00" if zone in ("Z", "z") else zone
    try:
        base = datetime.fromisoformat(f"{date}T{time}.{frac[:6].ljust(6, '0')}{zone}")
    except (ValueError, OverflowError) as e:
        raise ValueError(f"not a valid RFC 3339 date-time: {e}") from None
    dt = Instant(
        base.year, base.month, base.day, base.hour, base.minute, base.second, base.microsecond,
        tzinfo=base.tzinfo,
    )  # fmt: skip
    dt.sub_us_ns = int(frac[6:9].ljust(3, "0"))
    return dt


# An instant (a start, an end, or the decision clock), exact to the nanosecond.
Timestamp = Annotated[AwareDatetime, BeforeValidator(_rfc3339)]


class _Strict(BaseModel):
    """Base: unknown keys are errors, values are not coerced across types."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class TaskRef(_Strict):
    id: Id
    version: Id


class ResponseContract(_Strict):
    id: Id
    schema_sha256: Hex64


class Segment(_Strict):
    """Half-open token range ``[start, end)`` with a role."""

    role: Role
    start: int = Field(ge=0)
    end: int = Field(ge=0)


class Prompt(_Strict):
    """Token ids, optional text, and segments that tile the tokens in order."""

    # NOTE: validated as list[TokenId] (a JSON list, item by item), held as one read-only uint32
    # array (semgov.facts.token_ids.TokenIds), serialized back to the same list.
    token_ids: TokenIds
    text: str | None = None
    segments: list[Segment]

    @model_validator(mode="after")
    def _segments_tile(self) -> Prompt:
        check_tiling(self.segments, len(self.token_ids))
        return self


def check_tiling(segments: list[Segment], n_tokens: int) -> None:
    """Raise :class:`ValueError` unless ``segments`` tile ``n_tokens`` tokens in order."""
    pos = 0
    for i, seg in enumerate(segments):
        if seg.start != pos:
            raise ValueError(
                f"segments[{i}] starts at {seg.start}, expected {pos}: segments must tile the prompt in order"
            )
        if seg.end <= seg.start:
            raise ValueError(f"segments[{i}] is empty or reversed ({seg.start}..{seg.end})")
        pos = seg.end
    if pos != n_tokens:
        raise ValueError(f"segments end at {pos} but the prompt has {n_tokens} tokens")


class PiiScan(_Strict):
    scanned: bool
    entities: list[Annotated[str, StringConstraints(min_length=1, max_length=128)]]


class ProvenancePayload(_Strict):
    """What the donor's producer signed about it."""

    schema_: Literal["semgov.provenance/v1"] = Field(alias="schema")
    donor_id: Id
    tenant: Id
    namespace: Id
    task: TaskRef
    response_contract: ResponseContract
    created_at: Timestamp
    expires_at: Timestamp
    policy_version: Id
    token_ids_sha256: Hex64
    # SHA-256 of the RFC 8785 segment list, and of the UTF-8 text (null: signed without text).
    segments_sha256: Hex64
    text_sha256: Hex64 | None
    pii: PiiScan
    visibility: Literal["tenant", "public"]

    model_config = ConfigDict(extra="forbid", strict=False, frozen=True, populate_by_name=True)


class Provenance(_Strict):
    """Signed provenance envelope. ``payload`` stays raw JSON: it is what was signed."""

    payload: dict[str, object]
    key_id: Id
    signature: Annotated[str, StringConstraints(min_length=1, max_length=1024)]


class Candidate(_Strict):
    donor_id: Id
    similarity: float = Field(allow_inf_nan=False)
    prompt: Prompt
    provenance: Provenance

    model_config = ConfigDict(extra="forbid", strict=False, frozen=True)

    @field_validator("similarity", mode="before")
    @classmethod
    def _number(cls, v: object) -> object:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError("similarity must be a number")
        return v


class CapturedRequest(_Strict):
    """One line of a captured-traffic JSONL file."""

    schema_: Literal["semgov.captured_request/v1"] = Field(alias="schema")
    request_id: Id
    received_at: Timestamp
    tenant: Id
    namespace: Id
    task: TaskRef
    response_contract: ResponseContract
    prompt: Prompt
    candidates: list[Candidate]
    expect: dict[str, Literal["allow", "deny"]] | None = None

    model_config = ConfigDict(extra="forbid", strict=False, frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _unique_donors(self) -> CapturedRequest:
        seen: set[str] = set()
        for c in self.candidates:
            if c.donor_id in seen:
                raise ValueError(f"candidate donor_id {c.donor_id!r} appears twice")
            seen.add(c.donor_id)
        if self.expect is not None:
            unknown = sorted(set(self.expect) - seen)
            if unknown:
                raise ValueError(f"expect names donors that are not candidates: {unknown}")
        return self


# --- decisions -------------------------------------------------------------

GateName = Literal[
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
]
# The gates in the order every decision record lists them (one list: GateName's).
GATES: tuple[GateName, ...] = get_args(GateName)


class GateResult(_Strict):
    gate: GateName
    result: Literal["pass", "fail", "error"]
    detail: str


class Span(_Strict):
    """Token positions that may be copied from donor to recipient."""

    recipient_start: int = Field(ge=0)
    donor_start: int = Field(ge=0)
    length: int = Field(ge=1)
    kind: Literal["prefix", "shifted"]


SPAN_KEYS: tuple[str, ...] = ("recipient_start", "donor_start", "length", "kind")


def span_dict(span: Any) -> dict[str, Any]:
    """A span's wire fields (:data:`SPAN_KEYS`; no ``recompute``) from any object that has them."""
    return {k: getattr(span, k) for k in SPAN_KEYS}


class PlannedSpan(Span):
    """An approved span with its realization plan (``semgov.decision/v2``): the engine computes the
    span's leading ``recompute`` tokens and may copy only the rest."""

    recompute: int = Field(ge=0)

    @model_validator(mode="after")
    def _within(self) -> PlannedSpan:
        if self.recompute > self.length:
            raise ValueError(f"recompute {self.recompute} exceeds the span's length {self.length}")
        return self


class CrossBoundary(_Strict):
    """A boundary an allowed reuse crossed: the donor (by its verified provenance) belonged to another
    tenant or namespace, and the policy rule that allowed it (the gate's detail, e.g.
    ``shared by namespace.sharing[0]``)."""

    boundary: Literal["tenant", "namespace"]
    rule: str


class PolicyRef(_Strict):
    name: str
    version: str
    revision: str
    engine: str


class DecisionFields(_Strict):
    """The fields of every decision record, live (:class:`DecisionRecord`) or shadow
    (:class:`ShadowDecisionRecord`), in their wire order; not a record itself: each subclass
    narrows ``schema`` to its own ids."""

    schema_: str = Field(alias="schema")
    decision_id: str
    request_id: str
    tenant: str
    namespace: str
    donor_id: str
    decision: Literal["allow", "deny"]
    gates: list[GateResult]
    approved_spans: list[PlannedSpan | Span]
    approved_tokens: int = Field(ge=0)
    recipient_tokens: int = Field(ge=0)
    policy: PolicyRef
    evaluated_at: datetime
    key_id: str
    signature: str

    model_config = ConfigDict(extra="forbid", strict=False, frozen=True, populate_by_name=True)


class DecisionRecord(DecisionFields):
    """Signed outcome of evaluating one donor candidate for one request.

    ``semgov.decision/v3`` (written since the audit report): a v2 record plus the donor's scope,
    ``donor_tenant`` and ``donor_namespace`` (from its provenance, null unless the provenance gate
    passed: an unverified claim is never recorded as the donor's scope), and ``cross_boundary``:
    for an allow whose donor belonged to another tenant or namespace, each boundary crossed with
    the rule that allowed it (empty otherwise). ``semgov.decision/v2``: every approved span states
    ``recompute``; ``semgov.decision/v1`` (older logs): spans without it. Older records are read
    and verified as they are.
    """

    # NOTE: a subclass's field keeps its base's place: the record's field order (and schema) is unchanged.
    schema_: Literal["semgov.decision/v1", "semgov.decision/v2", "semgov.decision/v3"] = Field(alias="schema")
    donor_tenant: str | None = None
    donor_namespace: str | None = None
    cross_boundary: list[CrossBoundary] | None = None

    @model_validator(mode="after")
    def _plan_by_version(self) -> DecisionRecord:
        v3 = self.schema_ == DECISION_SCHEMA
        for name in DECISION_V3_FIELDS:
            # NOTE: by presence, not value: a v3 record states each (null included), older ones none.
            if (name in self.model_fields_set) != v3:
                raise ValueError(f"a {self.schema_} record {'must state' if v3 else 'has no'} {name}")
        planned = self.schema_ != "semgov.decision/v1"
        for i, s in enumerate(self.approved_spans):
            if isinstance(s, PlannedSpan) != planned:
                need = "states `recompute`" if planned else "has no `recompute`"
                raise ValueError(f"approved_spans.{i}: a {self.schema_} span {need}")
        if self.schema_ == DECISION_SCHEMA:
            self._check_boundaries()
        return self

    def _check_boundaries(self) -> None:
        """NOTE: a v3 record names exactly the boundaries its allow crossed: none for a deny or an
        unverified donor, ``tenant`` iff the donor's tenant differs, ``namespace`` iff its namespace does."""
        crossed = [c.boundary for c in self.cross_boundary or []]
        if (self.donor_tenant is None) != (self.donor_namespace is None):
            raise ValueError("donor_tenant and donor_namespace are both null or both set")
        want: list[str] = []
        if self.decision == "allow" and self.donor_tenant is not None:
            want += ["tenant"] if self.donor_tenant != self.tenant else []
            want += ["namespace"] if self.donor_namespace != self.namespace else []
        if self.cross_boundary is None or crossed != want:
            raise ValueError(f"cross_boundary: names {crossed}, the decision crossed {want}")


class ShadowDecisionRecord(DecisionFields):
    """Signed outcome of a *shadow* policy for one donor candidate of one request: decided by a
    shadow policy alongside the live one, audited, and never acted on.

    The fields of a ``semgov.decision/v2`` record (every approved span states ``recompute``) under
    its own schema id, so that it can never be taken for a live decision, plus the live policy's
    decision of the same request and donor: ``live_decision_id`` (its ``decision_id``) and
    ``live_decision`` (its outcome), both null when the live policy made none. The shadow
    disagrees with the live policy when ``decision != live_decision`` (no live decision counts as a
    deny: nothing was reused).
    """

    schema_: Literal["semgov.shadow_decision/v1"] = Field(alias="schema")
    # NOTE: narrower than the base's list[PlannedSpan | Span] (shadow records have the v2 shape only);
    # a list is invariant, so mypy sees an incompatible override, which pydantic validates as declared.
    approved_spans: list[PlannedSpan]  # type: ignore[assignment]
    live_decision_id: str | None
    live_decision: Literal["allow", "deny"] | None

    @model_validator(mode="after")
    def _live_pair(self) -> ShadowDecisionRecord:
        if (self.live_decision_id is None) != (self.live_decision is None):
            raise ValueError("live_decision_id and live_decision are both null or both set")
        return self


# --- engine events -----------------------------------------------------------

EngineEventKind = Literal[
    "realization",
    "realization_failed",
    "invariant_violation",
    "reuse_disabled",
    "canary",
    "shifted_reuse_disabled",
    "policy_loaded",
    "policy_load_failed",
    "calibration_released",
]
# The kinds a ``semgov.engine_event/v1`` record may have (v2 added the canary's two).
V1_EVENT_KINDS = frozenset({"realization", "realization_failed", "invariant_violation", "reuse_disabled"})
# A run of KV-pool slots: ``[start, length]`` (slots ``start .. start + length - 1``).
# NOTE: the tuple itself is lax (JSON gives lists), its two integers stay strict.
SlotRange = Annotated[
    tuple[Annotated[int, Field(ge=0, strict=True)], Annotated[int, Field(ge=1, strict=True)]],
    Field(strict=False),
]


class EngineEvent(_Strict):
    """Signed record of what a serving engine did with reuse (off its scheduler's path).

    ``realization``: KV copied from a donor under ``decision_id`` (``materialized_tokens``
    kept, in the recipient's KV-pool ``slots``, for the realized ``spans``);
    ``realization_failed``: an allowed realization that did not happen; ``invariant_violation``:
    the engine caught itself about to break a semgov invariant; ``reuse_disabled``: the engine
    turned semantic reuse off. ``detail`` says why. Since ``semgov.engine_event/v2``: ``canary``:
    a realized request with shifted spans was replayed cold and compared (``materialized_tokens``:
    the output tokens compared; ``detail``: match, or where they differ); ``shifted_reuse_disabled``:
    canaries found more regressions than the budget for a task and response contract, and the
    engine stopped copying shifted spans there (``detail`` names the scope); ``policy_loaded``:
    the engine reloaded its live or shadow policy (or keyring) while running, and decides with it
    from its next decision on (``detail``: which one, its ``name@version`` and revision, and the
    revision it replaced); ``policy_load_failed``: such a reload failed and the engine kept deciding
    with the policy it had (``detail``: why, and the revision kept); ``calibration_released``: a
    ``semgov calibrate`` run released one measured pair's scope and the engine dropped its donors
    (``detail``: the run and how many were dropped).
    """

    schema_: Literal["semgov.engine_event/v1", "semgov.engine_event/v2"] = Field(alias="schema")
    event_id: Id
    kind: EngineEventKind
    engine: Id
    request_id: Id | None
    decision_id: Id | None
    donor_id: Id | None
    materialized_tokens: int = Field(ge=0)
    slots: list[SlotRange]
    spans: list[Span]
    detail: str
    at: Annotated[AwareDatetime, Field(strict=False)]
    key_id: str
    signature: str

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _kind_by_version(self) -> EngineEvent:
        if self.schema_ == "semgov.engine_event/v1" and self.kind not in V1_EVENT_KINDS:
            raise ValueError(f"kind: a semgov.engine_event/v1 record cannot be {self.kind!r} (a v2 kind)")
        return self

    @field_validator("at", mode="before")
    @classmethod
    def _utc(cls, v: object) -> object:
        if isinstance(v, str) and v.endswith("Z"):
            return v
        if isinstance(v, datetime) and v.utcoffset() == timedelta(0):
            return v
        raise ValueError("must be an RFC 3339 UTC timestamp ending in 'Z'")
