"""Copy approved KV between slots of SGLang's KV pool, re-rotating keys that move position.

semgov approves spans of a recipient's prompt whose tokens equal a donor's. The hook copies the
donor's K/V from the donor's slots of SGLang's ``MHATokenToKVPool`` into freshly allocated slots
the recipient owns:

- a ``prefix`` span sits at the same position in both prompts: K and V are copied as they are;
- a ``shifted`` span moves by ``delta = recipient_pos - donor_pos`` positions. SGLang stores keys
  *after* RoPE, and RoPE rotates each frequency pair ``i`` of a key by ``p * inv_freq[i]``;
  rotations compose, so rotating a stored key by ``delta * inv_freq[i]`` gives exactly the key
  RoPE would have produced at ``p + delta`` (:mod:`engine_hooks.core.rotation`). Values carry no
  position and are copied unchanged.

Only RoPE whose angle is linear in the position is re-rotated: plain, linear, llama3 and static
YaRN scaling, with the frequencies taken from the model's own rotary embedding
(:mod:`engine_hooks.sglang.rope` answers ``None`` for anything else: dynamic NTK, per-layer or
multimodal RoPE, or a model whose SGLang implementation is not known here; shifted spans of
such a model are then refused and run cold), and only SGLang's plain ``MHATokenToKVPool`` with
unquantized 16/32-bit buffers is written (:func:`supported_pool`). Everything is checked before
the first write; a refused copy raises ``ValueError`` and leaves the pool untouched.

Pool attributes relied on (SGLang 0.5.23, ``sglang.srt.mem_cache.memory_pool``): ``start_layer``,
``layer_num``, ``size``, ``page_size``, ``dtype``, ``store_dtype``, ``kv_cache_layout``,
``is_quantized_kv_cache``, ``requires_physical_write_loc``, ``k_buffer``/``v_buffer`` (one
``[size + page_size, head_num, head_dim]`` tensor per layer, indexed by slot) and the accessors
``get_key_buffer``/``get_value_buffer`` (by model layer id, ``start_layer`` based).
"""

from __future__ import annotations

from typing import Any

import torch

from engine_hooks.core.rope import RopeSpec
from engine_hooks.core.rotation import check_delta, rotate, rotation

__all__ = ["copy_kv", "supported_pool"]

_POOL_MODULE = "sglang.srt.mem_cache.memory_pool"
_POOL_CLASS = "MHATokenToKVPool"
_STORE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def supported_pool(pool: Any) -> str | None:
    """``None`` if :func:`copy_kv` can write this pool, else why not (refuse the config at build time).

    Supported: exactly SGLang's ``MHATokenToKVPool`` (no subclass: unified, page-interleaved,
    hi-sparse, NPU, FP4/MXFP8, no-op pools lay out or address their slots differently), NHD
    layout, unquantized, storing float16/bfloat16/float32 (an fp8 pool stores uint8 views), with
    one ``[size + page_size, heads, head_dim]`` K and V tensor per layer.
    """
    cls = type(pool)
    if not (cls.__module__ == _POOL_MODULE and cls.__qualname__ == _POOL_CLASS):
        bases = {(c.__module__, c.__qualname__) for c in cls.__mro__}
        if (_POOL_MODULE, _POOL_CLASS) in bases:
            return f"{cls.__qualname__} is a subclass of {_POOL_CLASS} whose slot layout is not supported"
        return f"{cls.__module__}.{cls.__qualname__} is not SGLang's {_POOL_CLASS}"
    layout = getattr(pool, "kv_cache_layout", None)
    if layout != "nhd":
        return f"KV cache layout {layout!r} is not supported (only 'nhd': one row per slot)"
    if getattr(pool, "is_quantized_kv_cache", True):
        return "quantized KV cache is not supported"
    if getattr(pool, "requires_physical_write_loc", True):
        return "pools that translate logical to physical slot ids are not supported"
    dtype, store = getattr(pool, "dtype", None), getattr(pool, "store_dtype", None)
    if store not in _STORE_DTYPES or dtype != store:
        return f"KV dtype {dtype} stored as {store} is not supported (float16, bfloat16 or float32 only)"
    layers = _positive_int(getattr(pool, "layer_num", None))
    if layers is None:
        return "pool has no layers"
    if not isinstance(getattr(pool, "start_layer", None), int):
        return "pool has no integer start_layer"
    size, page = _positive_int(getattr(pool, "size", None)), _positive_int(getattr(pool, "page_size", None))
    if size is None or page is None:
        return "pool has no positive size/page_size"
    for name in ("k_buffer", "v_buffer"):
        bufs = getattr(pool, name, None)
        if not isinstance(bufs, list | tuple) or len(bufs) != layers:
            return f"pool.{name} is not one tensor per layer"
        for b in bufs:
            if not isinstance(b, torch.Tensor) or b.dim() != 3 or b.dtype != store or len(b) != size + page:
                return f"pool.{name} holds a buffer that is not [size + page_size, heads, dim] of {store}"
    return None


def _check_slots(name: str, slots: Any) -> torch.Tensor:
    if not isinstance(slots, torch.Tensor) or slots.dtype != torch.int64 or slots.dim() != 1:
        raise ValueError(f"{name} must be a 1-D int64 tensor of slot ids")
    return slots


def copy_kv(
    pool: Any,
    src: torch.Tensor,
    dst: torch.Tensor,
    delta: torch.Tensor | None,
    rope: RopeSpec | None,
    *,
    check: bool = True,
) -> None:
    """Copy K/V of slots ``src`` into slots ``dst`` on every layer of an SGLang ``MHATokenToKVPool``.

    ``v[dst] = v[src]``; ``k[dst] = k[src]`` when ``delta`` is ``None``, else
    ``k[dst] = rerotate_keys(k[src], delta, rope)`` (rows with ``delta == 0`` still copied
    bit-identical). Where the pool has SGLang's fused all-layer move (``move_kv_cache`` with its
    copy kernel configured, or ``SGLANG_NATIVE_MOVE_KV_CACHE``), K and V of every layer move in
    one call and only the shifted keys are then re-rotated in place; otherwise one gather and one
    ``index_copy_`` per buffer and layer. Everything is enqueued on the current stream.

    Always refused, before any write (``ValueError``): an unsupported pool
    (:func:`supported_pool`); ``src``/``dst``/``delta`` not 1-D int64 or of different lengths; a
    ``delta`` without a ``rope``; ``rope.head_dim`` not the pool's key head dim.

    ``check`` (default) also refuses, with device-side checks that are host syncs on an
    accelerator: ``src`` and ``dst`` sharing a slot; ``dst`` repeating a slot; a slot out of range
    or in SGLang's padding page (slots below ``page_size``; slot 0 absorbs padded-token writes); a
    nonzero ``delta`` with ``rope`` None. A caller whose slots are valid by construction (the hook:
    ``src`` from the tree's live path, ``dst`` fresh from the allocator) passes ``check=False``
    on an accelerator, so the copy path makes no host sync.
    """
    reason = supported_pool(pool)
    if reason is not None:
        raise ValueError(f"unsupported KV pool: {reason}")
    src, dst = _check_slots("src", src), _check_slots("dst", dst)
    n = src.shape[0]
    if dst.shape[0] != n:
        raise ValueError(f"src has {n} slots, dst has {dst.shape[0]}")
    if delta is not None:
        delta = check_delta(delta, n)

    buffers = _layer_buffers(pool)
    device = buffers[0][0].device
    if delta is not None:
        _check_rope(delta, rope, buffers[0][0].shape[-1], check)
    if n == 0:
        return

    src, dst = src.to(device), dst.to(device)
    if check:
        _check_slot_ids(src, dst, page=pool.page_size, rows=pool.size + pool.page_size)

    turn: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    if delta is not None and rope is not None:
        delta = delta.to(device, non_blocking=True)
        cos, sin = rotation(delta, rope, device)
        turn = (cos, sin, delta == 0)

    if _has_fused_move(pool):
        pool.move_kv_cache(dst, src)
        if turn is not None:
            assert rope is not None
            for k, _ in buffers:
                k.index_copy_(0, dst, rotate(k.index_select(0, dst), *turn, rope))
        return
    for k, v in buffers:
        v.index_copy_(0, dst, v.index_select(0, src))
        keys = k.index_select(0, src)
        if turn is not None:
            assert rope is not None
            keys = rotate(keys, *turn, rope)
        k.index_copy_(0, dst, keys)


def _layer_buffers(pool: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every layer's (key, value) buffer; ValueError unless each is a 3-D store-dtype tensor with
    a row per slot (the padding page included)."""
    layer_ids = range(pool.start_layer, pool.start_layer + pool.layer_num)
    buffers = [(pool.get_key_buffer(i), pool.get_value_buffer(i)) for i in layer_ids]
    rows = pool.size + pool.page_size
    for k, v in buffers:
        for b in (k, v):
            if b.dim() != 3 or b.shape[0] != rows or b.dtype not in _STORE_DTYPES:
                raise ValueError(f"unsupported KV pool: a layer buffer is {b.dtype} {tuple(b.shape)}")
    return buffers


def _check_rope(delta: torch.Tensor, rope: RopeSpec | None, head_dim: int, check: bool) -> None:
    """A ``delta`` needs a ``rope`` of the pool's key head dim (with ``check``, only a nonzero one)."""
    if rope is None:
        if check and bool((delta != 0).any()):
            raise ValueError("nonzero delta needs a RopeSpec to re-rotate keys (rope is None)")
        if not check:
            raise ValueError("delta needs a RopeSpec to re-rotate keys (rope is None)")
    elif rope.head_dim != head_dim:
        raise ValueError(f"rope.head_dim {rope.head_dim} != the pool's key head dim {head_dim}")


def _check_slot_ids(src: torch.Tensor, dst: torch.Tensor, *, page: int, rows: int) -> None:
    """The device-side checks (host syncs on an accelerator): slot ids in range and out of the
    padding page, ``src`` and ``dst`` disjoint, no slot repeated in ``dst``."""
    lo = int(torch.minimum(src.min(), dst.min()))
    hi = int(torch.maximum(src.max(), dst.max()))
    if lo < page or hi >= rows:
        raise ValueError(
            f"slot ids must lie in [{page}, {rows}): got [{lo}, {hi}] (slots below page_size={page} "
            "are SGLang's padding page)"
        )
    if bool(torch.isin(src, dst).any()):
        raise ValueError("src and dst share slots: a copy must not overwrite its own source")
    if torch.unique(dst).shape[0] != dst.shape[0]:
        raise ValueError("dst repeats a slot")


def _has_fused_move(pool: Any) -> bool:
    """Whether SGLang's own all-layer ``move_kv_cache`` is usable on this pool (its triton copy
    kernel configured, or the native move forced); the NHD layout is checked by supported_pool."""
    if getattr(pool, "use_hnd", False) or not callable(getattr(pool, "move_kv_cache", None)):
        return False
    return getattr(pool, "_kv_copy_config", None) is not None or bool(
        getattr(pool, "use_native_move_kv_cache", False)
    )
