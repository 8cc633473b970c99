"""Scaled RoPE taken from the model's own SGLang rotary embedding (issue 13, part 2).

Ground truth is SGLang's real rotary embedding classes on CPU (``get_rope`` with each scaling,
``forward_native``): a key roped at ``p`` and re-rotated by ``d`` must equal the key SGLang ropes
at ``p + d``, and anything whose angle is not linear in the position is refused.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import LlamaConfig

from engine_hooks.core.rope import RopeSpec
from engine_hooks.core.rotation import rerotate_keys
from engine_hooks.sglang.rope import rope_for_model, rope_from_rotary_embedding

_STUBS = Path(__file__).resolve().parent / "stubs"
if importlib.util.find_spec("torchvision") is None and str(_STUBS) not in sys.path:
    sys.path.insert(0, str(_STUBS))

pytestmark = pytest.mark.sglang

HEAD_DIM, MAX_POS = 64, 4096

SCALED = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 512,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    "yarn-attention-factor": {
        "rope_type": "yarn",
        "factor": 2.0,
        "original_max_position_embeddings": 2048,
        "attn_factor": 1.3,  # SGLang's name (its get_rope ignores HF's attention_factor)
    },
}


def _config(scaling: dict[str, Any] | None) -> LlamaConfig:
    cfg = LlamaConfig(
        hidden_size=HEAD_DIM * 4, num_attention_heads=4, max_position_embeddings=MAX_POS, rope_theta=10000.0
    )
    # NOTE: transformers 5 keeps the scaling in rope_parameters (rope_scaling reads it back).
    cfg.rope_parameters = {"rope_theta": 10000.0, "rope_type": "default", **(scaling or {})}
    return cfg


@pytest.fixture
def make_rope(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[dict[str, Any] | None], Any]]:
    """SGLang's ``get_rope`` on CPU for one scaling dict (as SGLang's llama model calls it)."""
    base_mod = importlib.import_module("sglang.srt.layers.rotary_embedding.base")
    monkeypatch.setattr(base_mod, "_is_cpu", True)  # else it would import vllm's custom op
    get_rope = importlib.import_module("sglang.srt.layers.rotary_embedding").get_rope

    def make(scaling: dict[str, Any] | None) -> Any:
        return get_rope(HEAD_DIM, HEAD_DIM, MAX_POS, 10000, rope_scaling=scaling, dtype=torch.float32)

    yield make


def _rope_at(emb: Any, pos: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    _, key = emb.forward_native(pos, k.clone(), k.clone())
    assert isinstance(key, torch.Tensor)
    return key


@pytest.mark.parametrize("name", list(SCALED))
def test_rerotation_with_the_models_frequencies_matches_sglangs_rope(
    make_rope: Callable[[dict[str, Any] | None], Any], name: str
) -> None:
    """For plain, linear, llama3 and YaRN RoPE, rerotate(rope(p, k), d) equals SGLang's rope(p + d, k)."""
    scaling = SCALED[name]
    emb = make_rope(scaling)
    spec = rope_from_rotary_embedding(_config(scaling), emb)
    assert spec is not None and spec.scaling == (scaling or {}).get("rope_type", "default")
    assert spec.inv_freq is not None and len(spec.inv_freq) == HEAD_DIM // 2
    gen = torch.Generator().manual_seed(3)
    k = torch.randn(256, 2, HEAD_DIM, generator=gen)
    p = torch.randint(0, MAX_POS, (256,), generator=gen)
    d = torch.randint(0, MAX_POS, (256,), generator=gen) - p
    out = rerotate_keys(_rope_at(emb, p, k), d, spec)
    atol = float(k.abs().max()) * 2 * MAX_POS * 2.0**-23 * 2
    torch.testing.assert_close(out, _rope_at(emb, p + d, k), atol=atol, rtol=0)


def test_yarn_attention_factor_is_kept_once_not_applied_again(
    make_rope: Callable[[dict[str, Any] | None], Any],
) -> None:
    """YaRN scales cos/sin by its attention factor: a re-rotated key keeps the norm SGLang gave it."""
    scaling = SCALED["yarn-attention-factor"]
    emb = make_rope(scaling)
    assert float(emb.mscale) > 1.0
    spec = rope_from_rotary_embedding(_config(scaling), emb)
    assert spec is not None
    k = torch.randn(64, 2, HEAD_DIM, generator=torch.Generator().manual_seed(4))
    pos = torch.arange(64) * 7
    roped = _rope_at(emb, pos, k)
    moved = rerotate_keys(roped, torch.full((64,), 100), spec)
    torch.testing.assert_close(moved.norm(dim=-1), roped.norm(dim=-1), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(moved, _rope_at(emb, pos + 100, k), atol=2e-4, rtol=0)


def test_the_plain_formula_would_be_wrong_for_scaled_rope(
    make_rope: Callable[[dict[str, Any] | None], Any],
) -> None:
    """Re-rotating a llama3-scaled key with plain RoPE's frequencies misses SGLang's rope(p + d)."""
    emb = make_rope(SCALED["llama3"])
    k = torch.randn(64, 2, HEAD_DIM, generator=torch.Generator().manual_seed(5))
    pos = torch.arange(64) * 11
    wrong = rerotate_keys(
        _rope_at(emb, pos, k), torch.full((64,), 1000), RopeSpec(HEAD_DIM, HEAD_DIM, 1e4, True)
    )
    assert float((wrong - _rope_at(emb, pos + 1000, k)).abs().max()) > 0.1


def test_dynamic_ntk_and_mismatched_embeddings_are_refused(
    make_rope: Callable[[dict[str, Any] | None], Any],
) -> None:
    """Dynamic NTK, an embedding of another type than the config says, or a cache that disagrees: None."""
    dynamic = {"rope_type": "dynamic", "factor": 2.0}
    assert rope_from_rotary_embedding(_config(dynamic), make_rope(dynamic)) is None
    assert rope_from_rotary_embedding(_config(SCALED["llama3"]), make_rope(SCALED["linear"])) is None
    other = make_rope({"rope_type": "linear", "factor": 3.0})
    assert rope_from_rotary_embedding(_config(SCALED["linear"]), other) is not None  # the module decides
    emb = make_rope(SCALED["yarn"])
    emb.cos_sin_cache = emb.cos_sin_cache.clone()
    emb.cos_sin_cache[MAX_POS - 1] += 0.01
    assert rope_from_rotary_embedding(_config(SCALED["yarn"]), emb) is None
    assert rope_from_rotary_embedding(_config(SCALED["yarn"]), object()) is None


def test_for_model_takes_the_models_one_embedding_or_refuses_two(
    make_rope: Callable[[dict[str, Any] | None], Any],
) -> None:
    """rope_for_model: one rotary embedding decides; two that disagree refuse; none: the config decides."""
    lin, y = make_rope(SCALED["linear"]), make_rope(SCALED["yarn"])
    one = torch.nn.ModuleDict({"a": lin, "b": lin})
    spec = rope_for_model(_config(SCALED["linear"]), one)
    assert spec is not None and spec.scaling == "linear"
    assert rope_for_model(_config(SCALED["linear"]), torch.nn.ModuleDict({"a": lin, "b": y})) is None
    plain = rope_for_model(_config(None), torch.nn.Linear(2, 2))
    assert plain == RopeSpec(HEAD_DIM, HEAD_DIM, 10000.0, True)
    assert rope_for_model(_config(SCALED["llama3"]), torch.nn.Linear(2, 2)) is None
