"""Token verification: find runs of identical tokens between donor and recipient.

Pure, vectorised (numpy) and exact: every span returned has been compared token
by token, so a hash collision can only cost reuse, never approve a wrong token.

Method, for prompts of tens of thousands of tokens in well under a millisecond:
1. The common prefix (``kind = prefix``): its KV is exactly what a cold prefill
   computes, because every earlier token matches too.
2. Past it, recipient *anchors* (k-grams at a fixed stride) are looked up in the
   donor's sorted k-gram index (:class:`KgramIndex`, built once per registered
   donor); each hit proposes a diagonal ``donor_pos - recipient_pos``, and an
   anchor meets only the donor positions nearest its own. The stride is chosen
   so that every run of at least ``min_span`` identical tokens contains a whole anchor.
3. The best diagonals are compared element-wise; runs of equal tokens become
   ``shifted`` spans (same tokens, different context).
4. Overlaps in recipient positions are resolved (prefix first, then longer runs),
   and spans are split at every segment boundary of both prompts.

Worst case O(n log n) whatever the layout (issue 12): runs are bounded per diagonal,
a run inside an earlier one is dropped unseen, the greedy pass searches a coverage
byte map instead of comparing with every span already taken, and splitting bisects
the segment boundaries. ``benchmarks/token_adversarial.py`` measures the layouts
that made the old pass quadratic (repeated blocks, periodic tokens, short matches).
"""

from __future__ import annotations

import array
import hashlib
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from semgov._internal.deadline import Deadline
from semgov.wire.models import Role

U32 = npt.NDArray[np.uint32]

ANCHOR_K = 8  # k-gram length used for anchors (shorter when min_span is smaller)
MAX_DIAGONALS = 32  # most promising diagonals compared per candidate
MAX_PER_SLOT = 8  # anchors one donor k-gram is compared with
# Odd 32-bit multipliers for k-gram hashing (wrapping uint32 arithmetic: half the
# memory traffic of uint64; collisions only cost a wasted comparison).
_MULT = np.array(
    [0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, 0x165667B1, 0xD3A2646D, 0xFD7046C5, 0xB55A4F09],
    dtype=np.uint32,
)


@dataclass(frozen=True, slots=True)
class SegmentTable:
    """Segment boundaries of one prompt as arrays: ``starts[i]``, ``ends[i]``, ``roles[i]``."""

    starts: npt.NDArray[np.int64]
    ends: npt.NDArray[np.int64]
    roles: tuple[Role, ...]
    start_list: list[int] = field(init=False, repr=False, compare=False)
    end_list: list[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # NOTE: Python lists for bisection: bisect on a list costs no numpy call per lookup.
        object.__setattr__(self, "start_list", self.starts.tolist())
        object.__setattr__(self, "end_list", self.ends.tolist())

    @classmethod
    def from_triples(cls, segs: list[tuple[Role, int, int]]) -> SegmentTable:
        return cls(
            np.array([s for _, s, _ in segs], dtype=np.int64),
            np.array([e for _, _, e in segs], dtype=np.int64),
            tuple(r for r, _, _ in segs),
        )

    def index_at(self, pos: int) -> int:
        return bisect_right(self.start_list, pos) - 1


@dataclass(frozen=True, slots=True)
class FoundSpan:
    recipient_start: int
    donor_start: int
    length: int
    kind: Literal["prefix", "shifted"]
    recipient_role: Role
    donor_role: Role


def as_tokens(token_ids: list[int]) -> U32:
    """Token ids as a uint32 array (ids are validated to fit on input)."""
    # NOTE: array.array converts a list of ints ~3x faster than numpy does.
    return np.frombuffer(array.array("I", token_ids), dtype=np.uint32)


def token_hash(tokens: U32) -> str:
    """SHA-256 hex of the token ids as little-endian uint32."""
    return hashlib.sha256(tokens.astype("<u4", copy=False).tobytes()).hexdigest()


def _kgram_hashes(t: U32, k: int) -> U32:
    n = len(t) - k + 1
    h: U32 = t[:n] * _MULT[0]
    for j in range(1, k):
        h += t[j : j + n] * _MULT[j]
    # NOTE: wrapping arithmetic; collisions are harmless (runs are compared exactly).
    return h


def _runs(eq: npt.NDArray[np.bool_], min_len: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Starts and lengths of True runs of at least ``min_len`` in ``eq``."""
    n = len(eq)
    if n == 0 or not eq.any():
        empty = np.empty(0, dtype=np.int64)
        return empty, empty
    # NOTE: two passes over the n flags (where they change, and where that is): the run edges are
    # few, so telling starts from ends on them costs nothing.
    edges = np.flatnonzero(eq[1:] != eq[:-1]) + 1
    rising = eq[edges]
    starts = edges[rising]
    ends = edges[~rising]
    if eq[0]:
        starts = np.concatenate(([0], starts))
    if eq[-1]:
        ends = np.concatenate((ends, [n]))
    lengths = ends - starts
    keep = lengths >= min_len
    return starts[keep].astype(np.int64, copy=False), lengths[keep].astype(np.int64, copy=False)


@dataclass(frozen=True, slots=True)
class KgramIndex:
    """A donor's k-gram hashes with their positions, sorted by ``(hash, position)``: ``hashes[i]`` and
    ``positions[i]`` (both uint32: 8 bytes per token).

    Built once per donor (:func:`kgram_index`; ``semgov.facts.compute.DonorDigest`` keeps it from the
    donor's registration), so a decision only looks its recipient's anchors up in it.
    """

    k: int
    hashes: npt.NDArray[np.uint32]
    positions: npt.NDArray[np.uint32]
    _keys: list[npt.NDArray[np.uint64]] = field(default_factory=list, compare=False, repr=False)

    @classmethod
    def of_keys(cls, k: int, keys: npt.NDArray[np.uint64]) -> KgramIndex:
        """From sorted keys ``hash << 32 | position``."""
        return cls(k, (keys >> _HIGH).astype(np.uint32), (keys & _LOW32).astype(np.uint32))

    def keys(self) -> npt.NDArray[np.uint64]:
        """The sorted keys ``hash << 32 | position``, built on first use (only repeated k-grams need
        them) and kept. NOTE: two threads may both build them; they build the same array."""
        if not self._keys:
            self._keys.append((self.hashes.astype(np.uint64) << _HIGH) | self.positions)
        return self._keys[0]


_LOW32 = np.uint64(0xFFFFFFFF)
_HIGH = np.uint64(32)


def kgram_index(d: U32, k: int) -> KgramIndex:
    """The sorted k-gram index of ``d`` (O(n log n); positions fit in 32 bits by the input limits)."""
    if len(d) < k:
        return KgramIndex.of_keys(k, np.empty(0, dtype=np.uint64))
    keys = _kgram_hashes(d, k).astype(np.uint64) << _HIGH
    keys |= np.arange(len(keys), dtype=np.uint64)
    keys.sort()
    return KgramIndex.of_keys(k, keys)


def _anchored_keys(d: U32, k: int, anchors: U32) -> npt.NDArray[np.uint64]:
    """The part of ``d``'s :func:`kgram_index` keys whose hash some anchor has (a donor not indexed ahead).

    NOTE: every donor k-gram whose hash equals an anchor's lands in a marked slot, so each anchor's
    group of equal keys is complete, and the lookups below see exactly what the full index gives
    them; only unmarked hashes (no anchor can meet them) and a share of colliding ones are left out,
    so the sort is over about ``len(anchors)`` matches plus ``n / 16`` collisions instead of ``n``.
    """
    dh = _kgram_hashes(d, k)
    bits = min(24, max(10, int(len(anchors) * 16 - 1).bit_length()))
    shift = np.uint32(32 - bits)
    marked = np.zeros(1 << bits, dtype=np.bool_)
    marked[anchors >> shift] = True
    pos = np.flatnonzero(marked[dh >> shift])
    keys = dh[pos].astype(np.uint64) << _HIGH
    keys |= pos.astype(np.uint64)
    keys.sort()
    return keys


def anchor_k(min_span: int) -> int:
    """The k-gram length the span search anchors on for ``min_span``."""
    return min(ANCHOR_K, min_span)


def _anchor_hashes(r: U32, lo: int, stride: int, k: int) -> tuple[npt.NDArray[np.int64], U32]:
    """Anchor positions ``lo, lo + stride, ...`` (every whole k-gram of ``r`` from there) and their
    k-gram hashes (:func:`_kgram_hashes` at those positions), as one product of a strided view."""
    count = (len(r) - k - lo) // stride + 1
    pos = np.arange(lo, lo + stride * count, stride, dtype=np.int64)
    item = r.itemsize
    if r.flags.c_contiguous and r.dtype == np.uint32:
        grams = np.ndarray((count, k), np.uint32, buffer=r, offset=lo * item, strides=(stride * item, item))
    else:
        grams = r[pos[:, None] + np.arange(k)]
    # NOTE: uint32 products and sums wrap modulo 2**32, as _kgram_hashes' running sum does.
    h: U32 = grams @ _MULT[:k]
    return pos, h


def _top_diagonals(offs: npt.NDArray[np.int64]) -> list[int]:
    """The ``MAX_DIAGONALS`` most frequent values of ``offs`` (not empty), most votes first, ties
    smallest value first (as ``np.unique`` orders them)."""
    return [off for off, _, _ in _top_windows(offs, None, 0)]


def _top_windows(
    offs: npt.NDArray[np.int64], apos: npt.NDArray[np.int64] | None, reach: int
) -> list[tuple[int, int, int]]:
    """:func:`_top_diagonals` as ``(diagonal, first, end)``: with the anchors' positions ``apos``, the
    recipient window ``[first, end)`` from the diagonal's first hit anchor less ``reach`` to its last
    plus ``reach``; without them ``(diagonal, 0, -1)`` (the whole diagonal)."""
    order = np.argsort(offs, kind="stable")
    s = offs[order]
    ends = np.flatnonzero(s[1:] != s[:-1])
    if len(ends) == 0:  # NOTE: the usual case: every hit on one diagonal
        if apos is None:
            return [(int(s[0]), 0, -1)]
        return [(int(s[0]), int(apos.min()) - reach, int(apos.max()) + reach)]
    at = np.concatenate(([0], ends + 1))
    votes = np.diff(at, append=len(s))
    best = np.argsort(-votes, kind="stable")[:MAX_DIAGONALS]
    diagonals: list[int] = s[at[best]].tolist()
    if apos is None:
        return [(off, 0, -1) for off in diagonals]
    a = apos[order]
    first: list[int] = (np.minimum.reduceat(a, at)[best] - reach).tolist()
    last: list[int] = (np.maximum.reduceat(a, at)[best] + reach).tolist()
    return list(zip(diagonals, first, last, strict=True))


def _candidate_diagonals(
    r: U32, d: U32, lo: int, min_span: int, index: KgramIndex | None = None
) -> list[int]:
    """Diagonals (donor_pos - recipient_pos) that anchor hits propose, best first."""
    return [off for off, _, _ in _diagonal_windows(r, d, lo, min_span, index)]


def _diagonal_windows(
    r: U32, d: U32, lo: int, min_span: int, index: KgramIndex | None = None
) -> list[tuple[int, int, int]]:
    """:func:`_candidate_diagonals`, each as ``(diagonal, first, end)``: every run of ``min_span`` or
    more on the diagonal lies inside the recipient window ``[first, end)`` (``end`` -1: anywhere).

    NOTE: each recipient anchor is looked up in the donor's sorted k-gram index (O(A log n) for A
    anchors) and meets at most ``MAX_PER_SLOT`` donor positions with its hash: the ones nearest its
    own position (half before, half after), so repeated content votes for the diagonals closest to
    the anchor and the work is bounded by ``MAX_PER_SLOT * A`` pairs, even for one repeated token.
    Equal keys compare exactly (no collision filter needed: a collision only costs a comparison).

    NOTE: windows, when every hit anchor meets exactly one donor position (the usual case): a run of
    ``min_span`` or more holds a whole anchor (the stride says so), whose one donor position is then
    on the run's diagonal, so every such anchor is a hit there; the anchors one stride before the
    run's first and after its last are not wholly inside it. So the run starts after the diagonal's
    first hit less a stride and ends before its last hit plus a stride and k: comparing that window
    finds exactly the runs comparing the whole diagonal finds (what a window cuts is shorter than
    ``min_span``). Otherwise (repeated k-grams) the whole diagonal is compared.
    """
    k = anchor_k(min_span)
    if len(r) - lo < min_span or len(d) < min_span:
        return []
    stride = max(1, min_span - k + 1)
    apos, h = _anchor_hashes(r, lo, stride, k)
    idx = index if index is not None and index.k == k else KgramIndex.of_keys(k, _anchored_keys(d, k, h))
    n = len(idx.hashes)
    if n == 0:
        return []
    # NOTE: the anchors in hash order (a radix sort): the searches then walk the index in order, so a
    # cold index costs a few cache misses per anchor instead of a dozen; the order changes no vote.
    order = np.argsort(h, kind="stable")
    h, apos = h[order], apos[order]
    left = np.searchsorted(idx.hashes, h)
    # NOTE: whether each anchor's hash is in the index, and whether twice, read at the left end of its
    # group; only when some hash is there twice are the groups' ends searched for.
    hit = np.flatnonzero(idx.hashes[np.minimum(left, n - 1)] == h)
    if len(hit) == 0:
        return []
    left, apos = left[hit], apos[hit]
    if not (idx.hashes[np.minimum(left + 1, n - 1)] == h[hit])[left + 1 < n].any():
        return _top_windows(idx.positions[left].astype(np.int64) - apos, apos, stride + k - 1)
    hh = h[hit]
    cnt = np.searchsorted(idx.hashes, hh, side="right") - left
    # NOTE: an anchor whose hash more than MAX_PER_SLOT donor positions share takes the ones around
    # its own position in the group (found on the full keys: only those anchors search them).
    near = left.copy()
    big = np.flatnonzero(cnt > MAX_PER_SLOT)
    if len(big):
        needle = (hh[big].astype(np.uint64) << _HIGH) | apos[big].astype(np.uint64)
        near[big] = np.searchsorted(idx.keys(), needle)
    take = np.minimum(cnt, MAX_PER_SLOT)
    start = np.clip(near - take // 2, left, left + cnt - take)
    first = np.repeat(start - (np.cumsum(take) - take), take)
    dpos = idx.positions[first + np.arange(len(first))].astype(np.int64)
    return _top_windows(dpos - np.repeat(apos, take), None, 0)


def _split(
    rs: int,
    ds: int,
    length: int,
    kind: Literal["prefix", "shifted"],
    tables: tuple[SegmentTable, SegmentTable],
    min_len: int,
    out: list[FoundSpan],
    deadline: Deadline | None,
) -> int:
    """Cut one run at every segment boundary of either prompt; append the pieces of ``min_len`` or more.

    Returns the number of pieces made (kept or not). O(log S + pieces) for S segments: the boundaries
    inside the run are found by bisection (the deadline is checked every 4,096 pieces).
    """
    rseg, dseg = tables
    rends, dends = rseg.end_list, dseg.end_list
    end, shift = rs + length, rs - ds
    # NOTE: segments tile their prompt in order (checked on input), so the end lists are sorted
    # and strictly increasing: the slices below are exactly the ends strictly inside the run.
    cuts = rends[bisect_right(rends, rs) : bisect_left(rends, end)]
    dcuts = dends[bisect_right(dends, ds) : bisect_left(dends, ds + length)]
    if dcuts:
        mapped = [x + shift for x in dcuts]
        cuts = sorted({*cuts, *mapped}) if cuts else mapped
    rstarts, dstarts = rseg.start_list, dseg.start_list
    a = rs
    for i, b in enumerate((*cuts, end)):
        if i & 4095 == 4095:
            _tick(deadline)
        if b - a >= min_len:
            out.append(
                FoundSpan(
                    a,
                    a - shift,
                    b - a,
                    kind,
                    rseg.roles[bisect_right(rstarts, a) - 1],
                    dseg.roles[bisect_right(dstarts, a - shift) - 1],
                )
            )
        a = b
    return len(cuts) + 1


@dataclass(slots=True)
class SpanWork:
    """Work counters of one :func:`find_spans` call (tests bound them; nothing else reads them)."""

    compared: int = 0
    """Token pairs compared on the candidate diagonals (their windows, see :func:`_diagonal_windows`)."""
    runs: int = 0
    """Runs of at least ``min_span`` equal tokens found on the compared diagonals."""
    considered: int = 0
    """Runs left after dropping those inside an earlier run (they could never keep a piece)."""
    steps: int = 0
    """Searches of the coverage map in the greedy pass (each a ``memchr`` within one run)."""
    scanned: int = 0
    """Tokens those searches may read: the considered runs' lengths, summed."""
    pieces: int = 0
    """Free pieces kept as shifted spans, before segment splitting."""
    cuts: int = 0
    """Pieces made by segment splitting, prefix included (kept or not)."""


def _tick(deadline: Deadline | None) -> None:
    if deadline is not None:
        deadline.check("token verification (span search)")


def _collect_runs(
    r: U32,
    d: U32,
    lcp: int,
    min_span: int,
    deadline: Deadline | None,
    index: KgramIndex | None,
    work: SpanWork,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """``(lengths, starts, offsets)`` of every run of ``min_span`` or more on the candidate diagonals."""
    parts: list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], int]] = []
    for off, first, end in _diagonal_windows(r, d, lcp, min_span, index):
        _tick(deadline)
        lo = max(lcp, -off, first)
        hi = min(len(r), len(d) - off) if end < 0 else min(len(r), len(d) - off, end)
        if hi - lo < min_span:
            continue
        work.compared += hi - lo
        starts, lengths = _runs(r[lo:hi] == d[lo + off : hi + off], min_span)
        if len(starts):
            parts.append((lengths, starts + lo, off))
    if not parts:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty, empty
    lengths = np.concatenate([p[0] for p in parts]).astype(np.int64, copy=False)
    starts = np.concatenate([p[1] for p in parts]).astype(np.int64, copy=False)
    offs = np.concatenate([np.full(len(p[0]), p[2], dtype=np.int64) for p in parts])
    return lengths, starts, offs


def _greedy_order(
    lengths: npt.NDArray[np.int64], starts: npt.NDArray[np.int64], offs: npt.NDArray[np.int64]
) -> npt.NDArray[np.intp]:
    """Indices of the runs to consider, in greedy order: longest first, then by start, then by offset.

    NOTE: a run whose recipient interval lies inside an earlier run's (earlier in this order: longer,
    or the same interval with a smaller offset) is dropped: when the earlier one was taken, every
    free piece of its interval of ``min_span`` or more was kept, and coverage only grows, so every
    free piece inside it is shorter than ``min_span`` for good. At most one run per start survives.
    """
    ends = starts + lengths
    by_start = np.lexsort((offs, -ends, starts))
    e = ends[by_start]
    before = np.maximum.accumulate(e)
    covered = np.empty(len(e), dtype=np.bool_)
    covered[:1] = False
    covered[1:] = before[:-1] >= e[1:]
    keep = by_start[~covered]
    return keep[np.lexsort((offs[keep], starts[keep], -lengths[keep]))]


def _take(
    runs: list[tuple[int, int, int]],
    n: int,
    lcp: int,
    min_span: int,
    deadline: Deadline | None,
    work: SpanWork,
) -> list[tuple[int, int, int]]:
    """Greedy pass: the free pieces ``(start, end, offset)`` of ``min_span`` or more, run by run.

    NOTE: ``cov`` marks taken recipient positions (the prefix and every kept piece); a run's free
    pieces are the maximal unmarked stretches of its interval, found with ``bytearray.find`` (memchr)
    from left to right, so a run costs one search plus two per free piece, each reading only its own
    interval. Pieces trimmed this way stay exact because they keep their diagonal.
    """
    cov = bytearray(n)
    cov[:lcp] = b"\x01" * lcp
    kept: list[tuple[int, int, int]] = []
    check_at = 0
    for length, rs, off in runs:
        if work.steps >= check_at:  # NOTE: every 4,096 searches at most, whatever the runs' lengths
            _tick(deadline)
            check_at = work.steps + 4096
        end = rs + length
        work.scanned += length
        p = cov.find(0, rs, end)
        work.steps += 1
        while p >= 0:
            q = cov.find(1, p, end)
            work.steps += 1
            if q < 0:
                q = end
            if q - p >= min_span:
                kept.append((p, q, off))
                cov[p:q] = b"\x01" * (q - p)
            if q >= end:
                break
            p = cov.find(0, q, end)
            work.steps += 1
    return kept


def _common_prefix(r: U32, d: U32) -> int:
    """The length of the longest common prefix of ``r`` and ``d``.

    NOTE: the first 512 tokens are compared alone: prompts that differ early (most pairs) never read
    the rest of either.
    """
    m = min(len(r), len(d))
    head = min(m, 512)
    ne = r[:head] != d[:head]
    if ne.any():
        return int(ne.argmax())
    ne = r[head:m] != d[head:m]
    return head + int(ne.argmax()) if ne.any() else m


def find_spans(
    r: U32,
    rseg: SegmentTable,
    d: U32,
    dseg: SegmentTable,
    *,
    min_span: int,
    deadline: Deadline | None = None,
    work: SpanWork | None = None,
    donor_index: KgramIndex | None = None,
) -> tuple[int, list[FoundSpan]]:
    """Return ``(common_prefix, spans)``.

    Prefix spans cover the common prefix, split at segment boundaries, whatever
    their length. Shifted spans are exact runs of at least ``min_span`` tokens
    after splitting, never overlapping each other or the prefix in recipient
    positions. Spans are sorted by ``recipient_start``.

    Worst case, for n tokens, S segments and D = ``MAX_DIAGONALS`` (a constant): O(n log n) to
    find the diagonals and O(D n) to compare them, giving R <= D (n / (min_span + 1) + 1) runs,
    sorted in O(R log R); at most n of them are considered, and the greedy pass reads O(D n)
    bytes in at most 7 R + 2 D n / min_span searches; splitting is O(n log S). At most
    ``min(lcp, S_r + S_d)`` prefix and ``(n_r - lcp) / min_span`` shifted spans come back.
    ``deadline`` is checked between bounded steps (per diagonal, every 4,096 searches, 1,024
    pieces or 4,096 cuts): past it, :class:`~semgov._internal.deadline.DeadlineExceeded` is raised.
    ``donor_index``: ``d``'s :func:`kgram_index` for :func:`anchor_k` of ``min_span``, when the caller
    holds it (a registered donor); built here otherwise. Either way the spans are the same.
    """
    w = work if work is not None else SpanWork()
    tables = (rseg, dseg)
    _tick(deadline)
    lcp = _common_prefix(r, d)
    spans: list[FoundSpan] = []
    if lcp:
        w.cuts += _split(0, 0, lcp, "prefix", tables, 1, spans, deadline)
    lengths, starts, offs = _collect_runs(r, d, lcp, min_span, deadline, donor_index, w)
    w.runs = len(lengths)
    _tick(deadline)
    order = _greedy_order(lengths, starts, offs)
    w.considered = len(order)
    runs = list(zip(lengths[order].tolist(), starts[order].tolist(), offs[order].tolist(), strict=True))
    kept = _take(runs, len(r), lcp, min_span, deadline, w)
    w.pieces = len(kept)
    for i, (s, e, off) in enumerate(kept):
        if i & 1023 == 0:
            _tick(deadline)
        w.cuts += _split(s, s + off, e - s, "shifted", tables, min_span, spans, deadline)
    spans.sort(key=lambda x: x.recipient_start)
    return lcp, spans
