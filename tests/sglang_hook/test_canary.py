"""Canaries (issue 14): sampled shifted reuses replayed cold, compared, and a scope turned off."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from engine_hooks.core.canary import (
    DISABLED,
    STATE_FILE,
    Canaries,
    Canary,
    CanaryBook,
    CanaryEvent,
    CanaryMarker,
    CanarySettings,
    compare,
    load_state,
    plain_greedy,
    replay_params,
    save_state,
    scope_of,
)
from semgov.context import RequestContext

TASK = {"id": "qa", "version": "1"}
CONTRACT = {"id": "answer-json", "schema_sha256": "a" * 64}
OTHER = {"id": "summary", "version": "1"}


def _ctx(
    task: dict[str, str] = TASK, tenant: str = "acme", namespace: str = "ns1", lora: str | None = None
) -> RequestContext:
    """A verified request context of that scope."""
    return RequestContext(tenant, namespace, dict(task), dict(CONTRACT), None, lora)


def _canary(
    warm: tuple[int, ...] = (5, 6, 7), task: dict[str, str] = TASK, rid: str = "r", tenant: str = "acme"
) -> Canary:
    return Canary(rid, "dec", "donor", scope_of(_ctx(task, tenant)), (1, 2, 3), warm)


def test_compare_finds_the_first_difference_or_none() -> None:
    """A replay equal to the warm output is None; otherwise the first differing (or missing) position."""
    assert compare([1, 2, 3], [1, 2, 3]) is None
    assert compare([1, 2, 3], [1, 9, 3]) == 1
    assert compare([1, 2, 3], [1, 2]) == 2
    assert compare([1, 2], [1, 2, 3]) is None  # NOTE: only the warm tokens are compared


def test_marker_verifies_only_what_this_process_minted() -> None:
    """A canary marker verifies; a look-alike, another process's, an edited one or a non-string does not."""
    m = CanaryMarker(b"s" * 32)
    tok = m.token(7)
    assert m.verify(tok)
    assert not CanaryMarker(b"t" * 32).verify(tok)
    assert not m.verify(tok[:-1] + ("0" if tok[-1] != "0" else "1"))
    assert not m.verify(tok.replace(":7.", ":8."))
    for bad in (
        None,
        7,
        b"semgov-canary:7.x",
        "semgov-canary:",
        "semgov-canary:x." + "0" * 32,
        tok + "x" * 200,
    ):
        assert not m.verify(bad)


def _req(**sp: Any) -> Any:
    base = dict(
        top_k=1, n=1, beam_width=None, frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.0,
        min_new_tokens=0, json_schema=None, regex=None, ebnf=None, structural_tag=None, logit_bias=None,
        custom_params=None, temperature=1.0, top_p=1.0, min_p=0.0, watermark=None,
    )  # fmt: skip
    base.update(sp)
    return SimpleNamespace(sampling_params=SimpleNamespace(**base), custom_logit_processor=None)


@pytest.mark.parametrize(
    "change",
    [
        {"top_k": 40},
        {"n": 2},
        {"beam_width": 4},
        {"frequency_penalty": 0.5},
        {"presence_penalty": 0.1},
        {"repetition_penalty": 1.1},
        {"min_new_tokens": 3},
        {"json_schema": "{}"},
        {"regex": "a+"},
        {"logit_bias": {"5": 1.0}},
        {"custom_params": {"x": 1}},
    ],
)
def test_only_plain_greedy_requests_are_canaries(change: dict[str, Any]) -> None:
    """Plain greedy decoding is a canary candidate; sampling, penalties, grammars or biases are not."""
    assert plain_greedy(_req())
    assert not plain_greedy(_req(**change))
    assert not plain_greedy(SimpleNamespace())  # an unknown shape, never an error


def test_budget_zero_turns_the_scope_off_at_the_first_regression_only_there() -> None:
    """A match counts; the first regression (budget 0) turns shifted reuse off for its scope, not another."""
    book = CanaryBook(CanarySettings(budget=0), "rev1")
    assert not book.record(_canary(), [5, 6, 7], None, "t0")
    assert book.disabled == frozenset()
    assert book.record(_canary(), [5, 6, 8], None, "t1")
    other = _canary(task=OTHER)
    assert not book.record(other, [5, 6, 7], None, "t2")
    assert book.disabled == {scope_of(_ctx())}
    kinds = [(e.kind, e.detail.split(":")[0]) for e in book.take_events()]
    assert kinds == [
        ("canary", "match"),
        ("canary", "regression at output token 2"),
        ("shifted_reuse_disabled", 'shifted reuse off for {"lora_id"'),
        ("canary", "match"),
    ]
    assert book.take_events() == []


def test_a_new_live_revision_clears_what_canaries_found_under_the_old_one() -> None:
    """A hot-reloaded policy revision turns the scopes back on, clears counts and the queue; the
    revision in force is a no-op, and the state then names the new revision."""
    book = CanaryBook(CanarySettings(budget=0), "rev1")
    assert book.record(_canary(), [5, 6, 8], None, "t1")
    assert book.offer(_canary(task=OTHER))
    assert not book.new_revision("rev1") and book.disabled
    assert book.new_revision("rev2")
    assert (book.disabled, book.counts, book.pending()) == (frozenset(), {}, 0)
    assert book.state()["policy_revision"] == "rev2" and book.offer(_canary())


def test_a_budget_tolerates_that_many_regressions() -> None:
    """With budget 2 the third regression turns the scope off, and only once."""
    book = CanaryBook(CanarySettings(budget=2), "rev1")
    assert [book.record(_canary(), [0], None, "t") for _ in range(4)] == [None, None, DISABLED, None]
    assert sum(e.kind == "shifted_reuse_disabled" for e in book.take_events()) == 1


def test_a_failed_replay_is_audited_and_counts_neither_way() -> None:
    """A replay error is an audited canary event; the scope's counts do not move."""
    book = CanaryBook(CanarySettings(), "rev1")
    assert not book.record(_canary(), None, "TimeoutError: slow", "t")
    assert book.counts == {} and [e.detail for e in book.take_events()] == [
        "replay failed: TimeoutError: slow"
    ]


def test_the_queue_is_bounded_and_a_disabled_scope_takes_no_more() -> None:
    """offer drops (counted) past the bound, and refuses a scope already off; turning a scope off
    drops its queued canaries."""
    book = CanaryBook(CanarySettings(queue=2), "rev1")
    assert book.offer(_canary(rid="a")) and book.offer(_canary(rid="b")) and not book.offer(_canary(rid="c"))
    assert book.dropped == 1 and book.pending() == 2
    book.record(_canary(), [9], None, "t")
    assert book.pending() == 0 and not book.offer(_canary())


def test_state_survives_a_restart_under_the_same_policy_revision_only(tmp_path: Path) -> None:
    """The disabled scopes are restored from the state file under the same revision, cleared by another."""
    book = CanaryBook(CanarySettings(), "rev1")
    book.record(_canary(), [0], None, "2026-12-02T00:00:00Z")
    path = tmp_path / STATE_FILE
    save_state(path, book.state())
    again = CanaryBook(CanarySettings(), "rev1")
    assert again.restore(load_state(path)) == (True, "1 scope(s) off, 0 trusted, restored")
    assert again.disabled == book.disabled
    fresh = CanaryBook(CanarySettings(), "rev2")
    assert (
        "cleared by the new revision" in fresh.restore(load_state(path))[1] and fresh.disabled == frozenset()
    )
    assert "nothing restored" in fresh.restore({"schema": "x"})[1]
    (tmp_path / "bad.json").write_text("{")
    assert "unreadable" in str(load_state(tmp_path / "bad.json"))
    assert load_state(tmp_path / "none.json") is None
    broken = json.loads(path.read_text())
    broken["scopes"][0]["task"] = {"id": 5, "version": "1"}
    assert "malformed" in CanaryBook(CanarySettings(), "rev1").restore(broken)[1]


def _wait(cond: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_canaries_sample_replay_when_idle_audit_and_persist(tmp_path: Path) -> None:
    """Sampled, queued, replayed only once the scheduler is idle, audited, and the state written."""
    events: list[CanaryEvent] = []
    sent: list[tuple[str, list[int]]] = []
    lock = threading.Lock()

    def replay(c: Canary, key: str) -> list[int]:
        with lock:
            sent.append((key, list(c.input_ids)))
        return [c.warm[0], c.warm[1] + 1]  # NOTE: differs at output token 1

    can = Canaries(
        CanarySettings(rate=1.0, tokens=2, idle_ms=300),
        revision="rev1",
        replay=replay,
        audit=events.append,
        state_path=tmp_path / STATE_FILE,
        clock=lambda: "2026-12-02T00:00:00Z",
    )
    try:
        req = _req()
        req.output_ids, req.origin_input_ids = [5, 6, 7], [1, 2, 3]
        can.busy()
        assert can.offer(req, request_id="r1", decision_id="d", donor_id="o", ctx=_ctx())
        time.sleep(0.1)
        assert sent == []  # NOTE: requests were waiting a moment ago: not idle yet
        _wait(lambda: len(events) == 2)
        assert can.marker.verify(sent[0][0]) and sent[0][1] == [1, 2, 3]
        assert [e.kind for e in events] == ["canary", "shifted_reuse_disabled"]
        assert events[0].compared == 2 and events[0].detail == "regression at output token 1: warm 6, cold 7"
        assert can.off_for(_ctx()) and not can.off_for(_ctx(OTHER))
        state = json.loads((tmp_path / STATE_FILE).read_text())
        assert state["policy_revision"] == "rev1" and state["scopes"][0]["task"] == TASK
        assert can.stats()["shifted_reuse_off_scopes"] == 1
    finally:
        can.close()
    restarted = Canaries(
        CanarySettings(rate=1.0), revision="rev1", replay=replay, audit=events.append,
        state_path=tmp_path / STATE_FILE, clock=lambda: "t",
    )  # fmt: skip
    try:
        assert restarted.off_for(_ctx())
    finally:
        restarted.close()


def test_an_unwritable_state_file_still_audits_and_keeps_the_scope_off(tmp_path: Path) -> None:
    """When the state file cannot be written, the scope is still off and both events are audited."""
    events: list[CanaryEvent] = []
    can = Canaries(
        CanarySettings(rate=1.0, tokens=1, idle_ms=0), revision="rev1",
        replay=lambda c, k: [c.warm[0] + 1], audit=events.append,
        state_path=tmp_path / "missing-dir" / STATE_FILE, clock=lambda: "t",
    )  # fmt: skip
    try:
        req = _req()
        req.output_ids, req.origin_input_ids = [5], [1, 2]
        assert can.offer(req, request_id="r1", decision_id="d", donor_id="o", ctx=_ctx())
        _wait(lambda: len(events) == 2)
        assert [e.kind for e in events] == ["canary", "shifted_reuse_disabled"]
        assert can.off_for(_ctx()) and not (tmp_path / "missing-dir").exists()
    finally:
        can.close()


def test_sampling_rate_and_greedy_gate_what_is_offered() -> None:
    """At rate 0.25 a sampler above it offers nothing; a non-greedy request is never offered."""
    draws = iter([0.9, 0.1])
    can = Canaries(
        CanarySettings(rate=0.25), revision="r", replay=lambda c, k: [], audit=lambda e: None,
        state_path=None, clock=lambda: "t", sample=lambda: next(draws),
    )  # fmt: skip
    try:
        req = _req()
        req.output_ids, req.origin_input_ids = [5], [1]
        kw: dict[str, Any] = dict(request_id="r", decision_id=None, donor_id=None, ctx=_ctx())
        assert not can.offer(req, **kw)  # 0.9 >= 0.25
        sampling = _req(top_k=50)
        sampling.output_ids, sampling.origin_input_ids = [5], [1]
        assert not can.offer(sampling, **kw)  # 0.1 < 0.25, but not greedy
    finally:
        can.close()


# ---- issue 31: per scope, per tenant, fail closed, the same computation ---------------------------


def test_one_tenants_regressions_never_turn_shifted_reuse_off_for_another_scope() -> None:
    """A regression in tenant acme's scope turns shifted reuse off there only: not for another tenant,
    namespace or LoRA adapter with the same task and contract, whose counts stay apart."""
    book = CanaryBook(CanarySettings(budget=0), "rev1")
    assert book.record(_canary(), [0], None, "t") == DISABLED
    others = [_ctx(tenant="globex"), _ctx(namespace="other"), _ctx(lora="adapter-1")]
    assert all(scope_of(c) not in book.disabled for c in others)
    assert book.disabled == {scope_of(_ctx())} and len({scope_of(c) for c in [_ctx(), *others]}) == 4
    assert book.record(Canary("g", None, None, scope_of(others[0]), (1,), (5,)), [5], None, "t") is None
    assert book.counts[scope_of(others[0])].regressions == 0


def test_one_tenants_burst_cannot_crowd_another_tenant_out_of_the_canary_queue() -> None:
    """A tenant's canaries take at most its share of the queue: past it they are dropped, and
    another tenant's canary is still queued."""
    book = CanaryBook(CanarySettings(queue=16, tenant_queue=2), "rev1")
    assert [book.offer(_canary(rid=f"a{i}")) for i in range(5)] == [True, True, False, False, False]
    assert book.offer(_canary(rid="g", tenant="globex")) and book.dropped == 3 and book.pending() == 3


def test_the_state_file_is_keyed_by_the_full_scope(tmp_path: Path) -> None:
    """Each entry of canary-state.json names tenant, namespace, task, contract and adapter, and a
    restart restores exactly that scope."""
    book = CanaryBook(CanarySettings(), "rev1")
    book.record(Canary("r", None, None, scope_of(_ctx(lora="ad")), (1,), (5,)), [6], None, "t")
    entry = book.state()["scopes"][0]
    assert (entry["tenant"], entry["namespace"], entry["lora_id"]) == ("acme", "ns1", "ad")
    save_state(tmp_path / STATE_FILE, book.state())
    again = CanaryBook(CanarySettings(), "rev1")
    assert again.restore(load_state(tmp_path / STATE_FILE))[0]
    assert again.disabled == {scope_of(_ctx(lora="ad"))}


def _restart(tmp_path: Path, probation: int = 2) -> Canaries:
    """The hook's canaries after a restart with the state file as it now is."""
    return Canaries(
        CanarySettings(rate=0.0, probation=probation), revision="rev1", replay=lambda c, k: [],
        audit=lambda e: None, state_path=tmp_path / STATE_FILE, clock=lambda: "t",
    )  # fmt: skip


@pytest.mark.parametrize("damage", ["deleted", "truncated", "old-schema", "one-bad-entry"])
def test_a_lost_or_damaged_state_file_never_re_enables_shifted_reuse_unmeasured(
    tmp_path: Path, damage: str
) -> None:
    """Delete, truncate or replace the state file and restart: no scope is trusted unmeasured (a
    request no canary can replay gets no shifted KV, the metric says the state was not restored);
    entries that still parse keep their scopes off; a scope is trusted again only after
    ``probation`` matching canaries."""
    book = CanaryBook(CanarySettings(probation=2), "rev1")
    book.record(_canary(), [0], None, "t")  # acme qa: off
    for _ in range(2):
        book.record(_canary(task=OTHER), [5, 6, 7], None, "t")  # acme summary: trusted
    assert book.trusted == {scope_of(_ctx(OTHER))}
    path = tmp_path / STATE_FILE
    save_state(path, book.state())
    full = _restart(tmp_path)
    assert full.stats()["canary_state_restored"] == 1 and full.shifted_ok(_ctx(OTHER), _req(top_k=50))
    full.close()
    if damage == "deleted":
        path.unlink()
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:40])
    elif damage == "old-schema":
        path.write_text(json.dumps({"schema": "semgov.canary_state/v1", "policy_revision": "rev1"}))
    else:
        doc = json.loads(path.read_text())
        doc["scopes"].append({"tenant": 7})
        path.write_text(json.dumps(doc))
    can = _restart(tmp_path)
    try:
        assert can.stats()["canary_state_restored"] == 0
        assert not can.shifted_ok(_ctx(OTHER), _req(top_k=50))  # NOTE: trusted before, unmeasured now
        assert can.shifted_ok(_ctx(OTHER), _req())  # ... except for a request a canary replays
        if damage == "one-bad-entry":
            assert can.off_for(_ctx()) and not can.shifted_ok(_ctx(), _req())  # NOTE: entries that parse
        for _ in range(2):
            can.book.record(_canary(task=OTHER), [5, 6, 7], None, "t")
        assert can.shifted_ok(_ctx(OTHER), _req(top_k=50))
    finally:
        can.close()


def test_a_scope_on_probation_replays_every_replayable_request() -> None:
    """On probation every replayable request is offered whatever the rate; once trusted, the rate
    samples again."""
    can = Canaries(
        CanarySettings(rate=0.0, probation=1), revision="r", replay=lambda c, k: [], audit=lambda e: None,
        state_path=None, clock=lambda: "t",
    )  # fmt: skip
    try:
        req = _req()
        req.output_ids, req.origin_input_ids = [5], [1]
        kw: dict[str, Any] = dict(request_id="r", decision_id=None, donor_id=None, ctx=_ctx())
        assert can.offer(req, **kw)
        canary = can.book.next()
        assert canary is not None and can.book.record(canary, [5], None, "t") == "trusted"
        assert not can.offer(req, **kw)  # NOTE: rate 0 once trusted
    finally:
        can.close()


@pytest.mark.parametrize(
    "field", ["lora_id", "multimodal_inputs", "input_embeds", "token_type_ids", "positional_embed_overrides"]
)
def test_a_request_a_replay_cannot_reproduce_is_never_sampled(field: str) -> None:
    """A request whose answer an adapter, media, embeddings, token types or positional overrides shape
    cannot be replayed through /generate with its input ids: it is not sampled (nor is a watermark)."""
    req = _req()
    assert replay_params(req) is not None
    setattr(req, field, object())
    assert replay_params(req) is None
    assert replay_params(_req(watermark=object())) is None


def test_the_replay_sends_the_requests_own_sampling_parameters() -> None:
    """The replay's sampling parameters are the request's own (normalized) ones, sent explicitly so
    the server's defaults cannot differ, with exactly as many tokens and ignore_eos."""
    import http.server

    from engine_hooks.core.canary import http_replay

    got: list[dict[str, Any]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            body = json.dumps({"output_ids": [5, 6]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: Any) -> None:
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.handle_request, daemon=True)
    t.start()
    try:
        params = replay_params(_req(top_p=0.5, min_p=0.1))
        assert params is not None
        canary = Canary("r", None, None, scope_of(_ctx()), (1, 2), (5, 6), params)
        assert http_replay("127.0.0.1", srv.server_address[1], None, 10.0)(canary, "k") == [5, 6]
    finally:
        t.join(10)
        srv.server_close()
    sp = got[0]["sampling_params"]
    assert sp == {
        "temperature": 1.0, "top_p": 0.5, "top_k": 1, "min_p": 0.1, "frequency_penalty": 0.0,
        "presence_penalty": 0.0, "repetition_penalty": 1.0, "max_new_tokens": 2, "ignore_eos": True,
    }  # fmt: skip


# ---- in the hook, on real SGLang objects ----------------------------------------------------------


def _attach(h: Any, replay: Any, events: list[CanaryEvent], **kw: Any) -> Canaries:
    """Canaries on the harness's tree, audited as the backend factory audits them (and listed)."""
    from engine_hooks.sglang.factory import canary_audit

    audit = canary_audit(h.tree.gov)

    def both(ev: CanaryEvent) -> None:
        audit(ev)
        events.append(ev)

    can = Canaries(
        CanarySettings(rate=1.0, tokens=3, idle_ms=0, **kw),
        revision=h.tree.gov.policy.revision,
        replay=replay,
        audit=both,
        state_path=None,
        clock=lambda: "2026-12-02T00:00:00Z",
    )
    h.tree.hook.canaries = can
    return can


def _greedy_finish(h: Any, req: Any, outputs: list[int]) -> None:
    """Finish ``req`` as a greedy request that produced ``outputs``."""
    req.sampling_params.top_k = 1
    req.output_ids = list(outputs)
    h.finish(req, len(outputs))


def _pair(h: Any, seed: int, task: dict[str, str], rid: str, tenant: str = "acme") -> Any:
    """A donor run to completion and its recipient, in ``task``'s scope; returns the recipient."""
    from tests.sglang_hook.scenario import blocks

    b = blocks(seed)
    lay = b.donor()
    ctx = h.context(tenant=tenant, segments=lay.segments, task=task)
    d = h.new_req(f"{rid}-donor", lay.tokens, ctx, text=lay.text)
    h.run(d)
    h.finish(d)
    r = b.recipient()
    return h.new_req(rid, r.tokens, h.context(tenant=tenant, segments=r.segments, task=task), text=r.text)


def test_a_realized_shifted_recipient_is_replayed_and_a_regression_turns_its_scope_off(
    make_harness: Any,
) -> None:
    """A greedy recipient that got shifted KV is replayed with a canary marker; a differing replay turns
    shifted reuse off for its task and contract: the next recipient there gets no shifted KV, while
    another task's recipient still does; both outcomes are in the audit log as signed events."""
    from engine_hooks.sglang.state import state_of

    h = make_harness()
    events: list[CanaryEvent] = []
    sent: list[tuple[str, list[int], tuple[int, ...]]] = []

    def replay(c: Canary, key: str) -> list[int]:
        sent.append((key, list(c.input_ids), c.warm))
        return [c.warm[0], c.warm[1], c.warm[2] + 1]

    can = _attach(h, replay, events)
    first = _pair(h, 11, TASK, "r1")
    h.run(first)
    st = state_of(first)
    assert st is not None and st.realizations == 1 and st.shifted
    _greedy_finish(h, first, [7, 8, 9, 10])
    _wait(lambda: len(events) == 2)
    assert (
        can.marker.verify(sent[0][0])
        and sent[0][1] == list(first.origin_input_ids)
        and sent[0][2] == (7, 8, 9)
    )
    assert can.off_for(_ctx())

    again = _pair(h, 12, TASK, "r2")
    h.run(again)
    st2 = state_of(again)
    assert st2 is not None and [d.decision for d in st2.decisions] == [
        "allow"
    ]  # NOTE: the policy still allows
    assert st2.realizations == 0 and not st2.shifted  # ... but no shifted KV is copied in this scope
    other = _pair(h, 13, OTHER, "r3")
    h.run(other)
    st3 = state_of(other)
    assert st3 is not None and st3.realizations == 1 and st3.shifted
    events_ = [
        r for r in h.records() if r["schema"] == "semgov.engine_event/v2" and r["kind"] != "realization"
    ]
    # NOTE: the allow in the scope canaries turned off is not acted on, and says why
    assert [r["kind"] for r in events_] == ["canary", "shifted_reuse_disabled", "realization_failed"]
    assert events_[2]["request_id"] == "r2" and "canaries turned shifted reuse off" in events_[2]["detail"]
    ok, why = h.invariant()
    assert ok, why


def test_a_canary_replay_gets_a_key_of_its_own_no_reuse_and_never_becomes_a_donor(make_harness: Any) -> None:
    """The hook's marker gives a request an isolated tree key, no decision, no tree insert, no donor; the
    same text minted by another process is an ordinary anonymous request."""
    from engine_hooks.sglang.state import state_of

    h = make_harness()
    can = _attach(h, lambda c, k: [], [])
    from tests.sglang_hook.scenario import blocks

    b = blocks(21)
    lay = b.donor()
    donors = h.tree.stats["donors_registered"]
    req = h.new_req("semgov-canary-x", lay.tokens, can.marker.token(1))
    h.run(req)
    st = state_of(req)
    assert st is not None and st.canary and st.context is None and st.pending is None
    assert st.cache_key.startswith("semgov:canary:") and req.skip_radix_cache_insert
    h.finish(req)
    assert h.tree.stats["donors_registered"] == donors
    forged = h.new_req("forged", lay.tokens, CanaryMarker().token(1))
    h.run(forged)
    fst = state_of(forged)
    assert fst is not None and not fst.canary and fst.cache_key.startswith("semgov:anon:")
    h.finish(forged)


def test_in_the_hook_one_tenants_regression_leaves_another_tenants_shifted_reuse_on(
    make_harness: Any,
) -> None:
    """A regression in acme's qa scope turns shifted reuse off for acme's next qa recipient only:
    globex's qa recipient (same task and contract) still gets shifted KV."""
    from engine_hooks.sglang.state import state_of

    h = make_harness()
    events: list[CanaryEvent] = []
    can = _attach(h, lambda c, k: [c.warm[0] + 1, 0, 0], events)
    first = _pair(h, 31, TASK, "a1")
    h.run(first)
    _greedy_finish(h, first, [7, 8, 9])
    _wait(lambda: len(events) == 2)
    assert can.off_for(_ctx()) and not can.off_for(_ctx(tenant="globex"))
    again, other = _pair(h, 32, TASK, "a2"), _pair(h, 33, TASK, "g1", tenant="globex")
    h.run(again)
    h.run(other)
    st, st_other = state_of(again), state_of(other)
    assert st is not None and not st.shifted and st.realizations == 0
    assert st_other is not None and st_other.shifted and st_other.realizations == 1


def test_in_the_hook_a_scope_on_probation_gives_shifted_kv_only_to_a_replayable_request(
    make_harness: Any,
) -> None:
    """Before its scope has a matching canary (probation 1), a sampled recipient gets no shifted KV
    (the policy still allows it) and a greedy one does; after one match the sampled one does too."""
    from engine_hooks.sglang.state import state_of

    h = make_harness()
    events: list[CanaryEvent] = []
    _attach(h, lambda c, k: list(c.warm), events, probation=1)
    sampled = _pair(h, 41, TASK, "s1")
    h.run(sampled)
    st = state_of(sampled)
    assert st is not None and [d.decision for d in st.decisions] == ["allow"] and not st.shifted
    h.finish(sampled)
    greedy = _pair(h, 42, TASK, "g1")
    greedy.sampling_params.top_k = 1
    h.run(greedy)
    st = state_of(greedy)
    assert st is not None and st.shifted and st.realizations == 1
    _greedy_finish(h, greedy, [7, 8, 9])
    _wait(lambda: len(events) == 1)
    assert events[0].detail.startswith("match") and "probation over" in events[0].detail
    later = _pair(h, 43, TASK, "s2")
    h.run(later)
    st = state_of(later)
    assert st is not None and st.shifted and st.realizations == 1


def test_a_taken_decisions_spans_are_planned_once_not_at_every_match(
    make_harness: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The canaries are consulted once for a taken decision's spans, not again at each later match of
    the request; its admission consults them once more (the realization's re-check) and realizes."""
    from engine_hooks.sglang.state import state_of

    h = make_harness()
    can = _attach(h, lambda c, k: [], [])
    calls: list[Any] = []
    real = can.shifted_ok

    def counted(ctx: Any, req: Any) -> bool:
        calls.append(req)
        return real(ctx, req)

    monkeypatch.setattr(can, "shifted_ok", counted)
    r = _pair(h, 21, TASK, "r1")
    r.init_next_round_input(h.tree)  # the first match queues its decision
    h.settle()
    for _ in range(3):
        r.init_next_round_input(h.tree)  # the scheduler's rounds: the first one takes the decision
    st = state_of(r)
    assert st is not None and st.chosen is not None and r.host_hit_length > 0
    assert calls == [r]
    h.admit(r)
    assert len(calls) == 2 and st.realizations == 1 and st.shifted
    h.prefill([r])
    h.finish(r)
    ok, why = h.invariant()
    assert ok, why


def test_a_scope_turned_off_after_its_decision_was_taken_gets_no_shifted_kv_at_admission(
    make_harness: Any,
) -> None:
    """Canaries turning a scope's shifted reuse off after a recipient's decision was taken (its host hit
    already reported) make its admission fall back cold, audited with why."""
    from engine_hooks.sglang.state import state_of

    h = make_harness()
    can = _attach(h, lambda c, k: [], [])
    r = _pair(h, 22, TASK, "r1")
    r.init_next_round_input(h.tree)
    h.settle()
    r.init_next_round_input(h.tree)
    st = state_of(r)
    assert st is not None and st.chosen is not None and r.host_hit_length > 0
    can.book.disabled = can.book.disabled | {scope_of(_ctx())}
    h.admit(r)
    assert st.realizations == 0 and not st.shifted and h.tree.stats["fallbacks"] == 1
    h.prefill([r])
    h.finish(r)
    h.settle()
    failed = [e for e in h.records() if e.get("kind") == "realization_failed"]
    assert len(failed) == 1 and "shifted reuse was turned off" in failed[0]["detail"]
    ok, why = h.invariant()
    assert ok, why
