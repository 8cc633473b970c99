"""The scheduler side's book of the worker's donor store: what it holds, within a token budget.

Pure bookkeeping on the scheduler thread (no tensor, no lock): the worker store holds exactly the
entries this book says, because every change is sent to it in the step's plan (a reservation
becomes save operations, an eviction a drop). Least recently used entries are evicted first.

NOTE: invariants:
- ``used`` is the sum of the reserved entries' token counts and never exceeds ``budget``;
- an entry is usable as a donor only once ``complete`` (every prompt position saved);
- a dropped key is never reused (keys are server-generated, one per request).
"""

from __future__ import annotations

from collections import OrderedDict


class StoreBook:
    """Entries of the worker's donor store, by key: token count and whether complete."""

    def __init__(self, budget_tokens: int) -> None:
        self.budget = budget_tokens
        self.used = 0
        self._entries: OrderedDict[str, int] = OrderedDict()
        self._complete: set[str] = set()
        self._drops: list[str] = []
        self.evictions = 0

    def reserve(self, key: str, tokens: int) -> list[str] | None:
        """Room for ``tokens`` under ``key``, evicting the least recently used entries; the evicted
        keys (the caller forgets those donors), or None when ``tokens`` exceeds the whole budget."""
        if tokens > self.budget or tokens <= 0 or key in self._entries:
            return None
        evicted: list[str] = []
        while self.used + tokens > self.budget and self._entries:
            old = next(iter(self._entries))
            self.release(old)
            evicted.append(old)
            self.evictions += 1
        self._entries[key] = tokens
        self.used += tokens
        return evicted

    def complete(self, key: str) -> bool:
        """Mark ``key`` fully saved (a donor may be registered); False if it was evicted meanwhile."""
        if key not in self._entries:
            return False
        self._complete.add(key)
        return True

    def usable(self, key: str) -> int:
        """Tokens of a complete entry (0 when absent or incomplete); counts as a use (LRU)."""
        if key not in self._complete:
            return 0
        self._entries.move_to_end(key)
        return self._entries[key]

    def release(self, key: str) -> None:
        """Forget ``key`` and queue its drop for the worker (no-op when absent)."""
        n = self._entries.pop(key, None)
        if n is None:
            return
        self.used -= n
        self._complete.discard(key)
        self._drops.append(key)

    def take_drops(self) -> list[str]:
        """The drops queued since the last call, for this step's plan."""
        out, self._drops = self._drops, []
        return out

    def keys(self) -> list[str]:
        return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
