"""Adapters that act on semgov decisions inside a serving engine.

``engine_hooks.reference`` is a CPU reference engine: it materializes the KV
positions a signed ``allow`` record approves (prefix spans as they are, shifted
spans with their keys re-rotated) and prefills everything else, failing closed to
a cold prefill. The SGLang hook comes later and follows the same contract.
"""
