"""Engine events: slot runs, building, signing, verifying ``semgov.engine_event/v2`` records (v1 read too)."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from pydantic import ValidationError

from semgov.audit.verify import record_problem
from semgov.errors import InputError, SignatureError
from semgov.signing.canonical import canonicalize
from semgov.signing.engine_events import (
    SignedEvent,
    engine_event,
    sign_engine_event,
    slot_indices,
    slot_ranges,
    verify_engine_event,
)
from semgov.signing.keys import load_public_key
from semgov.wire.models import ENGINE_EVENT_SCHEMA, EngineEvent
from tests.conftest import ASSETS, Keys

AT = datetime(2026, 11, 29, 10, 0, 0, 123456, tzinfo=UTC)
SPANS = [{"recipient_start": 0, "donor_start": 0, "length": 50, "kind": "prefix"}]


def _event(**over: Any) -> dict[str, Any]:
    kw: dict[str, Any] = {
        "engine": "sglang 0.5.23",
        "request_id": "r-1",
        "decision_id": "d" * 32,
        "donor_id": "r-03",
        "materialized_tokens": 50,
        "slots": list(range(1000, 1040)) + list(range(7, 17)),
        "spans": SPANS,
        "detail": "",
        "at": AT,
    }
    kw.update(over)
    return engine_event(kw.pop("kind", "realization"), **kw)


def _signed(keys: Keys, **over: Any) -> SignedEvent:
    return sign_engine_event(_event(**over), keys.decision)


# ---- slot runs --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("slots", "runs"),
    [
        ([], []),
        ([5], [[5, 1]]),
        ([0, 1, 2, 3], [[0, 4]]),
        ([7, 8, 9, 1, 2], [[7, 3], [1, 2]]),
        ([3, 2, 1], [[3, 1], [2, 1], [1, 1]]),
        ([4, 4, 5], [[4, 1], [4, 2]]),
        ([1, 3, 5], [[1, 1], [3, 1], [5, 1]]),
        (range(100, 200), [[100, 100]]),
    ],
    ids=["empty", "one", "run", "two-runs", "descending", "repeat", "gaps", "range"],
)
def test_slot_ranges(slots: Any, runs: list[list[int]]) -> None:
    """Consecutive ascending slots become one [start, length] run, in the given order."""
    assert slot_ranges(slots) == runs
    assert slot_indices(runs) == list(slots)


def test_slot_ranges_accepts_numpy_integers() -> None:
    """Integer-like slot indices (numpy's) are accepted and stored as Python ints."""
    np = pytest.importorskip("numpy")
    runs = slot_ranges(np.arange(10, 14, dtype=np.int64))
    assert runs == [[10, 4]] and all(type(x) is int for run in runs for x in run)


@pytest.mark.parametrize(
    ("slots", "field"),
    [([1, -2], "slots.1"), ([1.0], "slots.0"), (["3"], "slots.0"), ([0, True], "slots.1")],
    ids=["negative", "float", "str", "bool"],
)
def test_slot_ranges_rejects_bad_slots(slots: list[Any], field: str) -> None:
    """A negative or non-integer slot raises InputError naming its position."""
    with pytest.raises(InputError) as e:
        slot_ranges(slots)
    assert e.value.field == field


# ---- building ---------------------------------------------------------------------------------


def test_engine_event_is_a_valid_unsigned_record() -> None:
    """engine_event gives JSON data: schema, fresh id, compressed slots, UTC time with microseconds."""
    a, b = _event(), _event()
    assert a["schema"] == ENGINE_EVENT_SCHEMA and a["event_id"] != b["event_id"]
    assert a["slots"] == [[1000, 40], [7, 10]] and a["spans"] == SPANS
    assert a["at"] == "2026-11-29T10:00:00.123456Z" and "signature" not in a
    assert json.loads(json.dumps(a)) == a


def test_engine_event_normalizes_time_to_utc() -> None:
    """An aware time in another zone is stored as the same instant in UTC ('Z')."""
    plus2 = AT.astimezone(timezone(timedelta(hours=2)))
    assert _event(at=plus2)["at"] == "2026-11-29T10:00:00.123456Z"


def test_engine_event_without_a_decision() -> None:
    """Events that concern no request or decision (reuse_disabled) carry nulls and no slots."""
    ev = engine_event("reuse_disabled", engine="sglang 0.5.23", detail="audit log unavailable", at=AT)
    assert ev["request_id"] is None and ev["decision_id"] is None and ev["donor_id"] is None
    assert ev["slots"] == [] and ev["spans"] == [] and ev["materialized_tokens"] == 0


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"kind": "teleported"}, "kind"),
        ({"engine": ""}, "engine"),
        ({"request_id": ""}, "request_id"),
        ({"materialized_tokens": -1}, "materialized_tokens"),
        ({"materialized_tokens": 1.5}, "materialized_tokens"),
        ({"slots": [3, -1]}, "slots.1"),
        (
            {"spans": [{"recipient_start": 0, "donor_start": 0, "length": 0, "kind": "prefix"}]},
            "spans.0.length",
        ),
        ({"spans": [{"recipient_start": 0, "donor_start": 0, "length": 1, "kind": "x"}]}, "spans.0.kind"),
        ({"spans": [7]}, "spans.0"),
        ({"detail": 3}, "detail"),
        ({"at": datetime(2026, 11, 29, 10)}, "at"),
    ],
    ids=[
        "kind",
        "engine",
        "request",
        "tokens",
        "tokens-float",
        "slot",
        "span-len",
        "span-kind",
        "span-type",
        "detail",
        "naive-time",
    ],  # fmt: skip
)
def test_engine_event_rejects_bad_data(over: dict[str, Any], field: str) -> None:
    """Bad data raises InputError naming the field."""
    with pytest.raises(InputError) as e:
        _event(**over)
    assert e.value.field == field


def test_model_requires_utc_text() -> None:
    """The model accepts only RFC 3339 UTC text for ``at`` (no offsets, no numbers)."""
    ok = {**_event(), "key_id": "k", "signature": "s"}
    assert EngineEvent.model_validate(ok).at == AT
    for at in ("2026-11-29T12:00:00+02:00", 0, "2026-11-29T10:00:00"):
        with pytest.raises(ValueError, match="EngineEvent\nat\n"):
            EngineEvent.model_validate({**ok, "at": at})


def test_model_slot_runs_are_strict_pairs() -> None:
    """A slot run is exactly [start >= 0, length >= 1] of JSON integers."""
    ok = {**_event(), "key_id": "k", "signature": "s"}
    for bad in ([[1]], [[1, 2, 3]], [[-1, 2]], [[1, 0]], [["1", 2]], [[1, True]]):
        with pytest.raises(ValueError, match="EngineEvent\nslots\\.0"):
            EngineEvent.model_validate({**ok, "slots": bad})


# ---- signing and verifying ---------------------------------------------------------------------


def test_round_trip(keys: Keys) -> None:
    """A signed event verifies under its key; its canonical bytes are the RFC 8785 JSON of the record."""
    s = _signed(keys)
    assert s.canonical == canonicalize(s.record) and json.loads(s.canonical) == s.record
    assert s.record["key_id"] == keys.decision.key_id and s.kind == "realization"
    typed = verify_engine_event(s.record, keys.decision.public_key)
    assert typed.event_id == s.event_id and typed.slots == [(1000, 40), (7, 10)]
    assert record_problem(s.canonical, keys.decision.public_key, keys.decision.key_id) is None


def test_signing_does_not_modify_its_input(keys: Keys) -> None:
    """sign_engine_event returns a new record and leaves the unsigned one as it was."""
    unsigned = _event()
    before = copy.deepcopy(unsigned)
    sign_engine_event(unsigned, keys.decision)
    assert unsigned == before


def test_signing_refuses_a_malformed_event(keys: Keys) -> None:
    """A hand-built dict that is not an engine event is refused with the field named."""
    with pytest.raises(InputError) as e:
        sign_engine_event({**_event(), "slots": [[0, 0]]}, keys.decision)
    assert e.value.field == "slots.0.1"


@pytest.mark.parametrize(
    "mutate",
    [
        lambda r: r.__setitem__("kind", "realization_failed"),
        lambda r: r.__setitem__("decision_id", "e" * 32),
        lambda r: r.__setitem__("materialized_tokens", r["materialized_tokens"] + 1),
        lambda r: r["slots"][0].__setitem__(0, 2000),
        lambda r: r["spans"][0].__setitem__("donor_start", 5),
        lambda r: r.__setitem__("at", "2030-01-01T00:00:00Z"),
        lambda r: r.__setitem__("detail", "nothing to see"),
    ],
    ids=["kind", "decision", "tokens", "slots", "span", "time", "detail"],
)
def test_tampering_is_detected(keys: Keys, mutate: Any) -> None:
    """Changing any signed field breaks the signature, as a dict and as audit-log bytes."""
    s = _signed(keys)
    rec = copy.deepcopy(s.record)
    mutate(rec)
    with pytest.raises(SignatureError, match="does not verify"):
        verify_engine_event(rec, keys.decision.public_key)
    why = record_problem(canonicalize(rec), keys.decision.public_key, keys.decision.key_id)
    assert why == "engine event signature does not verify"


def test_wrong_key_is_named(keys: Keys) -> None:
    """Verifying with another public key reports the key id mismatch."""
    s = _signed(keys)
    with pytest.raises(SignatureError, match="signed by key"):
        verify_engine_event(s.record, keys.k1.public_key)
    assert "signed by key" in str(record_problem(s.canonical, keys.k1.public_key, "k1"))


def test_non_canonical_bytes_are_detected(keys: Keys) -> None:
    """The same signed event with other key order or whitespace is not a valid audit leaf."""
    s = _signed(keys)
    pub, kid = keys.decision.public_key, keys.decision.key_id
    for raw in (json.dumps(s.record).encode(), json.dumps(s.record, sort_keys=True).encode()):
        assert record_problem(raw, pub, kid) == "record bytes are not RFC 8785 canonical JSON"


def test_not_an_event(keys: Keys) -> None:
    """Objects that are not engine events are refused before any crypto; the log names both schemas."""
    with pytest.raises(SignatureError, match="not an engine event"):
        verify_engine_event({"hello": 1}, keys.decision.public_key)
    other = canonicalize({**_signed(keys).record, "schema": "semgov.engine_event/v3"})
    known = (
        "semgov.decision/v1, semgov.decision/v2, semgov.decision/v3, semgov.shadow_decision/v1, "
        "semgov.engine_event/v1, "
        "semgov.engine_event/v2, semgov.audit_recovery/v1"
    )
    expect = f"not a {known} record"
    assert record_problem(other, keys.decision.public_key, keys.decision.key_id) == expect
    assert record_problem(b'{"schema":[]}', keys.decision.public_key, keys.decision.key_id) == expect


def test_committed_fixture_verifies() -> None:
    """Engine events signed when the format was fixed still verify (format stability)."""
    pub = load_public_key(ASSETS / "decision-signing-key.pub.pem")
    lines = (ASSETS / "engine-events.jsonl").read_text().splitlines()
    kinds = set()
    for line in lines:
        rec = json.loads(line)
        kinds.add(verify_engine_event(rec, pub).kind)
        assert record_problem(line.encode(), pub, rec["key_id"]) is None
    assert kinds == {"realization", "reuse_disabled"}
    bad = json.loads(lines[0])
    bad["slots"][0][1] -= 1
    with pytest.raises(SignatureError):
        verify_engine_event(bad, pub)


@pytest.mark.parametrize("kind", ["canary", "shifted_reuse_disabled"])
def test_canary_kinds_are_v2_only(keys: Keys, kind: str) -> None:
    """The canary's kinds sign and verify as v2; a v1 record claiming one is refused, signature or not."""
    signed = _signed(keys, kind=kind, materialized_tokens=8, slots=[], spans=[], detail="match: 8 tokens")
    assert signed.record["schema"] == "semgov.engine_event/v2"
    assert verify_engine_event(signed.record, keys.decision.public_key).kind == kind
    unsigned = {k: v for k, v in signed.record.items() if k not in ("key_id", "signature")}
    with pytest.raises(InputError, match="cannot be"):
        sign_engine_event({**unsigned, "schema": "semgov.engine_event/v1"}, keys.decision)
    with pytest.raises(ValidationError, match="a semgov.engine_event/v1 record cannot be"):
        EngineEvent.model_validate({**signed.record, "schema": "semgov.engine_event/v1"})


def test_v1_realizations_still_verify_as_v1(keys: Keys) -> None:
    """A v1 record of an original kind (what logs written before v2 hold) verifies unchanged."""
    v1 = {k: v for k, v in _event().items()} | {"schema": "semgov.engine_event/v1"}
    signed = sign_engine_event(v1, keys.decision)
    assert verify_engine_event(signed.record, keys.decision.public_key).schema_ == "semgov.engine_event/v1"


@pytest.mark.parametrize("member", ["detail", "request_id", "spans"])
def test_a_signed_record_lacking_a_required_member_is_refused(keys: Keys, member: str) -> None:
    """The audit verifier refuses a correctly signed record that lacks a member its schema requires
    (the signer cannot make a malformed record pass; found by the hostile campaign's records target)."""
    from semgov.signing.records import sign_record_canonical

    unsigned = {k: v for k, v in _signed(keys).record.items() if k not in ("key_id", "signature", member)}
    _, line = sign_record_canonical(unsigned, keys.decision)
    why = record_problem(line, keys.decision.public_key, keys.decision.key_id)
    assert why is not None and member in why, why
