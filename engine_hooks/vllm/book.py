"""The scheduler side's book of the worker's donor store: what it holds, within a token budget.

Pure bookkeeping on the scheduler thread (no tensor, no lock): the worker store holds exactly the
entries this book says, because every change is sent to it in the step's plan (a reservation
becomes save operations, an eviction a drop). Least recently used entries are evicted first.

A donor becomes usable when two things are known, in either order: its request finished as a
donor on the scheduler (:meth:`StoreBook.finish`, with the donor to register), and every worker
reported the entry saved, its copies complete (:meth:`StoreBook.saved`, from the worker's report).
On a GPU a save's device-to-host copy completes after the step that enqueued it; on CPU both are
known within the same ``update_from_output`` call.

NOTE: invariants:
- ``used`` is the sum of the reserved entries' token counts and never exceeds ``budget``;
- an entry is usable as a donor only once ``complete``: finished as a donor and saved by every
  worker; a load never reads an entry whose copies are still in flight;
- a dropped key is never reused (keys are server-generated, one per request).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Generic, TypeVar

from engine_hooks.core.settings import HookConfigError

T = TypeVar("T")


class StoreBook(Generic[T]):
    """Entries of the worker's donor store, by key: token count, saves reported, whether complete.

    ``workers``: how many workers hold a part of each entry (vLLM's world size: tensor and
    pipeline parallel ranks), each reporting it saved once."""

    def __init__(self, budget_tokens: int, workers: int = 1) -> None:
        self.budget = budget_tokens
        self.workers = max(1, workers)
        self.used = 0
        self._entries: OrderedDict[str, int] = OrderedDict()
        self._complete: set[str] = set()
        self._saves: dict[str, int] = {}  # key -> workers that reported it saved
        self._waiting: dict[str, T] = {}  # finished donors whose saves are not all reported yet
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
        """Mark ``key`` usable (a donor may be registered); False if it was evicted meanwhile."""
        if key not in self._entries:
            return False
        self._complete.add(key)
        return True

    def finish(self, key: str, donor: T) -> T | None:
        """The request behind ``key`` finished as a donor: ``donor`` back (register it now: the
        entry is complete) when every worker already reported it saved, else None: held until they
        do (:meth:`saved`), or ``key`` was evicted."""
        if key not in self._entries:
            return None
        if self._saves.get(key, 0) >= self.workers:
            self._complete.add(key)
            return donor
        self._waiting[key] = donor
        return None

    def saved(self, key: str, workers: int = 1) -> T | None:
        """``workers`` more workers report every position of ``key`` saved: the donor held by
        :meth:`finish` once all have (the entry is then complete), else None."""
        if key not in self._entries:
            return None
        self._saves[key] = self._saves.get(key, 0) + workers
        if self._saves[key] < self.workers or key not in self._waiting:
            return None
        self._complete.add(key)
        return self._waiting.pop(key)

    def waiting(self) -> int:
        """Finished donors whose saves are not all reported yet (a recipient may wait for them)."""
        return len(self._waiting)

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
        self._saves.pop(key, None)
        self._waiting.pop(key, None)
        self._drops.append(key)

    def take_drops(self) -> list[str]:
        """The drops queued since the last call, for this step's plan."""
        out, self._drops = self._drops, []
        return out

    def keys(self) -> list[str]:
        return list(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


def store_budget_tokens(vllm_config: Any, megabytes: int) -> int:
    """Tokens of donor KV that ``megabytes`` hold for the served model (all layers, K and V)."""
    mc = vllm_config.model_config
    layers = int(mc.get_num_layers(vllm_config.parallel_config))
    per_token = layers * 2 * int(mc.get_num_kv_heads(vllm_config.parallel_config)) * int(mc.get_head_size())
    itemsize = int(getattr(mc.dtype, "itemsize", 2))
    return max(0, megabytes * 1024 * 1024 // max(1, per_token * itemsize))


def store_mb(env: dict[str, str]) -> int:
    """``SEMGOV_VLLM_STORE_MB`` (default 512), refused naming the variable when not a whole number >= 0."""
    raw = env.get("SEMGOV_VLLM_STORE_MB", "512").strip()
    try:
        mb = int(raw)
    except ValueError:
        raise HookConfigError(f"SEMGOV_VLLM_STORE_MB={raw!r}: expected a whole number of MiB") from None
    if mb < 0:
        raise HookConfigError(f"SEMGOV_VLLM_STORE_MB={raw!r}: must be 0 (no donors) or more")
    return mb
