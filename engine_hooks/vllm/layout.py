"""Where vLLM's attention kernel keeps one token's K and V inside a KV block, learned from the kernel.

vLLM's CPU attention backend (0.32) declares a per-layer cache ``[num_blocks, kv_heads, block_size,
2 * head_dim]`` but arranges each block's interior for its kernels: observed on x86 with AVX-512
(ISA ``vec``), keys are stored dimension-major (``[head_dim, block_size]``, one row per dimension)
and values token-major. Another ISA (AMX, NEON, ...) may pack them differently. Rather than trust
a belief about the interior, :func:`learn_layout` writes index-coded keys and values through the
kernel's own cache writer (the function the attention layer calls, passed in) and reads back where
each ``(token offset, kv head, dim)`` landed. The result, :class:`BlockLayout`, gathers a token's
K/V in a canonical ``[n, 2, kv_heads, head_dim]`` form and scatters it back; it is checked to be a
bijection over the block (every element written exactly once, nothing outside the block touched)
or :class:`LayoutError` is raised and the connector reuses nothing.

Codes are small integers (< 128), exact in every float type the kernel takes (bf16, fp16, fp32);
a quantized (fp8) cache is refused.

NOTE: the worker side learns through :mod:`engine_hooks.vllm.device_layout` (every supported
backend, any of vLLM's cache layouts, any device; issue 33). This module keeps :class:`LayoutError`,
vLLM's CPU kernel as a writer (:func:`cpu_cache_writer`), and the first, CPU-only learner, which
the tests hold the device learner to on vLLM's CPU kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# key, value [n, kv_heads, head_dim]; key_cache, value_cache (the kernel's views); slot_mapping [n]
CacheWriter = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]

_DIGIT = 128  # codes are written in base-128 digits: exact in bf16 (8 significant bits)
_UNSET = -1.0
_OTHER = -2.0


class LayoutError(RuntimeError):
    """The kernel's block layout could not be learned or is not a bijection (reuse stays off)."""


@dataclass(frozen=True, slots=True)
class BlockLayout:
    """Flat element offsets, within one block, of each ``(offset, kv head, dim)`` of K and of V."""

    block_size: int
    kv_heads: int
    head_dim: int
    k_index: torch.Tensor  # [block_size, kv_heads, head_dim] int64
    v_index: torch.Tensor  # [block_size, kv_heads, head_dim] int64

    def _where(self, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        slots = slots.to(torch.int64)
        return (slots // self.block_size).view(-1, 1, 1), slots % self.block_size

    def gather(self, layer: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """K/V of the tokens in ``slots`` (block * block_size + offset): ``[n, 2, kv_heads, head_dim]``."""
        flat = layer.view(layer.shape[0], -1)
        blocks, offs = self._where(slots)
        k = flat[blocks, self.k_index[offs]]
        v = flat[blocks, self.v_index[offs]]
        return torch.stack([k, v], dim=1)

    def scatter(self, layer: torch.Tensor, slots: torch.Tensor, kv: torch.Tensor) -> None:
        """Write canonical ``kv`` (``[n, 2, kv_heads, head_dim]``) into ``slots`` of ``layer`` in place."""
        flat = layer.view(layer.shape[0], -1)
        blocks, offs = self._where(slots)
        flat[blocks, self.k_index[offs]] = kv[:, 0].to(layer.dtype)
        flat[blocks, self.v_index[offs]] = kv[:, 1].to(layer.dtype)


def _codes(n: int, kv_heads: int, head_dim: int, axis: int, digit: int) -> torch.Tensor:
    """``[n, kv_heads, head_dim]`` holding base-128 digit ``digit`` of each element's index on ``axis``."""
    shape = (n, kv_heads, head_dim)
    idx = torch.arange(shape[axis]).view([-1 if i == axis else 1 for i in range(3)]).expand(shape)
    codes: torch.Tensor = (idx // (_DIGIT**digit)) % _DIGIT
    return codes.to(torch.float32)


def _learn_side(
    write: CacheWriter, dtype: torch.dtype, block_size: int, kv_heads: int, head_dim: int, side: int
) -> torch.Tensor:
    """Element offsets within a block of K (``side`` 0) or V (1), ``[block_size, kv_heads, head_dim]``."""
    per_block = kv_heads * block_size * 2 * head_dim
    index = torch.zeros(per_block, 3, dtype=torch.int64)
    written: torch.Tensor | None = None
    other = torch.full((block_size, kv_heads, head_dim), _OTHER).to(dtype)
    for axis, size in enumerate((block_size, kv_heads, head_dim)):
        for digit in range(max(1, -(-(size.bit_length()) // 7))):
            cache = torch.full((2, kv_heads, block_size, 2 * head_dim), _UNSET, dtype=dtype)
            view = cache.view(2, kv_heads, block_size * 2, head_dim)
            kc, vc = view.chunk(2, dim=2)
            coded = _codes(block_size, kv_heads, head_dim, axis, digit).to(dtype)
            key, value = (coded, other) if side == 0 else (other, coded)
            write(key.contiguous(), value.contiguous(), kc, vc, torch.arange(block_size, 2 * block_size))
            if not bool((cache[0] == _UNSET).all()):
                raise LayoutError("the kernel wrote outside the block it was given")
            got = cache[1].reshape(-1).to(torch.float32)
            mine = got >= 0
            if written is None:
                written = mine
            elif not torch.equal(written, mine):
                raise LayoutError("the kernel put elements in different places on two writes")
            index[:, axis] += torch.where(mine, got, 0).to(torch.int64) * (_DIGIT**digit)
    assert written is not None
    n = block_size * kv_heads * head_dim
    if int(written.sum()) != n:
        raise LayoutError(f"{int(written.sum())} elements written for {n} values")
    where = written.nonzero().view(-1)
    t, h, d = index[where, 0], index[where, 1], index[where, 2]
    out = torch.full((block_size, kv_heads, head_dim), -1, dtype=torch.int64)
    out[t, h, d] = where
    if bool((out < 0).any()):
        raise LayoutError("some (offset, head, dim) of the block was never written")
    return out


def learn_layout(
    write: CacheWriter, dtype: torch.dtype, block_size: int, kv_heads: int, head_dim: int
) -> BlockLayout:
    """The kernel's block layout, learned by writing coded K/V through ``write`` (the kernel's own
    cache writer) into a scratch two-block cache. Raises :class:`LayoutError` unless K and V map
    one to one onto the block's elements."""
    if not dtype.is_floating_point or dtype.itemsize < 2:
        raise LayoutError(f"cache dtype {dtype} is not a 16/32-bit float (quantized caches are refused)")
    k = _learn_side(write, dtype, block_size, kv_heads, head_dim, 0)
    v = _learn_side(write, dtype, block_size, kv_heads, head_dim, 1)
    both = torch.cat([k.view(-1), v.view(-1)])
    if int(torch.unique(both).numel()) != 2 * block_size * kv_heads * head_dim:
        raise LayoutError("K and V share elements of the block")
    return BlockLayout(block_size, kv_heads, head_dim, k, v)


def cpu_cache_writer(dtype: torch.dtype, block_size: int, head_dim: int, kv_cache_dtype: str) -> CacheWriter:
    """The cache writer vLLM's CPU attention layer calls (``cpu_attn_reshape_and_cache`` with the
    ISA the backend picks for this dtype, block size and head size), as a :data:`CacheWriter`."""
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    isa = _get_attn_isa(dtype, block_size, head_dim, kv_cache_dtype)

    def write(
        key: torch.Tensor, value: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: torch.Tensor
    ) -> None:
        ops.cpu_attn_reshape_and_cache(key, value, kc, vc, slots, isa, kv_cache_dtype=kv_cache_dtype)

    return write
