"""Move post-RoPE keys to another position: the rotation math both engines' copies share.

Engines store keys *after* RoPE, and RoPE rotates each frequency pair ``i`` of a key by
``p * inv_freq[i]``; rotations compose, so rotating a stored key by ``delta * inv_freq[i]``
gives exactly the key RoPE would have produced at ``p + delta`` (for the RoPE types
:class:`~engine_hooks.core.rope.RopeSpec` accepts). Values carry no position and never move.
Used by SGLang's pool copy (:mod:`engine_hooks.sglang.kv_copy`) and vLLM's worker side
(:mod:`engine_hooks.vllm.worker_side`). Torch, no engine.
"""

from __future__ import annotations

from typing import Any

import torch

from engine_hooks.core.rope import RopeSpec

__all__ = ["check_delta", "rerotate_keys", "rotate", "rotation"]


def _inv_freq(rope: RopeSpec, device: torch.device) -> torch.Tensor:
    """RoPE's inverse frequencies ``[rotary_dim / 2]`` in float32: the model's own effective ones
    when the spec carries them (scaled RoPE), else computed as SGLang's
    ``RotaryEmbedding._compute_inv_freq`` (and transformers) compute plain RoPE's."""
    if rope.inv_freq is not None:
        return torch.tensor(rope.inv_freq, dtype=torch.float32, device=device)
    exponents = torch.arange(0, rope.rotary_dim, 2, dtype=torch.float32, device=device) / rope.rotary_dim
    return 1.0 / (rope.base**exponents)


def rotation(delta: torch.Tensor, rope: RopeSpec, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of ``delta * inv_freq`` as float32 ``[n, 1, rotary_dim / 2]``.

    The angle is formed in float64 so a large ``delta`` loses no precision before cos/sin."""
    angle = delta.to(device=device, dtype=torch.float64)[:, None] * _inv_freq(rope, device).to(torch.float64)
    return angle.cos().to(torch.float32)[:, None, :], angle.sin().to(torch.float32)[:, None, :]


def rotate(
    keys: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unmoved: torch.Tensor, rope: RopeSpec
) -> torch.Tensor:
    """``keys`` rotated pairwise by the angles behind ``cos``/``sin``; rows in ``unmoved`` are
    returned bit-identical."""
    x = keys.to(torch.float32)
    rot, rest = x[..., : rope.rotary_dim], x[..., rope.rotary_dim :]
    if rope.is_neox_style:
        x1, x2 = rot.chunk(2, dim=-1)
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    if rope.is_neox_style:
        rotated = torch.cat((o1, o2), dim=-1)
    else:
        rotated = torch.stack((o1, o2), dim=-1).flatten(-2)
    out = torch.cat((rotated, rest), dim=-1).to(keys.dtype)
    return torch.where(unmoved[:, None, None], keys, out)


def check_delta(delta: Any, n: int) -> torch.Tensor:
    if not isinstance(delta, torch.Tensor) or delta.dtype != torch.int64 or delta.dim() != 1:
        raise ValueError("delta must be a 1-D int64 tensor (or None)")
    if delta.shape[0] != n:
        raise ValueError(f"delta has {delta.shape[0]} entries for {n} slots")
    return delta


def rerotate_keys(keys: torch.Tensor, delta: torch.Tensor, rope: RopeSpec) -> torch.Tensor:
    """Post-RoPE keys ``[n, kv_heads, head_dim]`` moved by ``delta[i]`` positions each.

    Computed in float32 (angles in float64) and returned in ``keys.dtype``; dims at and beyond
    ``rope.rotary_dim`` are untouched, and rows with ``delta == 0`` come back bit-identical.
    """
    if keys.dim() != 3 or keys.shape[-1] != rope.head_dim:
        raise ValueError(f"keys must be [n, kv_heads, {rope.head_dim}], got {tuple(keys.shape)}")
    if not keys.is_floating_point():
        raise ValueError(f"keys must be floating point, got {keys.dtype}")
    delta = check_delta(delta, keys.shape[0]).to(keys.device)
    cos, sin = rotation(delta, rope, keys.device)
    return rotate(keys, cos, sin, delta == 0, rope)
