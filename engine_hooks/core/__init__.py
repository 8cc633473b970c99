"""semgov's governed-serving core: everything an engine adapter needs that touches no engine.

The :class:`~engine_hooks.core.governor.Governor` (composition root), decisions and the decision
process, donors, context tokens, plans, settings, policies (reload, shadow, capture), canaries,
metrics, engine events and the audit trail, candidate providers, and the RoPE spec and rotation
math. ``engine_hooks.sglang`` and ``engine_hooks.vllm`` build on it and never on each other; no
module here imports ``sglang`` or ``vllm`` (``tests/test_layout.py``;
``python scripts/import_graph.py`` prints who imports what).
"""
