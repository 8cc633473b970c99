"""Which RoPE a served model applies to its keys, so that stored keys can be moved exactly.

SGLang stores keys after RoPE. A key moved ``delta`` positions is re-rotated by
``delta * inv_freq[i]`` per frequency pair, which is exact when the model's rotation angle is
linear in the position: plain RoPE, and the static scalings ``linear`` (positions divided by a
factor: the effective frequencies are divided by it), ``llama3`` (per-frequency factors) and
``yarn`` (blended frequencies; its attention factor multiplies the cached cos/sin, so it is
already in the stored keys and a rotation, being linear, keeps it: it is never applied twice).
Dynamic NTK, longrope, multimodal and per-layer RoPE are refused (``None``: shifted spans of such
a model run cold, audited as a failed realization).

Two sources, both for the models whose SGLang implementation was read (``_MODELS``):
:meth:`RopeSpec.from_hf_config` (plain RoPE from the config alone) and
:func:`engine_hooks.sglang.rope.rope_from_rotary_embedding` (the model's own SGLang rotary
embedding, scaled or not: its effective frequencies, checked against its own cos/sin cache before
they are trusted), which reads the config through :func:`config_rope`. The rotation itself is
:func:`engine_hooks.core.rotation.rerotate_keys`. No engine import here: the vLLM connector reads
the same specs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["RopeSpec", "config_rope"]

# Keys a plain ("default") RoPE parameter dict may carry. Anything else (mrope_section,
# use_fope, factor, ...) changes what SGLang builds, so the config is refused.
_PLAIN_ROPE_KEYS = frozenset(
    {"rope_type", "type", "rope_theta", "partial_rotary_factor", "original_max_position_embeddings"}
)
# What each static scaling SGLang builds may carry besides (the rotary embedding then says how).
_SCALED_ROPE_KEYS = {
    "linear": frozenset({"factor"}),
    "llama3": frozenset({"factor", "low_freq_factor", "high_freq_factor"}),
    "yarn": frozenset(
        {
            "factor",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
            "attn_factor",
            "attention_factor",
            "extrapolation_factor",
            "truncate",
        }
    ),
}


@dataclass(frozen=True, slots=True)
class _ModelRope:
    """How SGLang 0.5.23's implementation of one HF ``model_type`` builds its RoPE."""

    neox: bool  # rotate-half (True) or GPT-J interleaved pairs (False)
    neox_attr: bool  # the style may be overridden by ``config.rope_is_neox_style`` (models/llama.py)
    head_dim_attr: bool  # head_dim from ``config.head_dim``; False: hidden_size // num_attention_heads
    partial: bool  # applies ``config.partial_rotary_factor``; False: rotary_dim = head_dim only
    rotary_dim_attr: bool  # rotary_dim is ``config.rotary_dim`` (GPT-J)
    default_theta: float | None  # base when the config names none; None: refuse such a config


_LLAMA = _ModelRope(True, True, True, True, False, None)
_QWEN = _ModelRope(True, False, True, False, False, None)
_FIXED_HEAD_DIM = _ModelRope(True, False, False, False, False, None)
# SGLang's models/gpt_j.py: get_rope(head_dim, config.rotary_dim, base=getattr(config, "rope_theta",
# 10000), is_neox_style=False); 10000 is also HF's fixed GPT-J base (create_sinusoidal_positions).
_GPTJ = _ModelRope(False, False, False, False, True, 10000.0)

_MODELS: dict[str, _ModelRope] = {
    "llama": _LLAMA,
    "mistral": _LLAMA,  # MistralForCausalLM is LlamaForCausalLM
    "qwen2": _QWEN,
    "qwen3": _QWEN,
    "qwen3_moe": _QWEN,
    "qwen2_moe": _FIXED_HEAD_DIM,
    "mixtral": _FIXED_HEAD_DIM,
    "gptj": _GPTJ,
}


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


@dataclass(frozen=True, slots=True)
class RopeSpec:
    """The RoPE a model applies to its keys before SGLang stores them.

    ``rotary_dim`` leading dims of each ``head_dim``-wide key head are rotated (the rest pass
    through); ``base`` is RoPE's theta; ``is_neox_style`` selects rotate-half pairs ``(i, i +
    rotary_dim / 2)`` (Llama, Qwen, Mistral) over GPT-J's interleaved pairs ``(2i, 2i + 1)``.
    ``inv_freq``, when set, are the model's effective inverse frequencies (float32 values; scaled
    RoPE), and ``scaling`` names the RoPE type; plain RoPE computes them from ``base``.
    """

    rotary_dim: int
    head_dim: int
    base: float
    is_neox_style: bool
    inv_freq: tuple[float, ...] | None = None
    scaling: str = "default"

    def __post_init__(self) -> None:
        if _positive_int(self.head_dim) is None:
            raise ValueError(f"head_dim must be a positive int, got {self.head_dim!r}")
        rd = _positive_int(self.rotary_dim)
        if rd is None or rd % 2 or rd > self.head_dim:
            raise ValueError(
                f"rotary_dim must be a positive even int <= head_dim ({self.head_dim}), "
                f"got {self.rotary_dim!r}"
            )
        if isinstance(self.base, bool) or not isinstance(self.base, int | float):
            raise ValueError(f"base must be a number, got {self.base!r}")
        if not (math.isfinite(self.base) and self.base > 0.0):
            raise ValueError(f"base must be finite and > 0, got {self.base!r}")
        if self.inv_freq is not None:
            f = self.inv_freq
            if len(f) != self.rotary_dim // 2 or not all(
                isinstance(x, float) and math.isfinite(x) and x > 0.0 for x in f
            ):
                raise ValueError(f"inv_freq must be {self.rotary_dim // 2} finite positive floats")

    @classmethod
    def from_hf_config(cls, hf_config: Any) -> RopeSpec | None:
        """The plain RoPE SGLang builds for this (text) model config, or ``None`` when keys of that
        model cannot be re-rotated from the config alone or this module does not know how SGLang
        builds its RoPE.

        ``None`` for: a ``model_type`` outside the models whose SGLang implementation was read
        (llama, mistral, qwen2, qwen3, qwen3_moe, qwen2_moe, mixtral, gptj); RoPE parameters whose
        type is not plain (scaled RoPE needs the model's rotary embedding:
        :func:`engine_hooks.sglang.rope.rope_from_rotary_embedding`) or that carry extra keys, or
        that differ per layer type; a dual-chunk attention config; no ``rope_theta`` anywhere
        (except GPT-J, whose base is fixed at 10000); a ``partial_rotary_factor`` that SGLang
        would not apply as HF does; inconsistent sizes. Reads transformers 5
        (``config.rope_parameters``) and 4 (``rope_theta``/``rope_scaling``) conventions.
        """
        found = config_rope(hf_config, scaled=False)
        return found[0] if found is not None else None


def config_rope(hf_config: Any, *, scaled: bool) -> tuple[RopeSpec, str, dict[str, Any]] | None:
    """The config's RoPE as a plain spec, its type and its parameters (None: refused)."""
    model = _MODELS.get(str(getattr(hf_config, "model_type", "")))
    if model is None:
        return None
    if getattr(hf_config, "dual_chunk_attention_config", None) is not None:
        return None
    if getattr(hf_config, "original_num_attention_heads", None) is not None:
        return None  # models/qwen2.py then derives head_dim differently
    found = _rope_parameters(hf_config, scaled=scaled)
    if found is None:
        return None
    rope_type, params = found
    theta = _rope_theta(hf_config, params, model)
    head_dim = _head_dim(hf_config, model)
    if theta is None or head_dim is None:
        return None
    rotary_dim = _rotary_dim(hf_config, params, model, head_dim)
    if rotary_dim is None:
        return None
    neox = model.neox
    if model.neox_attr:
        style = getattr(hf_config, "rope_is_neox_style", True)
        if not isinstance(style, bool):
            return None
        neox = style
    try:
        spec = RopeSpec(rotary_dim=rotary_dim, head_dim=head_dim, base=float(theta), is_neox_style=neox)
    except ValueError:
        return None
    return spec, str(rope_type), params


def _rope_parameters(hf_config: Any, *, scaled: bool) -> tuple[str, dict[str, Any]] | None:
    """The config's RoPE type and parameter dict, if SGLang builds plain RoPE (or, when ``scaled``,
    a static scaling) from them; None otherwise."""
    params = getattr(hf_config, "rope_parameters", None)
    if params is None:
        params = getattr(hf_config, "rope_scaling", None)
    if params is None:
        params = {}
    if not isinstance(params, dict):
        return None
    if any(isinstance(v, dict) for v in params.values()):
        return None  # per-layer-type RoPE (transformers 5 nested rope_parameters)
    rope_type = params.get("rope_type", params.get("type"))
    rope_type = "default" if rope_type is None else rope_type
    if not isinstance(rope_type, str):
        return None
    allowed = _PLAIN_ROPE_KEYS | (_SCALED_ROPE_KEYS.get(rope_type, frozenset()) if scaled else frozenset())
    if not set(params) <= allowed:
        return None
    if rope_type != "default" and not (scaled and rope_type in _SCALED_ROPE_KEYS):
        return None
    return rope_type, params


def _rope_theta(hf_config: Any, params: dict[str, Any], model: _ModelRope) -> int | float | None:
    """The RoPE base: the parameters', else the config's, else the model's default."""
    theta = params.get("rope_theta")
    if theta is None:
        theta = getattr(hf_config, "rope_theta", None)
    if theta is None:
        theta = model.default_theta
    if isinstance(theta, bool) or not isinstance(theta, int | float):
        return None
    return theta


def _head_dim(hf_config: Any, model: _ModelRope) -> int | None:
    """The head dim SGLang's implementation of the model uses (None: unknown, or HF would differ)."""
    hidden = _positive_int(getattr(hf_config, "hidden_size", None))
    heads = _positive_int(getattr(hf_config, "num_attention_heads", None))
    derived = hidden // heads if hidden is not None and heads is not None else None
    if model.head_dim_attr:
        return _positive_int(getattr(hf_config, "head_dim", None)) or derived
    attr = getattr(hf_config, "head_dim", None)
    if attr is not None and attr != derived:
        return None  # SGLang ignores config.head_dim for this model; HF would not
    return derived


def _rotary_dim(hf_config: Any, params: dict[str, Any], model: _ModelRope, head_dim: int) -> int | None:
    """How many of a head's dims are rotated (None: a partial rotation SGLang and HF would not agree on)."""
    # partial_rotary_factor: SGLang reads the config attribute only (models/llama.py);
    # transformers 5 may also keep it in rope_parameters. Both must agree.
    attr_factor = getattr(hf_config, "partial_rotary_factor", None)
    param_factor = params.get("partial_rotary_factor")
    if param_factor is not None and attr_factor is None:
        return None
    if param_factor is not None and param_factor != attr_factor:
        return None
    factor = 1.0 if attr_factor is None else attr_factor
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not 0.0 < factor <= 1.0:
        return None
    if not model.partial and factor != 1.0:
        return None
    if model.rotary_dim_attr:
        return _positive_int(getattr(hf_config, "rotary_dim", None))
    return int(head_dim * factor)
