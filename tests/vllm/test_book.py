"""The scheduler side's book of the donor store (pure): budget, LRU eviction, completeness, drops."""

from __future__ import annotations

from engine_hooks.vllm.book import StoreBook


def test_reservations_stay_within_the_budget_evicting_least_recently_used() -> None:
    """Reserving past the budget evicts the least recently used entries first, and queues their drops."""
    b = StoreBook(1000)
    assert b.reserve("a", 400) == [] and b.reserve("b", 400) == []
    assert b.complete("a") and b.complete("b")
    assert b.usable("a") == 400  # a use: "b" is now the oldest
    assert b.reserve("c", 400) == ["b"]
    assert b.used == 800 and b.keys() == ["a", "c"]
    assert b.take_drops() == ["b"] and b.take_drops() == []


def test_an_entry_is_usable_only_once_complete() -> None:
    """A reserved entry being saved is not a donor yet; a released one is never usable again."""
    b = StoreBook(100)
    b.reserve("a", 50)
    assert b.usable("a") == 0
    b.complete("a")
    assert b.usable("a") == 50
    b.release("a")
    assert b.usable("a") == 0 and not b.complete("a") and b.used == 0


def test_oversized_empty_and_duplicate_reservations_are_refused() -> None:
    """More tokens than the whole budget, zero tokens, or a key already held: None, nothing changes."""
    b = StoreBook(100)
    assert b.reserve("big", 101) is None and b.reserve("zero", 0) is None
    assert b.reserve("a", 10) == [] and b.reserve("a", 10) is None
    assert b.used == 10 and len(b) == 1


def test_a_store_of_zero_tokens_holds_nothing() -> None:
    """SEMGOV_VLLM_STORE_MB=0: every reservation is refused (no donors, no memory)."""
    assert StoreBook(0).reserve("a", 1) is None


def test_a_donor_is_complete_once_finished_and_saved_by_every_worker_in_either_order() -> None:
    """finish() then every worker's saved(), or the reverse: the donor comes back once, then usable;
    one worker of two is not enough, and a release forgets a donor still waiting."""
    b: StoreBook[str] = StoreBook(1000, workers=2)
    b.reserve("a", 10), b.reserve("b", 10), b.reserve("c", 10)
    assert b.finish("a", "donor-a") is None and b.waiting() == 1 and b.usable("a") == 0
    assert b.saved("a") is None and b.usable("a") == 0  # one worker of two
    assert b.saved("a") == "donor-a" and b.usable("a") == 10 and b.waiting() == 0
    assert b.saved("b", 2) is None and b.finish("b", "donor-b") == "donor-b" and b.usable("b") == 10
    assert b.finish("c", "donor-c") is None
    b.release("c")
    assert b.waiting() == 0 and b.saved("c", 2) is None and b.finish("c", "x") is None
