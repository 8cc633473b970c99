"""Calibration requests in the governed-serving core (issue 47): decided under the live policy plus
the run's plan, kept out of shadow and capture, and their donors released, in both decision modes."""

from __future__ import annotations

import time
from array import array
from pathlib import Path

from engine_hooks.core.donors import DonorSpec
from semgov.context import CalibrationClaim, RequestContext, calibration_namespace
from semgov.intake.capture import read_captured
from tests.core.files import CONTRACT, TASK, HookFiles
from tests.core.test_policy_lifecycle import (
    EVIDENCE,
    SEGS,
    SYSTEM,
    governor,
    mode,  # noqa: F401 - the fixture, parametrized over both decision modes
    records,
    stricter,
    tokens,
    wait_for,
    write_policy,
)

RUN = "r1-0"
NS = calibration_namespace("ns1", RUN)


# NOTE: a recipient behind a new 40-token instruction wrapper: its evidence is the donor's, shifted
SHIFTED_SEGS = (("system", 0, 200), ("instruction", 200, 240), ("evidence", 240, 640), ("question", 640, 690))
SHIFTED_IDS = SYSTEM + tokens(9, 40) + EVIDENCE + tokens(4, 50)


def _ctx(role: str, plan: str | None = None, namespace: str = NS, run: str = RUN) -> RequestContext:
    segs = SHIFTED_SEGS if role == "recipient" else SEGS
    return RequestContext(
        "acme", namespace, dict(TASK), dict(CONTRACT), segs, None, CalibrationClaim(run, role, plan)
    )


def _donate(gov: object, donor_id: str, ctx: RequestContext) -> None:
    ids = array("q", SYSTEM + EVIDENCE + tokens(3, 50))
    gov.submit_donor(DonorSpec(donor_id, ctx, ctx.cache_key(gov.context_key), None, ids, None))  # type: ignore[attr-defined]
    assert gov.wait_registrations(60)  # type: ignore[attr-defined]
    gov.drain_donors()  # type: ignore[attr-defined]


def _decide(gov: object, rid: str, ctx: RequestContext) -> object:
    ids = array("q", SHIFTED_IDS if ctx.calibration is not None and ctx.calibration.role == "recipient"
                else SYSTEM + EVIDENCE + tokens(4, 50))  # fmt: skip
    job = gov.decide_later(rid, ctx, None, ids)  # type: ignore[attr-defined]
    deadline = time.monotonic() + 60
    while not job.done:
        assert time.monotonic() < deadline, "no decision within 60 s"
        time.sleep(0.005)
    assert gov.wait_idle(60)  # type: ignore[attr-defined]
    return job


def test_a_recipient_is_decided_under_the_live_policy_plus_its_plan(
    hook_files: HookFiles,
    tmp_path: Path,
    mode: str,  # noqa: F811
) -> None:
    """Its record names '<live revision>+calibrate:<plan>' and plans the plan's tail; no shadow record
    and no capture are made of it, while a production request still gets both."""
    shadow = tmp_path / "shadow"
    write_policy(shadow, stricter(hook_files.policy))
    capture = tmp_path / "capture"
    gov = governor(hook_files, mode, SEMGOV_SHADOW_POLICY=str(shadow), SEMGOV_CAPTURE_DIR=str(capture),
                   SEMGOV_CAPTURE_RATE="1")  # fmt: skip
    try:
        _donate(gov, "sglang-donor-cal", _ctx("donor"))
        cal = _decide(gov, "cal-1", _ctx("recipient", "trailing:64"))
        prod_ctx = RequestContext("acme", "ns1", dict(TASK), dict(CONTRACT), SEGS, None)
        _donate(gov, "sglang-donor-prod", prod_ctx)
        prod = _decide(gov, "prod-1", prod_ctx)
        wait_for(lambda: gov.shadow_records == 1)
    finally:
        gov.close()
    (rec,) = [d.record for d in cal.decisions]  # type: ignore[attr-defined]
    assert rec["decision"] == "allow" and rec["namespace"] == NS
    assert rec["policy"]["revision"] == f"{gov.revision}+calibrate:trailing:64"
    shifted = [s for s in rec["approved_spans"] if s["kind"] == "shifted"]
    assert [(s["recipient_start"], s["donor_start"], s["length"], s["recompute"]) for s in shifted] == [
        (240, 200, 400 - 64, 0)  # NOTE: the plan's tail of 64 ends the span early, no head
    ]
    assert [d.record["policy"]["revision"] for d in prod.decisions] == [gov.revision]  # type: ignore[attr-defined]
    shadows = [r for r in records(hook_files) if r["schema"] == "semgov.shadow_decision/v1"]
    assert [s["request_id"] for s in shadows] == ["prod-1"]
    captured = [c.request_id for c in read_captured(capture)]  # type: ignore[union-attr]
    assert captured == ["prod-1"]


def test_a_donor_or_cold_role_is_never_decided(hook_files: HookFiles) -> None:
    """Only recipients are decided: any other role asking for a decision gets none (no record)."""
    gov = governor(hook_files, "thread")
    try:
        _donate(gov, "sglang-donor-cal", _ctx("donor"))
        job = _decide(gov, "cal-donor", _ctx("donor"))
    finally:
        gov.close()
    assert job.decisions == []  # type: ignore[attr-defined]
    assert not [r for r in records(hook_files) if r.get("request_id") == "cal-donor"]


def test_a_release_drops_its_scope_donors_only_and_those_still_registering(hook_files: HookFiles) -> None:
    """Release empties the pair's scope (audited with the count), leaves another scope's donor, and a
    donor of the released scope that finishes registering afterwards is never made visible."""
    gov = governor(hook_files, "thread")
    other = _ctx("donor", namespace=calibration_namespace("ns1", "r1-1"), run="r1-1")
    try:
        _donate(gov, "d-a", _ctx("donor"))
        _donate(gov, "d-b", other)
        assert gov.release_scope(_ctx("release"), None) == 1
        assert not gov.has_donors(_ctx("recipient", "none"), None) and gov.has_donors(other, None)
        _donate(gov, "d-late", _ctx("donor"))  # NOTE: registered after its scope was released
        assert not gov.has_donors(_ctx("recipient", "none"), None) and gov.donor("d-late") is None
        assert _decide(gov, "after", _ctx("recipient", "none")).decisions == []  # type: ignore[attr-defined]
    finally:
        gov.close()
    (ev,) = [r for r in records(hook_files) if r.get("kind") == "calibration_released"]
    assert ev["detail"] == f"calibration run {RUN}: 1 donor(s) dropped"
