"""Server-side identity, free groups and retraction, with real SGLang objects on CPU.

What the real server runs showed and review found, pinned at the unit level (the real-server
scenarios in ``tests/sglang_server`` drive the same paths through SGLang's own scheduler):

- SGLang frees KV inside allocator free groups while it processes a batch's results; the guard
  runs in ``on_release`` inside such a group and must count what the open group holds;
- client ``rid``s key nothing: two live requests with one rid get their own plans, and another
  tenant's request finishing under a donor's rid does not replace that donor;
- a retracted request keeps its decisions and is realized again under them;
- nothing a client puts in ``extra_key`` raises out of ``match_prefix``.
"""

from __future__ import annotations

from typing import Any

import pytest

from engine_hooks.sglang.guard import held_in_open_free_group
from engine_hooks.sglang.state import state_of
from tests.sglang_hook.scenario import E_LEN, S_LEN, blocks, new_recipient, run_donor


def _finish_in_free_group(h: Any, req: Any) -> None:
    """Release a finished request the way SGLang's result processing does: inside a free group."""
    h.allocator.free_group_begin()
    try:
        h.finish(req)
    finally:
        h.allocator.free_group_end()


@pytest.mark.parametrize("page_size", [1, 16])
def test_release_inside_a_free_group_passes_the_guard(make_harness: Any, page_size: int) -> None:
    """A realized recipient released inside SGLang's free group: the guard counts the group, no violation."""
    h = make_harness(page_size=page_size)
    b = blocks()
    donor = run_donor(h, b)
    rcp = new_recipient(h, b)
    h.run(rcp)
    assert rcp.skip_radix_cache_insert  # realized
    seen: list[int] = []
    real_check = h.tree.guard.check

    def check(owners: Any, pending: int) -> Any:
        seen.append(held_in_open_free_group(h.allocator))
        return real_check(owners, pending)

    h.tree.guard.check = check  # type: ignore[method-assign]
    _finish_in_free_group(h, rcp)
    assert seen and seen[0] > 0  # the guard ran while the group held the freed row
    assert h.tree.reuse_disabled is None
    h.assert_clean()
    del donor


def test_free_group_accounting_is_what_the_bug_missed(make_harness: Any) -> None:
    """Inside the group, SGLang's own check without the group's slots reads as a leak (the real-server
    failure); the guard, counting them, passes at that very point."""
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH
    from sglang.srt.mem_cache.common import release_kv_cache

    h = make_harness()
    b = blocks()
    run_donor(h, b)
    rcp = new_recipient(h, b)
    h.run(rcp)
    h.allocator.free_group_begin()
    try:
        rcp.finished_reason = FINISH_LENGTH(length=1)
        release_kv_cache(rcp, h.tree, checkpoint=True)  # the guard runs in on_release, in the group
        assert h.tree.reuse_disabled is None
        held = held_in_open_free_group(h.allocator)
        stats = h.tree.guard._observer.get_pool_stats()
        leak, msg = h.tree.guard._checker._check_full_pool(stats, uncached=0)
        assert held > 0 and leak, msg
        assert h.tree.guard.check([], 0) is None
    finally:
        h.allocator.free_group_end()
    h.running.pop(rcp.rid, None)
    h.assert_clean()


def test_twin_rids_get_their_own_plans(make_harness: Any) -> None:
    """Two live requests with one rid (several front ends): each has its own state, decision and KV."""
    h = make_harness()
    b = blocks()
    run_donor(h, b)
    plain = h.new_req("twin", b.recipient().tokens, None)  # same rid, no context
    rcp = new_recipient(h, b, rid="twin")
    h.match(plain)
    h.match(rcp)
    assert state_of(plain) is not state_of(rcp)
    assert state_of(plain).serial != state_of(rcp).serial
    assert state_of(plain).chosen is None and state_of(rcp).chosen is not None
    h.admit(rcp)
    h.admit(plain)
    h.prefill([rcp, plain])
    assert rcp.prefix_len == S_LEN + E_LEN and rcp.skip_radix_cache_insert
    assert plain.prefix_len == 0 and not plain.skip_radix_cache_insert
    h.finish(rcp)
    h.finish(plain)
    h.assert_clean()


def test_another_tenants_request_under_a_donors_rid_keeps_that_donor(make_harness: Any) -> None:
    """globex finishing a request with acme's donor rid adds a donor; acme's stays and is reused."""
    h = make_harness()
    b = blocks()
    acme = run_donor(h, b, rid="same")
    globex = run_donor(h, blocks(seed=3), rid="same", tenant="globex")
    rcp = new_recipient(h, b)
    h.run(rcp)  # drains both registrations, then decides
    assert h.tree.gov.donor_count() == 2
    ids = {h.tree.donor_id(state_of(acme)), h.tree.donor_id(state_of(globex))}
    assert len(ids) == 2 and "same" not in ids
    assert rcp.prefix_len == S_LEN + E_LEN
    assert state_of(rcp).donor.donor_id == h.tree.donor_id(state_of(acme))
    h.finish(rcp)
    h.assert_clean()


def test_retracted_recipient_keeps_its_decision_and_is_realized_again(make_harness: Any) -> None:
    """Retraction releases the row; re-admission realizes again under the same decision, no new one."""
    from sglang.srt.mem_cache.common import release_kv_cache

    h = make_harness()
    b = blocks()
    run_donor(h, b)
    rcp = new_recipient(h, b)
    h.run(rcp)
    st = state_of(rcp)
    first = st.chosen.record["decision_id"]
    decisions = h.tree.stats["decisions"]
    # SGLang's retract path: release_req -> release_kv_cache(checkpoint=False), reset_for_retract.
    release_kv_cache(rcp, h.tree, checkpoint=False)
    rcp.reset_for_retract()
    h.running.pop(rcp.rid, None)
    h.waiting[rcp.rid] = rcp
    assert state_of(rcp) is st and st.retractions == 1
    h.run(rcp)
    assert rcp.prefix_len == S_LEN + E_LEN
    assert h.tree.stats["decisions"] == decisions and st.chosen.record["decision_id"] == first
    assert st.realizations == 2
    h.finish(rcp)
    h.assert_clean()
    events = [r for r in h.records() if r.get("kind") == "realization"]
    assert [e["decision_id"] for e in events] == [first, first]


@pytest.mark.parametrize(
    "extra_key",
    [
        "semgov1.caf\u00e9",
        "semgov1.\udcff",
        "\udcff",
        "x" * 100_000,
        "semgov1." + "A" * 20_000,
    ],
)
def test_hostile_extra_keys_never_raise_out_of_match_prefix(make_harness: Any, extra_key: str) -> None:
    """Non-ASCII, lone surrogates, huge keys: matched without semantic reuse, no exception."""
    h = make_harness()
    b = blocks()
    run_donor(h, b)
    req = h.new_req("hostile", b.recipient().tokens, extra_key)
    h.run(req)
    assert state_of(req).context is None and not req.skip_radix_cache_insert
    assert req.extra_key.startswith("semgov:anon:")
    h.finish(req)
    h.assert_clean()


def test_valid_token_with_trailing_garbage_is_not_a_context(make_harness: Any) -> None:
    """A valid token followed by a lone surrogate or junk (no LoRA) is refused: served without reuse."""
    h = make_harness()
    b = blocks()
    run_donor(h, b)
    lay = b.recipient()
    for tail in ("\udcff", "X", "\U0001f600"):
        req = h.new_req(f"tail-{len(tail)}", lay.tokens, h.context(segments=lay.segments) + tail)
        h.run(req)
        assert state_of(req).context is None and not req.skip_radix_cache_insert
        h.finish(req)
    h.assert_clean()


def _req_with_lora(h: Any, rid: str, tokens: list[int], extra_key: str | None, lora_id: str | None) -> Any:
    from array import array

    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    sp = SamplingParams(max_new_tokens=4)
    sp.normalize(None)
    req = Req(rid, "", array("q", tokens), sp, extra_key=extra_key, lora_id=lora_id)
    h.waiting[rid] = req
    return req


def test_lora_adapter_comes_from_the_server_side_lora_id(make_harness: Any) -> None:
    """SGLang appends lora_id to extra_key; the hook binds the token to req.lora_id, not to the text."""
    h = make_harness()
    b = blocks()
    lay = b.donor()
    token = h.context(segments=lay.segments)
    with_lora = _req_with_lora(h, "a", lay.tokens, token, "adapter-x")
    assert with_lora.extra_key == token + "adapter-x"  # what SGLang itself does
    forged = _req_with_lora(h, "b", lay.tokens, token + "adapter-x", None)  # same text, no adapter
    plain = _req_with_lora(h, "c", lay.tokens, token, None)
    for r in (with_lora, forged, plain):
        h.match(r)
    a, f, p = state_of(with_lora), state_of(forged), state_of(plain)
    assert a.context is not None and a.context.lora_id == "adapter-x"
    assert f.context is None  # the suffix is not the request's adapter: not a context
    assert p.context is not None and p.context.lora_id is None
    assert len({a.cache_key, f.cache_key, p.cache_key}) == 3  # three trees, nothing shared
    for r in (with_lora, forged, plain):
        h.waiting.pop(r.rid, None)
        h.abort_waiting(r)
    h.assert_clean()


def test_cache_salt_partitions_scope_and_tree(make_harness: Any) -> None:
    """Two requests of one tenant and namespace with different cache salts share no tree and no donor."""
    h = make_harness()
    b = blocks()
    lay = b.donor()
    token = h.context(segments=lay.segments)
    salted = h.new_req("s", lay.tokens, token)
    salted.cache_salt = "salt-1"
    unsalted = h.new_req("u", lay.tokens, token)
    h.match(salted)
    h.match(unsalted)
    assert state_of(salted).cache_key != state_of(unsalted).cache_key
    ctx = state_of(salted).context
    assert ctx is not None and ctx.scope(h.tree.gov.context_key, "salt-1") != ctx.scope(
        h.tree.gov.context_key
    )
    for r in (salted, unsalted):
        h.abort_waiting(r)
    h.assert_clean()
