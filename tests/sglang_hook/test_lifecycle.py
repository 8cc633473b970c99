"""The governed radix cache through SGLang's own request lifecycle on CPU (allow, deny, fallbacks)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from engine_hooks.sglang.state import state_of
from tests.sglang_hook.scenario import E_LEN, I_LEN, S_LEN, blocks, new_recipient, run_donor


def _check_copied(h: Any, req: Any, start: int, n: int) -> None:
    """The recipient's realized slots hold exactly what a cold prefill writes at those positions."""
    row = h.row(req)
    toks = torch.as_tensor(list(req.origin_input_ids[start : start + n]))
    pos = torch.arange(start, start + n)
    for layer in h.model.layers:
        k, v = h.model.expected(toks, pos, layer)
        got_k = h.kv.get_key_buffer(layer)[row[start : start + n]]
        got_v = h.kv.get_value_buffer(layer)[row[start : start + n]]
        torch.testing.assert_close(got_k, k, atol=2e-5, rtol=1e-5)
        assert torch.equal(got_v, v)


@pytest.mark.parametrize("tree_core", ["rust", "python"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_allow_realizes_the_shifted_evidence_into_recipient_slots(
    make_harness: Any, page_size: int, tree_core: str
) -> None:
    """An allowed donor's evidence KV is copied (re-rotated) into fresh slots the recipient owns."""
    h = make_harness(page_size=page_size, tree_core=tree_core)
    assert (
        type(h.tree.tree_core).__name__
        == {"rust": "RustUnifiedTreeCore", "python": "UnifiedTreeCore"}[tree_core]
    )
    b = blocks()
    donor = run_donor(h, b)
    rcp = new_recipient(h, b)
    h.match(rcp)
    assert rcp.prefix_len == S_LEN and rcp.host_hit_length == E_LEN
    h.admit(rcp)
    assert rcp.prefix_len == S_LEN + E_LEN
    assert rcp.skip_radix_cache_insert
    h.prefill([rcp])
    ok, msg = h.invariant()
    assert ok, msg
    assert rcp.kv.cache_protected_len == S_LEN  # realized slots are request-private
    row = h.row(rcp)
    donor_slots = set(
        h.tree.tree_core.collect_full_device_indices(
            h.tree.donor_path(h.tree.gov.donor(h.tree.donor_id(state_of(donor))))[1],
            h.tree.root_node_handle(donor.extra_key),
        ).tolist()
    )
    assert not donor_slots & set(row[S_LEN : S_LEN + E_LEN].tolist())  # copied, never adopted
    _check_copied(h, rcp, S_LEN, E_LEN)
    h.finish(rcp)
    h.assert_clean()
    kinds = [r.get("kind") for r in h.records() if r["schema"] == "semgov.engine_event/v2"]
    assert kinds == ["realization"]
    assert h.tree.gov.donor(h.tree.donor_id(state_of(rcp))) is None  # a recipient never becomes a donor


def test_deny_other_tenant_runs_cold(make_harness: Any) -> None:
    """A donor of another tenant is never a candidate, and the exact tree is keyed apart too."""
    h = make_harness()
    b = blocks()
    run_donor(h, b, tenant="acme")
    rcp = new_recipient(h, b, tenant="globex")
    h.match(rcp)
    assert rcp.prefix_len == 0  # not even the shared system prompt: keys are per tenant
    assert rcp.host_hit_length == 0
    h.admit(rcp)
    h.prefill([rcp])
    h.finish(rcp)
    h.assert_clean()
    assert h.tree.stats["decisions"] == 0


def test_deny_unrelated_evidence_runs_cold(make_harness: Any) -> None:
    """A candidate whose evidence differs is denied by token verification and nothing is realized."""
    h = make_harness(SEMGOV_PROVIDER="tests.sglang_hook.test_lifecycle:everything_provider")
    b = blocks()
    run_donor(h, b)
    rcp = new_recipient(h, b, lay=b.other_evidence(5))
    h.match(rcp)
    assert h.tree.stats["decisions"] == 1 and h.tree.stats["allowed"] == 0
    assert rcp.host_hit_length == 0
    h.admit(rcp)
    h.prefill([rcp])
    h.finish(rcp)
    h.assert_clean()
    decisions = [r for r in h.records() if r["schema"] == "semgov.decision/v3"]
    assert [d["decision"] for d in decisions] == ["deny"]


class _Everything:
    """A provider that proposes every donor of the scope with similarity 0.9 (to reach the policy)."""

    name = "everything"

    def __init__(self) -> None:
        self.d: dict[str, str] = {}

    def add(self, donor_id: str, scope: str, token_ids: Any, text: Any) -> None:
        self.d[donor_id] = scope

    def remove(self, donor_id: str) -> None:
        self.d.pop(donor_id, None)

    def query(self, scope: str, token_ids: Any, text: Any, *, limit: int) -> list[Any]:
        from semgov.typing import Match

        return [Match(k, 0.9) for k, s in self.d.items() if s == scope][:limit]

    def __len__(self) -> int:
        return len(self.d)


def everything_provider(**_: Any) -> _Everything:
    return _Everything()


def test_decisions_are_made_once_per_request_across_rounds(make_harness: Any) -> None:
    """match_prefix on every scheduling round decides once, allocates nothing and pins nothing."""
    h = make_harness()
    b = blocks()
    run_donor(h, b)
    rcp = new_recipient(h, b)
    free = h.allocator.available_size()
    for _ in range(5):
        h.match(rcp)
    assert h.tree.stats["decisions"] == 1
    assert h.allocator.available_size() == free
    assert h.tree.pins == 0 and h.tree.protected_size() == 0  # a waiting request holds no donor
    h.admit(rcp)
    assert h.tree.pins == 0  # pinned only while the copy ran
    h.prefill([rcp])
    h.finish(rcp)
    h.assert_clean()


def test_matched_but_never_admitted_then_aborted_leaves_nothing(make_harness: Any) -> None:
    """A waiting request that is decided and aborted leaves no pin, no slot and no state behind."""
    h = make_harness()
    b = blocks()
    run_donor(h, b)
    rcp = new_recipient(h, b)
    h.match(rcp)
    assert h.tree.pins == 0 and h.tree.protected_size() == 0
    h.abort_waiting(rcp)
    h.assert_clean()


def test_realized_then_aborted_before_row_allocation_frees_the_copy(make_harness: Any) -> None:
    """Realized slots that never reached a row are freed when the request is aborted."""
    h = make_harness()
    b = blocks()
    run_donor(h, b)
    rcp = new_recipient(h, b)
    h.match(rcp)
    h.admit(rcp)
    assert h.tree.pending_private() == E_LEN
    h.tree.unlock(rcp.lock)
    rcp.lock = None
    h.abort_waiting(rcp)
    h.assert_clean()


def test_running_recipient_aborted_frees_its_row(make_harness: Any) -> None:
    """A running recipient aborted mid-flight frees its realized slots with its row."""
    h = make_harness()
    b = blocks()
    run_donor(h, b)
    rcp = new_recipient(h, b)
    h.run(rcp)
    h.finish(rcp, abort=True)
    h.assert_clean()


def test_donor_evicted_before_the_recipient_arrives_means_cold(make_harness: Any) -> None:
    """A donor whose KV was evicted is dropped from the candidates and the recipient runs cold."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    h = make_harness()
    b = blocks()
    run_donor(h, b)
    h.tree.evict(EvictParams(num_tokens=h.size))
    assert h.tree.evictable_size() == 0
    rcp = new_recipient(h, b)
    h.run(rcp)
    assert rcp.prefix_len == 0 and not rcp.skip_radix_cache_insert
    assert h.tree.gov.donor_count() == 0
    h.finish(rcp)
    h.assert_clean()


def test_donor_evicted_between_decision_and_admission_runs_cold(make_harness: Any) -> None:
    """A waiting request pins nothing: eviction may take its donor, and admission then runs it cold."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    h = make_harness()
    b = blocks()
    run_donor(h, b)
    rcp = new_recipient(h, b)
    h.match(rcp)
    assert rcp.host_hit_length == E_LEN
    h.tree.evict(EvictParams(num_tokens=h.size))
    assert h.tree.evictable_size() == 0 and h.tree.protected_size() == 0
    h.match(rcp)  # the next round: the exact match is gone too, the plan still names the donor
    h.admit(rcp)
    assert rcp.prefix_len == 0 and not rcp.skip_radix_cache_insert
    h.prefill([rcp])
    h.finish(rcp)
    h.assert_clean()
    failed = [r for r in h.records() if r.get("kind") == "realization_failed"]
    assert len(failed) == 1 and "live KV covers 0 tokens" in failed[0]["detail"]


def test_donor_is_pinned_while_the_copy_allocates(make_harness: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eviction for the realization's own allocation cannot take the donor it copies from."""
    h = make_harness()
    b = blocks()
    run_donor(h, b)
    rcp = new_recipient(h, b)
    h.match(rcp)
    seen: list[int] = []
    real_alloc = h.tree.alloc

    def alloc(n: int) -> Any:
        seen.append(h.tree.pins)
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        h.tree.evict(EvictParams(num_tokens=h.size))  # everything evictable goes
        return real_alloc(n)

    monkeypatch.setattr(h.tree, "alloc", alloc)
    h.admit(rcp)
    assert seen == [1] and h.tree.pins == 0
    h.prefill([rcp])
    _check_copied(h, rcp, S_LEN, E_LEN)
    h.finish(rcp)
    h.assert_clean()


def test_token_mismatch_at_realization_falls_back_cold(make_harness: Any) -> None:
    """If the live donor no longer holds the decided tokens, nothing is copied and the run is cold."""
    h = make_harness()
    b = blocks()
    run_donor(h, b)
    rcp = new_recipient(h, b)
    h.match(rcp)
    st = state_of(rcp)
    forged = list(st.donor.token_ids)
    forged[S_LEN + I_LEN + 10] += 1
    object.__setattr__(st.donor, "token_ids", tuple(forged))
    h.admit(rcp)
    assert rcp.prefix_len == S_LEN and not rcp.skip_radix_cache_insert
    h.prefill([rcp])
    h.finish(rcp)
    h.assert_clean()
    failed = [r for r in h.records() if r.get("kind") == "realization_failed"]
    assert len(failed) == 1 and "RealizationError" in failed[0]["detail"]


@pytest.mark.parametrize("page_size", [1, 4])
def test_chunked_prefill_after_realization(make_harness: Any, page_size: int) -> None:
    """A recipient prefilled in chunks keeps the realized prefix and stays within the invariant."""
    h = make_harness(page_size=page_size)
    b = blocks()
    run_donor(h, b)
    rcp = new_recipient(h, b)
    h.run(rcp, chunk=8)
    assert rcp.prefix_len == S_LEN + E_LEN
    while rcp.extend_end < len(rcp.full_untruncated_fill_ids):
        h.next_chunk(rcp, 8)
        ok, msg = h.invariant()
        assert ok, msg
    _check_copied(h, rcp, S_LEN, E_LEN)
    h.finish(rcp)
    h.assert_clean()


def test_no_context_means_no_semantic_reuse_and_no_donor(make_harness: Any) -> None:
    """Requests without a verified context get exact reuse among themselves only, never semantic."""
    h = make_harness()
    b = blocks()
    lay = b.donor()
    d = h.new_req("d", lay.tokens, None, text=lay.text)
    h.run(d)
    h.finish(d)
    assert h.tree.gov.donor(h.tree.donor_id(state_of(d))) is None and h.tree.gov.donor_count() == 0
    forged = h.context().replace("semgov1.", "semgov1.x", 1)
    r = h.new_req("r", b.recipient().tokens, forged)
    h.run(r)
    assert r.prefix_len == 0 and h.tree.stats["decisions"] == 0
    h.finish(r)
    h.assert_clean()


def test_short_unmatched_tail_asks_for_no_candidates(make_harness: Any) -> None:
    """When the exact match leaves fewer than min_unmatched_tokens, no donor is looked up."""
    h = make_harness(SEMGOV_MIN_UNMATCHED_TOKENS=str(E_LEN + 100))
    b = blocks()
    run_donor(h, b)
    rcp = new_recipient(h, b)
    h.run(rcp)
    assert h.tree.stats["decided_requests"] == 0 and rcp.prefix_len == S_LEN
    h.finish(rcp)
    h.assert_clean()


def test_namespace_isolation_in_the_exact_tree(make_harness: Any) -> None:
    """The same tokens in another namespace share no exact-prefix node."""
    h = make_harness()
    b = blocks()
    run_donor(h, b, namespace="ns1")
    r = h.new_req("r", b.donor().tokens, h.context("acme", "ns2", b.donor().segments))
    h.match(r)
    assert r.prefix_len == 0 and r.host_hit_length == 0
    h.abort_waiting(r)
    h.assert_clean()


def test_realization_event_names_decision_tokens_and_slots(make_harness: Any) -> None:
    """The realization's engine event carries the allowing decision id, the token count and slots."""
    h = make_harness()
    b = blocks()
    run_donor(h, b)
    rcp = new_recipient(h, b)
    h.run(rcp)
    recs = h.records()
    decision = next(r for r in recs if r["schema"] == "semgov.decision/v3")
    event = next(r for r in recs if r.get("kind") == "realization")
    assert decision["decision"] == "allow"
    assert event["decision_id"] == decision["decision_id"]
    assert event["materialized_tokens"] == E_LEN
    assert sum(n for _, n in event["slots"]) == E_LEN
    assert event["spans"] == [
        {"recipient_start": S_LEN, "donor_start": S_LEN + I_LEN, "length": E_LEN, "kind": "shifted"}
    ]
    h.finish(rcp)
    h.assert_clean()


def test_donor_with_pii_is_denied_and_the_recipient_runs_cold(make_harness: Any) -> None:
    """A donor whose text holds an e-mail address is registered with that finding and denied (PII gate)."""
    from tests.sglang_hook.scenario import EMAIL_TOKEN, Blocks

    h = make_harness()
    b0 = blocks()
    ev = list(b0.evidence)
    ev[100] = EMAIL_TOKEN
    b = Blocks(b0.system, b0.instruction, ev, b0.q1, b0.q2)
    dreq = run_donor(h, b)
    assert h.tree.gov.drain_donors() == 1
    entry = h.tree.gov.donor(h.tree.donor_id(state_of(dreq)))
    assert entry.provenance.payload["pii"] == {"scanned": True, "entities": ["EMAIL_ADDRESS"]}
    rcp = new_recipient(h, b)
    h.run(rcp)
    assert rcp.prefix_len == S_LEN and not rcp.skip_radix_cache_insert
    (decision,) = [r for r in h.records() if r["schema"] == "semgov.decision/v3"]
    gates = {g["gate"]: g["result"] for g in decision["gates"]}
    assert decision["decision"] == "deny" and gates["pii"] == "fail"
    h.finish(rcp)
    h.assert_clean()


def test_async_registration_makes_donors_visible_on_a_later_round(make_harness: Any) -> None:
    """With background registration a donor appears to the provider once registered, never half-built."""
    h = make_harness(SEMGOV_ASYNC_REGISTRATION="1")
    b = blocks()
    run_donor(h, b)
    assert h.tree.gov.wait_registrations(30)
    rcp = new_recipient(h, b)
    h.run(rcp)  # match_prefix drains the registered donor first
    assert rcp.prefix_len == S_LEN + E_LEN
    h.finish(rcp)
    h.assert_clean()


def test_reset_forgets_plans_pins_and_donors(make_harness: Any) -> None:
    """Flushing the tree (SGLang's reset) drops every plan, pin and donor: their KV is gone."""
    h = make_harness()
    b = blocks()
    run_donor(h, b)
    rcp = new_recipient(h, b)
    h.match(rcp)
    assert h.tree.pins == 0 and state_of(rcp) is not None and state_of(rcp).chosen is not None
    # A paused engine flushes with requests still waiting: what flush_cache does, in its order.
    h.tree.reset()
    h.req_pool.clear()
    h.allocator.clear()
    assert h.tree.pins == 0 and state_of(rcp).chosen is None and h.tree.gov.donor_count() == 0
    h.run(rcp)  # the waiting request matches again: nothing cached, nothing to reuse
    assert rcp.prefix_len == 0 and not rcp.skip_radix_cache_insert
    h.finish(rcp)
    h.assert_clean()


def test_realizations_inside_a_prefill_round_are_guarded_once_when_it_ends(make_harness: Any) -> None:
    """Two realizations in one prefill round: one guard check at its end, its cost shared by both."""
    h = make_harness()
    b = blocks()
    run_donor(h, b)
    r1, r2 = new_recipient(h, b, rid="r1"), new_recipient(h, b, rid="r2")
    h.match(r1)
    h.match(r2)
    checks, sched = h.tree.stats["guard_checks"], [state_of(r).sched_ns for r in (r1, r2)]
    h.tree.begin_round()
    h.admit(r1)
    h.admit(r2)
    assert h.tree.stats["guard_checks"] == checks  # deferred to the round's end
    h.tree.end_round()
    assert h.tree.stats["guard_checks"] == checks + 1 and h.tree.stats["realizations"] == 2
    assert all(state_of(r).sched_ns > s for r, s in zip((r1, r2), sched, strict=True))
    h.tree.end_round()  # nothing left to check
    assert h.tree.stats["guard_checks"] == checks + 1
    h.prefill([r1, r2])
    h.finish(r1)
    h.finish(r2)
    h.assert_clean()
