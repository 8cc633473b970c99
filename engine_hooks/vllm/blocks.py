"""vLLM's blocks, seen from the connector's scheduler side: what of an allow's plan can be loaded
as whole blocks continuing vLLM's own prefix hit (and why not), sealing a recipient's blocks out
of vLLM's prefix cache, and reading the scheduler's output. Pure functions of vLLM's objects."""

from __future__ import annotations

import secrets
from typing import Any

from engine_hooks.core.settings import HookSettings
from engine_hooks.vllm.meta import LoadPiece


def unloadable_reason(spans: Any, m: int, block_size: int, settings: HookSettings) -> str | None:
    """Why an allow's approved spans give vLLM's connector nothing to load after vLLM's own prefix
    hit of ``m`` tokens, or None when nothing was approved past it (vLLM's own cache covers it).

    The connector can answer only a count of tokens that continue the hit (``get_num_new_matched_
    tokens``): an approved run after fresh tokens, or whose planned head (``recompute``) must be
    computed before the copied part, cannot be loaded; nor a run shorter than one block."""
    past = [s for s in spans if int(s["recipient_start"]) + int(s["length"]) > m]
    if not past:
        return None
    first = min(past, key=lambda s: int(s["recipient_start"]))
    start, head = int(first["recipient_start"]), int(first.get("recompute", 0))
    floor = settings.shifted_recompute_pct
    if start > m:
        return (
            f"the approved run starts at position {start}, {start - m} fresh tokens past vLLM's own "
            f"prefix hit ({m} tokens): vLLM's connector loads only a run that continues the hit"
        )
    if head or (floor and first["kind"] == "shifted"):
        return (
            f"the plan computes the first {head} tokens of the {first['kind']} span at {start} (recompute; "
            f"SEMGOV_SHIFTED_RECOMPUTE_PCT {floor}): vLLM's connector cannot compute tokens before a load; "
            "plan a tail instead (quality.shifted_recompute_tail_tokens)"
        )
    end, gap_to = run_end(past, m)
    if end - m < block_size and gap_to is not None:
        return (
            f"the approved run after vLLM's own prefix hit ({m} tokens) ends at position {end}, "
            f"{gap_to - end} unapproved token(s) before the next approved span at {gap_to} (fresh tokens, "
            f"or a junction token that differs from the donor's): {end - m} tokens, less than one "
            f"{block_size}-token block, and vLLM's connector loads only a run that continues the hit"
        )
    return (
        f"the approved run after vLLM's own prefix hit ({m} tokens) is {end - m} tokens long, shorter than "
        f"one {block_size}-token block, or its tokens differ from the donor's stored prompt"
    )


def run_end(spans: Any, m: int) -> tuple[int, int | None]:
    """Where the approved run contiguous from ``m`` ends, and where the next approved span starts
    past that end (None: no span after it)."""
    end = m
    for s in sorted(spans, key=lambda s: int(s["recipient_start"])):
        start = int(s["recipient_start"])
        if start > end:
            return end, start
        end = max(end, start + int(s["length"]))
    return end, None


def seal_blocks(request: Any, first_block: int) -> bool:
    """Keep a recipient's blocks from ``first_block`` on out of vLLM's prefix cache.

    vLLM caches every full block of a request under a hash chained from its tokens, loaded ones
    included: the donor-derived K/V a recipient receives would then serve any later request with
    the same tokens in the same scope, as an exact hit, without a decision or a record. Replacing
    the request's block hashes from ``first_block`` on (before vLLM allocates and caches them) by
    fresh random ones, which later blocks chain from, makes those blocks unreachable by any other
    request. Blocks before ``first_block`` (vLLM's own exact hit) stay shared.

    NOTE: ``Request.block_hashes`` is vLLM's (0.32) own list, read by its cache manager; no public
    hook marks blocks uncacheable. Without that list nothing is loaded (False).
    """
    hashes = getattr(request, "block_hashes", None)
    if not isinstance(hashes, list) or first_block < 0:
        return False
    for i in range(first_block, len(hashes)):
        hashes[i] = secrets.token_bytes(32)  # NOTE: vLLM's BlockHash is a NewType of bytes
    return True


def trim(pieces: tuple[LoadPiece, ...], n: int) -> tuple[LoadPiece, ...]:
    """The first ``n`` tokens of ``pieces`` (a piece cut short keeps its start)."""
    out: list[LoadPiece] = []
    for p in pieces:
        if n <= 0:
            break
        k = min(p.length, n)
        out.append(LoadPiece(p.recipient_start, p.donor_start, k))
        n -= k
    return tuple(out)


def block_ids(blocks: Any) -> tuple[int, ...]:
    """The block ids of vLLM's ``KVCacheBlocks`` (its first group), or () if it has none."""
    try:
        return tuple(int(b) for b in blocks.get_block_ids()[0])
    except Exception:  # noqa: BLE001
        return ()


def scheduled(out: Any) -> list[tuple[str, int, int]]:
    """(request id, tokens scheduled, tokens computed before this step) of every scheduled request."""
    rows = [
        (r.req_id, out.num_scheduled_tokens.get(r.req_id, 0), r.num_computed_tokens)
        for r in out.scheduled_new_reqs
    ]
    cached = out.scheduled_cached_reqs
    for i, rid in enumerate(cached.req_ids):
        rows.append((rid, out.num_scheduled_tokens.get(rid, 0), cached.num_computed_tokens[i]))
    return rows
