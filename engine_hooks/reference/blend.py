"""Selective recompute of shifted spans for the CPU reference engine (CacheBlend's idea).

A shifted span's K/V were computed behind the donor's tokens; copied into the recipient they are
right for most tokens and wrong for a few, the ones whose meaning depends most on what came
before. Leading recompute (:func:`~engine_hooks.reference.materialize.warm_prefill`) computes a
span's first tokens whatever they are; selective recompute computes the same number of tokens,
chosen where the copy deviates most from the recipient's own context:

1. Every position runs through the first decoder layer, attending to the recipient's context
   (each copied position's layer-0 K/V are its own re-rotated copy, which layer 0 does not
   change: its input is the token's embedding alone). The output gives each copied token's
   layer-1 K/V *as the recipient computes them*; their distance from the donor's copy is the
   token's deviation (one layer of ``L``: about ``1/L`` of a cold prefill).
2. The ``k`` most deviating tokens of each shifted span (``k`` = the decision record's
   ``recompute``) are computed through every layer together with the positions that were never
   copied, attending to the copied K/V of the rest; their K/V replace the copies.

Prefix spans are exact (their K/V are what a cold prefill computes) and are never selected.
Selecting every copied token computes every position: the result then equals a cold prefill up
to floating-point order (``tests/reference/test_materialize.py`` holds it to that).

NOTE: invariants: positions are either copied or computed, never neither; the last prompt
position is always computed (it gives the logits); nothing is copied outside an approved span.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb, repeat_kv

from engine_hooks.reference import materialize as mz
from engine_hooks.reference.model import LoadedModel


def _copied_kv(
    lm: LoadedModel, n: int, donor: mz.DonorKV, spans: Sequence[Any], inv_freq: torch.Tensor | None
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """Per layer ``[kv_heads, n, head_dim]`` K/V holding each approved span's copy at the
    recipient's positions (keys re-rotated), zeros elsewhere; and the copied positions' mask."""
    copied = torch.zeros(n, dtype=torch.bool)
    keys = [torch.zeros(k.shape[0], n, k.shape[2], dtype=k.dtype) for k in donor.keys]
    values = [torch.zeros_like(k) for k in keys]
    for s in spans:
        a, d, m = s.recipient_start, s.donor_start, s.length
        copied[a : a + m] = True
        for layer, (k, v) in enumerate(zip(donor.keys, donor.values, strict=True)):
            src = k[:, d : d + m]
            if a != d and inv_freq is not None:
                src = mz.rerotate_keys(src, a - d, inv_freq)
            keys[layer][:, a : a + m] = src
            values[layer][:, a : a + m] = v[:, d : d + m]
    copied[n - 1] = False  # NOTE: the last position is always computed
    return keys, values, copied


def _forward(
    lm: LoadedModel,
    token_ids: Sequence[int],
    fresh: torch.Tensor,
    keys: list[torch.Tensor],
    values: list[torch.Tensor],
    layers: int | None = None,
) -> torch.Tensor:
    """Run the positions ``fresh`` (sorted indices) through the first ``layers`` decoder layers,
    attending causally to every position's K/V: the computed ones for ``fresh``, ``keys`` /
    ``values`` (updated in place) for the rest. Returns the hidden states ``[1, len(fresh), d]``."""
    model = lm.model.model
    n, f = len(token_ids), len(fresh)
    h = model.embed_tokens(torch.tensor(token_ids, dtype=torch.long)[fresh])[None]
    cos, sin = model.rotary_emb(h, fresh[None])
    allowed = torch.arange(n)[None, :] <= fresh[:, None]  # [f, n]: key position <= query position
    for i, layer in enumerate(model.layers[: layers if layers is not None else len(model.layers)]):
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        shape = (1, f, -1, attn.head_dim)
        q = attn.q_proj(x).view(shape).transpose(1, 2)
        k = attn.k_proj(x).view(shape).transpose(1, 2)
        v = attn.v_proj(x).view(shape).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        keys[i][:, fresh] = k[0]
        values[i][:, fresh] = v[0]
        kk = repeat_kv(keys[i][None], attn.num_key_value_groups)
        vv = repeat_kv(values[i][None], attn.num_key_value_groups)
        o = F.scaled_dot_product_attention(q, kk, vv, attn_mask=allowed, scale=attn.scaling)
        h = h + attn.o_proj(o.transpose(1, 2).reshape(1, f, -1))
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    out: torch.Tensor = h
    return out


def _deviation(
    lm: LoadedModel, token_ids: Sequence[int], keys: list[torch.Tensor], values: list[torch.Tensor]
) -> torch.Tensor:
    """Per position, how far the copied layer-1 K/V are from what the recipient's context gives."""
    n = len(token_ids)
    if len(lm.model.model.layers) < 2:
        raise ValueError("selective recompute measures deviation on layer 1: the model has one layer")
    k0, v0 = [keys[0].clone()], [values[0].clone()]
    h = _forward(lm, token_ids, torch.arange(n), k0, v0, layers=1)
    nxt = lm.model.model.layers[1]
    attn = nxt.self_attn
    x = nxt.input_layernorm(h)
    shape = (1, n, -1, attn.head_dim)
    k = attn.k_proj(x).view(shape).transpose(1, 2)
    v = attn.v_proj(x).view(shape).transpose(1, 2)
    cos, sin = lm.model.model.rotary_emb(h, torch.arange(n)[None])
    _, k = apply_rotary_pos_emb(k, k, cos, sin)
    dk = (k[0] - keys[1]).norm(dim=-1).sum(0)
    dv = (v[0] - values[1]).norm(dim=-1).sum(0)
    dev: torch.Tensor = dk + dv  # [n]
    return dev


def blend_prefill(
    lm: LoadedModel,
    token_ids: list[int],
    donor: mz.DonorKV,
    spans: list[dict[str, Any]],
    *,
    decision_id: str,
    on_event: Callable[[mz.Realization], None] | None = None,
) -> tuple[mz.Prefill, mz.Realization]:
    """A warm prefill that recomputes, of each shifted span, its ``recompute`` most deviating
    tokens instead of its first ones (see the module docstring); spans as for
    :func:`~engine_hooks.reference.materialize.warm_prefill` (checked the same way first)."""
    t0 = time.perf_counter()
    checked = mz.validate_spans(lm, token_ids, donor, spans)
    n = len(token_ids)
    shifted = [s for s in checked if s.kind == "shifted"]
    inv_freq = mz.rotation(lm) if shifted else None
    with torch.no_grad():
        keys, values, copied = _copied_kv(lm, n, donor, checked, inv_freq)
        chosen = torch.zeros(n, dtype=torch.bool)
        if any(s.recompute for s in shifted):
            dev = _deviation(lm, token_ids, keys, values)
            for s in shifted:
                a, b = s.recipient_start, s.recipient_start + s.length
                k = min(s.recompute, s.length)
                if k:
                    chosen[a + torch.topk(dev[a:b], k).indices] = True
        fresh = torch.nonzero(~copied | chosen).flatten()
        h = _forward(lm, token_ids, fresh, keys, values)
        logits = lm.model.lm_head(lm.model.model.norm(h[:, -1]))[0]
        cache = DynamicCache(ddp_cache_data=[(k[None], v[None]) for k, v in zip(keys, values, strict=True)])
    seconds = time.perf_counter() - t0
    materialized = n - len(fresh)
    approved = sum(s.length for s in checked)
    realization = mz.Realization(
        decision_id=decision_id,
        materialized_tokens=materialized,
        recomputed_tokens=approved - materialized,
        prefilled_tokens=len(fresh),
        spans=tuple(s.as_dict() for s in checked),
        seconds=seconds,
    )
    if on_event is not None:
        on_event(realization)
    return mz.Prefill(cache, logits, seconds, len(fresh)), realization
