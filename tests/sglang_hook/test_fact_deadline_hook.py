"""The SGLang hook's decisions are bounded by SEMGOV_DECISION_TIMEOUT_MS, fact computation included."""

from __future__ import annotations

from typing import Any

from tests.sglang_hook.scenario import blocks


class _Jumps:
    """A monotonic clock that reads 0 when a decision's deadline is set, and 1 s later ever after."""

    def __init__(self) -> None:
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return 0.0 if self.reads == 1 else 1.0


def test_facts_past_the_decision_timeout_deny_and_the_request_runs_cold(make_harness: Any) -> None:
    """Facts not ready within the timeout: a signed deny naming fact computation, cold, nothing leaked."""
    h = make_harness(SEMGOV_DECISION_TIMEOUT_MS="50")
    b = blocks()
    lay = b.donor()
    donor = h.new_req("donor", lay.tokens, h.context(segments=lay.segments))
    h.run(donor)
    h.finish(donor)
    h.tree.gov.evaluator.monotonic = _Jumps()
    rl = b.recipient()
    rcp = h.new_req("rcp", rl.tokens, h.context(segments=rl.segments))
    h.match(rcp)
    decisions = [r for r in h.records() if r["schema"] == "semgov.decision/v3"]
    assert [d["decision"] for d in decisions] == ["deny"]
    assert {g["result"] for g in decisions[0]["gates"]} == {"error"}
    assert decisions[0]["gates"][0]["detail"].startswith("fact computation exceeded 0.05 s")
    assert rcp.host_hit_length == 0
    h.abort_waiting(rcp)
    h.assert_clean()
