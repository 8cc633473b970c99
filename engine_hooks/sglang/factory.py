"""The ``semgov`` radix-cache backend factory: refuse what the hook does not support, then build.

SGLang calls :func:`build_governed_cache` with its ``TreeCacheBuildContext`` when the server runs
with ``--radix-cache-backend semgov`` (registered by :mod:`engine_hooks.sglang.plugin`). It
builds SGLang's default unified radix tree with :class:`GovernedRadixCache` as the class
(``create_unified_radix_cache(ctx, cache_class=...)``) and attaches a :class:`Governor` built
from the ``SEMGOV_*`` settings. Every unsupported configuration is refused here, with the
option to drop, before the server takes traffic.
"""

from __future__ import annotations

from typing import Any

from engine_hooks.core.settings import HookConfigError, HookSettings


def unsupported(ctx: Any) -> list[str]:
    """Why the hook cannot govern this server configuration (empty when it can)."""
    from sglang.srt.runtime_context import get_disagg, get_memory, get_serving, get_spec

    from engine_hooks.sglang.kv_copy import supported_pool

    out = []
    if ctx.disable_radix_cache:
        out.append("--disable-radix-cache is set: there is no tree to govern (drop the flag or the backend)")
    if ctx.is_hybrid_swa or ctx.is_hybrid_ssm or getattr(ctx, "is_dsa", False):
        out.append("hybrid models (sliding-window, SSM/Mamba or sparse attention) are not supported")
    if ctx.enable_hierarchical_cache:
        out.append("--enable-hierarchical-cache is not supported (host hits are how the hook reports reuse)")
    if getattr(get_spec(), "speculative_algorithm", None) is not None:
        out.append("speculative decoding is not supported")
    server_args = ctx.server_args
    if int(getattr(server_args, "pp_size", 1) or 1) != 1:
        out.append("pipeline parallelism (--pp-size above 1) is not supported")
    if getattr(server_args, "enable_dp_attention", False):
        out.append("--enable-dp-attention is not supported (ranks would hold different requests)")
    if int(ctx.tp_size) != 1 and getattr(ctx, "tp_group", None) is None:
        out.append(f"tensor parallelism ({ctx.tp_size} ranks) without SGLang's TP process group")
    mem = get_memory()
    for flag, what in (
        ("enable_lmcache", "--enable-lmcache"),
        ("enable_unified_cache_external_linker", "an external unified-cache linker"),
        ("enable_session_radix_cache", "--enable-session-radix-cache"),
    ):
        if getattr(mem, flag, False):
            out.append(f"{what} is not supported")
    if getattr(get_serving(), "enable_streaming_session", False):
        out.append("--enable-streaming-session is not supported")
    mode = getattr(get_disagg(), "disaggregation_mode", "null")
    if str(getattr(mode, "value", mode)) not in ("null", "None"):
        out.append(f"prefill/decode disaggregation ({mode}) is not supported")
    allocator = ctx.params.token_to_kv_pool_allocator
    reason = supported_pool(allocator.get_kvcache()) if allocator is not None else "no KV pool"
    if reason is not None:
        out.append(f"KV pool not supported: {reason}")
    return out


def build_governed_cache(ctx: Any, settings: HookSettings | None = None) -> Any:
    """SGLang's ``RadixCacheFactory`` for the ``semgov`` backend."""
    import sglang
    from sglang.srt.mem_cache.registry import create_unified_radix_cache

    from engine_hooks.core.governor import Governor
    from engine_hooks.sglang.cache import GovernedRadixCache
    from engine_hooks.sglang.rope import rope_for_model
    from engine_hooks.sglang.tp import FollowerGovernor, TpLink
    from semgov.log import get_logger

    problems = unsupported(ctx)
    if problems:
        raise HookConfigError(
            "--radix-cache-backend semgov cannot govern this configuration:\n  - " + "\n  - ".join(problems)
        )
    settings = settings if settings is not None else HookSettings.from_env()
    hf_config = getattr(ctx.model_config, "hf_config", None)
    model = getattr(getattr(getattr(ctx, "tp_worker", None), "model_runner", None), "model", None)
    rope = rope_for_model(hf_config, model) if hf_config is not None else None
    get_logger().info(
        "semgov radix cache: shifted spans "
        + (
            f"re-rotated ({rope.scaling} RoPE)"
            if rope is not None
            else "refused (RoPE not re-rotatable here)"
        )
    )
    server_args = ctx.server_args
    tokenizer_path = getattr(server_args, "tokenizer_path", None) or getattr(server_args, "model_path", None)
    # NOTE: with tensor parallelism only rank 0 decides, signs and audits; the other ranks follow
    # its round messages (engine_hooks.sglang.tp) and copy their own KV shards.
    tp = TpLink(ctx.tp_group) if int(ctx.tp_size) > 1 else None
    governor: Governor | FollowerGovernor
    if tp is None or tp.leader:
        engine = f"sglang {sglang.__version__}"
        governor = Governor(settings, engine_name=engine, tokenizer_path=str(tokenizer_path or "") or None)
    else:
        governor = FollowerGovernor.from_settings(settings)
    if tp is not None:
        get_logger().info(f"semgov radix cache: tensor-parallel rank {tp.rank} of {tp.size}")
    canaries = None
    if settings.canary_rate > 0:
        if tp is not None:
            raise HookConfigError(
                "SEMGOV_CANARY_RATE is set but --tp-size is above 1: canaries are not supported with "
                "tensor parallelism (unset SEMGOV_CANARY_RATE)"
            )
        assert isinstance(governor, Governor)
        canaries = build_canaries(settings, governor, server_args)
        governor.on_revision.append(canaries.book.new_revision)
    if isinstance(governor, Governor):
        governor.watch(sighup=True)
    cache = create_unified_radix_cache(ctx, cache_class=GovernedRadixCache)
    # NOTE: realization copies run on the stream current at admission (the scheduler's
    # schedule stream): without overlap the forward runs on it, with overlap the forward
    # stream waits on it before every launch.
    cache.attach(governor, rope=rope, strict=settings.strict, tp=tp, canaries=canaries)
    return cache


def build_canaries(settings: HookSettings, governor: Any, server_args: Any) -> Any:
    """The hook's canaries (``SEMGOV_CANARY_*``): replays go to this server's own ``/generate``."""
    from engine_hooks.core.canary import STATE_FILE, Canaries, CanarySettings, http_replay
    from semgov.wire.timefmt import rfc3339

    host = str(getattr(server_args, "host", None) or "127.0.0.1")
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    port = int(server_args.port)
    api_key = getattr(server_args, "api_key", None) or None

    return Canaries(
        CanarySettings(
            rate=settings.canary_rate,
            tokens=settings.canary_tokens,
            budget=settings.canary_budget,
            queue=settings.canary_queue,
            timeout_s=float(settings.canary_timeout_s),
            idle_ms=settings.canary_idle_ms,
            tenant_queue=settings.canary_tenant_queue,
            probation=settings.canary_probation,
        ),
        revision=governor.revision,
        replay=http_replay(host, port, api_key, float(settings.canary_timeout_s)),
        audit=canary_audit(governor),
        state_path=settings.audit_dir / STATE_FILE,
        clock=lambda: rfc3339(governor.clock()),
    )


def canary_audit(governor: Any) -> Any:
    """Canary events as engine events, queued on the governor like every other (signed off-thread)."""
    from engine_hooks.core.canary import CanaryEvent

    def audit(ev: CanaryEvent) -> None:
        c = ev.canary
        governor.event(
            ev.kind,
            request_id=c.request_id if c is not None else None,
            decision_id=c.decision_id if c is not None else None,
            donor_id=c.donor_id if c is not None else None,
            materialized_tokens=ev.compared,
            detail=ev.detail,
        )

    return audit
