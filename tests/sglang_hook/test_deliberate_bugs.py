"""Deliberate bugs in the governed radix cache, and the invariant guard catching each one where it happens.

Each bug is a test-only subclass of :class:`GovernedRadixCache` swapped onto the harness's tree
(``h.tree.__class__ = Buggy``); the product code is untouched. The known failure modes:

- ``adopt``: the realized "private" slots ARE the donor's slots (nothing allocated, nothing
  copied): the tree and the recipient both count them.
- ``leak``: the realization's slots are allocated, then the request falls back cold without
  freeing them: nobody counts them.
- ``stale``: the donor is evicted after the decision (a waiting request pins nothing), and the
  realization adopts the slots the decision saw instead of re-matching the live donor: the pool
  has them as free while the recipient holds them (the next allocation may hand them to another
  request).

Strict (``SEMGOV_STRICT=1``): the guard raises :class:`InvariantViolation` at that very step, with
SGLang's pool numbers off by exactly the slots involved. Not strict: semantic reuse is disabled for
the process, the audit log holds ``invariant_violation`` and ``reuse_disabled`` engine events, and
serving continues cold. The real class, driven through the same scenarios, raises nothing.

The last test is a real bug of the real class that the stress run found (a realized request matched
again before its row existed had its copy counted as cache-owned), fixed in ``match_prefix``.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from engine_hooks.core.plan import Piece, plan_pieces
from engine_hooks.sglang import realize as realize_mod
from engine_hooks.sglang.cache import GovernedRadixCache
from engine_hooks.sglang.guard import InvariantViolation
from engine_hooks.sglang.state import RealizationError, state_of
from tests.sglang_hook.scenario import E_LEN, S_LEN, blocks

POOL = re.compile(
    r"\[full\] total=(?P<total>\d+), available=(?P<available>\d+), evictable=(?P<evictable>\d+), "
    r"protected=(?P<protected>\d+), session_held=(?P<session_held>\d+), uncached=(?P<uncached>\d+)"
)


def _planned(cache: Any, st: Any, req: Any) -> list[Piece]:
    """The pieces the real ``Realizer.realize`` would copy for this request (same computation)."""
    m = int(req.prefix_len)
    limit = min(req._compute_max_prefix_len(len(req.full_untruncated_fill_ids)), len(req.origin_input_ids))
    return plan_pieces(st.chosen.approved_spans, m, limit, st.donor_len, cache.page_size)


def _gather(slots: torch.Tensor, pieces: list[Piece]) -> torch.Tensor:
    return torch.cat([slots[p.donor_start : p.donor_start + p.length] for p in pieces]).to(torch.int64)


class _AdoptsDonorSlots(GovernedRadixCache):
    """BUG: the realized slots are the donor's own: nothing allocated (and, with no_copy, nothing copied)."""

    def init_load_back(self, params: Any) -> tuple[int, Any]:
        self._bug_realizing = params.req
        return super().init_load_back(params)

    def alloc(self, n: int) -> torch.Tensor:
        req = self._bug_realizing
        st = state_of(req)
        root = self.root_node_handle(st.donor.cache_key)
        _, node = self.donor_path(st.donor)
        donor = self.tree_core.collect_full_device_indices(node, root)[: st.donor_len]
        slots = _gather(donor, _planned(self, st, req))
        assert len(slots) == n
        return slots


class _LeaksOnFallback(GovernedRadixCache):
    """BUG: the realization's slots are allocated, the copy is refused, the fallback never frees them."""

    def alloc(self, n: int) -> torch.Tensor:
        super().alloc(n)
        raise RealizationError("copy refused after allocation")


class _UnpinnedStaleDonor(GovernedRadixCache):
    """BUG: the realization adopts the slots the decision saw, without re-matching the live donor."""

    def match_prefix(self, params: Any) -> Any:
        result = super().match_prefix(params)
        st = state_of(params.req)
        seen = self.__dict__.setdefault("_bug_seen", {})
        if st is None or st.chosen is None or st.serial in seen:
            return result
        root = self.root_node_handle(st.donor.cache_key)
        _, node = self.donor_path(st.donor)
        seen[st.serial] = self.tree_core.collect_full_device_indices(node, root)[: st.donor_len].clone()
        return result

    def init_load_back(self, params: Any) -> tuple[int, Any]:
        req = params.req
        st = state_of(req)
        if st is None or st.chosen is None or st.serial not in self.__dict__.get("_bug_seen", {}):
            return super().init_load_back(params)
        pieces = _planned(self, st, req)
        slots = _gather(self._bug_seen.pop(st.serial), pieces)
        st.private, st.private_base, st.pieces = slots, int(req.prefix_len), tuple(pieces)
        req.skip_radix_cache_insert = True
        self.stats["realizations"] += 1
        self.checks.check("realization", st)
        return len(slots), req.last_node


BUGS: dict[str, tuple[type[GovernedRadixCache], str, int]] = {
    # name: (class, where the guard reports it, pool sum minus total)
    "adopt": (_AdoptsDonorSlots, "realization", +E_LEN),
    "leak": (_LeaksOnFallback, "realization_failed", -E_LEN),
    "stale": (_UnpinnedStaleDonor, "realization", +E_LEN),
}


@pytest.fixture
def no_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The adopting variants copy nothing: the hook's ``copy_kv`` becomes a no-op for the test."""
    monkeypatch.setattr(realize_mod, "copy_kv", lambda *a, **k: None)


def _donor(h: Any, b: Any, rid: str = "donor") -> Any:
    lay = b.donor()
    req = h.new_req(rid, lay.tokens, h.context(segments=lay.segments), text=lay.text)
    h.run(req)
    h.finish(req)
    return req


def _recipient(h: Any, b: Any, rid: str = "rcp") -> Any:
    lay = b.recipient()
    return h.new_req(rid, lay.tokens, h.context(segments=lay.segments), text=lay.text)


def _until_the_buggy_step(h: Any, bug: str, buggy: type[GovernedRadixCache] | None) -> Any:
    """Donor, recipient matched (and for ``stale`` the tree evicted): all still sound, then admit is next."""
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams

    if buggy is not None:
        h.tree.__class__ = buggy
    b = blocks()
    _donor(h, b)
    rcp = _recipient(h, b)
    rcp.init_next_round_input(h.tree)  # the round's match queues the decision
    # NOTE: decided and the allow record durable before the rounds that admit it: a slow fsync on a
    # loaded machine must not outlast SEMGOV_AUDIT_WAIT_MS and turn the buggy step into a cold fallback.
    h.settle()
    h.match(rcp)
    assert rcp.prefix_len == S_LEN and rcp.host_hit_length == E_LEN
    if bug == "stale":
        h.tree.evict(EvictParams(num_tokens=h.size))  # nothing pins a waiting request's donor
        # Another request of the scope runs and puts S back, so the recipient's exact match is S again.
        lay = b.other_evidence(7)
        other = h.new_req("other", lay.tokens, h.context(segments=lay.segments), text=lay.text)
        h.run(other)
        h.finish(other)
        h.match(rcp)  # the scheduler's next round
        assert rcp.prefix_len == S_LEN and rcp.host_hit_length == E_LEN
    ok, msg = h.invariant()
    assert ok, msg
    assert h.tree.reuse_disabled is None
    return rcp


def _pool_numbers(text: str) -> dict[str, int]:
    m = POOL.search(text)
    assert m is not None, text
    return {k: int(v) for k, v in m.groupdict().items()}


def _assert_off_by(text: str, total: int, delta: int) -> None:
    n = _pool_numbers(text)
    assert n["total"] == total
    assert (
        n["available"] + n["evictable"] + n["protected"] + n["session_held"] + n["uncached"] == total + delta
    )


@pytest.mark.parametrize("bug", list(BUGS))
def test_strict_guard_raises_at_the_buggy_step(make_harness: Any, no_copy: None, bug: str) -> None:
    """Strict: the buggy admission raises InvariantViolation with SGLang's pool numbers off by the slots."""
    buggy, where, delta = BUGS[bug]
    h = make_harness()
    rcp = _until_the_buggy_step(h, bug, buggy)
    with pytest.raises(InvariantViolation) as e:
        h.admit(rcp)
    reason = str(e.value)
    assert reason.startswith(f"after {where} of request rcp: ")
    _assert_off_by(reason, h.size, delta)
    assert h.tree.reuse_disabled == reason
    if bug == "stale":  # what the recipient adopted, the pool had already taken back
        free = torch.cat([h.allocator.free_pages, h.allocator.release_pages]).tolist()
        assert set(state_of(rcp).private.tolist()) <= set(free)
    ok, msg = h.invariant()  # the harness's independent check agrees
    assert not ok
    _assert_off_by(msg, h.size, delta)


@pytest.mark.parametrize("bug", list(BUGS))
def test_inside_a_prefill_round_the_guard_catches_the_bug_when_the_round_ends(
    make_harness: Any, no_copy: None, bug: str
) -> None:
    """In a prefill round the buggy admission is caught as the round ends (before its forward), same pool."""
    buggy, where, delta = BUGS[bug]
    h = make_harness()
    rcp = _until_the_buggy_step(h, bug, buggy)
    checks = h.tree.stats["guard_checks"]
    h.tree.begin_round()
    h.admit(rcp)  # NOTE: deferred: nothing is checked (or raised) at the step itself
    assert h.tree.stats["guard_checks"] == checks and h.tree.reuse_disabled is None
    with pytest.raises(InvariantViolation) as e:
        h.tree.end_round()
    reason = str(e.value)
    assert reason.startswith(f"after {where} of request rcp: ")
    _assert_off_by(reason, h.size, delta)
    assert h.tree.reuse_disabled == reason and h.tree.stats["guard_checks"] == checks + 1


@pytest.mark.parametrize("bug", list(BUGS))
def test_non_strict_guard_disables_reuse_and_serving_continues_cold(
    make_harness: Any, no_copy: None, bug: str
) -> None:
    """Not strict: reuse is disabled and audited at the buggy step; later allowed-looking requests go cold."""
    buggy, where, delta = BUGS[bug]
    h = make_harness(SEMGOV_STRICT="0")
    rcp = _until_the_buggy_step(h, bug, buggy)
    h.admit(rcp)  # no raise
    reason = h.tree.reuse_disabled
    assert reason is not None and reason.startswith(f"after {where} of request rcp: ")
    _assert_off_by(reason, h.size, delta)
    assert h.tree.pins == 0 and all(st.chosen is None for st in h.tree.live_states())
    decisions = h.tree.stats["decisions"]

    h.prefill([rcp])  # serving continues
    h.finish(rcp)
    b = blocks(2)  # prompts the tree has not seen (rcp itself may have been inserted cold)
    donors = h.tree.gov.donor_count()
    donor2 = _donor(h, b, rid="donor2")
    assert h.tree.gov.donor_count() == donors and donor2.finished()  # no new donors either
    rcp2 = _recipient(h, b, rid="rcp2")
    h.match(rcp2)
    assert rcp2.prefix_len == S_LEN and rcp2.host_hit_length == 0  # the exact match only
    h.admit(rcp2)
    h.prefill([rcp2])
    assert rcp2.prefix_len == S_LEN and not rcp2.skip_radix_cache_insert
    h.finish(rcp2)
    assert h.tree.stats["decisions"] == decisions and h.tree.pins == 0
    assert h.tree.reuse_disabled is not None

    events = [r for r in h.records() if r["schema"] == "semgov.engine_event/v2"]
    kinds = [r["kind"] for r in events]
    assert kinds.count("reuse_disabled") == 1
    first = kinds.index("invariant_violation")
    assert kinds[first + 1] == "reuse_disabled"
    assert events[first]["detail"] == events[first + 1]["detail"] == reason


@pytest.mark.parametrize("bug", list(BUGS))
def test_control_real_class_same_scenario_raises_nothing(make_harness: Any, bug: str) -> None:
    """The real class through the same scenario: realized (cold for ``stale``: it re-matches the live
    donor at admission and finds it evicted), all clean."""
    h = make_harness()
    rcp = _until_the_buggy_step(h, bug, None)
    h.admit(rcp)
    if bug == "stale":
        assert rcp.prefix_len == S_LEN and h.tree.stats["fallbacks"] == 1
    else:
        assert rcp.prefix_len == S_LEN + E_LEN and h.tree.stats["realizations"] == 1
    ok, msg = h.invariant()
    assert ok, msg
    h.prefill([rcp])
    for req in list(h.running.values()):
        h.finish(req)
    assert h.tree.reuse_disabled is None
    h.assert_clean()


def test_control_real_fallback_after_allocation_frees_the_slots(
    make_harness: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real class whose copy fails after allocating frees the slots: the request runs cold, all clean."""

    def refuse(*_: Any, **__: Any) -> None:
        raise ValueError("copy refused after allocation")

    monkeypatch.setattr(realize_mod, "copy_kv", refuse)
    h = make_harness()
    rcp = _until_the_buggy_step(h, "leak", None)
    h.admit(rcp)
    assert rcp.prefix_len == S_LEN and h.tree.stats["fallbacks"] == 1
    ok, msg = h.invariant()
    assert ok, msg
    h.prefill([rcp])
    h.finish(rcp)
    assert h.tree.reuse_disabled is None
    h.assert_clean()


def test_rematch_of_realized_request_keeps_its_copy_private(make_harness: Any) -> None:
    """A realized request matched again before its row exists keeps cache_protected_len at the exact match."""
    h = make_harness()
    b = blocks()
    _donor(h, b)
    rcp = _recipient(h, b)
    h.match(rcp)
    h.admit(rcp)  # realized: the copy is held by the hook until the row is allocated
    h.tree.unlock(rcp.lock)  # not run this round: the scheduler matches it again next round
    rcp.lock = None
    h.match(rcp)
    assert rcp.prefix_len == S_LEN + E_LEN  # the realized run is still reported
    assert rcp.kv.cache_protected_len == S_LEN  # was S_LEN + E_LEN before the fix
    h.admit(rcp)
    h.prefill([rcp])
    ok, msg = h.invariant()
    assert ok, msg
    h.finish(rcp)
    h.assert_clean()
