"""SGLang general plugin (entry-point group ``sglang.srt.plugins``): registers the ``semgov`` backend.

SGLang loads every installed general plugin at scheduler start, before the tree cache is built,
and calls it; :func:`register` makes ``--radix-cache-backend semgov`` available and registers three
AROUND hooks (SGLang's ``HookRegistry``, applied by SGLang right after the plugins ran):

- on ``Scheduler.get_new_batch_prefill``: before each prefill round, with tensor parallelism,
  every rank applies rank 0's round message
  (:meth:`~engine_hooks.sglang.cache.GovernedRadixCache.sync_round`); then SGLang's chunked request,
  if its computed prefix ends where an approved region starts, gets the region's K/V appended to
  its row (:meth:`~engine_hooks.sglang.cache.GovernedRadixCache.advance_chunked`), and requests
  whose semgov decision is not ready are taken out of the waiting queue for that round (SGLang
  does not even match them), and put back after it
  (:meth:`~engine_hooks.sglang.cache.GovernedRadixCache.hold_back`);
- on ``PrefillAdder.add_one_req``: a request first seen in this round (its ``match_prefix`` just
  queued its decision) is not added to this round's batch
  (:meth:`~engine_hooks.sglang.cache.GovernedRadixCache.holds`): the adder goes on to the next;
  a request with an approved region after fresh tokens has its first chunk end where the region
  starts (:meth:`~engine_hooks.sglang.cache.GovernedRadixCache.chunk_cap`);
- on ``PrefillAdder.add_chunked_req``: a chunked request's next chunk ends at its next region
  (:meth:`~engine_hooks.sglang.cache.GovernedRadixCache.chunk_limit`).

Both do nothing for a scheduler whose tree is not the ``semgov`` backend. Importing this module
is cheap: the hook itself is imported only when a server selects the backend.
"""

from __future__ import annotations

from typing import Any

BACKEND = "semgov"
PREFILL_ROUND = "sglang.srt.managers.scheduler.Scheduler.get_new_batch_prefill"
ADD_ONE_REQ = "sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req"
ADD_CHUNKED_REQ = "sglang.srt.managers.schedule_policy.PrefillAdder.add_chunked_req"
_registered = False


def _factory(ctx: Any) -> Any:
    from engine_hooks.sglang.factory import build_governed_cache

    return build_governed_cache(ctx)


def prefill_round(original: Any, scheduler: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``get_new_batch_prefill``: realize the chunked request's region that starts where its
    prefix ends, then run the round without the requests semgov holds back; the hook's changes in
    the round are checked by the guard once, when it ends."""
    tree = getattr(scheduler, "tree_cache", None)
    begin, end = getattr(tree, "begin_round", None), getattr(tree, "end_round", None)
    if begin is None or end is None:
        return _round(original, scheduler, tree, args, kwargs)
    begin()
    try:
        return _round(original, scheduler, tree, args, kwargs)
    finally:
        end()


def _round(original: Any, scheduler: Any, tree: Any, args: Any, kwargs: Any) -> Any:
    """The round itself: TP round message, the chunked request's region, then the held requests
    taken out of the waiting queue for the round and put back after it."""
    chunked = getattr(scheduler, "chunked_req", None)
    sync = getattr(tree, "sync_round", None)
    if sync is not None:
        sync(getattr(scheduler, "waiting_queue", None) or [], chunked)  # NOTE: TP only (no-op otherwise)
    advance = getattr(tree, "advance_chunked", None)
    if advance is not None and chunked is not None:
        advance(chunked)
    hold = getattr(tree, "hold_back", None)
    waiting = getattr(scheduler, "waiting_queue", None)
    if hold is None or not isinstance(waiting, list) or not waiting:
        return original(scheduler, *args, **kwargs)
    held = hold(waiting)
    if not held:
        return original(scheduler, *args, **kwargs)
    ids = {id(r) for r in held}
    scheduler.waiting_queue = [r for r in waiting if id(r) not in ids]
    try:
        return original(scheduler, *args, **kwargs)
    finally:
        # NOTE: the round may replace the list (admitted requests leave it): put the held ones
        # back, in their order, at the front of whatever list it left.
        scheduler.waiting_queue = held + list(scheduler.waiting_queue)


def add_one_req(original: Any, adder: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``PrefillAdder.add_one_req``: skip a request semgov holds (CONTINUE: try the next);
    cap the first chunk of a request with an approved region at the region's start.

    NOTE: the cap lowers the adder's chunk budget for this one call. If the request is admitted
    as the round's chunked request, the budget stays as SGLang left it (spent: no other request
    joins this round, so SGLang's one-chunked-request rule holds); otherwise it is restored.
    """
    tree = getattr(adder, "tree_cache", None)
    holds = getattr(tree, "holds", None)
    if holds is not None and holds(req):
        from sglang.srt.managers.schedule_policy import AddReqResult

        return AddReqResult.CONTINUE
    cap_of = getattr(tree, "chunk_cap", None)
    saved = getattr(adder, "rem_chunk_tokens", None)
    if cap_of is None or saved is None:
        return original(adder, req, *args, **kwargs)
    has_chunked = bool(kwargs.get("has_chunked_req", args[0] if args else False))
    cap = cap_of(req, has_chunked)
    if cap is None or cap >= saved:
        return original(adder, req, *args, **kwargs)
    if cap == 0:
        from sglang.srt.managers.schedule_policy import AddReqResult

        return AddReqResult.CONTINUE
    adder.rem_chunk_tokens = cap
    try:
        return original(adder, req, *args, **kwargs)
    finally:
        if getattr(adder, "new_chunked_req", None) is not req:
            adder.rem_chunk_tokens = saved


def add_chunked_req(original: Any, adder: Any, req: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ``PrefillAdder.add_chunked_req``: end the chunk where the request's next region starts."""
    limit_of = getattr(getattr(adder, "tree_cache", None), "chunk_limit", None)
    cap = limit_of(req) if limit_of is not None else None
    if cap is None:
        return original(adder, req, *args, **kwargs)
    saved = adder.chunked_req_limit
    adder.chunked_req_limit = cap if saved is None else min(saved, cap)
    try:
        return original(adder, req, *args, **kwargs)
    finally:
        adder.chunked_req_limit = saved


def register() -> None:
    """Register the ``semgov`` radix-cache backend and the prefill-round hook (idempotent)."""
    global _registered
    from sglang.srt.mem_cache.registry import get_radix_cache_factory, register_radix_cache_backend

    if get_radix_cache_factory(BACKEND) is None:
        register_radix_cache_backend(BACKEND, _factory)
    if not _registered:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        HookRegistry.register(PREFILL_ROUND, prefill_round, HookType.AROUND)
        HookRegistry.register(ADD_ONE_REQ, add_one_req, HookType.AROUND)
        HookRegistry.register(ADD_CHUNKED_REQ, add_chunked_req, HookType.AROUND)
        _registered = True
