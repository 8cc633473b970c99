"""What every candidate provider shares: the contract, input validation and per-scope row storage.

- the contract the hook calls, ``CandidateProvider``, and ``Match``, one candidate it returns,
  are public types in :mod:`semgov.typing` (see :mod:`engine_hooks.core.providers`);
- the ``_check_*`` helpers and :func:`_as_tokens` validate what a provider is called with;
- :class:`_Store` keeps each scope's donors as rows of one 2-D array (a signature or an
  embedding per donor, :class:`_Scope`), evicting a scope's oldest at ``max_donors_per_scope``;
  :func:`_rank` turns one scope's similarities into matches, best first.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from semgov.typing import Match

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
