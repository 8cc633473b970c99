"""KV copy between slots of SGLang's real KV pool, with keys re-rotated for shifted positions.

Ground truth is SGLang's own ``RotaryEmbedding.forward_native`` and real ``MHATokenToKVPool``
objects on CPU; nothing is mocked.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import GPTJConfig, LlamaConfig, MixtralConfig, Qwen2Config

from engine_hooks.core.rope import RopeSpec
from engine_hooks.core.rotation import rerotate_keys
from engine_hooks.sglang import kv_copy as kv_copy_mod
from engine_hooks.sglang.kv_copy import copy_kv, supported_pool

# SGLang imports torchvision, which cannot be installed next to CPU torch: use the import-only stub.
_STUBS = Path(__file__).resolve().parent / "stubs"
if importlib.util.find_spec("torchvision") is None and str(_STUBS) not in sys.path:
    sys.path.insert(0, str(_STUBS))

pytestmark = pytest.mark.sglang

SIZE, HEADS, HEAD_DIM, LAYERS = 64, 2, 16, 2
RopeAt = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@pytest.fixture(scope="module")
def pool_module() -> Any:
    return importlib.import_module("sglang.srt.mem_cache.memory_pool")


@pytest.fixture
def sglang_rope(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., RopeAt]]:
    """SGLang's ``get_rope`` on CPU: ``make(head_dim, rotary_dim, neox, base)`` -> ``rope_at(pos, k)``."""
    base_mod = importlib.import_module("sglang.srt.layers.rotary_embedding.base")
    # Off CUDA and not detected as CPU, RotaryEmbedding would import vllm's custom op.
    monkeypatch.setattr(base_mod, "_is_cpu", True)
    get_rope = importlib.import_module("sglang.srt.layers.rotary_embedding").get_rope

    def make(head_dim: int, rotary_dim: int, neox: bool, base: float = 10000.0) -> RopeAt:
        emb = get_rope(head_dim, rotary_dim, 70000, base, is_neox_style=neox, dtype=torch.float32)
        assert type(emb).__name__ == "RotaryEmbedding"

        def rope_at(pos: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
            _, key = emb.forward_native(pos, k.clone(), k.clone())
            assert isinstance(key, torch.Tensor)
            return key

        return rope_at

    yield make


def _positions(n: int, limit: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Donor positions p and deltas d (negative ones included) with 0 <= p, p + d < limit."""
    p = torch.randint(0, limit, (n,), generator=gen)
    q = torch.randint(0, limit, (n,), generator=gen)
    return p, q - p


ROPES = [
    pytest.param(64, 64, True, 10000.0, id="neox"),
    pytest.param(64, 64, False, 10000.0, id="gptj"),
    pytest.param(64, 32, True, 1e6, id="neox-partial"),
    pytest.param(64, 16, False, 10000.0, id="gptj-partial"),
]


@pytest.mark.parametrize(("head_dim", "rotary_dim", "neox", "base"), ROPES)
def test_rerotate_matches_sglang_rope_at_shifted_position(
    sglang_rope: Callable[..., RopeAt], head_dim: int, rotary_dim: int, neox: bool, base: float
) -> None:
    """rerotate(rope_at(p, k), d) equals SGLang's rope_at(p + d, k) to 1e-5 (fp32), negative d too."""
    rope_at = sglang_rope(head_dim, rotary_dim, neox, base)
    gen = torch.Generator().manual_seed(1)
    k = torch.randn(512, 4, head_dim, generator=gen)
    p, d = _positions(512, 32, gen)
    assert bool((d < 0).any()) and bool((d > 0).any())
    out = rerotate_keys(rope_at(p, k), d, RopeSpec(rotary_dim, head_dim, base, neox))
    torch.testing.assert_close(out, rope_at(p + d, k), atol=1e-5, rtol=0)


@pytest.mark.parametrize(("head_dim", "rotary_dim", "neox", "base"), ROPES)
def test_rerotate_matches_sglang_rope_at_long_positions(
    sglang_rope: Callable[..., RopeAt], head_dim: int, rotary_dim: int, neox: bool, base: float
) -> None:
    """Up to 32k positions, rerotation stays within SGLang's own float32 angle rounding of rope_at."""
    rope_at = sglang_rope(head_dim, rotary_dim, neox, base)
    gen = torch.Generator().manual_seed(2)
    k = torch.randn(512, 2, head_dim, generator=gen)
    limit = 32768
    p, d = _positions(512, limit, gen)
    out = rerotate_keys(rope_at(p, k), d, RopeSpec(rotary_dim, head_dim, base, neox))
    # SGLang rounds each angle pos * inv_freq to float32 (relative 2**-24) at p and at p + d.
    atol = float(k.abs().max()) * 2 * limit * 2.0**-23
    torch.testing.assert_close(out, rope_at(p + d, k), atol=atol, rtol=0)


def test_rerotate_zero_delta_and_pass_through_dims_are_bit_identical() -> None:
    """Rows with delta 0, and dims at or beyond rotary_dim, come back bit-identical; dtype is kept."""
    gen = torch.Generator().manual_seed(3)
    keys = torch.randn(6, 2, 32, generator=gen).to(torch.bfloat16)
    delta = torch.tensor([0, 5, 0, -3, 0, 1000])
    out = rerotate_keys(keys, delta, RopeSpec(16, 32, 10000.0, True))
    assert out.dtype == torch.bfloat16
    assert torch.equal(out[delta == 0], keys[delta == 0])
    assert torch.equal(out[..., 16:], keys[..., 16:])
    assert not torch.equal(out[1, :, :16], keys[1, :, :16])


def test_rerotate_composes_back_to_the_original() -> None:
    """Rotating by d and then by -d returns the original keys (fp32, 1e-5)."""
    gen = torch.Generator().manual_seed(4)
    keys = torch.randn(64, 2, 16, generator=gen)
    d = torch.randint(-5000, 5000, (64,), generator=gen)
    rope = RopeSpec(16, 16, 10000.0, False)
    torch.testing.assert_close(rerotate_keys(rerotate_keys(keys, d, rope), -d, rope), keys, atol=1e-5, rtol=0)


def test_rerotate_rejects_bad_inputs() -> None:
    """rerotate_keys refuses a head dim other than the spec's and a delta of the wrong dtype or length."""
    rope = RopeSpec(16, 16, 10000.0, True)
    keys = torch.zeros(3, 2, 16)
    with pytest.raises(ValueError, match="keys must be"):
        rerotate_keys(torch.zeros(3, 2, 8), torch.zeros(3, dtype=torch.int64), rope)
    with pytest.raises(ValueError, match="int64"):
        rerotate_keys(keys, torch.zeros(3, dtype=torch.int32), rope)
    with pytest.raises(ValueError, match="entries"):
        rerotate_keys(keys, torch.zeros(2, dtype=torch.int64), rope)


# -- copy_kv on a real MHATokenToKVPool ------------------------------------------------------------


def _pool(pool_module: Any, page_size: int, dtype: torch.dtype, **kw: Any) -> Any:
    pool = pool_module.MHATokenToKVPool(
        size=SIZE,
        page_size=page_size,
        dtype=dtype,
        head_num=HEADS,
        head_dim=HEAD_DIM,
        layer_num=LAYERS,
        device="cpu",
        enable_memory_saver=False,
        **kw,
    )
    gen = torch.Generator().manual_seed(5)
    for buf in [*pool.k_buffer, *pool.v_buffer]:
        buf.copy_(torch.randn(buf.shape, generator=gen).to(dtype))
    return pool


def _snapshot(pool: Any) -> list[torch.Tensor]:
    return [b.clone() for b in [*pool.k_buffer, *pool.v_buffer]]


def _assert_unchanged(pool: Any, before: list[torch.Tensor], rows: torch.Tensor | None = None) -> None:
    for old, new in zip(before, [*pool.k_buffer, *pool.v_buffer], strict=True):
        if rows is None:
            assert torch.equal(old, new)
        else:
            assert torch.equal(old[rows], new[rows])


def _slots(page_size: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Distinct src and dst slot ids outside the padding page, and the untouched rows."""
    perm = torch.randperm(SIZE, generator=torch.Generator().manual_seed(seed)) + page_size
    src, dst = perm[:n], perm[n : 2 * n]
    untouched = torch.ones(SIZE + page_size, dtype=torch.bool)
    untouched[dst] = False
    return src, dst, untouched


POOLS = [
    pytest.param(page, dtype, id=f"page{page}-{str(dtype).removeprefix('torch.')}")
    for page in (1, 4)
    for dtype in (torch.float32, torch.bfloat16)
]


@pytest.mark.parametrize(("page_size", "dtype"), POOLS)
@pytest.mark.parametrize("zero_delta", [False, True], ids=["delta-none", "delta-zero"])
def test_prefix_copy_is_bit_identical_on_every_layer(
    pool_module: Any, page_size: int, dtype: torch.dtype, zero_delta: bool
) -> None:
    """With delta None or all zero, K and V of dst equal src bit for bit on every layer; other slots keep."""
    pool = _pool(pool_module, page_size, dtype)
    src, dst, untouched = _slots(page_size, 12, seed=6)
    before = _snapshot(pool)
    delta = torch.zeros(12, dtype=torch.int64) if zero_delta else None
    copy_kv(pool, src, dst, delta, None)
    for layer in range(LAYERS):
        assert torch.equal(pool.k_buffer[layer][dst], before[layer][src])
        assert torch.equal(pool.v_buffer[layer][dst], before[LAYERS + layer][src])
    _assert_unchanged(pool, before, untouched)


@pytest.mark.parametrize(("page_size", "dtype"), POOLS)
@pytest.mark.parametrize(("rotary_dim", "neox"), [(16, True), (8, False)], ids=["neox", "gptj-partial"])
def test_shifted_copy_matches_sglang_rope(
    pool_module: Any,
    sglang_rope: Callable[..., RopeAt],
    page_size: int,
    dtype: torch.dtype,
    rotary_dim: int,
    neox: bool,
) -> None:
    """Shifted keys in dst equal SGLang's RoPE at p + d; zero-delta rows and values copy bit-identical."""
    rope_at = sglang_rope(HEAD_DIM, rotary_dim, neox)
    pool = _pool(pool_module, page_size, dtype)
    n = 16
    src, dst, untouched = _slots(page_size, n, seed=7)
    gen = torch.Generator().manual_seed(8)
    p, d = _positions(n, 32, gen)
    d[:3] = 0
    raw = [torch.randn(n, HEADS, HEAD_DIM, generator=gen) for _ in range(LAYERS)]
    for layer in range(LAYERS):  # the donor's keys, stored after RoPE at p as SGLang stores them
        pool.k_buffer[layer][src] = rope_at(p, raw[layer]).to(dtype)
    before = _snapshot(pool)

    copy_kv(pool, src, dst, d, RopeSpec(rotary_dim, HEAD_DIM, 10000.0, neox))

    tol = 1e-5 if dtype == torch.float32 else 3e-2  # bf16: the donor's stored key and the copy round
    for layer in range(LAYERS):
        k, v = pool.k_buffer[layer], pool.v_buffer[layer]
        torch.testing.assert_close(k[dst].float(), rope_at(p + d, raw[layer]), atol=tol, rtol=0)
        assert torch.equal(k[dst[:3]], before[layer][src[:3]])
        assert torch.equal(v[dst], before[LAYERS + layer][src])
    _assert_unchanged(pool, before, untouched)


@pytest.mark.parametrize("fused", [False, True], ids=["per-layer", "fused-move"])
@pytest.mark.parametrize("check", [True, False], ids=["checked", "unchecked"])
def test_every_copy_path_writes_the_same_kv(pool_module: Any, fused: bool, check: bool) -> None:
    """Checked or not (the accelerator path), per-layer or SGLang's fused all-layer move: same K/V."""
    rope = RopeSpec(HEAD_DIM, HEAD_DIM, 10000.0, True)
    src, dst, _ = _slots(4, 16, seed=9)
    d = torch.arange(16, dtype=torch.int64) - 5
    reference = _pool(pool_module, 4, torch.float32)
    copy_kv(reference, src, dst, d, rope)
    pool = _pool(pool_module, 4, torch.float32)
    if fused:
        pool.use_native_move_kv_cache = True  # SGLANG_NATIVE_MOVE_KV_CACHE=1: move_kv_cache works
        assert kv_copy_mod._has_fused_move(pool)
        moved: list[int] = []
        real_move = pool.move_kv_cache
        pool.move_kv_cache = lambda t, s_: (moved.append(len(t)), real_move(t, s_))  # type: ignore[method-assign]
    else:
        assert not kv_copy_mod._has_fused_move(pool)
    copy_kv(pool, src, dst, d, rope, check=check)
    for a, b in zip(_snapshot(reference), _snapshot(pool), strict=True):
        assert torch.equal(a, b)
    if fused:
        assert moved == [16]


def test_unchecked_copy_still_refuses_what_it_can_see_on_the_host(pool_module: Any) -> None:
    """check=False keeps the host-side refusals: a delta without a rope, mismatched lengths, bad dtypes."""
    pool = _pool(pool_module, 4, torch.float32)
    before = _snapshot(pool)
    with pytest.raises(ValueError, match="needs a RopeSpec"):
        copy_kv(pool, _I([5, 6]), _I([20, 21]), _I([0, 0]), None, check=False)
    with pytest.raises(ValueError, match="src has 2 slots"):
        copy_kv(pool, _I([5, 6]), _I([20]), None, None, check=False)
    with pytest.raises(ValueError, match="dst must be"):
        copy_kv(pool, _I([5, 6]), _I([20, 21]).int(), None, None, check=False)
    _assert_unchanged(pool, before)


def test_copy_uses_model_layer_ids_from_start_layer(pool_module: Any) -> None:
    """A pool holding model layers 5..6 (pipeline stage) is copied on both of its layers."""
    pool = _pool(pool_module, 1, torch.float32, start_layer=5)
    assert pool.start_layer == 5
    src, dst, untouched = _slots(1, 4, seed=9)
    before = _snapshot(pool)
    copy_kv(pool, src, dst, torch.tensor([0, 1, -1, 7]), RopeSpec(HEAD_DIM, HEAD_DIM, 10000.0, True))
    for layer in range(LAYERS):
        assert torch.equal(pool.v_buffer[layer][dst], before[LAYERS + layer][src])
        assert torch.equal(pool.k_buffer[layer][dst[0]], before[layer][src[0]])
        assert not torch.equal(pool.k_buffer[layer][dst[1]], before[layer][src[1]])
    _assert_unchanged(pool, before, untouched)


def test_empty_copy_is_a_no_op(pool_module: Any) -> None:
    """Copying zero slots changes nothing."""
    pool = _pool(pool_module, 1, torch.float32)
    before = _snapshot(pool)
    empty = torch.zeros(0, dtype=torch.int64)
    copy_kv(pool, empty, empty, empty, None)
    _assert_unchanged(pool, before)


_ROPE = RopeSpec(HEAD_DIM, HEAD_DIM, 10000.0, True)
_I = torch.tensor  # int64 slot ids
BAD = [
    pytest.param(_I([5, 6]), _I([20]), None, _ROPE, "src has 2 slots", id="lengths-differ"),
    pytest.param(_I([5, 6]), _I([6, 20]), None, _ROPE, "share slots", id="overlap"),
    pytest.param(_I([0, 6]), _I([20, 21]), None, _ROPE, "padding page", id="src-slot-0"),
    pytest.param(_I([5, 6]), _I([20, 0]), None, _ROPE, "padding page", id="dst-slot-0"),
    pytest.param(_I([5, 3]), _I([20, 21]), None, _ROPE, "padding page", id="padding-page-4"),
    pytest.param(_I([5, 6]), _I([20, SIZE + 4]), None, _ROPE, "must lie in", id="past-end"),
    pytest.param(_I([5, -1]), _I([20, 21]), None, _ROPE, "must lie in", id="negative"),
    pytest.param(_I([5, 6]), _I([20, 20]), None, _ROPE, "repeats", id="dst-repeats"),
    pytest.param(_I([5, 6]), _I([20, 21]), _I([0, 3]), None, "needs a RopeSpec", id="rope-none"),
    pytest.param(_I([5, 6]), _I([20, 21]), _I([1]), _ROPE, "entries", id="delta-length"),
    pytest.param(_I([5, 6]), _I([20, 21]), _I([1, 2]).int(), _ROPE, "delta must be", id="delta-int32"),
    pytest.param(_I([5, 6]).int(), _I([20, 21]), None, _ROPE, "src must be", id="src-int32"),
    pytest.param(_I([[5, 6]]), _I([[20, 21]]), None, _ROPE, "src must be", id="src-2d"),
    pytest.param(
        _I([5, 6]), _I([20, 21]), _I([1, 2]), RopeSpec(8, 8, 10000.0, True), "head_dim", id="rope-head-dim"
    ),
]


@pytest.mark.parametrize(("src", "dst", "delta", "rope", "match"), BAD)
def test_validation_errors_raise_before_any_write(
    pool_module: Any, src: torch.Tensor, dst: torch.Tensor, delta: torch.Tensor | None, rope: Any, match: str
) -> None:
    """Each refused copy raises ValueError and leaves every buffer of the pool unchanged."""
    pool = _pool(pool_module, 4, torch.bfloat16)
    before = _snapshot(pool)
    with pytest.raises(ValueError, match=match):
        copy_kv(pool, src, dst, delta, rope)
    _assert_unchanged(pool, before)


def test_copy_refuses_an_fp8_pool_before_any_write(pool_module: Any) -> None:
    """An fp8 pool (stored as uint8) is refused by copy_kv without touching it."""
    pool = pool_module.MHATokenToKVPool(
        size=SIZE,
        page_size=1,
        dtype=torch.float8_e4m3fn,
        head_num=HEADS,
        head_dim=HEAD_DIM,
        layer_num=LAYERS,
        device="cpu",
        enable_memory_saver=False,
    )
    for buf in [*pool.k_buffer, *pool.v_buffer]:
        buf.copy_(torch.randint(0, 256, buf.shape, dtype=torch.uint8))
    before = _snapshot(pool)
    with pytest.raises(ValueError, match="unsupported KV pool.*uint8"):
        copy_kv(pool, _I([5, 6]), _I([20, 21]), None, None)
    _assert_unchanged(pool, before)


# -- supported_pool ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("page_size", "dtype"), POOLS)
def test_supported_pool_accepts_plain_mha_pools(pool_module: Any, page_size: int, dtype: torch.dtype) -> None:
    """A plain NHD MHATokenToKVPool in float32/bfloat16 is supported."""
    assert supported_pool(_pool(pool_module, page_size, dtype)) is None


def test_supported_pool_refuses_other_pools(pool_module: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """fp8, HND-layout, subclass (no-op), MLA and non-pool objects are refused with a reason."""
    kw: dict[str, Any] = {"size": SIZE, "page_size": 4, "layer_num": LAYERS, "device": "cpu"}
    kw["enable_memory_saver"] = False
    mha = {"head_num": HEADS, "head_dim": HEAD_DIM}
    fp8 = pool_module.MHATokenToKVPool(dtype=torch.float8_e5m2, **mha, **kw)
    assert "uint8" in (supported_pool(fp8) or "")
    noop = pool_module.NoOpMHATokenToKVPool(dtype=torch.float32, **mha, **kw)
    assert "subclass" in (supported_pool(noop) or "")
    mla = pool_module.MLATokenToKVPool(dtype=torch.float32, kv_lora_rank=32, qk_rope_head_dim=16, **kw)
    assert "not SGLang's MHATokenToKVPool" in (supported_pool(mla) or "")
    assert "not SGLang's MHATokenToKVPool" in (supported_pool(object()) or "")
    monkeypatch.setenv("SGLANG_USE_HND_KVCACHE", "1")
    hnd = pool_module.MHATokenToKVPool(dtype=torch.float32, **mha, **kw)
    assert hnd.kv_cache_layout == "hnd"
    assert "layout 'hnd'" in (supported_pool(hnd) or "")


# -- RopeSpec ---------------------------------------------------------------------------------------


def test_rope_spec_rejects_impossible_sizes() -> None:
    """RopeSpec refuses an odd, zero or too large rotary_dim and a non-positive base."""
    for rotary_dim, head_dim, base in ((15, 16, 1e4), (0, 16, 1e4), (32, 16, 1e4), (16, 16, 0.0)):
        with pytest.raises(ValueError):
            RopeSpec(rotary_dim, head_dim, base, True)


def _cfg(**kw: Any) -> SimpleNamespace:
    base = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 4, "rope_theta": 10000.0}
    return SimpleNamespace(**{**base, **kw})


FROM_HF = [
    pytest.param(LlamaConfig(), RopeSpec(128, 128, 10000.0, True), id="llama-default"),
    pytest.param(
        LlamaConfig(hidden_size=576, num_attention_heads=9, rope_theta=100000.0),
        RopeSpec(64, 64, 100000.0, True),
        id="llama-theta",
    ),
    pytest.param(
        LlamaConfig(
            max_position_embeddings=131072,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        ),
        None,
        id="llama3-scaling",
    ),
    pytest.param(LlamaConfig(rope_scaling={"rope_type": "linear", "factor": 2.0}), None, id="linear-scaling"),
    pytest.param(
        LlamaConfig(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), None, id="dynamic-scaling"
    ),
    pytest.param(
        Qwen2Config(hidden_size=896, num_attention_heads=14, rope_theta=1000000.0),
        RopeSpec(64, 64, 1000000.0, True),
        id="qwen2",
    ),
    pytest.param(Qwen2Config(dual_chunk_attention_config={"chunk_size": 8}), None, id="qwen2-dual-chunk"),
    pytest.param(Qwen2Config(partial_rotary_factor=0.5), None, id="qwen2-partial-ignored-by-sglang"),
    pytest.param(MixtralConfig(head_dim=64), None, id="mixtral-head-dim-ignored-by-sglang"),
    pytest.param(GPTJConfig(), RopeSpec(64, 256, 10000.0, False), id="gptj"),
    pytest.param(
        LlamaConfig(partial_rotary_factor=0.5), RopeSpec(64, 128, 10000.0, True), id="llama-partial"
    ),
    pytest.param(
        LlamaConfig(
            rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}
        ),
        None,
        id="partial-only-in-rope-parameters",
    ),
    pytest.param(_cfg(), RopeSpec(64, 64, 10000.0, True), id="namespace-v4-llama"),
    pytest.param(_cfg(rope_is_neox_style=False), RopeSpec(64, 64, 10000.0, False), id="llama-interleaved"),
    pytest.param(_cfg(rope_theta=None), None, id="no-rope-theta"),
    pytest.param(_cfg(model_type="gemma3"), None, id="unknown-model"),
    pytest.param(_cfg(rope_scaling={"rope_type": "yarn", "factor": 4.0}), None, id="yarn"),
    pytest.param(_cfg(rope_scaling={"type": "longrope"}), None, id="longrope"),
    pytest.param(
        _cfg(rope_scaling={"rope_type": "default", "mrope_section": [16, 24, 24]}), None, id="mrope-default"
    ),
    pytest.param(
        _cfg(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e4}}),
        None,
        id="per-layer-rope",
    ),
]


@pytest.mark.parametrize(("config", "expected"), FROM_HF)
def test_rope_spec_from_hf_config(config: Any, expected: RopeSpec | None) -> None:
    """from_hf_config reads plain RoPE exactly as SGLang builds it and answers None for anything else."""
    assert RopeSpec.from_hf_config(config) == expected
