"""Where a vLLM attention backend keeps one token's K and V, on any device and in any of vLLM's
cache layouts, learned through the backend's own cache writer (issue 33).

vLLM 0.32 gives every attention layer a cache *view* of logical shape ``[blocks, kv_heads,
block_size, 2 * head_dim]`` over one allocation shared by all layers (``allocate_kv_cache``,
``create_kv_cache_views``). K is the first ``head_dim`` of the last axis and V the second for
FLASH_ATTN, FLASHINFER and TRITON_ATTN (their ``do_kv_cache_update``: ``kv_cache.transpose(1,
2).split(head_dim, dim=-1)``); the CPU backend splits the same view its own way. Where the
elements lie in memory is the view's *strides*, set by the resolved ``KVCacheLayout`` (``LBNHC``,
vLLM's default: NHD inside a block; ``LBHNC``: HND; the block-outer ``BL*`` layouts put every
layer's page of a block together, so one layer's blocks are not adjacent), and the block size is
the view's (vLLM may split a ``--block-size`` block into smaller kernel blocks; slot numbers are
the same either way).

So nothing here assumes a layout. :func:`learn_device_layout` takes one registered layer view and
a :data:`LayerWriter`: on a GPU the backend's own ``impl.do_kv_cache_update`` with its layer
bound (:func:`backend_layer_writer`, the kernel vLLM runs), in tests a reference with the same
semantics (:func:`flash_reference_writer`). It writes index-coded K/V through the writer into a
three-block scratch with the view's strides, dtype and device, reads back where each ``(offset,
kv head, dim)`` of K and of V landed relative to the block's first element, and checks that this
is a bijection onto ``2 * block_size * kv_heads * head_dim`` elements inside the block's stride
window with nothing else in the scratch touched (other blocks, other layers' pages between
them). Then random values written through the writer at slots in all three blocks must gather
back exactly and scatter to a byte-identical cache. Anything else raises :class:`LayoutError`
(reuse stays off); a backend the connector does not support, or a quantized cache, raises
:class:`BackendRefused`, naming the backend and the setting that selects a supported one.

:class:`DeviceLayout` then gathers a token's K/V in the canonical ``[n, 2, kv_heads, head_dim]``
form and scatters it back, on the cache's device, with slots checked on the host first (an
out-of-range index on a GPU is a device-side assert, fatal to the engine, never an exception).

NOTE: imports only torch; vLLM is imported inside the one function that needs it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine_hooks.vllm.layout import LayoutError, cpu_cache_writer

__all__ = [
    "BackendRefused",
    "DeviceLayout",
    "LayerWriter",
    "LayoutError",
    "SUPPORTED_BACKENDS",
    "backend_layer_writer",
    "check_backend",
    "cpu_layer_writer",
    "flash_reference_writer",
    "learn_device_layout",
    "learn_for_layers",
]

# key, value [n, kv_heads, head_dim]; kv_cache (one layer's [B, H, N, 2 * head_dim] view); slot_mapping [n]
LayerWriter = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]

# The backends whose cache writer is learned and tested (vLLM 0.32 names, AttentionBackend.get_name()).
SUPPORTED_BACKENDS = ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "CPU_ATTN")
# What selects one: vLLM 0.32's --attention-backend (AttentionConfig.backend; VLLM_ATTENTION_BACKEND is gone).
SELECT_HINT = "start vLLM with --attention-backend FLASH_ATTN (or FLASHINFER, TRITON_ATTN)"
CPU_HINT = "start vLLM with --attention-backend CPU_ATTN"  # NOTE: vLLM's CPU build
_UNQUANTIZED = ("auto", "float16", "bfloat16", "float32")

_DIGIT = 128  # codes are base-128 digits: integers below 128 are exact in bf16, fp16 and fp32
_UNSET = -1.0
_OTHER = -2.0


class BackendRefused(LayoutError):
    """The attention backend or cache dtype is one the connector does not support (reuse stays off)."""


def check_backend(backend: str, kv_cache_dtype: str, device_type: str = "cuda") -> None:
    """Raise :class:`BackendRefused` unless ``backend`` is supported with an unquantized cache; the
    message names the backend and the setting that selects a supported one on ``device_type``."""
    if backend not in SUPPORTED_BACKENDS:
        hint = CPU_HINT if device_type == "cpu" else SELECT_HINT
        raise BackendRefused(
            f"attention backend {backend} is not supported by semgov's vLLM connector "
            f"(supported: {', '.join(SUPPORTED_BACKENDS)}); {hint}"
        )
    if kv_cache_dtype not in _UNQUANTIZED:
        raise BackendRefused(
            f"--kv-cache-dtype {kv_cache_dtype} on {backend}: quantized KV caches are not supported "
            "(keys cannot be re-rotated exactly); start vLLM with --kv-cache-dtype auto"
        )


@dataclass(frozen=True, slots=True)
class DeviceLayout:
    """Element offsets, from a block's first element, of each ``(offset, kv head, dim)`` of K and V.

    Valid for every layer view with the strides it was learned on (all layers of a uniform model:
    their views differ only in where they start)."""

    backend: str
    block_size: int
    kv_heads: int
    head_dim: int
    strides: tuple[int, ...]
    k_index: torch.Tensor  # [block_size, kv_heads, head_dim] int64, on the cache's device
    v_index: torch.Tensor

    def _check(self, layer: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        if tuple(layer.stride()) != self.strides or layer.shape[1:] != (
            self.kv_heads,
            self.block_size,
            2 * self.head_dim,
        ):
            raise LayoutError(
                f"layer view {tuple(layer.shape)} {tuple(layer.stride())} is not the learned one"
            )
        s = slots.detach().to("cpu", torch.int64)
        if s.numel() and (int(s.min()) < 0 or int(s.max()) >= layer.shape[0] * self.block_size):
            raise ValueError(f"slots outside the cache's {layer.shape[0]} blocks")
        if layer.device.type == "cuda":  # NOTE: from pinned memory the copy does not block the host
            return s.pin_memory().to(layer.device, non_blocking=True)
        return s

    def _offsets(self, layer: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = self._check(layer, slots)
        base = ((s // self.block_size) * layer.stride(0)).view(-1, 1, 1)
        off = s % self.block_size
        return base + self.k_index[off], base + self.v_index[off]

    def gather(self, layer: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """K/V of the tokens in ``slots`` (block * block_size + offset): ``[n, 2, kv_heads, head_dim]``."""
        k, v = self._offsets(layer, slots)
        flat = _flat(layer)
        return torch.stack([flat[k], flat[v]], dim=1)

    def scatter(self, layer: torch.Tensor, slots: torch.Tensor, kv: torch.Tensor) -> None:
        """Write canonical ``kv`` (``[n, 2, kv_heads, head_dim]``) into ``slots`` of ``layer`` in place."""
        k, v = self._offsets(layer, slots)
        flat = _flat(layer)
        flat[k] = kv[:, 0].to(device=layer.device, dtype=layer.dtype)
        flat[v] = kv[:, 1].to(device=layer.device, dtype=layer.dtype)


def _flat(t: torch.Tensor) -> torch.Tensor:
    """A 1-D view of ``t``'s storage from its first element to its last (strides all positive)."""
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return t.as_strided((span,), (1,))


# ---- writers ------------------------------------------------------------------------------------


def flash_reference_writer(head_dim: int) -> LayerWriter:
    """The cache update of FLASH_ATTN, FLASHINFER and TRITON_ATTN for an unquantized cache, in
    PyTorch: the backend's split of the layer view (``transpose(1, 2).split(head_dim, -1)``, giving
    ``[B, N, H, D]`` K and V views) and ``reshape_and_cache_flash``'s semantics: token ``i`` of
    ``slot_mapping`` goes to ``[slot // N, slot % N, h, :]`` through the views' strides, negative
    slots (padding) are skipped, and ``key``/``value`` may hold more rows than ``slot_mapping``."""

    def write(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor) -> None:
        k_cache, v_cache = torch.split(kv_cache.transpose(1, 2), head_dim, dim=-1)  # the backends' split
        n = k_cache.shape[1]
        keep = slots >= 0
        s = slots[keep].to(torch.int64)
        rows = torch.arange(slots.shape[0], device=slots.device)[keep]
        k_cache[s // n, s % n] = key[rows].to(k_cache.dtype)
        v_cache[s // n, s % n] = value[rows].to(v_cache.dtype)

    return write


def backend_layer_writer(layer: Any) -> LayerWriter:
    """The attention layer's own cache writer: ``layer.impl.do_kv_cache_update(layer, ...)``, the
    call vLLM's ``unified_kv_cache_update`` makes each forward (the backend's kernel, its scales)."""
    impl = layer.impl
    if getattr(impl, "kv_sharing_target_layer_name", None) is not None:
        raise LayoutError("the layer shares another layer's KV cache (it writes none of its own)")
    if not hasattr(impl, "do_kv_cache_update"):
        raise LayoutError(f"{type(impl).__name__} has no do_kv_cache_update (its forward writes the cache)")

    def write(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor) -> None:
        impl.do_kv_cache_update(layer, key, value, kv_cache, slots)

    return write


def cpu_layer_writer(dtype: torch.dtype, block_size: int, head_dim: int, kv_cache_dtype: str) -> LayerWriter:
    """vLLM's CPU backend's cache update: its split of the view (``[B, H, 2N, D]``, K the first N
    rows) and ``cpu_attn_reshape_and_cache`` with the ISA it picks (needs vLLM's CPU build)."""
    inner = cpu_cache_writer(dtype, block_size, head_dim, kv_cache_dtype)

    def write(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor) -> None:
        b, h, n, _ = kv_cache.shape
        kc, vc = kv_cache.view(b, h, 2 * n, -1).chunk(2, dim=2)
        inner(key, value, kc, vc, slots)

    return write


# ---- learning -----------------------------------------------------------------------------------


def _codes(n: int, kv_heads: int, head_dim: int, axis: int, digit: int) -> torch.Tensor:
    """``[n, kv_heads, head_dim]`` holding base-128 digit ``digit`` of each element's index on ``axis``."""
    shape = (n, kv_heads, head_dim)
    idx = torch.arange(shape[axis]).view([-1 if i == axis else 1 for i in range(3)]).expand(shape)
    codes: torch.Tensor = (idx // (_DIGIT**digit)) % _DIGIT
    return codes.to(torch.float32)


@dataclass(frozen=True, slots=True)
class _Scratch:
    """Three blocks with a layer view's strides: the writer fills block 1, the rest must stay unset."""

    cache: torch.Tensor
    flat: torch.Tensor  # the whole storage, 1-D
    window: int  # block 1 is [window, 2 * window) of ``flat``

    @classmethod
    def like(cls, view: torch.Tensor) -> _Scratch:
        shape = (3, *view.shape[1:])
        cache = torch.empty_strided(shape, view.stride(), dtype=view.dtype, device=view.device)
        total = cache.untyped_storage().nbytes() // cache.element_size()
        return cls(cache, cache.as_strided((total,), (1,), 0), view.stride(0))


def _check_view(view: torch.Tensor, kv_heads: int, head_dim: int) -> None:
    if view.dim() != 4 or view.shape[1] != kv_heads or view.shape[3] != 2 * head_dim:
        raise LayoutError(
            f"KV cache view {tuple(view.shape)}, expected [blocks, {kv_heads}, N, {2 * head_dim}]"
        )
    if not view.dtype.is_floating_point or view.element_size() < 2:
        raise LayoutError(f"cache dtype {view.dtype} is not a 16/32-bit float (quantized caches are refused)")
    if any(s <= 0 for n, s in zip(view.shape, view.stride(), strict=True) if n > 1):
        raise LayoutError(f"KV cache view strides {tuple(view.stride())} are not all positive")
    page = 1 + sum((n - 1) * s for n, s in zip(view.shape[1:], view.stride()[1:], strict=True))
    if page > view.stride(0):
        raise LayoutError(
            f"a block of the KV cache view {tuple(view.stride())} is not one window (a head-outer layout): "
            "set VLLM_KV_CACHE_LAYOUT=LBNHC (vLLM's default) or LBHNC"
        )


def _learn_side(write: LayerWriter, sc: _Scratch, kv_heads: int, head_dim: int, side: int) -> torch.Tensor:
    """Offsets from block 1's start of K (``side`` 0) or V (1), ``[block_size, kv_heads, head_dim]``."""
    bs, w = sc.cache.shape[2], sc.window
    dev, dtype = sc.cache.device, sc.cache.dtype
    n = bs * kv_heads * head_dim
    index = torch.zeros(w, 3, dtype=torch.int64)
    mine: torch.Tensor | None = None
    other = torch.full((bs, kv_heads, head_dim), _OTHER, dtype=dtype, device=dev)
    slots = torch.arange(bs, 2 * bs, device=dev)
    for axis, size in enumerate((bs, kv_heads, head_dim)):
        for digit in range(max(1, -(-(size.bit_length()) // 7))):
            sc.flat.fill_(_UNSET)
            coded = _codes(bs, kv_heads, head_dim, axis, digit).to(device=dev, dtype=dtype)
            key, value = (coded, other) if side == 0 else (other, coded)
            write(key.contiguous(), value.contiguous(), sc.cache, slots)
            full = sc.flat.to("cpu", torch.float32)
            if not bool((full[:w] == _UNSET).all() and (full[2 * w :] == _UNSET).all()):
                raise LayoutError("the writer wrote outside the block it was given")
            got = full[w : 2 * w]
            if int((got != _UNSET).sum()) != 2 * n:
                raise LayoutError(
                    f"the writer touched {int((got != _UNSET).sum())} elements of the block for {2 * n}"
                )
            now = got >= 0
            if mine is None:
                mine = now
            elif not torch.equal(mine, now):
                raise LayoutError("the writer put elements in different places on two writes")
            index[:, axis] += torch.where(now, got, 0).to(torch.int64) * (_DIGIT**digit)
    assert mine is not None
    where = mine.nonzero().view(-1)
    if where.numel() != n:
        raise LayoutError(f"{where.numel()} elements written for {n} values")
    t, h, d = index[where, 0], index[where, 1], index[where, 2]
    if bool((t >= bs).any() or (h >= kv_heads).any() or (d >= head_dim).any()):
        raise LayoutError("the writer changed the values it was given (codes out of range)")
    out = torch.full((bs, kv_heads, head_dim), -1, dtype=torch.int64)
    out[t, h, d] = where
    if bool((out < 0).any()):
        raise LayoutError("some (offset, head, dim) of the block was never written")
    return out


def _verify(write: LayerWriter, layout: DeviceLayout, sc: _Scratch) -> None:
    """Random exact values written through ``write`` at slots in all three blocks (and one padding
    slot) gather back exactly, and scattering them reproduces the writer's cache byte for byte."""
    bs, dev, dtype = layout.block_size, sc.cache.device, sc.cache.dtype
    g = torch.Generator().manual_seed(33)
    slots = torch.randperm(3 * bs, generator=g)[: 2 * bs]
    shape = (slots.numel() + 1, layout.kv_heads, layout.head_dim)
    key = torch.randint(-100, 100, shape, generator=g).to(device=dev, dtype=dtype)
    value = torch.randint(-100, 100, shape, generator=g).to(device=dev, dtype=dtype)
    sc.flat.fill_(0)
    write(key, value, sc.cache, torch.cat([slots, torch.tensor([-1])]).to(dev))
    got = layout.gather(sc.cache, slots)
    if not (torch.equal(got[:, 0], key[:-1]) and torch.equal(got[:, 1], value[:-1])):
        raise LayoutError("the learned layout does not read back what the writer wrote in every block")
    written = sc.flat.clone()
    sc.flat.fill_(0)
    layout.scatter(sc.cache, slots, got)
    if not torch.equal(sc.flat, written):
        raise LayoutError("scattering through the learned layout does not reproduce the writer's cache")


def learn_device_layout(
    write: LayerWriter, view: torch.Tensor, kv_heads: int, head_dim: int, backend: str = ""
) -> DeviceLayout:
    """The block layout of ``view`` (one layer's registered cache) as ``write`` fills it, learned on
    a scratch with the view's strides, dtype and device, checked to be a bijection and verified by
    a round trip. Raises :class:`LayoutError` otherwise."""
    _check_view(view, kv_heads, head_dim)
    sc = _Scratch.like(view)
    k = _learn_side(write, sc, kv_heads, head_dim, 0)
    v = _learn_side(write, sc, kv_heads, head_dim, 1)
    # NOTE: K and V cannot share an element: each write touches exactly 2 * n distinct ones.
    layout = DeviceLayout(
        backend, view.shape[2], kv_heads, head_dim, tuple(view.stride()), k.to(view.device), v.to(view.device)
    )
    _verify(write, layout, sc)
    return layout


def learn_for_layers(
    caches: dict[str, torch.Tensor],
    backends: dict[str, str],
    writer_for: Callable[[str], LayerWriter],
    kv_heads: int,
    head_dim: int,
    kv_cache_dtype: str,
) -> DeviceLayout:
    """One layout for every registered layer: one backend (supported, unquantized cache), one view
    geometry (shape after the block axis, strides, dtype, device), learned through the writer of
    the first layer that writes its own cache. Raises :class:`LayoutError` / :class:`BackendRefused`."""
    if not caches:
        raise LayoutError("no KV cache layers")
    names = set(backends.get(n, "?") for n in caches)
    if len(names) != 1:
        raise BackendRefused(f"layers use several attention backends {sorted(names)}; {SELECT_HINT}")
    backend = names.pop()
    check_backend(backend, kv_cache_dtype, next(iter(caches.values())).device.type)
    geometry = {(tuple(t.shape[1:]), tuple(t.stride()), t.dtype, t.device) for t in caches.values()}
    if len(geometry) != 1:
        raise LayoutError(f"{len(geometry)} different KV cache view geometries across layers")
    errors: list[str] = []
    for name in caches:
        try:
            write = writer_for(name)
        except LayoutError as e:
            errors.append(str(e))
            continue
        return learn_device_layout(write, caches[name], kv_heads, head_dim, backend)
    raise LayoutError(f"no layer writes its own KV cache ({'; '.join(errors[:1])})")
