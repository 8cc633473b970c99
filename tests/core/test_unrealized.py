"""Allows not realized (engine_hooks.core.unrealized): one outcome per abandoned decision, reported
by the core with its reason code, in either decision mode; counted by the metric and the audit CLI."""

from __future__ import annotations

import threading
from array import array
from pathlib import Path
from typing import Any

import pytest

from engine_hooks.core.decisions import PendingDecision
from engine_hooks.core.donors import DonorSpec
from engine_hooks.core.governor import Governor
from engine_hooks.core.settings import HookSettings
from engine_hooks.core.unrealized import REASONS
from semgov.wire.names import NOT_REALIZED_REASONS, not_realized_reason
from tests.sglang_server.rig import CONTEXT_SECRET, Gateway, HookFiles, pair_prompts, read_audit

GW = Gateway(CONTEXT_SECRET)


def _job() -> PendingDecision:
    return PendingDecision("r", None, None, (), None)  # type: ignore[arg-type]


def test_abandon_before_finish_is_reported_and_after_finish_is_taken() -> None:
    """Exactly one outcome: abandoned first, finish() returns the reason (the core reports it);
    finished first, abandon() is refused (the adapter takes the decision)."""
    a = _job()
    assert a.abandon("late") is True and a.finish() == "late" and a.done
    b = _job()
    assert b.finish() is None and b.abandon("late") is False and b.abandoned is None


def test_abandon_racing_finish_never_gives_two_outcomes() -> None:
    """Abandon and finish racing on two threads: the job is either abandoned (reported) or taken,
    never both and never neither, every time."""
    for _ in range(2000):
        job = _job()
        got: dict[str, Any] = {}
        t = threading.Thread(target=lambda j=job, g=got: g.__setitem__("finish", j.finish()))
        t.start()
        got["abandon"] = job.abandon("late")
        t.join()
        reported = got["finish"] is not None
        taken = not got["abandon"]
        assert reported != taken


def test_the_reason_codes_are_one_list() -> None:
    """The core's Literal and the wire names list the same codes; a detail's head is its code."""
    assert REASONS == NOT_REALIZED_REASONS
    assert not_realized_reason("late: decided in 900 ms") == "late"
    assert not_realized_reason("RuntimeError: gone") is None and not_realized_reason(None) is None


def _governor(tmp_path: Path, **env: str) -> Governor:
    files = HookFiles.make(tmp_path / "hook")
    base = {**files.env(), "SEMGOV_PROVIDER": "tests.sglang_server.cpu_plugin:permissive_minhash",
            "SEMGOV_DETOKENIZER": "none", "SEMGOV_DECISION_PROCESS": "0", "SEMGOV_ASYNC_REGISTRATION": "0",
            "SEMGOV_WARMUP": "0"}  # fmt: skip
    return Governor(HookSettings.from_env({**base, **env}), engine_name="test")


def _decide_abandoned(gov: Governor, tag: str, reason: str) -> PendingDecision:
    p = pair_prompts(tag, e_len=512)
    d_ctx = gov.verdict_of(GW.token("acme", "ns", p.donor_segs), None, dedicated=True).context
    r_ctx = gov.verdict_of(GW.token("acme", "ns", p.recipient_segs), None, dedicated=True).context
    assert d_ctx is not None and r_ctx is not None
    gov.submit_donor(DonorSpec(f"{tag}-donor", d_ctx, "", None, array("q", p.donor), None))
    assert gov.wait_registrations() and gov.drain_donors() == 1
    job = gov.decide_later(f"{tag}-r", r_ctx, None, array("q", p.recipient))
    assert job.abandon(reason)  # NOTE: the decision thread has not finished it yet (or, inline, has)
    return job


@pytest.mark.parametrize("process", ["0", "1"])
def test_an_abandoned_allow_is_reported_by_the_core(tmp_path: Path, process: str) -> None:
    """A decision its adapter abandoned (here: ``late``) that finishes with an allow leaves one
    ``realization_failed`` event ``late: ...`` naming that allow, counted by reason, whether it
    was decided on the decision thread or in the decision process."""
    gate = threading.Event()
    gov = _governor(tmp_path, SEMGOV_DECISION_PROCESS=process, SEMGOV_ASYNC_REGISTRATION=process)
    try:
        if process == "0":
            gov.jobs.submit(threading.Event())  # NOTE: a no-op job: the thread is up
            orig = gov.local.run  # type: ignore[union-attr]

            def held(job: PendingDecision) -> None:
                gate.wait(30)
                orig(job)

            gov.local.run = held  # type: ignore[union-attr,method-assign]
        job = _decide_abandoned(gov, f"abandon-{process}", "late")
        gate.set()
        assert gov.wait_idle(60) and gov.wait_idle(60)
        assert job.done
        counter = gov.metrics.allows_not_realized.labels("late")._value.get()
    finally:
        gate.set()
        gov.close()
    records = read_audit(gov.settings.audit_dir)
    allows = [r["decision_id"] for r in records if r.get("decision") == "allow"]
    failed = [r for r in records if r.get("kind") == "realization_failed"]
    assert allows and [f["decision_id"] for f in failed] == allows
    assert all(f["detail"].startswith("late: decided in ") for f in failed) and counter >= len(allows)


def test_a_decision_taken_by_its_adapter_reports_nothing(tmp_path: Path) -> None:
    """A decision that finished before the adapter looked is taken, not reported: no event."""
    gov = _governor(tmp_path, SEMGOV_ASYNC_DECISIONS="0")
    try:
        p = pair_prompts("taken", e_len=512)
        d_ctx = gov.verdict_of(GW.token("acme", "ns", p.donor_segs), None, dedicated=True).context
        r_ctx = gov.verdict_of(GW.token("acme", "ns", p.recipient_segs), None, dedicated=True).context
        assert d_ctx is not None and r_ctx is not None
        gov.submit_donor(DonorSpec("taken-donor", d_ctx, "", None, array("q", p.donor), None))
        gov.drain_donors()
        job = gov.decide_later("taken-r", r_ctx, None, array("q", p.recipient))
        assert job.done and not job.abandon("late")
        assert any(d.decision == "allow" for d in job.decisions)
    finally:
        gov.close()
    assert [r for r in read_audit(gov.settings.audit_dir) if r.get("kind") == "realization_failed"] == []


def test_not_realized_writes_the_code_first_and_counts_it(tmp_path: Path) -> None:
    """Governor.not_realized: a realization_failed event whose detail is ``<code>: <why>``, and one
    more in semgov:allows_not_realized_total{reason=<code>}."""
    gov = _governor(tmp_path)
    try:
        counter = gov.metrics.allows_not_realized.labels("donor_evicted")
        before = counter._value.get()  # NOTE: the process's registry: other tests count here too
        gov.not_realized("donor_evicted", request_id="r", decision_id="d", donor_id="x", detail="gone")
        assert counter._value.get() == before + 1
    finally:
        gov.close()
    (ev,) = [r for r in read_audit(gov.settings.audit_dir) if r.get("kind") == "realization_failed"]
    assert (ev["detail"], ev["decision_id"], ev["donor_id"]) == ("donor_evicted: gone", "d", "x")
