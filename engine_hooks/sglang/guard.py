"""The invariant guard: SGLang's own KV-pool accounting check, run wherever the hook changed the pool.

That is after every realization (or failed one; inside a prefill round, once when the round has
built its batch), and at the release or abort of every request that received realized slots; a
release of a request the hook gave no KV is SGLang's own accounting and is not re-checked (it was
measured as most of the hook's scheduler-thread time).

The scheduler's invariant (``available + evictable + protected + session_held + uncached ==
total``) is what the published semantic-reuse attempt tripped. The guard evaluates exactly
SGLang's check (``SchedulerInvariantChecker._check_full_pool`` over
``SchedulerPoolStatsObserver.get_pool_stats()``), with ``uncached`` computed by SGLang's own
``kv_private_tokens`` over the requests that own a KV row, plus the realized slots the hook holds
for a request between its admission and its row allocation. The hook adds its own lock
accounting: every donor pin it took is either still held by a live plan or released.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any


class InvariantViolation(RuntimeError):
    """SGLang's KV-pool accounting or the hook's lock accounting does not hold."""


class InvariantGuard:
    """Checks the full KV pool of one radix cache with SGLang's own invariant checker."""

    def __init__(self, cache: Any) -> None:
        from sglang.srt.disaggregation.utils import DisaggregationMode
        from sglang.srt.managers.scheduler_components.invariant_checker import SchedulerInvariantChecker
        from sglang.srt.managers.scheduler_components.pool_stats_observer import (
            SchedulerPoolStatsObserver,
            kv_private_tokens,
        )

        allocator = cache.token_to_kv_pool_allocator
        self._allocator = allocator
        self.page_size = int(cache.page_size)
        self.total = int(allocator.size)
        self._private = kv_private_tokens
        self._observer = SchedulerPoolStatsObserver(
            tree_cache=cache,
            token_to_kv_pool_allocator=allocator,
            req_to_token_pool=cache.req_to_token_pool,
            session_controller=SimpleNamespace(sessions={}),
            hisparse_coordinator=None,
            is_hybrid_swa=False,
            is_hybrid_ssm=False,
            enable_hisparse=False,
            full_tokens_per_layer=None,
            swa_tokens_per_layer=None,
            max_total_num_tokens=self.total,
        )
        self._checker = SchedulerInvariantChecker(
            is_hybrid_swa=False,
            is_hybrid_ssm=False,
            disaggregation_mode=DisaggregationMode.NULL,
            page_size=self.page_size,
            full_tokens_per_layer=None,
            swa_tokens_per_layer=None,
            max_total_num_tokens=self.total,
            tree_cache=cache,
            token_to_kv_pool_allocator=allocator,
            req_to_token_pool=cache.req_to_token_pool,
            pool_stats_observer=self._observer,
            get_last_batch=lambda: None,
            get_running_batch=lambda: None,
            scheduler_stage_metrics=None,
        )

    def uncached(self, owners: Iterable[Any], pending: int) -> int:
        """Slots owned by requests (SGLang's count) plus realized slots not yet in a row."""
        return pending + sum(int(self._private(r.kv, self.page_size)) for r in owners if r.kv.holds_kv)

    def check(self, owners: Iterable[Any], pending: int) -> str | None:
        """None when the pool invariant holds, else SGLang's message.

        NOTE: SGLang frees KV inside allocator *free groups* while it processes a batch's results
        (``free_group_begin`` ... ``free_group_end``): a slot freed there is neither available nor
        owned until the group ends. The guard runs inside such groups (a release), so it counts
        what the open group holds as available, exactly as ``free_group_end`` will release it.
        """
        stats = self._observer.get_pool_stats()
        held = held_in_open_free_group(self._allocator)
        if held:
            stats = dataclasses.replace(stats, full_available_size=stats.full_available_size + held)
        leak, msg = self._checker._check_full_pool(stats, uncached=self.uncached(owners, pending))
        if not leak:
            return None
        return f"{msg}, held_in_open_free_group={held}" if held else str(msg)


def held_in_open_free_group(allocator: Any) -> int:
    """Tokens an open free group of ``allocator`` will release at ``free_group_end`` (0 when none
    is open): token slots for a token allocator, whole pages for a paged one (its group holds
    token indices, released as their unique pages, and page ids freed directly)."""
    group = getattr(allocator, "free_group", None)
    if group is None:
        return 0
    page = int(allocator.page_size)
    if page == 1:
        return sum(int(t.numel()) for t in group)
    import torch

    pages = int(torch.unique(torch.cat(group) // page).numel()) if group else 0
    pages += sum(int(t.numel()) for t in getattr(allocator, "free_page_ids_group", None) or ())
    return pages * page
