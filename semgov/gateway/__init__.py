"""``semgov gateway``: the OpenAI-compatible gateway where tenant identity enters the system.

It authenticates clients by API key (:mod:`~semgov.gateway.tenants`), checks what they claim,
turns their messages into the token ids and segments the engine serves
(:mod:`~semgov.gateway.prompt`), mints the signed context token (:mod:`semgov.context`) and
forwards to SGLang or vLLM (:mod:`~semgov.gateway.upstream`). docs/gateway.md.
"""

from __future__ import annotations

from semgov.gateway.app import Gateway, GatewayConfig
from semgov.gateway.upstream import Target

__all__ = ["Gateway", "GatewayConfig", "Target"]
