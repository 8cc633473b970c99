"""The RoPE of a loaded SGLang model, read from its own rotary embedding modules.

:func:`rope_for_model` is what the factory asks at start-up; :func:`rope_from_rotary_embedding`
reads one SGLang rotary embedding (plain, ``linear``, ``llama3`` or ``yarn``) into a
:class:`~engine_hooks.core.rope.RopeSpec`, whose config reading and checks live in the
engine-agnostic core (:mod:`engine_hooks.core.rope`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from engine_hooks.core.rope import RopeSpec, config_rope

__all__ = ["rope_for_model", "rope_from_rotary_embedding", "rotary_embeddings"]

# SGLang's rotary embedding class behind each accepted RoPE type (exact classes, no subclass).
_ROPE_MODULE = "sglang.srt.layers.rotary_embedding"
_ROPE_CLASSES = {
    "default": "RotaryEmbedding",
    "linear": "LinearScalingRotaryEmbedding",
    "llama3": "Llama3RotaryEmbedding",
    "yarn": "YaRNScalingRotaryEmbedding",
}


def rope_for_model(hf_config: Any, model: Any) -> RopeSpec | None:
    """The RoPE of a loaded SGLang model: from its rotary embedding module(s)
    (:func:`rope_from_rotary_embedding`; several distinct ones must all give the same spec), or
    from the config alone (plain RoPE only) when the model shows none. Never raises."""
    try:
        embs = rotary_embeddings(model) if model is not None else []
    except Exception:  # noqa: BLE001 - a model we cannot walk: the config decides alone
        embs = []
    if not embs:
        return RopeSpec.from_hf_config(hf_config)
    specs = {rope_from_rotary_embedding(hf_config, e) for e in embs}
    return specs.pop() if len(specs) == 1 else None


def rope_from_rotary_embedding(hf_config: Any, emb: Any) -> RopeSpec | None:
    """The RoPE of a model whose config passes :meth:`RopeSpec.from_hf_config`'s checks with a
    plain, ``linear``, ``llama3`` or ``yarn`` RoPE type, taken from ``emb``, the SGLang rotary
    embedding its attention layers apply: sizes, style and base must match the config, the
    class must be exactly SGLang's class for that type, and the effective frequencies (from
    the class's own ``_compute_inv_freq``) must reproduce ``emb.cos_sin_cache`` at sampled
    positions. ``None`` otherwise (never raises)."""
    try:
        return _from_embedding(hf_config, emb)
    except Exception:  # noqa: BLE001 - an embedding we cannot read is one we do not re-rotate
        return None


def _from_embedding(hf_config: Any, emb: Any) -> RopeSpec | None:
    import torch

    found = config_rope(hf_config, scaled=True)
    if found is None:
        return None
    plain, rope_type, _ = found
    cls = type(emb)
    if not (cls.__module__.startswith(_ROPE_MODULE) and cls.__qualname__ == _ROPE_CLASSES[rope_type]):
        return None
    if (
        emb.head_size != plain.head_dim
        or emb.rotary_dim != plain.rotary_dim
        or bool(emb.is_neox_style) != plain.is_neox_style
        or float(emb.base) != plain.base
        or int(getattr(emb, "position_start", 0)) != 0
    ):
        return None
    mscale = 1.0
    with torch.no_grad():
        if rope_type == "linear":
            factors = list(emb.scaling_factors)
            if len(factors) != 1 or not float(factors[0]) > 0.0:
                return None  # several factors: one cache per factor, chosen per request
            inv = _plain_inv_freq(emb) / float(factors[0])
        elif rope_type == "yarn":
            inv = emb._compute_inv_freq(emb.scaling_factor)
            mscale = float(emb.mscale)
        else:  # default and llama3: _compute_inv_freq(base) is the effective one
            inv = emb._compute_inv_freq(emb.base)
        inv = inv.to(device="cpu", dtype=torch.float32)
        if not _reproduces_cache(emb.cos_sin_cache, inv, mscale):
            return None
    spec = RopeSpec(
        plain.rotary_dim,
        plain.head_dim,
        plain.base,
        plain.is_neox_style,
        inv_freq=tuple(float(x) for x in inv.tolist()),
        scaling=rope_type,
    )
    return spec


def _plain_inv_freq(emb: Any) -> Any:
    """Plain RoPE's inverse frequencies for ``emb``'s sizes, computed by SGLang's base class."""
    from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding

    return RotaryEmbedding._compute_inv_freq(emb, emb.base)


def _reproduces_cache(cache: Any, inv: Any, mscale: float) -> bool:
    """Whether ``mscale * [cos | sin](p * inv)`` matches the embedding's own cache at sampled
    positions, within the cache dtype's rounding and SGLang's float32 angle rounding."""
    import torch

    n = int(cache.shape[0])
    half = int(inv.shape[0])
    if cache.dim() != 2 or int(cache.shape[1]) != 2 * half or n < 2:
        return False
    pos = sorted({1, 2, 3, 17, 255, min(n - 1, 4095), n // 2, n - 1})
    p = torch.tensor(pos, dtype=torch.float64)[:, None]
    angle = p * inv.to(torch.float64)[None, :]
    want = torch.cat([angle.cos(), angle.sin()], dim=-1) * mscale
    got = cache[pos].to(device="cpu", dtype=torch.float64)
    eps = torch.finfo(cache.dtype).eps if cache.is_floating_point() else 1.0
    # NOTE: SGLang forms p * inv_freq in float32 (relative 2**-24 per angle), then rounds the
    # cos/sin to the cache dtype; a wrong frequency is off by far more at the larger positions.
    tol = (4 * eps + p * 2.0**-22) * max(1.0, abs(mscale))
    return bool(((got - want).abs() <= tol).all())


def rotary_embeddings(model: Any) -> list[Any]:
    """The distinct rotary embedding modules of a loaded SGLang model (objects with a
    ``cos_sin_cache``), in module order."""
    out: list[Any] = []
    seen: set[int] = set()
    modules: Iterable[Any] = model.modules() if hasattr(model, "modules") else ()
    for m in modules:
        if hasattr(m, "cos_sin_cache") and id(m) not in seen:
            seen.add(id(m))
            out.append(m)
    return out
