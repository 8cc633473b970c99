"""The MinHash candidate provider (``minhash``, the hook's default): estimated Jaccard similarity
of the token ids' shingle sets, in pure numpy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

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

__all__ = ["MinHashProvider"]

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
