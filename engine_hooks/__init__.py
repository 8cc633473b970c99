"""Adapters that act on semgov decisions inside a serving engine.

``engine_hooks.reference`` is a CPU reference engine: it materializes the KV
positions a signed ``allow`` record approves (prefix spans as they are, shifted
spans with their keys re-rotated) and prefills everything else, failing closed to
a cold prefill. ``engine_hooks.core`` is the governed-serving core (no engine import);
``engine_hooks.sglang`` and ``engine_hooks.vllm`` are the engine adapters built on it.
"""
