"""The connector's cache layouts for vLLM's GPU attention backends (engine_hooks.vllm.device_layout),
tested on CPU (issue 33).

Here, in semgov's environment (pure torch): every KVCacheLayout vLLM 0.32 can resolve, written by a
reference writer with ``reshape_and_cache_flash``'s semantics (FLASH_ATTN, FLASHINFER, TRITON_ATTN),
is learned and round-trips through gather and scatter; a shifted load re-rotates keys; writers that
are not a bijection, head-outer layouts, unsupported backends and quantized caches are refused by
name. In vLLM's environment (one interpreter start): vLLM's own allocation code
(``create_kv_cache_views``) for every layout and a split kernel block, vLLM's own Triton cache
writer run by Triton's interpreter on CPU (the kernel TRITON_ATTN launches on a GPU), vLLM's CPU
kernel through the same learner, and the backends' installed source still making the calls the
reference mirrors.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest
import torch

from engine_hooks.core.rope import RopeSpec
from engine_hooks.core.rotation import rerotate_keys
from engine_hooks.vllm.device_layout import (
    BackendRefused,
    LayoutError,
    backend_layer_writer,
    check_backend,
    flash_reference_writer,
    learn_device_layout,
    learn_for_layers,
)
from tests.vllm.rig import require_vllm_python

ROOT = Path(__file__).resolve().parents[2]
H, D, N, BLOCKS, LAYERS = 2, 16, 16, 6, 3
# vLLM 0.32's KVCacheLayout members (vllm/v1/kv_cache_layout.py): logical [L, B, H, N, C] -> memory order.
PERMS = {
    "LBNHC": (0, 1, 3, 2, 4),
    "LBHNC": (0, 1, 2, 3, 4),
    "BLHNC": (1, 0, 2, 3, 4),
    "BLNHC": (1, 0, 3, 2, 4),
    "BHLNC": (1, 2, 0, 3, 4),
}


def _views(perm: tuple[int, ...], dtype: torch.dtype, n: int = N, blocks: int = BLOCKS) -> list[torch.Tensor]:
    """One allocation viewed as LAYERS per-layer ``[B, H, N, 2D]`` caches, memory ordered by ``perm``."""
    shape = (LAYERS, blocks, H, n, 2 * D)
    strides, cur = [0] * 5, 1
    for dim in reversed(perm):
        strides[dim], cur = cur, cur * shape[dim]
    full = torch.zeros(cur, dtype=dtype).as_strided(shape, strides)
    return [full[i] for i in range(LAYERS)]


def _kv(n: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, H, D, generator=g).to(dtype), torch.randn(n, H, D, generator=g).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("name", sorted(PERMS))
def test_every_layout_round_trips_what_the_flash_writer_wrote(name: str, dtype: torch.dtype) -> None:
    """Each layout and dtype, every layer: gather reads back what the writer wrote, scatter its bytes."""
    views = _views(PERMS[name], dtype)
    write = flash_reference_writer(D)
    layout = learn_device_layout(write, views[1], H, D, "FLASH_ATTN")
    assert layout.block_size == N and layout.backend == "FLASH_ATTN"
    storage = views[0].as_strided((LAYERS * BLOCKS * H * N * 2 * D,), (1,), 0)
    for i, view in enumerate(views):
        slots = torch.randperm(BLOCKS * N, generator=torch.Generator().manual_seed(i))[:40]
        key, value = _kv(41, dtype, i)
        storage.zero_()
        write(key, value, view, torch.cat([slots, torch.tensor([-1])]))
        got = layout.gather(view, slots)
        assert torch.equal(got[:, 0], key[:40]) and torch.equal(got[:, 1], value[:40])
        written = storage.clone()
        storage.zero_()
        layout.scatter(view, slots, got)
        assert torch.equal(storage, written)


def test_a_head_outer_layout_is_refused_naming_the_setting() -> None:
    """LHBNC (a block is not one memory window) is refused, naming VLLM_KV_CACHE_LAYOUT."""
    views = _views((0, 2, 1, 3, 4), torch.bfloat16)
    with pytest.raises(LayoutError, match="VLLM_KV_CACHE_LAYOUT=LBNHC"):
        learn_device_layout(flash_reference_writer(D), views[0], H, D, "FLASH_ATTN")


def _spills(key: torch.Tensor, value: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor) -> None:
    flash_reference_writer(D)(key, value, kv, slots)
    kv[0, 0, 0, 0] = 1.0  # into a block it was not given


def _drops_a_dim(key: torch.Tensor, value: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor) -> None:
    flash_reference_writer(D)(key, value, kv, slots)
    kv[1, :, :, 3] = -1.0  # dimension 3 of every key in its block is lost


def _v_over_k(key: torch.Tensor, value: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor) -> None:
    k_cache = kv.transpose(1, 2)[..., :D]
    s = slots[slots >= 0]
    k_cache[s // N, s % N] = key[: s.numel()]
    k_cache[s // N, s % N] = value[: s.numel()]  # V lands on K's elements


def _nothing(key: torch.Tensor, value: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor) -> None:
    return  # a layer that shares another layer's cache writes nothing


def _block_variant(key: torch.Tensor, value: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor) -> None:
    # right for block 1 (where learning writes), tokens of other blocks land one offset later
    s = torch.where((slots >= 0) & (slots // N != 1), slots - slots % N + (slots + 1) % N, slots)
    flash_reference_writer(D)(key, value, kv, s)


@pytest.mark.parametrize(
    ("writer", "why"),
    [
        (_spills, "outside the block"),
        (_drops_a_dim, "touched"),
        (_v_over_k, "touched"),
        (_nothing, "touched 0"),
        (_block_variant, "every block"),
    ],
)
def test_a_writer_that_is_not_a_block_bijection_is_refused(writer: Any, why: str) -> None:
    """A writer that is not a bijection on its block is refused with LayoutError saying how."""
    view = _views(PERMS["LBNHC"], torch.float32)[0]
    with pytest.raises(LayoutError, match=why):
        learn_device_layout(writer, view, H, D, "FLASH_ATTN")


def test_unsupported_backends_and_quantized_caches_are_refused_by_name() -> None:
    """Unsupported, mixed backends and fp8 caches are refused, naming the setting to change."""
    with pytest.raises(BackendRefused, match=r"FLEX_ATTENTION.*--attention-backend FLASH_ATTN"):
        check_backend("FLEX_ATTENTION", "auto")
    with pytest.raises(BackendRefused, match=r"fp8.*--kv-cache-dtype auto"):
        check_backend("FLASH_ATTN", "fp8")
    for ok in ("FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "CPU_ATTN"):
        check_backend(ok, "auto")
    views = _views(PERMS["LBNHC"], torch.bfloat16)
    caches = {"a": views[0], "b": views[1]}
    with pytest.raises(BackendRefused, match="several attention backends"):
        learn_for_layers(
            caches, {"a": "FLASH_ATTN", "b": "TRITON_ATTN"}, lambda _: flash_reference_writer(D), H, D, "auto"
        )


def _fake_layer(name: str, shares: str | None, calls: list[str]) -> Any:
    """An attention layer whose impl writes like FLASHINFER's: nothing when it shares a cache."""
    ref = flash_reference_writer(D)

    def update(
        layer: Any, key: torch.Tensor, value: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor
    ) -> None:
        calls.append(name)
        if shares is None:
            ref(key, value, kv, slots)

    return NS(impl=NS(kv_sharing_target_layer_name=shares, do_kv_cache_update=update))


def test_the_layers_own_cache_update_is_the_writer_and_a_sharing_layer_is_skipped() -> None:
    """The layer's own do_kv_cache_update is the writer; a layer sharing another's cache is skipped."""
    views = _views(PERMS["BLNHC"], torch.bfloat16)
    calls: list[str] = []
    layers = {"l0": _fake_layer("l0", "l1", calls), "l1": _fake_layer("l1", None, calls)}
    layers["l2"] = _fake_layer("l2", None, calls)
    caches = dict(zip(layers, views, strict=True))
    layout = learn_for_layers(
        caches, dict.fromkeys(layers, "FLASHINFER"), lambda n: backend_layer_writer(layers[n]), H, D, "auto"
    )
    assert calls and set(calls) == {"l1"} and layout.backend == "FLASHINFER"
    key, value = _kv(8, torch.bfloat16, 7)
    slots = torch.arange(20, 28)
    flash_reference_writer(D)(key, value, views[2], slots)
    assert torch.equal(layout.gather(views[2], slots)[:, 0], key)


def test_slots_outside_the_cache_and_a_foreign_view_are_refused_before_any_write() -> None:
    """Out-of-range slots and a view with other strides are refused on the host, nothing written."""
    nhd, hnd = _views(PERMS["LBNHC"], torch.float32), _views(PERMS["LBHNC"], torch.float32)
    layout = learn_device_layout(flash_reference_writer(D), nhd[0], H, D, "FLASH_ATTN")
    kv = torch.ones(1, 2, H, D)
    with pytest.raises(ValueError, match="outside"):
        layout.scatter(nhd[0], torch.tensor([BLOCKS * N]), kv)
    with pytest.raises(LayoutError, match="not the learned one"):
        layout.scatter(hnd[0], torch.tensor([0]), kv)
    assert not bool(nhd[0].any()) and not bool(hnd[0].any())


def test_a_shifted_load_re_rotates_keys_in_a_gpu_layout() -> None:
    """A load shifted by 37 into an NHD cache equals a cold prefill there: keys to 1e-5, values exact."""
    rope = RopeSpec(rotary_dim=D, head_dim=D, base=10000.0, is_neox_style=True)
    views = _views(PERMS["LBNHC"], torch.float32, blocks=12)
    write = flash_reference_writer(D)
    layout = learn_device_layout(write, views[0], H, D, "FLASH_ATTN")
    raw_k, value = _kv(48, torch.float32, 3)
    pos = torch.arange(48)
    write(rerotate_keys(raw_k, pos, rope), value, views[0], pos)  # the donor's prefill: blocks 0-2
    shift, dest = 37, torch.arange(48) + 37 + 4 * N  # recipient positions 37.., in blocks 4..
    kv = layout.gather(views[0], pos)
    kv[:, 0] = rerotate_keys(kv[:, 0], torch.full((48,), shift), rope)
    layout.scatter(views[1], dest, kv)
    cold = _views(PERMS["LBNHC"], torch.float32, blocks=12)[2]
    write(rerotate_keys(raw_k, pos + shift, rope), value, cold, dest)  # a cold prefill at the new positions
    got, want = layout.gather(views[1], dest), layout.gather(cold, dest)
    assert torch.allclose(got[:, 0], want[:, 0], atol=1e-5) and torch.equal(got[:, 1], want[:, 1])
    assert not torch.equal(got[:, 0], kv.new_zeros(got[:, 0].shape))


# ---- in vLLM's environment ----------------------------------------------------------------------

SCRIPT = r"""
import inspect, json, os, types
os.environ["TRITON_INTERPRET"] = "1"  # before Triton is imported: kernels run on CPU tensors
import torch, triton, triton.language as tl
from importlib.util import find_spec
from pathlib import Path
from engine_hooks.vllm.device_layout import (
    cpu_layer_writer, flash_reference_writer, learn_device_layout, LayoutError)
from engine_hooks.vllm.layout import cpu_cache_writer, learn_layout
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec, KVCacheTensor, compute_layout_strides, create_kv_cache_views)
from vllm.v1.kv_cache_layout import KVCacheLayout

out = {}
H, D, L, B, BS = 2, 64, 3, 4, 32

def allocate(layout, dtype, kernel_bs):
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=H, head_size=D, dtype=dtype)
    ls, bstride, *_ = compute_layout_strides(spec, B, L, layout)
    size = L * B * spec.page_size_bytes
    t = KVCacheTensor(size=size, layers=[f"l{i}" for i in range(L)], layer_stride=ls, block_stride=bstride)
    raw = torch.zeros(size, dtype=torch.int8)
    return create_kv_cache_views(raw, spec, B, layout, t, kernel_block_size=kernel_bs)

def round_trip(write, views, layout):
    for view in views:
        slots = torch.randperm(B * BS)[:50]
        key, value = torch.randn(50, H, D).to(view.dtype), torch.randn(50, H, D).to(view.dtype)
        write(key, value, view, slots)
        got = layout.gather(view, slots)
        assert torch.equal(got[:, 0], key) and torch.equal(got[:, 1], value)

# 1. vLLM's own allocation: every KVCacheLayout, whole and split kernel blocks.
for layout in KVCacheLayout:
    for kernel_bs in (None, 16):
        key = f"{layout.name}/{kernel_bs}"
        try:
            views = allocate(layout, torch.bfloat16, kernel_bs)
            lay = learn_device_layout(flash_reference_writer(D), views[0], H, D, "FLASH_ATTN")
            round_trip(flash_reference_writer(D), views, lay)
            out[key] = f"ok N={lay.block_size}"
        except (LayoutError, ValueError) as e:
            out[key] = f"refused {type(e).__name__}: {str(e)[:160]}"

# 2. vLLM's Triton cache writer (TRITON_ATTN's do_kv_cache_update), run by Triton's interpreter.
import vllm.v1.attention.ops.triton_reshape_and_cache_flash as m
fn = m.reshape_and_cache_kernel_flash  # vLLM's @triton.jit was a placeholder without a GPU driver
g = dict(fn.__globals__, tl=tl, triton=triton)
m.reshape_and_cache_kernel_flash = triton.jit(types.FunctionType(fn.__code__, g, fn.__name__))
m.triton = triton
torch.cuda.get_device_capability = lambda *a, **k: (9, 0)  # the wrapper reads it to size tiles
one = torch.ones((), dtype=torch.float32)

def triton_writer(key, value, kv, slots):
    kc, vc = kv.transpose(1, 2).split(D, dim=-1)  # TritonAttentionImpl.do_kv_cache_update's split
    m.triton_reshape_and_cache_flash(key, value, kc, vc, slots, "auto", one, one)

for layout in (KVCacheLayout.LBNHC, KVCacheLayout.LBHNC, KVCacheLayout.BLNHC):
    for dtype in (torch.bfloat16, torch.float16):
        views = allocate(layout, dtype, None)
        lay = learn_device_layout(triton_writer, views[1], H, D, "TRITON_ATTN")
        ref = learn_device_layout(flash_reference_writer(D), views[1], H, D, "TRITON_ATTN")
        same = torch.equal(lay.k_index, ref.k_index) and torch.equal(lay.v_index, ref.v_index)
        round_trip(triton_writer, views[:2], lay)
        out[f"triton/{layout.name}/{dtype}"] = "same" if same else "differs"

# 3. vLLM's CPU kernel through the device learner agrees with the CPU learner.
for dtype in (torch.bfloat16, torch.float32):
    view = torch.zeros(3, H, 128, 2 * D, dtype=dtype)
    lay = learn_device_layout(cpu_layer_writer(dtype, 128, D, "auto"), view, H, D, "CPU_ATTN")
    old = learn_layout(cpu_cache_writer(dtype, 128, D, "auto"), dtype, 128, H, D)
    same = torch.equal(lay.k_index, old.k_index) and torch.equal(lay.v_index, old.v_index)
    out[f"cpu/{dtype}"] = "same" if same else "differs"

# 4. The installed backends still make the calls the reference mirrors (source, not imported:
#    FlashInfer needs its CUDA package).
split = "kv_cache.transpose(1, 2).split("
for name in ("flash_attn", "flashinfer", "triton_attn"):
    src = Path(find_spec("vllm").origin).parent.joinpath("v1/attention/backends", name + ".py").read_text()
    body = src[src.index("def do_kv_cache_update"):][:3000]
    out[f"src/{name}"] = [split in body, "reshape_and_cache_flash(" in body]
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def in_vllm() -> dict[str, Any]:
    """What :data:`SCRIPT` found in vLLM's environment (one interpreter start)."""
    proc = subprocess.run(
        [str(require_vllm_python()), "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=900,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")},
    )  # fmt: skip
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout[-2000:] + proc.stderr[-4000:]
    result: dict[str, Any] = json.loads(lines[0][len("RESULT ") :])
    return result


def test_vllms_own_allocation_round_trips_in_every_layout_and_kernel_block(in_vllm: dict[str, Any]) -> None:
    """vLLM's create_kv_cache_views, all six layouts, whole and kernel-split blocks: learned or refused."""
    learned = {k: v for k, v in in_vllm.items() if k.split("/")[0] in (*PERMS, "LHBNC")}
    for name in PERMS:
        assert learned[f"{name}/None"] == "ok N=32", learned
    for name in ("LBNHC", "LBHNC"):
        assert learned[f"{name}/16"] == "ok N=16", learned
    assert (
        learned["LHBNC/None"].startswith("refused LayoutError")
        and "VLLM_KV_CACHE_LAYOUT" in learned["LHBNC/None"]
    )
    for name in ("BLHNC", "BLNHC", "BHLNC"):  # vLLM itself cannot split a block-outer layout's blocks
        assert learned[f"{name}/16"].startswith("refused ValueError: The resolved KV cache layout"), learned


def test_vllms_triton_cache_kernel_is_learned_and_matches_the_reference(in_vllm: dict[str, Any]) -> None:
    """vLLM's Triton cache kernel, interpreted on CPU, gives the reference writer's layout and round-trips."""
    tri = {k: v for k, v in in_vllm.items() if k.startswith("triton/")}
    assert len(tri) == 6 and set(tri.values()) == {"same"}, tri


def test_vllms_cpu_kernel_through_the_device_learner_matches_the_cpu_learner(in_vllm: dict[str, Any]) -> None:
    """vLLM's CPU writer through the device learner gives layout.py's layout (bf16, fp32)."""
    assert in_vllm["cpu/torch.bfloat16"] == "same" and in_vllm["cpu/torch.float32"] == "same", in_vllm


def test_the_installed_backends_still_write_the_way_the_reference_does(in_vllm: dict[str, Any]) -> None:
    """FLASH_ATTN, FLASHINFER, TRITON_ATTN source still splits the view and calls reshape_and_cache_flash."""
    for name in ("flash_attn", "flashinfer", "triton_attn"):
        assert in_vllm[f"src/{name}"] == [True, True], (name, in_vllm[f"src/{name}"])
