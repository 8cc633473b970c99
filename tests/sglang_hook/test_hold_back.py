"""Decisions off the scheduler thread (issue 13): held out of prefill rounds, never waited for."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

import engine_hooks.sglang.governor as governor_mod
from engine_hooks.sglang.cache import state_of
from engine_hooks.sglang.plugin import prefill_round
from tests.sglang_hook.scenario import E_LEN, S_LEN, blocks, new_recipient, run_donor


class _Tree:
    def __init__(self, hold: set[str]) -> None:
        self.hold = hold

    def hold_back(self, waiting: list[Any]) -> list[Any]:
        return [r for r in waiting if r in self.hold]


def test_prefill_round_runs_without_held_requests_and_puts_them_back_first() -> None:
    """The round sees only the requests not held; afterwards the held ones lead the list it left."""
    sched = SimpleNamespace(tree_cache=_Tree({"b", "d"}), waiting_queue=["a", "b", "c", "d"])
    seen: list[list[str]] = []

    def original(s: Any) -> str:
        seen.append(list(s.waiting_queue))
        s.waiting_queue = [r for r in s.waiting_queue if r != "a"]  # "a" admitted: SGLang replaces the list
        return "batch"

    assert prefill_round(original, sched) == "batch"
    assert seen == [["a", "c"]]
    assert sched.waiting_queue == ["b", "d", "c"]


def test_prefill_round_restores_held_requests_when_the_round_raises() -> None:
    """An exception inside the round still puts the held requests back in the waiting queue."""
    sched = SimpleNamespace(tree_cache=_Tree({"b"}), waiting_queue=["a", "b"])

    def original(s: Any) -> None:
        raise RuntimeError("round failed")

    with pytest.raises(RuntimeError, match="round failed"):
        prefill_round(original, sched)
    assert sched.waiting_queue == ["b", "a"]


def test_prefill_round_leaves_a_scheduler_without_the_backend_alone() -> None:
    """A scheduler whose tree is not the semgov backend runs its round untouched."""
    queue = ["a"]
    sched = SimpleNamespace(tree_cache=object(), waiting_queue=queue)
    assert prefill_round(lambda s: s.waiting_queue, sched) is queue


def test_recipient_is_held_until_decided_and_durable_then_realized(make_harness: Any) -> None:
    """The first round queues the decision and holds the request; once durable it is let in and realized."""
    h = make_harness()
    b = blocks()
    run_donor(h, b)
    rcp = new_recipient(h, b)
    assert h.tree.hold_back([rcp]) == [rcp]  # decision queued, not made on this thread
    st = state_of(rcp)
    assert st is not None and st.pending is not None
    h.run(rcp)
    assert rcp.prefix_len == S_LEN + E_LEN and st.durable
    assert h.tree.stats["held"] >= 1 and h.tree.stats["late_decisions"] == 0
    h.finish(rcp)
    h.assert_clean()


def test_decisions_and_event_signing_run_on_the_decision_thread(
    make_harness: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Policy evaluation and engine-event signing happen on semgov-decide, never on the calling thread."""
    threads: dict[str, set[str]] = {"decide": set(), "sign": set()}
    h = make_harness()
    real_evaluate = h.tree.gov.evaluator.evaluate
    real_sign = governor_mod.sign_engine_event

    def evaluate(*a: Any, **k: Any) -> Any:
        threads["decide"].add(threading.current_thread().name)
        return real_evaluate(*a, **k)

    def sign(*a: Any, **k: Any) -> Any:
        threads["sign"].add(threading.current_thread().name)
        return real_sign(*a, **k)

    monkeypatch.setattr(h.tree.gov.evaluator, "evaluate", evaluate)
    monkeypatch.setattr(governor_mod, "sign_engine_event", sign)
    b = blocks()
    run_donor(h, b)
    rcp = new_recipient(h, b)
    h.run(rcp)
    h.finish(rcp)
    assert any(r.get("kind") == "realization" for r in h.records())
    assert threads == {"decide": {"semgov-decide"}, "sign": {"semgov-decide"}}


def test_a_late_decision_is_audited_but_the_request_runs_cold(
    make_harness: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past SEMGOV_DECISION_TIMEOUT_MS the request is let in cold; the late allow is audited, not acted on."""
    h = make_harness(SEMGOV_DECISION_TIMEOUT_MS="50")
    gate = threading.Event()
    real_decide = h.tree.gov.decide

    def slow(*a: Any, **k: Any) -> Any:
        gate.wait(30)
        return real_decide(*a, **k)

    monkeypatch.setattr(h.tree.gov, "decide", slow)
    b = blocks()
    run_donor(h, b)
    rcp = new_recipient(h, b)
    t0 = time.monotonic()
    rounds = h.hold(rcp)
    assert rounds >= 2 and time.monotonic() - t0 >= 0.05
    assert h.tree.stats["late_decisions"] == 1
    gate.set()
    h.run(rcp)
    assert rcp.prefix_len == S_LEN and not rcp.skip_radix_cache_insert  # cold past the exact match
    recs = h.records()
    assert [r["decision"] for r in recs if r["schema"] == "semgov.decision/v1"] == ["allow"]
    assert not any(r.get("kind") == "realization" for r in recs)
    h.finish(rcp)
    h.assert_clean()


def test_an_allow_not_durable_in_time_is_let_through_and_audited_as_a_fallback(
    make_harness: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An allow whose record is not durable within SEMGOV_AUDIT_WAIT_MS: admitted cold, realization_failed."""
    h = make_harness(SEMGOV_AUDIT_WAIT_MS="20")
    monkeypatch.setattr(h.tree.gov, "decision_durable", lambda decision_id, timeout: False)
    b = blocks()
    run_donor(h, b)
    rcp = new_recipient(h, b)
    h.run(rcp)
    assert rcp.prefix_len == S_LEN
    assert h.tree.stats["not_durable_in_time"] == 1
    failed = [r for r in h.records() if r.get("kind") == "realization_failed"]
    assert len(failed) == 1 and "not durable" in failed[0]["detail"]
    h.finish(rcp)
    h.assert_clean()
