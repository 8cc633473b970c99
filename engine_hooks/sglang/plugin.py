"""SGLang general plugin (entry-point group ``sglang.srt.plugins``): registers the ``semgov`` backend.

SGLang loads every installed general plugin at scheduler start, before the tree cache is built,
and calls it; :func:`register` makes ``--radix-cache-backend semgov`` available. Importing this
module is cheap: the hook itself is imported only when a server selects the backend.
"""

from __future__ import annotations

from typing import Any

BACKEND = "semgov"


def _factory(ctx: Any) -> Any:
    from engine_hooks.sglang.factory import build_governed_cache

    return build_governed_cache(ctx)


def register() -> None:
    """Register the ``semgov`` radix-cache backend (idempotent)."""
    from sglang.srt.mem_cache.registry import get_radix_cache_factory, register_radix_cache_backend

    if get_radix_cache_factory(BACKEND) is not None:
        return
    register_radix_cache_backend(BACKEND, _factory)
