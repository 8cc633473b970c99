"""semgov's connector as vLLM loads it, on a worker whose attention layers are reported as
``FLEX_ATTENTION``: vLLM's CPU build has only ``CPU_ATTN`` (and its fp8 KV cache needs AVX-512), so
this is how a real CPU server reaches the worker's start-up refusal (tests/vllm/test_reuse_off_server.py).
The layers are still looked up in vLLM's forward context; only the backend names are replaced.
Loaded by vLLM through ``kv_connector_module_path``; nothing in engine_hooks imports it."""

from __future__ import annotations

from typing import Any

from engine_hooks.vllm import worker_side
from engine_hooks.vllm.connector import SemgovConnector

__all__ = ["SemgovConnector"]

_lookup = worker_side.attention_backends


def _flex_named(vllm_config: Any, names: list[str]) -> tuple[dict[str, Any], dict[str, str]]:
    layers, _ = _lookup(vllm_config, names)
    return layers, dict.fromkeys(names, "FLEX_ATTENTION")


worker_side.attention_backends = _flex_named
