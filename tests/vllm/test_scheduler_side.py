"""The connector's scheduler side on its own paths (engine_hooks.vllm.scheduler_side), in semgov's
environment: a real Governor (policy, provider, signing, audit log; decisions inline), vLLM's
objects as plain namespaces with the attributes the side reads. The real-server tests
(test_connector_server.py) drive the same side inside vLLM; these reach the paths that traffic
rarely does: a load vLLM trims, a failed load, an aborted donor, hostile request fields.

vLLM is not installed here: its two empty metadata base classes are provided as plain classes
by conftest.py before the side is imported (nothing else of vLLM is used by it).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest

from engine_hooks.vllm.meta import WorkerReport
from engine_hooks.vllm.scheduler_side import SchedulerSide
from engine_hooks.vllm.scope import tag_salt
from tests.sglang_server.rig import CONTEXT_SECRET, Gateway, HookFiles, pair_prompts, read_audit, summarize

BS = 128


def _config() -> Any:
    import torch

    mc = NS(
        tokenizer=None,
        dtype=torch.bfloat16,
        get_num_layers=lambda pc: 2,
        get_num_kv_heads=lambda pc: 2,
        get_head_size=lambda: 64,
    )
    return NS(cache_config=NS(block_size=BS), model_config=mc, parallel_config=None)


@pytest.fixture
def side(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SchedulerSide]:
    files = HookFiles.make(tmp_path / "hook")
    for k, v in {
        **files.env(),
        "SEMGOV_PROVIDER": "tests.sglang_server.cpu_plugin:permissive_minhash",
        "SEMGOV_DETOKENIZER": "none",
        "SEMGOV_ASYNC_DECISIONS": "0",
        "SEMGOV_ASYNC_REGISTRATION": "0",
        "SEMGOV_DECISION_PROCESS": "0",
    }.items():
        monkeypatch.setenv(k, v)
    s = SchedulerSide(_config())
    s.audit_dir = files.audit_dir  # type: ignore[attr-defined]
    yield s
    s.close()


GW = Gateway(CONTEXT_SECRET)
_serial = iter(range(1, 1_000_000))


SALT = tag_salt(CONTEXT_SECRET, "s")  # what the scope middleware issues


def _req(
    prompt: list[int],
    token: object,
    status: str = "FINISHED_STOPPED",
    salt: str | None = SALT,
    lora: str | None = None,
) -> Any:
    params = {"semgov_context": token} if token is not None else None
    hashes = [bytes([i % 256]) * 32 for i in range(len(prompt or ()) // BS)]
    adapter = NS(lora_name=lora, lora_int_id=7) if lora is not None else None
    return NS(request_id=f"cmpl-{next(_serial)}-0-abcd1234", kv_transfer_params=params, lora_request=adapter,
              cache_salt=salt, prompt_token_ids=prompt, status=NS(name=status),
              block_hashes=hashes)  # fmt: skip


def _blocks(n_tokens: int, first: int = 1000) -> list[int]:
    return list(range(first, first + -(-n_tokens // BS)))


def _step(side: SchedulerSide, req: Any, computed: int, n: int, blocks: list[int]) -> Any:
    """One scheduler step of ``req`` alone (first schedule when ``computed`` is 0)."""
    rid = req.request_id
    new = [NS(req_id=rid, num_computed_tokens=computed)] if computed == 0 else []
    cached = NS(req_ids=[rid] if computed else [], num_computed_tokens=[computed] if computed else [])
    out = NS(scheduled_new_reqs=new, scheduled_cached_reqs=cached, num_scheduled_tokens={rid: n},
             kv_connector_block_state=NS(get_block_ids=lambda r: (blocks,)))  # fmt: skip
    return side.build(out)


def _ask(side: SchedulerSide, req: Any, m: int) -> int:
    """``get_num_new_matched_tokens`` as vLLM's scheduler asks it: again each step while None."""
    import time

    for _ in range(500):
        n, is_async = side.matched(req, m)
        assert is_async is False
        if n is not None:
            return n
        time.sleep(0.01)
    raise AssertionError("never answered")


def _donor(
    side: SchedulerSide, p: Any, ns: str = "ns", status: str = "FINISHED_STOPPED", lora: str | None = None
) -> Any:
    d = _req(p.donor, GW.token("acme", ns, p.donor_segs), status, lora=lora)
    assert side.matched(d, 0) == (0, False)  # no donors of its scope yet
    plan = _step(side, d, 0, len(p.donor), _blocks(len(p.donor)))
    side.finished(d)
    _worker_saved(side, plan)
    side.gov.wait_registrations()
    return plan


def _worker_saved(side: SchedulerSide, *plans: Any) -> None:
    """The worker's report that the plans' store entries are saved whole (its copies complete), as
    it comes on CPU: in the same step's output, after vLLM finished the step's requests."""
    saved = {s.key: 1 for plan in plans for s in plan.saves if s.end == s.total}
    side.output(NS(kv_connector_worker_meta=WorkerReport(saved=saved)))


def _allowed(side: SchedulerSide, tag: str) -> tuple[Any, Any]:
    """A donor, then its recipient asked until answered: the 512 tokens of E after S's 256."""
    p = pair_prompts(tag, e_len=512)
    _donor(side, p)
    r = _req(p.recipient, GW.token("acme", "ns", p.recipient_segs))
    assert _ask(side, r, 256) == 512
    return p, r


def test_a_lora_request_reuses_donors_of_its_own_adapter_only(side: SchedulerSide) -> None:
    """A request under a LoRA adapter is governed like SGLang's: its token verifies (it used to be
    refused outright), it is allowed a donor of the same adapter, and never one of another adapter
    or of the base model."""
    p = pair_prompts("unit-lora", e_len=512)
    _donor(side, p, lora="adapter-a")
    same = _req(p.recipient, GW.token("acme", "ns", p.recipient_segs), lora="adapter-a")
    assert _ask(side, same, 256) == 512
    decided = side.stats["decided"]
    for other in ("adapter-b", None):
        r = _req(p.recipient, GW.token("acme", "ns", p.recipient_segs), lora=other)
        assert _ask(side, r, 256) == 0
    assert side.stats["decided"] == decided  # no donor in those scopes: nothing to decide


def test_a_finished_context_request_is_saved_whole_and_becomes_a_donor(side: SchedulerSide) -> None:
    """Its first step saves every prompt position; finishing normally registers it (one donor)."""
    p = pair_prompts("unit-donor", e_len=512)
    plan = _donor(side, p)
    assert [(s.start, s.end, s.total) for s in plan.saves] == [(0, len(p.donor), len(p.donor))]
    side.gov.drain_donors()
    assert side.gov.donor_count() == 1 and side.stats["donors"] == 1


def test_an_aborted_donor_is_dropped_not_registered(side: SchedulerSide) -> None:
    """An aborted request's store entry is dropped at the next step; no donor is registered."""
    _donor(side, pair_prompts("unit-abort", e_len=512), status="FINISHED_ABORTED")
    side.gov.drain_donors()
    assert side.gov.donor_count() == 0
    idle = NS(scheduled_new_reqs=[], scheduled_cached_reqs=NS(req_ids=[], num_computed_tokens=[]),
              num_scheduled_tokens={}, kv_connector_block_state=None)  # fmt: skip
    assert len(side.build(idle).drops) == 1


def test_an_allowed_recipient_loads_whole_blocks_and_is_audited(side: SchedulerSide) -> None:
    """After vLLM's own hit on S (256), the allowed run is E (512, shifted by -64): whole blocks;
    the load goes out with the recipient's blocks, and the worker's report becomes a realization."""
    p, r = _allowed(side, "unit-allow")
    blocks = _blocks(len(p.recipient), 2000)
    side.after_alloc(r, NS(get_block_ids=lambda: (blocks,)), 512)
    plan = _step(side, r, 0, len(p.recipient) - 768, blocks)
    assert [(x.recipient_start, x.donor_start, x.length) for x in plan.loads[0].pieces] == [(256, 320, 512)]
    assert plan.saves == []  # a recipient never becomes a donor
    side.output(NS(kv_connector_worker_meta=WorkerReport(loaded={r.request_id: 512})))
    side.gov.wait_idle()
    audit = summarize(read_audit(side.audit_dir))  # type: ignore[attr-defined]
    assert list(audit.realized.values()) == [512]


def test_an_allowed_recipients_blocks_are_sealed_out_of_vllms_prefix_cache(side: SchedulerSide) -> None:
    """Answering a load replaces the recipient's block hashes from the load on (vLLM's own hit on S
    keeps its hashes), so the donor-derived K/V never serve another request as an exact hit; a
    request without block hashes gets nothing loaded, audited as a failed realization."""
    p = pair_prompts("unit-seal", e_len=512)
    _donor(side, p)
    r = _req(p.recipient, GW.token("acme", "ns", p.recipient_segs))
    before = list(r.block_hashes)
    assert _ask(side, r, 256) == 512  # NOTE: not _allowed(): the hashes before the answer are kept
    assert r.block_hashes[:2] == before[:2]
    assert all(a != b for a, b in zip(r.block_hashes[2:], before[2:], strict=True)) and len(before) > 2
    bare = _req(p.recipient, GW.token("acme", "ns", p.recipient_segs))
    del bare.block_hashes
    assert _ask(side, bare, 256) == 0
    side.gov.wait_idle()
    audit = summarize(read_audit(side.audit_dir))  # type: ignore[attr-defined]
    assert [str(f["detail"]).split(":")[0] for f in audit.failed] == ["unsealed"]
    assert any("block hashes" in str(f["detail"]) for f in audit.failed)


def test_a_load_vllm_trims_goes_out_trimmed_and_an_unplanned_one_fails_its_blocks(
    side: SchedulerSide,
) -> None:
    """vLLM taking fewer tokens than planned gets exactly those; tokens semgov never planned become
    a load with no pieces (the worker fails those blocks, vLLM recomputes them)."""
    p, r = _allowed(side, "unit-trim")
    blocks = _blocks(len(p.recipient), 3000)
    side.after_alloc(r, NS(get_block_ids=lambda: (blocks,)), 384)
    assert [x.length for x in side._loads[-1].pieces] == [384]
    other = _req(p.recipient, GW.token("acme", "elsewhere", p.recipient_segs))
    assert side.matched(other, 0)[0] == 0  # no donor of its scope: nothing planned
    side.after_alloc(other, NS(get_block_ids=lambda: (blocks,)), 256)
    op = side._loads[-1]
    assert (op.req_id, op.key, op.pieces, op.block_ids) == (other.request_id, "", (), tuple(blocks[:2]))


def test_a_failed_load_is_audited_as_a_failed_realization(side: SchedulerSide) -> None:
    """The worker's failure report: ``realization_failed`` in the audit log, counted, nothing realized."""
    p, r = _allowed(side, "unit-fail")
    side.after_alloc(r, NS(get_block_ids=lambda: (_blocks(len(p.recipient)),)), 512)
    side.output(NS(kv_connector_worker_meta=WorkerReport(failed={r.request_id: "RuntimeError: gone"})))
    side.gov.wait_idle()
    audit = summarize(read_audit(side.audit_dir))  # type: ignore[attr-defined]
    assert side.stats["failed_loads"] == 1 and audit.realized == {}
    assert [f["detail"] for f in audit.failed] == ["copy_failed: RuntimeError: gone"]


@pytest.mark.parametrize(
    "params",
    [12345, "semgov1.x", ["a"], {"semgov_context": 7}, {"semgov_context": "semgov1." + "A" * 100_000}, {}],
)
def test_hostile_request_fields_answer_zero_and_never_raise(side: SchedulerSide, params: object) -> None:
    """Whatever ``kv_transfer_params`` holds, and a missing prompt or odd salt: (0, False), no decision."""
    p = pair_prompts("unit-hostile", e_len=512)
    _donor(side, p)
    for prompt, salt in ((p.recipient, SALT), (None, object())):
        r = _req(p.recipient, None, salt=salt)  # type: ignore[arg-type]
        r.kv_transfer_params, r.prompt_token_ids = params, prompt
        assert side.matched(r, 0) == (0, False)
    assert side.stats["decided"] == 0


@pytest.mark.parametrize(
    "salt", [None, "s", "semgov:0123.0123456789abcdef0123456789abcdef", tag_salt(b"x" * 32, "s")]
)
def test_a_request_the_middleware_did_not_scope_gets_no_reuse_and_is_counted(
    side: SchedulerSide, salt: object
) -> None:
    """Where every route converges: a request whose salt the scope middleware did not issue (none, the
    client's own, a forged tag, another key's) is never decided or saved as a donor, and is counted."""
    p = pair_prompts("unit-unscoped", e_len=512)
    _donor(side, p)
    counter = side.gov.metrics.unscoped.labels("no_salt" if salt is None else "foreign_salt")
    before = counter._value.get()
    r = _req(p.recipient, GW.token("acme", "ns", p.recipient_segs), salt=salt)  # type: ignore[arg-type]
    assert side.matched(r, 0) == (0, False)
    assert side.stats["decided"] == 0 and side.stats["unscoped"] == 1
    assert counter._value.get() == before + 1
    side.finished(r)
    assert side.stats["donors"] == 1  # only the scoped donor of _donor


def test_a_store_of_zero_megabytes_saves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SEMGOV_VLLM_STORE_MB=0: no request is saved, none becomes a donor."""
    monkeypatch.setenv("SEMGOV_VLLM_STORE_MB", "0")
    files = HookFiles.make(tmp_path / "hook")
    for k, v in {**files.env(), "SEMGOV_PROVIDER": "minhash", "SEMGOV_DETOKENIZER": "none",
                 "SEMGOV_DECISION_PROCESS": "0", "SEMGOV_ASYNC_DECISIONS": "0"}.items():  # fmt: skip
        monkeypatch.setenv(k, v)
    s = SchedulerSide(_config())
    try:
        p = pair_prompts("unit-zero", e_len=512)
        plan = _donor(s, p)
        assert plan.saves == [] and s.gov.donor_count() == 0
    finally:
        s.close()


def test_a_bad_store_size_stops_the_server_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """SEMGOV_VLLM_STORE_MB that is not a whole number of MiB: HookConfigError naming it."""
    from engine_hooks.core.settings import HookConfigError
    from engine_hooks.vllm.book import store_mb as _store_mb

    with pytest.raises(HookConfigError, match="SEMGOV_VLLM_STORE_MB"):
        _store_mb({"SEMGOV_VLLM_STORE_MB": "lots"})
    with pytest.raises(HookConfigError, match="SEMGOV_VLLM_STORE_MB"):
        _store_mb({"SEMGOV_VLLM_STORE_MB": "-1"})


def test_an_allow_the_connector_cannot_load_is_audited_with_why(side: SchedulerSide) -> None:
    """An allowed span after fresh tokens (a new wrapper) or one whose plan computes its head first:
    vLLM's connector loads nothing (it can only continue vLLM's own hit), and says so: a
    ``realization_failed`` event naming the position or the plan, never a silent allow."""
    p = pair_prompts("unit-wrapper", e_len=512, wrapper=96)
    _donor(side, p, ns="ns-w")
    r = _req(p.recipient, GW.token("acme", "ns-w", p.recipient_segs))
    assert _ask(side, r, 256) == 0
    task = {"id": "quality-plan-check", "version": "1"}  # NOTE: the rig policy's rule plans a 25% head
    q = pair_prompts("unit-head", e_len=512)
    d = _req(q.donor, GW.token("acme", "ns-h", q.donor_segs, task=task))
    side.matched(d, 0)
    plan = _step(side, d, 0, len(q.donor), _blocks(len(q.donor)))
    side.finished(d)
    _worker_saved(side, plan)
    side.gov.wait_registrations()
    h = _req(q.recipient, GW.token("acme", "ns-h", q.recipient_segs, task=task))
    assert _ask(side, h, 256) == 0
    side.gov.wait_idle()
    audit = summarize(read_audit(side.audit_dir))  # type: ignore[attr-defined]
    details = {str(f["request_id"]).split("-")[1]: str(f["detail"]) for f in audit.failed}
    assert audit.allowed(next(iter(audit.decisions))) == 1 and audit.realized == {}
    assert any("fresh tokens past vLLM's own prefix hit (256 tokens)" in x for x in details.values()), details
    assert any("computes the first 128 tokens" in x and "plan a tail instead" in x for x in details.values())
    assert side.stats["unloadable"] == 2


def test_an_unloadable_allow_names_the_junction_token_that_breaks_the_run() -> None:
    """The spans a real chat prompt gets for a removed wrapper (SmolLM2 in a real vLLM server: the
    user-turn header is a prefix, one merged newline differs, the evidence follows shifted): the reason
    names where the run from vLLM's hit ends and where the next span starts, not a guess."""
    from engine_hooks.vllm.blocks import unloadable_reason

    spans = [
        {"kind": "prefix", "recipient_start": 0, "donor_start": 0, "length": 37, "recompute": 0},
        {"kind": "prefix", "recipient_start": 37, "donor_start": 37, "length": 2, "recompute": 0},
        {"kind": "shifted", "recipient_start": 40, "donor_start": 69, "length": 452, "recompute": 0},
    ]
    settings = NS(shifted_recompute_pct=0)
    why = unloadable_reason(spans, 0, 128, settings)  # type: ignore[arg-type]
    assert why is not None
    assert "ends at position 39, 1 unapproved token(s) before the next approved span at 40" in why
    assert unloadable_reason(spans[:2], 0, 128, settings) == (  # type: ignore[arg-type]
        "the approved run after vLLM's own prefix hit (0 tokens) is 39 tokens long, shorter than one "
        "128-token block, or its tokens differ from the donor's stored prompt"
    )
    assert unloadable_reason(spans, 512, 128, settings) is None  # type: ignore[arg-type]


# ---- every allow not loaded says why (issue 32) ----------------------------------------------------

GATE = threading.Event()  # the held provider's queries wait for it (warm-up queries never do)


def held_minhash(**kwargs: Any) -> Any:
    """The rig's provider, whose recipient queries wait for ``GATE``: a decision made late at will."""
    from engine_hooks.core.providers.minhash import MinHashProvider
    from engine_hooks.core.warmup import WARMUP_TENANT

    class Held(MinHashProvider):
        def query(self, scope: str, *a: Any, **kw: Any) -> Any:
            if not scope.startswith(WARMUP_TENANT):
                GATE.wait(60)
            return super().query(scope, *a, **kw)

    return Held(min_similarity=0.0, **kwargs)


def _not_realized(side: SchedulerSide) -> list[tuple[str, str]]:
    """(reason code, decision id) of every realization_failed event in the side's audit log."""
    side.gov.wait_idle()
    audit = summarize(read_audit(side.audit_dir))  # type: ignore[attr-defined]
    return [
        (str(f["detail"]).split(":", 1)[0], str(f["decision_id"])) for f in audit.failed + audit.not_chosen
    ]


def _allow_ids(side: SchedulerSide) -> list[str]:
    audit = summarize(read_audit(side.audit_dir))  # type: ignore[attr-defined]
    return [str(d["decision_id"]) for ds in audit.decisions.values() for d in ds if d["decision"] == "allow"]


def _make_side(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **env: str) -> SchedulerSide:
    """A side like the fixture's, with the decision thread unless ``env`` says otherwise."""
    files = HookFiles.make(tmp_path / "hook")
    base = {**files.env(), "SEMGOV_PROVIDER": "tests.sglang_server.cpu_plugin:permissive_minhash",
            "SEMGOV_DETOKENIZER": "none", "SEMGOV_DECISION_PROCESS": "0",
            "SEMGOV_ASYNC_REGISTRATION": "0"}  # fmt: skip
    for k, v in {**base, **env}.items():
        monkeypatch.setenv(k, v)
    s = SchedulerSide(_config())
    s.audit_dir = files.audit_dir  # type: ignore[attr-defined]
    return s


def test_a_late_allow_is_reported_late_by_the_core_when_it_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decision still running at SEMGOV_DECISION_TIMEOUT_MS is abandoned (the request runs cold);
    when the decision thread finishes it with an allow, the core audits ``late`` for that allow and
    counts it in semgov:allows_not_realized_total{reason="late"}."""
    GATE.clear()
    s = _make_side(
        tmp_path,
        monkeypatch,
        SEMGOV_PROVIDER="tests.vllm.test_scheduler_side:held_minhash",
        SEMGOV_DECISION_TIMEOUT_MS="50",
    )
    try:
        p = pair_prompts("unit-late", e_len=512)
        GATE.set()
        _donor(s, p)
        GATE.clear()
        r = _req(p.recipient, GW.token("acme", "ns", p.recipient_segs))
        assert _ask(s, r, 256) == 0 and s.stats["late"] == 1
        GATE.set()
        assert _not_realized(s) == [("late", x) for x in _allow_ids(s)] and _allow_ids(s)
        assert s.gov.metrics.allows_not_realized.labels("late")._value.get() >= 1
    finally:
        GATE.set()
        s.close()


def test_a_load_vllm_discards_for_prompt_logprobs_is_reported(side: SchedulerSide) -> None:
    """vLLM zeroes the connector's answer for a request that skips reading the prefix cache (prompt
    logprobs): allocated with 0 external tokens after a load was answered, the allow is audited
    ``discarded_by_engine``, once."""
    p, r = _allowed(side, "unit-discard")
    r.skip_reading_prefix_cache = True
    blocks = NS(get_block_ids=lambda: (_blocks(len(p.recipient)),))
    side.after_alloc(r, blocks, 0)
    side.after_alloc(r, blocks, 0)
    got = _not_realized(side)
    assert [c for c, _ in got] == ["discarded_by_engine"] and got[0][1] in _allow_ids(side)
    assert side._loads == []


def test_a_request_finished_before_its_load_reports_its_allow_aborted(side: SchedulerSide) -> None:
    """An answered load whose request finishes (aborted) before vLLM allocates it: ``aborted``."""
    p, r = _allowed(side, "unit-aborted")
    r.status = NS(name="FINISHED_ABORTED")
    side.finished(r)
    assert [c for c, _ in _not_realized(side)] == ["aborted"]


def test_a_second_allowed_donor_is_reported_another_donor_chosen(side: SchedulerSide) -> None:
    """Two donors allowed for one recipient: one is loaded, the other allow says
    ``another_donor_chosen`` (each allow has its outcome)."""
    p = pair_prompts("unit-two", e_len=512)
    donors = [_req(p.donor, GW.token("acme", "ns", p.donor_segs)) for _ in range(2)]
    plans = []
    for d in donors:
        assert side.matched(d, 0) == (0, False)
        plans.append(_step(side, d, 0, len(p.donor), _blocks(len(p.donor))))
    for d in donors:
        side.finished(d)
    _worker_saved(side, *plans)
    side.gov.wait_registrations()
    r = _req(p.recipient, GW.token("acme", "ns", p.recipient_segs))
    assert _ask(side, r, 256) == 512
    allows = _allow_ids(side)
    got = _not_realized(side)
    assert len(allows) == 2 and [c for c, _ in got] == ["another_donor_chosen"] and got[0][1] in allows


def test_an_allow_vllms_own_prefix_hit_covers_is_reported_prefix_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's own hit already holds every approved position: nothing to load, ``prefix_cached``."""
    s = _make_side(tmp_path, monkeypatch, SEMGOV_ASYNC_DECISIONS="0", SEMGOV_MIN_UNMATCHED_TOKENS="16")
    try:
        p = pair_prompts("unit-covered", e_len=512)
        _donor(s, p)
        r = _req(p.recipient, GW.token("acme", "ns", p.recipient_segs))
        assert _ask(s, r, 768) == 0
        assert [c for c, _ in _not_realized(s)] == ["prefix_cached"]
    finally:
        s.close()


def test_every_unloadable_reason_is_a_code(side: SchedulerSide) -> None:
    """The unloadable allows of a wrapper and a leading recompute are ``unrealizable_plan``; a
    request without block hashes is ``unsealed``."""
    test_an_allow_the_connector_cannot_load_is_audited_with_why(side)
    codes = [c for c, _ in _not_realized(side)]
    assert codes == ["unrealizable_plan", "unrealizable_plan"]


@pytest.mark.parametrize("threaded", ["0", "1"])
def test_a_request_skipping_the_prefix_cache_is_answered_0_and_its_allow_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, threaded: str
) -> None:
    """vLLM zeroes the connector's answer for a request that skips reading the prefix cache (prompt
    logprobs) without waiting for ``None``: the connector answers 0 at once, its decision is still
    made and audited, and each allow is reported ``discarded_by_engine`` (inline, or by the core
    once the decision thread finishes it)."""
    s = _make_side(tmp_path, monkeypatch, SEMGOV_ASYNC_DECISIONS=threaded)
    try:
        p = pair_prompts(f"unit-skip-{threaded}", e_len=512)
        _donor(s, p)
        r = _req(p.recipient, GW.token("acme", "ns", p.recipient_segs))
        r.skip_reading_prefix_cache = True
        before = list(r.block_hashes)
        assert s.matched(r, 256) == (0, False)
        assert r.block_hashes == before  # nothing answered, nothing sealed
        s.after_alloc(r, NS(get_block_ids=lambda: (_blocks(len(p.recipient)),)), 0)
        assert s.gov.wait_idle() and s.gov.wait_idle()
        got = _not_realized(s)
        assert [c for c, _ in got] == ["discarded_by_engine"] and [d for _, d in got] == _allow_ids(s)
        assert "skips reading the prefix cache" in str(summarize(read_audit(s.audit_dir)).failed[0]["detail"])  # type: ignore[attr-defined]
    finally:
        s.close()


# ---- donors complete only on the workers' report (issue 33) ---------------------------------------


def test_a_donor_is_registered_only_once_every_worker_reports_its_entry_saved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A donor finished while its copies are in flight (a GPU worker) is not registered; a recipient
    arriving meanwhile waits (None), and is decided once both workers reported the entry saved."""
    side = _make_side(tmp_path, monkeypatch, SEMGOV_ASYNC_DECISIONS="0", SEMGOV_DECISION_TIMEOUT_MS="60000")
    try:
        _inflight_donor(side)
    finally:
        side.close()


def _inflight_donor(side: SchedulerSide) -> None:
    side.book.workers = 2
    p = pair_prompts("unit-inflight", e_len=512)
    d = _req(p.donor, GW.token("acme", "ns", p.donor_segs))
    assert side.matched(d, 0) == (0, False)
    plan = _step(side, d, 0, len(p.donor), _blocks(len(p.donor)))
    side.finished(d)
    r = _req(p.recipient, GW.token("acme", "ns", p.recipient_segs))
    assert side.matched(r, 256) == (None, False) and side.book.waiting() == 1
    _worker_saved(side, plan)
    assert side.matched(r, 256) == (None, False) and side.stats["donors"] == 0  # one worker of two
    _worker_saved(side, plan)
    side.gov.wait_registrations()
    assert side.stats["donors"] == 1 and side.book.waiting() == 0
    assert _ask(side, r, 256) == 512


def test_an_entry_saved_before_its_request_finished_registers_at_the_finish(side: SchedulerSide) -> None:
    """The worker's report may come first (a request generating many tokens): the donor is then
    registered when the request finishes; a failed save instead drops the entry and no donor."""
    p = pair_prompts("unit-early", e_len=512)
    d = _req(p.donor, GW.token("acme", "ns", p.donor_segs))
    side.matched(d, 0)
    _worker_saved(side, _step(side, d, 0, len(p.donor), _blocks(len(p.donor))))
    assert side.stats["donors"] == 0
    side.finished(d)
    assert side.stats["donors"] == 1
    q = pair_prompts("unit-save-failed", e_len=512)
    f = _req(q.donor, GW.token("acme", "ns", q.donor_segs))
    side.matched(f, 0)
    key = _step(side, f, 0, len(q.donor), _blocks(len(q.donor))).saves[0].key
    side.finished(f)
    side.output(NS(kv_connector_worker_meta=WorkerReport(save_failed={key: "RuntimeError: gone"})))
    _worker_saved(side, NS(saves=[NS(key=key, end=1, total=1)]))
    assert side.stats["donors"] == 1 and side.book.waiting() == 0 and key not in side.book.keys()
