"""The ``semgov`` backend's registration, settings and build-time refusals, through SGLang's registry."""

from __future__ import annotations

from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

from engine_hooks.core.settings import HookConfigError, HookSettings


def test_entry_point_is_declared_for_sglang_plugins() -> None:
    """The installed package declares engine_hooks.sglang.plugin:register in sglang.srt.plugins."""
    eps = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert eps.get("semgov") == "engine_hooks.sglang.plugin:register"


def test_sglang_plugin_loader_registers_the_backend(sglang_runtime: Any) -> None:
    """SGLang's own plugin loader finds and runs the entry point; registering twice is harmless."""
    from sglang.srt.mem_cache.registry import registered_radix_cache_backends
    from sglang.srt.plugins import load_plugins_by_group

    plugins = load_plugins_by_group("sglang.srt.plugins")
    func, _ = plugins["semgov"]
    func()
    func()
    assert "semgov" in registered_radix_cache_backends()


def test_server_args_accept_the_backend_flag(sglang_runtime: Any) -> None:
    """`--radix-cache-backend semgov` parses once the plugin has registered the name."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model-path", "m", "--radix-cache-backend", "semgov"])
    assert ns.radix_cache_backend == "semgov"


def test_settings_name_the_missing_variable(hook_files: Any) -> None:
    """A missing required variable is refused naming it."""
    env = hook_files.env()
    del env["SEMGOV_POLICY"]
    with pytest.raises(HookConfigError, match="SEMGOV_POLICY is not set"):
        HookSettings.from_env(env)


@pytest.mark.parametrize(
    ("var", "value", "match"),
    [
        ("SEMGOV_TRUST", "/nonexistent/keyring.json", "no such file"),
        ("SEMGOV_MIN_UNMATCHED_TOKENS", "many", "not an integer"),
        ("SEMGOV_MAX_CANDIDATES", "0", "between 1 and 64"),
        ("SEMGOV_STRICT", "maybe", "expected 1/0"),
        ("SEMGOV_AUDIT_DIR", "", "SEMGOV_AUDIT_DIR is not set"),
        ("SEMGOV_CONTEXT_AUDIENCE", "", "SEMGOV_CONTEXT_AUDIENCE is not set"),
        ("SEMGOV_CONTEXT_AUDIENCE", "prod eu", "printable ASCII"),
        ("SEMGOV_CONTEXT_MAX_LIFETIME_S", "0", "between 1 and"),
    ],
)
def test_bad_settings_are_refused_naming_the_variable(
    hook_files: Any, var: str, value: str, match: str
) -> None:
    """Every bad value is refused with the variable's name and the problem."""
    env = hook_files.env(**{var: value})
    with pytest.raises(HookConfigError, match=match) as e:
        HookSettings.from_env(env)
    assert var in str(e.value)


def test_defaults(hook_files: Any) -> None:
    """Optional settings take their documented defaults."""
    env = {k: v for k, v in hook_files.env().items() if k in _REQUIRED}
    s = HookSettings.from_env(env)
    assert (s.provider, s.min_unmatched_tokens, s.max_candidates, s.strict, s.async_registration) == (
        "minhash",
        256,
        4,
        False,
        True,
    )
    assert s.detokenizer == "auto" and s.donor_ttl_s == 3600
    assert s.context_max_lifetime_s == 3600 and s.context_key_previous is None


_REQUIRED = {
    "SEMGOV_POLICY", "SEMGOV_TRUST", "SEMGOV_SIGNING_KEY", "SEMGOV_CONTEXT_KEY", "SEMGOV_CONTEXT_AUDIENCE",
    "SEMGOV_AUDIT_DIR",
}  # fmt: skip


def test_short_context_key_is_refused(make_harness: Any, hook_files: Any) -> None:
    """A gateway key under 32 bytes is refused when the backend is built."""
    hook_files.context_key.write_bytes(b"short")
    with pytest.raises(HookConfigError, match="at least 32 bytes"):
        make_harness()


def test_keyring_without_the_hooks_own_key_is_refused(make_harness: Any, hook_files: Any) -> None:
    """The hook signs donor provenance; a keyring that does not trust that key is refused at build."""
    hook_files.trust.write_text('{"keys": []}')
    with pytest.raises(HookConfigError, match="does not hold the hook's own key"):
        make_harness()


def test_broken_policy_is_refused_at_build(make_harness: Any, hook_files: Any, tmp_path: Path) -> None:
    """A policy that does not load stops the server at build time, naming the file."""
    from semgov.errors import PolicyError

    bad = tmp_path / "badpolicy"
    bad.mkdir()
    (bad / "policy.yaml").write_text("name: x\nversion: '1'\nbogus_key: 1\n")
    hook_files.policy = bad
    with pytest.raises(PolicyError, match="policy.yaml"):
        make_harness()


def _ctx(h: Any, **over: Any) -> Any:
    import dataclasses

    return dataclasses.replace(h.ctx, **over)


@pytest.mark.parametrize(
    ("over", "match"),
    [
        ({"disable_radix_cache": True}, "--disable-radix-cache"),
        ({"is_hybrid_swa": True}, "hybrid models"),
        ({"is_hybrid_ssm": True}, "hybrid models"),
        ({"enable_hierarchical_cache": True}, "hierarchical"),
        ({"tp_size": 2}, "without SGLang's TP process group"),
    ],
)
def test_unsupported_configurations_are_refused(make_harness: Any, over: dict[str, Any], match: str) -> None:
    """Configurations the hook cannot govern are refused at build with the option to drop."""
    from engine_hooks.sglang.factory import build_governed_cache

    h = make_harness()
    with pytest.raises(HookConfigError, match=match):
        build_governed_cache(_ctx(h, **over), HookSettings.from_env(h.env))


@pytest.mark.parametrize(
    ("over", "match"),
    [({"pp_size": 2}, "pipeline parallelism"), ({"enable_dp_attention": True}, "--enable-dp-attention")],
)
def test_parallelism_other_than_tensor_parallelism_is_refused(
    make_harness: Any, over: dict[str, Any], match: str
) -> None:
    """Pipeline parallelism and DP attention are refused at build (ranks would hold different requests)."""
    import copy

    from engine_hooks.sglang.factory import build_governed_cache

    h = make_harness()
    args = copy.copy(h.ctx.server_args)
    for name, value in over.items():
        setattr(args, name, value)
    ctx = _ctx(h, server_args=args)
    with pytest.raises(HookConfigError, match=match):
        build_governed_cache(ctx, HookSettings.from_env(h.env))


def test_speculative_decoding_is_refused(make_harness: Any) -> None:
    """A server with speculative decoding is refused (draft KV would not be governed)."""
    from sglang.srt.runtime_context import get_spec

    from engine_hooks.sglang.factory import build_governed_cache

    h = make_harness()
    with get_spec().override(speculative_algorithm="EAGLE"):
        with pytest.raises(HookConfigError, match="speculative decoding"):
            build_governed_cache(h.ctx, HookSettings.from_env(h.env))


def test_non_mha_pool_is_refused(make_harness: Any) -> None:
    """A KV pool the copy does not support (here an MLA pool) is refused with the reason."""
    import torch
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool

    from engine_hooks.sglang.factory import build_governed_cache

    h = make_harness()
    mla = MLATokenToKVPool(
        size=64,
        page_size=1,
        dtype=torch.float32,
        kv_lora_rank=16,
        qk_rope_head_dim=8,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    alloc = TokenToKVPoolAllocator(size=64, dtype=torch.float32, device="cpu", kvcache=mla, need_sort=False)
    import dataclasses

    params = dataclasses.replace(h.ctx.params, token_to_kv_pool_allocator=alloc)
    with pytest.raises(HookConfigError, match="KV pool not supported"):
        build_governed_cache(_ctx(h, params=params), HookSettings.from_env(h.env))


def test_the_built_cache_is_governed_and_keeps_sglang_defaults(make_harness: Any) -> None:
    """The registry builds a GovernedRadixCache (a UnifiedRadixCache) with the model's RoPE."""
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    from engine_hooks.sglang.cache import GovernedRadixCache

    h = make_harness()
    assert isinstance(h.tree, GovernedRadixCache) and isinstance(h.tree, UnifiedRadixCache)
    assert h.tree.rope is not None and h.tree.rope.base == 100000.0 and h.tree.rope.is_neox_style
    assert h.tree.reuse_disabled is None
