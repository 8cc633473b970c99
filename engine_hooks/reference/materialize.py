"""The CPU reference engine: prefill a prompt cold, or warm from a donor's KV as a decision allows.

A semgov ``allow`` record approves spans of the recipient's prompt whose tokens are identical
to the donor's (``docs/policy.md``, token verification):

- ``prefix`` span (``recipient_start == donor_start``, every earlier token identical): the
  donor's K/V are exactly what a cold prefill computes; they are copied as they are.
- ``shifted`` span (same tokens at another position or after other context): the K/V are an
  approximation. The leading tokens the record's plan names (the span's ``recompute``, set by
  the policy's quality section; at least ``min(len, max(min_recompute, ceil(recompute_share *
  len)))`` when the caller adds a floor of its own) are recomputed through the model, attending
  to everything before them in the recipient, and the rest is copied with keys re-rotated from
  the donor's positions to the recipient's (RoPE, rotate-half, from the model's ``inv_freq``).

Every position not approved is prefilled by the model, and the last prompt position is always
computed (it produces the logits). :func:`governed_prefill` is the fail-closed entry point: it
materializes only on an ``allow`` record with approved spans and runs cold on anything else,
including any error.

NOTE: invariants:
- The cache is built strictly in position order: every step appends (a model run over the next
  positions, or a copy of the next positions), so a position's K/V always sees exactly the
  recipient's positions before it, and ``cache.get_seq_length()`` is the next position.
- The model runs over a fixed grid of :data:`PREFILL_CHUNK_TOKENS` absolute positions (a run
  never crosses a multiple of the chunk), in cold and warm prefills alike. CPU kernels are only
  bit-reproducible for identical shapes (MKL's GEMM rounds a row differently for 1-3 rows, and
  for other small row counts depending on the thread count; SDPA's block split depends on the
  query length), so a position's K/V is bit-identical between two prefills when it was
  computed in the same chunk from bit-identical earlier K/V.
- Prefix spans are therefore copied in whole grid chunks (the partial chunks at their edges
  are recomputed) and never the chunk holding the last position. Because every earlier token
  is identical and the donor ran the same grid, the copied K/V are bit-identical to what a
  cold prefill of the recipient computes, the remaining chunks are computed exactly as cold
  computes them, and a prefix-only warm prefill gives bit-identical logits and cache.
- Nothing is touched before the spans and the donor's KV are validated (``ValueError``).
- Nothing here sets torch's thread count: the caller decides (benchmarks pin one thread).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache

from engine_hooks.reference.model import LoadedModel
from semgov.log import get_logger
from semgov.wire.models import SPAN_KEYS, span_dict

PREFILL_CHUNK_TOKENS = 128
"""Model runs never cross a multiple of this many positions (see the module NOTE)."""

_KINDS = ("prefix", "shifted")


@dataclass
class Prefill:
    """A prefilled prompt: its KV cache (every position), the last position's logits, the
    wall time taken, and how many positions the model actually ran."""

    cache: DynamicCache
    logits_last: torch.Tensor
    seconds: float
    computed_tokens: int


@dataclass
class DonorKV:
    """A donor prompt's tokens and its KV per layer, each ``[kv_heads, seq, head_dim]``; keys
    after RoPE, as the cache stores them."""

    token_ids: list[int]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]


@dataclass(frozen=True)
class Realization:
    """The engine-side event of one materialization: the evidence that reuse happened.

    ``materialized_tokens``: KV positions copied from the donor and kept.
    ``recomputed_tokens``: approved positions the model computed instead (the leading share of
    shifted spans, the partial grid chunks at the edges of prefix spans, and the last prompt
    position when it is approved).
    ``prefilled_tokens``: every position the model computed (prompt length minus
    ``materialized_tokens``).
    ``spans``: the approved spans acted on; ``seconds``: wall time of the warm prefill.
    """

    decision_id: str
    materialized_tokens: int
    recomputed_tokens: int
    prefilled_tokens: int
    spans: tuple[dict[str, Any], ...]
    seconds: float


@dataclass(frozen=True)
class _Span:
    recipient_start: int
    donor_start: int
    length: int
    kind: str
    recompute: int = 0  # NOTE: leading tokens the record's plan says to compute (as_dict leaves it out)

    @property
    def end(self) -> int:
        return self.recipient_start + self.length

    def as_dict(self) -> dict[str, Any]:
        return span_dict(self)


@dataclass(frozen=True)
class _Copy:
    """Copy ``length`` donor positions from ``donor_start`` to ``recipient_start``; keys are
    re-rotated by ``recipient_start - donor_start`` when ``rotate``."""

    recipient_start: int
    donor_start: int
    length: int
    rotate: bool


def _grid(start: int, end: int, chunk: int = PREFILL_CHUNK_TOKENS) -> Iterator[tuple[int, int]]:
    """``[start, end)`` cut at every multiple of ``chunk`` (:data:`PREFILL_CHUNK_TOKENS`)."""
    c = chunk
    while start < end:
        stop = min(end, (start // c + 1) * c)
        yield start, stop
        start = stop


def _run(
    lm: LoadedModel,
    cache: DynamicCache,
    token_ids: Sequence[int],
    start: int,
    end: int,
    chunk: int = PREFILL_CHUNK_TOKENS,
) -> torch.Tensor:
    """Run positions ``[start, end)`` through the model on the grid, appending to ``cache``;
    the logits of position ``end - 1``."""
    if cache.get_seq_length() != start:  # NOTE: positions are appended strictly in order
        raise RuntimeError(f"cache holds {cache.get_seq_length()} positions, next run starts at {start}")
    logits: torch.Tensor | None = None
    for a, b in _grid(start, end, chunk):
        ids = torch.tensor([list(token_ids[a:b])], dtype=torch.long)
        # position_ids default to arange(a, b): the cache holds exactly a positions.
        out = lm.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        logits = out.logits[0, -1]
    if logits is None:
        raise ValueError("empty model run")
    return logits


def _new_cache(lm: LoadedModel) -> DynamicCache:
    return DynamicCache(config=lm.model.config)


def cold_prefill(lm: LoadedModel, token_ids: list[int], *, chunk: int = PREFILL_CHUNK_TOKENS) -> Prefill:
    """Prefill every position through the model (the reference a warm prefill is held to).

    ``chunk``: the grid the model runs on (see the module NOTE). Only the default is comparable
    bit for bit with a warm prefill; another grid is the same computation in other kernel shapes,
    which is how a benchmark measures the answers' sensitivity to benign rounding (what a serving
    engine's batching changes from one run to the next)."""
    if not token_ids:
        raise ValueError("empty prompt")
    if chunk < 1:
        raise ValueError(f"chunk {chunk} < 1")
    t0 = time.perf_counter()
    with torch.no_grad():
        cache = _new_cache(lm)
        logits = _run(lm, cache, token_ids, 0, len(token_ids), chunk)
    return Prefill(cache, logits, time.perf_counter() - t0, len(token_ids))


def donor_kv(lm: LoadedModel, donor_token_ids: list[int]) -> DonorKV:
    """Cold-prefill the donor and keep its KV (in a real engine: the donor's cached KV)."""
    pre = cold_prefill(lm, donor_token_ids)
    keys = [layer.keys[0] for layer in pre.cache.layers]
    values = [layer.values[0] for layer in pre.cache.layers]
    return DonorKV(list(donor_token_ids), keys, values)


def _rotation(lm: LoadedModel) -> torch.Tensor:
    """The rotary module's ``inv_freq`` (``[head_dim / 2]``), refusing length-dependent RoPE."""
    rotary = lm.model.model.rotary_emb
    rope_type = str(getattr(rotary, "rope_type", "default"))
    if "dynamic" in rope_type:
        raise ValueError(f"RoPE type {rope_type!r} depends on the sequence length: keys cannot be re-rotated")
    inv_freq = rotary.inv_freq
    assert isinstance(inv_freq, torch.Tensor)
    return inv_freq


def rerotate_keys(keys: torch.Tensor, delta: int, inv_freq: torch.Tensor) -> torch.Tensor:
    """Keys ``[..., head_dim]`` after RoPE at position p, rotated to position ``p + delta``.

    Rotate-half style as Llama: ``k * cos(delta * f) + rotate_half(k) * sin(delta * f)`` with
    ``f = cat(inv_freq, inv_freq)``; RoPE rotations compose, so this equals RoPE at ``p + delta``.
    The rotary module's ``attention_scaling`` is deliberately not applied (the donor's keys
    already carry it)."""
    if delta == 0:
        return keys
    angle = float(delta) * inv_freq.to(torch.float64)
    emb = torch.cat((angle, angle))
    # NOTE: rotated in float32 (angles in float64) and cast back once: in bfloat16 the products
    # would round twice, off by up to 0.5 for Qwen2's large keys.
    cos, sin = emb.cos().to(torch.float32), emb.sin().to(torch.float32)
    x = keys.to(torch.float32)
    half = x.shape[-1] // 2
    rotated_half = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos + rotated_half * sin).to(keys.dtype)


def _validate(lm: LoadedModel, token_ids: Sequence[int], donor: DonorKV, spans: Sequence[Any]) -> list[_Span]:
    """Checked spans, or ``ValueError``: sorted, non-overlapping, within both prompts, and
    token-identical (a prefix span also at every earlier position) at every position."""
    n, m = len(token_ids), len(donor.token_ids)
    if n == 0:
        raise ValueError("empty prompt")
    layers = lm.model.config.num_hidden_layers
    if len(donor.keys) != layers or len(donor.values) != layers:
        raise ValueError(f"donor KV has {len(donor.keys)}/{len(donor.values)} layers, model has {layers}")
    for k, v in zip(donor.keys, donor.values, strict=True):
        if k.dim() != 3 or k.shape != v.shape or k.shape[1] != m:
            raise ValueError(f"donor KV shape {tuple(k.shape)}/{tuple(v.shape)} does not hold {m} positions")
    out: list[_Span] = []
    prev_end = 0
    for raw in spans:
        if not isinstance(raw, Mapping) or not set(SPAN_KEYS) <= set(raw):
            raise ValueError(f"not a span: {raw!r:.200}")
        nums = [raw[k] for k in SPAN_KEYS[:3]]
        if any(not isinstance(x, int) or isinstance(x, bool) for x in nums) or raw["kind"] not in _KINDS:
            raise ValueError(f"malformed span: {raw!r:.200}")
        head = raw.get("recompute", 0)
        if not isinstance(head, int) or isinstance(head, bool) or not 0 <= head <= nums[2]:
            raise ValueError(f"malformed span (recompute): {raw!r:.200}")
        s = _Span(nums[0], nums[1], nums[2], str(raw["kind"]), head)
        if s.length < 1 or s.recipient_start < 0 or s.donor_start < 0:
            raise ValueError(f"span with a negative start or no length: {s.as_dict()}")
        if s.end > n or s.donor_start + s.length > m:
            raise ValueError(f"span {s.as_dict()} outside the prompts ({n} recipient, {m} donor tokens)")
        if s.recipient_start < prev_end:
            raise ValueError(f"spans unsorted or overlapping at {s.as_dict()}")
        if (
            list(token_ids[s.recipient_start : s.end])
            != donor.token_ids[s.donor_start : s.donor_start + s.length]
        ):
            raise ValueError(f"span {s.as_dict()}: tokens differ between donor and recipient")
        if s.kind == "prefix" and (
            s.recipient_start != s.donor_start
            or list(token_ids[: s.recipient_start]) != donor.token_ids[: s.donor_start]
        ):
            raise ValueError(f"prefix span {s.as_dict()} is not inside the common prefix")
        prev_end = s.end
        out.append(s)
    return out


def _plan(n: int, spans: list[_Span], recompute_share: float, min_recompute: int) -> list[_Copy]:
    """The copies, in position order; every other position is computed by the model."""
    c = PREFILL_CHUNK_TOKENS
    last_chunk = ((n - 1) // c) * c  # NOTE: the chunk holding the last position is always computed
    copies: list[_Copy] = []
    merged: list[_Span] = []
    for s in spans:  # token verification splits the common prefix at segment boundaries: rejoin it
        if (
            merged
            and s.kind == merged[-1].kind == "prefix"
            and merged[-1].end == s.recipient_start
            and not s.recompute
            and not merged[-1].recompute
        ):
            prev = merged.pop()
            s = _Span(prev.recipient_start, prev.donor_start, prev.length + s.length, "prefix")
        merged.append(s)
    for s in merged:
        if s.kind == "prefix" and not s.recompute:
            a = -(-s.recipient_start // c) * c
            b = min((s.end // c) * c, last_chunk)
            if a < b:
                copies.append(_Copy(a, a, b - a, rotate=False))
        else:
            floor = 0 if s.kind == "prefix" else max(min_recompute, math.ceil(recompute_share * s.length))
            head = min(s.length, max(s.recompute, floor))
            a, b = s.recipient_start + head, min(s.end, n - 1)
            if a < b:
                copies.append(_Copy(a, s.donor_start + head, b - a, rotate=s.kind == "shifted"))
    return copies


def _warm_prefill(
    lm: LoadedModel,
    token_ids: list[int],
    donor: DonorKV,
    spans: list[dict[str, Any]],
    *,
    decision_id: str,
    recompute_share: float,
    min_recompute: int,
    on_event: Callable[[Realization], None] | None,
    rerotate: bool,
) -> tuple[Prefill, Realization]:
    """:func:`warm_prefill`; ``rerotate=False`` (tests and measurements only) copies shifted
    keys without re-rotation, to show what the correction is worth."""
    t0 = time.perf_counter()
    if not 0.0 <= recompute_share <= 1.0 or min_recompute < 0:
        raise ValueError(
            f"recompute_share {recompute_share} not in [0, 1] or min_recompute {min_recompute} < 0"
        )
    checked = _validate(lm, token_ids, donor, spans)
    copies = _plan(len(token_ids), checked, recompute_share, min_recompute)
    inv_freq = _rotation(lm) if any(cp.rotate for cp in copies) else None
    with torch.no_grad():
        cache = _new_cache(lm)
        pos = 0
        for cp in copies:
            if pos < cp.recipient_start:
                _run(lm, cache, token_ids, pos, cp.recipient_start)
            delta = cp.recipient_start - cp.donor_start
            d0, d1 = cp.donor_start, cp.donor_start + cp.length
            for layer, (k, v) in enumerate(zip(donor.keys, donor.values, strict=True)):
                keys = k[:, d0:d1]
                if cp.rotate and rerotate and inv_freq is not None:
                    keys = rerotate_keys(keys, delta, inv_freq)
                cache.update(keys.unsqueeze(0), v[:, d0:d1].unsqueeze(0), layer)
            pos = cp.recipient_start + cp.length
        logits = _run(lm, cache, token_ids, pos, len(token_ids))
    seconds = time.perf_counter() - t0
    materialized = sum(cp.length for cp in copies)
    approved = sum(s.length for s in checked)
    computed = len(token_ids) - materialized
    realization = Realization(
        decision_id=decision_id,
        materialized_tokens=materialized,
        recomputed_tokens=approved - materialized,
        prefilled_tokens=computed,
        spans=tuple(s.as_dict() for s in checked),
        seconds=seconds,
    )
    if on_event is not None:
        on_event(realization)
    return Prefill(cache, logits, seconds, computed), realization


def warm_prefill(
    lm: LoadedModel,
    token_ids: list[int],
    donor: DonorKV,
    spans: list[dict[str, Any]],
    *,
    decision_id: str,
    recompute_share: float = 0.0,
    min_recompute: int = 0,
    on_event: Callable[[Realization], None] | None = None,
) -> tuple[Prefill, Realization]:
    """Build the recipient's cache from the donor's KV over the approved ``spans`` (record
    format: ``recipient_start``, ``donor_start``, ``length``, ``kind`` and, in a
    ``semgov.decision/v2`` record, ``recompute``), computing the rest.

    Prefix spans are copied as they are (in whole grid chunks); shifted spans have their leading
    ``recompute`` tokens (the record's plan; at least ``min(len, max(min_recompute,
    ceil(recompute_share * len)))``, a floor of the caller's, none by default) recomputed and the
    rest copied with keys re-rotated by ``recipient_start - donor_start``; a prefix span that
    names a ``recompute`` is treated like a shifted one of shift 0 (its head computed, the rest
    copied as it is, outside the grid); every other position, and
    always the last, is computed by the model. Spans must be sorted by ``recipient_start``,
    non-overlapping, inside both prompts and token-identical: ``ValueError`` otherwise, before
    anything is computed (the caller then runs cold). Calls ``on_event`` with the
    :class:`Realization` when done.
    """
    return _warm_prefill(
        lm,
        token_ids,
        donor,
        spans,
        decision_id=decision_id,
        recompute_share=recompute_share,
        min_recompute=min_recompute,
        on_event=on_event,
        rerotate=True,
    )


def governed_prefill(
    lm: LoadedModel,
    token_ids: list[int],
    donor: DonorKV | None,
    record: dict[str, Any] | None,
    **kw: Any,
) -> tuple[Prefill, Realization | None]:
    """Fail closed: warm from ``donor`` only on an ``allow`` record with approved spans.

    On a deny, a missing record or donor, or any exception (a malformed record, spans that
    fail validation, a record for a prompt of another length, an error while materializing or
    in ``on_event``), run :func:`cold_prefill` and return ``(prefill, None)``. ``kw`` goes to
    :func:`warm_prefill`. The record's signature is the caller's to verify.
    """
    try:
        if (
            donor is not None
            and isinstance(record, Mapping)
            and record.get("decision") == "allow"
            and record.get("approved_spans")
        ):
            expected = record.get("recipient_tokens")
            if expected is not None and expected != len(token_ids):
                raise ValueError(f"record is for a {expected}-token prompt, this one has {len(token_ids)}")
            decision_id = record["decision_id"]
            if not isinstance(decision_id, str):
                raise ValueError(f"decision_id {decision_id!r} is not a string")
            # Engines may list spans in any order (a Rego set sorts by donor_start): order by position.
            spans = sorted((dict(s) for s in record["approved_spans"]), key=lambda s: s["recipient_start"])
            prefill, realization = warm_prefill(lm, token_ids, donor, spans, decision_id=decision_id, **kw)
            return prefill, realization
    except Exception as e:  # noqa: BLE001 - fail closed: anything wrong means a cold prefill
        get_logger().warning(
            "materialization refused, prefilling cold",
            decision_id=str(record.get("decision_id")) if isinstance(record, Mapping) else None,
            error=f"{type(e).__name__}: {e}",
        )
    return cold_prefill(lm, token_ids), None


def _fork(cache: DynamicCache) -> DynamicCache:
    """A new cache holding copies of ``cache``'s K/V, so appending to it leaves ``cache`` as it was."""
    return DynamicCache(ddp_cache_data=[(layer.keys, layer.values) for layer in cache.layers])


def greedy(
    lm: LoadedModel, prefill: Prefill, max_new_tokens: int, *, stop_token_ids: set[int] | None = None
) -> list[int]:
    """Greedy decoding from the prefill's last logits and cache; includes the stop token if
    one is generated. Decodes on a copy of the cache: ``prefill`` stays reusable."""
    out: list[int] = []
    if max_new_tokens <= 0:
        return out
    stop = stop_token_ids or set()
    with torch.no_grad():
        cache = _fork(prefill.cache)
        logits = prefill.logits_last
        while True:
            token = int(torch.argmax(logits))
            out.append(token)
            if token in stop or len(out) >= max_new_tokens:
                return out
            res = lm.model(
                input_ids=torch.tensor([[token]]), past_key_values=cache, use_cache=True, logits_to_keep=1
            )
            logits = res.logits[0, -1]


def teacher_forced_logits(lm: LoadedModel, prefill: Prefill, continuation: list[int]) -> torch.Tensor:
    """``[len(continuation) + 1, vocab]``: the prefill's last logits, then the logits after each
    continuation token fed in turn (one run; the prefill's cache is left as it was). Compares
    two prefills over a whole answer rather than one position."""
    rows = [prefill.logits_last.reshape(1, -1)]
    if continuation:
        with torch.no_grad():
            res = lm.model(
                input_ids=torch.tensor([continuation], dtype=torch.long),
                past_key_values=_fork(prefill.cache),
                use_cache=True,
            )
        rows.append(res.logits[0])
    return torch.cat(rows)


def compare_logits(reference: torch.Tensor, other: torch.Tensor) -> tuple[float, float, float]:
    """Mean KL(reference || other) in nats, top-1 agreement rate, and the max KL, over the rows
    of two ``[positions, vocab]`` (or ``[vocab]``) logit tensors."""
    ref = torch.log_softmax(reference.reshape(-1, reference.shape[-1]).double(), dim=-1)
    oth = torch.log_softmax(other.reshape(-1, other.shape[-1]).double(), dim=-1)
    kl = (ref.exp() * (ref - oth)).sum(-1).clamp_min(0.0)
    top1 = (ref.argmax(-1) == oth.argmax(-1)).double().mean()
    return float(kl.mean()), float(top1), float(kl.max())


def validate_spans(
    lm: LoadedModel, token_ids: Sequence[int], donor: DonorKV, spans: Sequence[Any]
) -> list[_Span]:
    """The approved spans checked as :func:`warm_prefill` checks them (``ValueError`` otherwise)."""
    return _validate(lm, token_ids, donor, spans)


def rotation(lm: LoadedModel) -> torch.Tensor:
    """The model's RoPE ``inv_freq``, refusing length-dependent RoPE (``ValueError``)."""
    return _rotation(lm)
